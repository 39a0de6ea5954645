"""Scoring a model on encoded examples: losses under both softmaxes and exact-match hits.

Logits are computed as hidden @ W[:V]ᵀ (old vocabulary) and hidden @ Wᵀ (full) only at scored
positions. Slicing W rather than the full logits makes the old-vocabulary matmul the very same
operation, shape included, for the base model and an expanded one, so a method that leaves old
weights untouched gets bit-identical old-vocabulary numbers, not "equal up to BLAS blocking".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from clbench import metrics
from clbench.data import Encoded, Padded
from clbench.devices import input_device
from clbench.train import autocast

POSITIONS_PER_CHUNK = 1024


@dataclass(frozen=True)
class Scores:
    nll_old: float  # Σ NLL over scored positions with an old-vocabulary target, old softmax
    n_old: int
    nll_full: float  # Σ NLL over all scored positions, full softmax
    n_full: int
    hits_old: torch.Tensor  # [n_examples] bool, old-vocabulary argmax
    hits_full: torch.Tensor  # [n_examples] bool, full-vocabulary argmax
    top1_old: torch.Tensor  # [n_examples] bool, old-vocabulary argmax right at the first completion position
    # per example: Σ NLL and scored positions, as nll_old/n_old and nll_full/n_full (their sums, in float64):
    # what a bootstrap over examples resamples (metrics.bootstrap_se)
    example_nll_old: torch.Tensor | None = None
    example_n_old: torch.Tensor | None = None
    example_nll_full: torch.Tensor | None = None
    example_n_full: torch.Tensor | None = None
    # per example: the argmax token id at its first completion position, old and full softmax (-1: none scored)
    first_token_old: torch.Tensor | None = None
    first_token_full: torch.Tensor | None = None
    # greedy use of new tokens, full-softmax argmax (metrics.new_token_recall / new_token_emissions): positions
    # whose target is a new token, scored or in the prompt; of them, where the argmax is that token; scored
    # positions whose argmax is any new token
    new_occurrences: int = 0
    new_recalled: int = 0
    new_emitted: int = 0
    # transition drift against a reference model on the same positions (score(..., reference=)): per example,
    # Σ over its positions of KL(reference ‖ this model) under the old softmax and the full one, and how many
    # positions' argmax differs from the reference's, old and full softmax (metrics.transition_drift)
    example_kl_old: torch.Tensor | None = None
    example_kl_full: torch.Tensor | None = None
    example_changed_old: torch.Tensor | None = None
    example_changed_full: torch.Tensor | None = None
    # bytes of the text the scored positions cover (data.Encoded.scored_bytes): bits per byte's denominator
    n_bytes: int = 0
    # per scored position (in scoring order, metrics.py's position measures): its example, its index in the
    # completion, its target, its NLL under the old softmax (NaN for a new-token target) and the full one, and how
    # many tokens after the latest new token before it its target comes (0: no new token before it)
    position_example: torch.Tensor | None = None
    position_index: torch.Tensor | None = None
    position_target: torch.Tensor | None = None
    position_nll_old: torch.Tensor | None = None
    position_nll_full: torch.Tensor | None = None
    position_since_new: torch.Tensor | None = None
    # the new tokens where they occur (prompt or completion, never predicted from bos alone): Σ full-softmax NLL
    # of predicting each, and how many (metrics.new_token_loss)
    new_nll_full: float = 0.0

    @property
    def loss_old(self) -> float:
        return metrics.mean_nll(self.nll_old, self.n_old)

    @property
    def loss_full(self) -> float:
        return metrics.mean_nll(self.nll_full, self.n_full)


class Head(NamedTuple):
    """A model's output layer, or its first rows: what turns hidden states into logits."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    cap: float | None  # final_logit_softcapping (Gemma 2)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden.to(self.weight.dtype), self.weight, self.bias)
        return torch.tanh(logits / self.cap) * self.cap if self.cap else logits

    def same(self, other: Head) -> bool:
        """Whether the two give the same logits: equal weights, biases and cap."""
        biases = (self.bias, other.bias)
        equal_bias = biases == (None, None) or None not in biases and torch.equal(*biases)
        return self.cap == other.cap and equal_bias and torch.equal(self.weight, other.weight)


def head_of(model, rows: int | None, *, keep: bool = False) -> Head:
    """The model's head over its first `rows` rows (None: all). keep: a copy, for a model that is handed on
    to be trained (models.Base.own_model with device_map)."""
    head = model.get_output_embeddings()
    weight = head.weight if rows is None else head.weight[:rows]
    bias = getattr(head, "bias", None)
    if bias is not None and rows is not None:
        bias = bias[:rows]
    if keep:
        weight, bias = weight.detach().clone(), None if bias is None else bias.detach().clone()
    return Head(weight, bias, getattr(model.config, "final_logit_softcapping", None))


def _head(model, hidden: torch.Tensor, rows: int | None) -> torch.Tensor:
    return head_of(model, rows)(hidden)


class Reference(NamedTuple):
    """The model drift is measured against (the unexpanded base) on the same examples: its positions() there,
    batch by batch as score() meets them, and its old-vocabulary head."""

    positions: list[Positions]
    head: Head


class Positions(NamedTuple):
    hidden: torch.Tensor  # [P, d] at the scored positions
    targets: torch.Tensor  # [P]
    example: torch.Tensor  # [P] the example each belongs to
    # prompt positions whose target is a new token: never scored, read for new_token_recall and new_token_loss
    prompt_hidden: torch.Tensor  # [Q, d]
    prompt_targets: torch.Tensor  # [Q]
    index: torch.Tensor  # [P] each target's index in its completion (0: the first completion token)
    since_new: torch.Tensor  # [P] tokens from the latest new token before each target to it (0: none before it)


@torch.inference_mode()
def positions(
    model, encoded: list[Encoded], *, pad_id: int, batch_size: int, new_from: int | None = None
) -> Iterator[Positions]:
    """The decoder's part of scoring, batch by batch: the last hidden states at scored positions (on
    the head's device), their targets and which example each belongs to; with new_from, also those of
    the prompt positions whose target id is >= new_from (a new token read in the prompt: pseudowords,
    arithmetic), from the same forward pass. A model whose backbone is the base's, on text without
    new tokens, has the base's: such positions can be kept and scored again by another head
    (score(..., at=...)), bit-identically, without the forward pass."""
    device = input_device(model)  # a model placed with device_map spans devices: inputs go to the embedding's
    head_device = model.get_output_embeddings().weight.device
    # batches of similar lengths waste little on padding; the order is a function of the data
    # alone, so base and adapted models still see identical batches
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].ids))
    padded = Padded(encoded, pad_id)
    for start in range(0, len(encoded), batch_size):
        members = order[start : start + batch_size]
        ids, _, target_mask = (t.to(device) for t in padded.batch(members))
        with autocast(device):
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state  # right padding: no mask (data.Padded)
        # the [positions, |V|] logits are made where the head lives; only per-position results leave it
        h = hidden[:, :-1][target_mask.to(hidden.device)].to(head_device)
        targets = ids[:, 1:][target_mask].to(head_device)
        example = torch.tensor(members)[:, None].expand_as(target_mask)[target_mask.cpu()]
        # kept apart from the scored positions, so their matmuls keep their shapes and their numbers their bits
        at = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        prompt_new = torch.zeros_like(target_mask)
        latest = torch.full_like(at, -1)
        if new_from is not None:
            # from position 1: a token predicted from bos alone is what a window starts with, never asked
            in_prompt = (at[:, 1:] < padded.loss_from[members, None]) & (at[:, 1:] > 1)
            prompt_new = in_prompt.to(ids.device) & (ids[:, 1:] >= new_from)
            latest = torch.where(ids.cpu() >= new_from, at, -1).cummax(1).values
        since = torch.where(latest[:, :-1] >= 0, at[:, 1:] - latest[:, :-1], 0)
        index = at[:, 1:] - padded.loss_from[members, None]
        mask = target_mask.cpu()
        prompt_h = hidden[:, :-1][prompt_new.to(hidden.device)].to(head_device)
        yield Positions(
            h, targets, example, prompt_h, ids[:, 1:][prompt_new].to(head_device), index[mask], since[mask]
        )


@torch.inference_mode()
def score(
    model,
    encoded: list[Encoded],
    *,
    old_vocab: int,
    pad_id: int,
    batch_size: int,
    at: Iterable[Positions] | None = None,
    reference: Reference | None = None,
) -> Scores:
    """at: positions() of these examples already computed (a frozen backbone's, kept from the base).
    reference: also measure the transition drift from that model, position by position (the same examples,
    batch size and so batches: positions() orders them by the data alone)."""
    if not encoded:
        empty = torch.zeros(0, dtype=torch.bool)
        return Scores(0.0, 0, 0.0, 0, empty, empty, empty)
    was_training = model.training
    model.eval()
    tally = _Tally(old_vocab, range(old_vocab, model.get_output_embeddings().weight.shape[0]), reference is not None)
    batches = positions(model, encoded, pad_id=pad_id, batch_size=batch_size, new_from=old_vocab) if at is None else at
    own = reference is not None and reference.positions is at and reference.head.same(head_of(model, old_vocab))
    for number, (h, targets, rows, prompt_h, prompt_targets, index, since_new) in enumerate(batches):
        if len(prompt_targets):  # no new token in a prompt: no head for it
            prompt_logits = _head(model, prompt_h, None)
            tally.recall(prompt_logits.argmax(-1), prompt_targets)
            tally.new_nll += metrics.token_nll(prompt_logits, prompt_targets).sum().item()
        kept = reference.positions[number] if reference is not None else None
        if kept is not None and not torch.equal(kept.targets, targets):
            raise ValueError("score: the reference's positions are not these examples' (other data or batch size)")
        # chunks of positions bound the [positions, |V|] logits (49k-152k vocabularies)
        for chunk in range(0, len(targets), POSITIONS_PER_CHUNK):
            cut = slice(chunk, chunk + POSITIONS_PER_CHUNK)
            # a frozen backbone's reference logits are its own old-softmax logits: not computed twice
            reference_logits = None if kept is None or own else reference.head(kept.hidden[cut])
            tally.add(model, h[cut], targets[cut], reference_logits, own_reference=own)
        tally.example_of.append(rows)
        tally.index.append(index)
        tally.since_new.append(since_new)
    model.train(was_training)
    return tally.scores(len(encoded), sum(e.scored_bytes for e in encoded))


@dataclass
class _Tally:
    """What score() gathers over chunks of scored positions, and the Scores it makes of them."""

    old_vocab: int
    new: range  # the new tokens' ids
    drift: bool  # a reference's logits come with each chunk
    nll_old: float = 0.0
    nll_full: float = 0.0
    n_old: int = 0
    n_full: int = 0
    occurrences: int = 0
    recalled: int = 0
    emitted: int = 0
    new_nll: float = 0.0
    correct_old: list = field(default_factory=list)
    correct_full: list = field(default_factory=list)
    example_of: list = field(default_factory=list)
    index: list = field(default_factory=list)
    since_new: list = field(default_factory=list)
    targets: list = field(default_factory=list)
    position_old: list = field(default_factory=list)
    position_full: list = field(default_factory=list)
    is_old: list = field(default_factory=list)
    argmax_old: list = field(default_factory=list)
    argmax_full: list = field(default_factory=list)
    drifts: list = field(default_factory=list)  # per chunk: metrics.transition_drift's four [P] tensors

    def recall(self, predicted: torch.Tensor, targets: torch.Tensor) -> None:
        counted = metrics.new_token_recall(predicted, targets, self.new)
        self.recalled, self.occurrences = self.recalled + counted[0], self.occurrences + counted[1]

    def add(
        self, model, h_chunk: torch.Tensor, t_chunk: torch.Tensor, reference_logits=None, *, own_reference=False
    ) -> None:
        """own_reference: the reference's logits are this chunk's old-softmax ones (score() checked that)."""
        logits_old = _head(model, h_chunk, self.old_vocab)
        if own_reference:
            reference_logits = logits_old
        is_old = t_chunk < self.old_vocab
        # a new-token target has no old-softmax NLL: clamped only to keep gather in range, then dropped
        nll = metrics.token_nll(logits_old, t_chunk.clamp(max=self.old_vocab - 1))
        self.nll_old += nll[is_old].sum().item()
        self.n_old += int(is_old.sum())
        self.position_old.append(torch.where(is_old, nll, 0.0).cpu())
        self.is_old.append(is_old.cpu())
        self.targets.append(t_chunk.cpu())
        predicted_old = logits_old.argmax(-1)
        hit_old = predicted_old == t_chunk
        if len(self.new):
            logits_full = _head(model, h_chunk, None)
            full = metrics.token_nll(logits_full, t_chunk)
            self.nll_full += full.sum().item()
            self.new_nll += full[~is_old].sum().item()
            self.position_full.append(full.cpu())
            predicted_full = logits_full.argmax(-1)
            hit_full = predicted_full == t_chunk
            self.recall(predicted_full, t_chunk)
            self.emitted += metrics.new_token_emissions(predicted_full, self.new)
        else:  # an unexpanded model: the full softmax is the old one, computed once
            self.nll_full += nll.sum().item()
            self.position_full.append(nll.cpu())
            predicted_full, hit_full = predicted_old, hit_old
            logits_full = logits_old
        if reference_logits is not None:
            drift = metrics.transition_drift(reference_logits, logits_old, logits_full)
            self.drifts.append([d.cpu() for d in drift])
        self.argmax_old.append(predicted_old.cpu())
        self.argmax_full.append(predicted_full.cpu())
        self.n_full += len(t_chunk)
        self.correct_old.append(hit_old)
        self.correct_full.append(hit_full)

    def scores(self, n_examples: int, n_bytes: int) -> Scores:
        example_of = torch.cat(self.example_of).cpu()
        correct_old = torch.cat(self.correct_old).cpu()
        per_example = lambda values: torch.zeros(n_examples, dtype=values.dtype).index_add_(0, example_of, values)
        is_old = torch.cat(self.is_old)
        first = metrics.first_position(example_of, n_examples)
        at_first = lambda predicted: torch.cat([torch.cat(predicted), torch.tensor([-1])])[first]
        drift = [per_example(torch.cat(d).double()) for d in zip(*self.drifts, strict=True)] if self.drift else []
        nll_old, nll_full = torch.cat(self.position_old), torch.cat(self.position_full)
        return Scores(
            self.nll_old,
            self.n_old,
            self.nll_full,
            self.n_full,
            metrics.exact_match(correct_old, example_of, n_examples),
            metrics.exact_match(torch.cat(self.correct_full).cpu(), example_of, n_examples),
            metrics.first_match(correct_old, example_of, n_examples),
            per_example(nll_old),
            per_example(is_old.long()),
            per_example(nll_full),
            per_example(torch.ones_like(is_old, dtype=torch.long)),
            at_first(self.argmax_old),
            at_first(self.argmax_full),
            self.occurrences,
            self.recalled,
            self.emitted,
            *(drift or [None] * 4),
            n_bytes=n_bytes,
            position_example=example_of,
            position_index=torch.cat(self.index),
            position_target=torch.cat(self.targets),
            position_nll_old=torch.where(is_old, nll_old, math.nan),
            position_nll_full=nll_full,
            position_since_new=torch.cat(self.since_new),
            new_nll_full=self.new_nll,
        )


@torch.inference_mode()
def greedy(model, ids: list[int], *, steps: int, vocab: int | None, eos_id: int) -> list[int]:
    """Free-running greedy continuation of ids: up to `steps` tokens, each the argmax over the first
    `vocab` rows of the head (None: all), stopping after eos. Every step runs the whole sequence
    again, without a cache: pt's prompt hooks serve whole forward passes only, and a few short
    continuations per run cost little."""
    was_training = model.training
    model.eval()
    device = input_device(model)
    out: list[int] = []
    for _ in range(steps):
        with autocast(device):
            hidden = model.get_decoder()(input_ids=torch.tensor([ids + out], device=device)).last_hidden_state
        head_device = model.get_output_embeddings().weight.device
        out.append(int(_head(model, hidden[0, -1:].to(head_device), vocab).argmax(-1)))
        if out[-1] == eos_id:
            break
    model.train(was_training)
    return out
