"""Transition drift (metrics.transition_drift; evaluate.score(..., reference=)) against an independent KL: the
softmaxes taken in float64 from the models' own forward logits, not from clbench's positions and heads."""

import copy
import dataclasses
import math

import pytest
import torch
from transformers import LlamaForCausalLM

from clbench import metrics as M
from clbench.arith import char_tokenizer
from clbench.data import encode_texts
from clbench.evaluate import Head, Reference, head_of, positions, score
from clbench.testing import tiny_llama

TEXTS = ["12+7=19", "3+4=7", "55+45=100", "8*9=72", "1+1=2", "606+1=607", "9+9=18"]


def kl64(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Per row, KL(softmax(reference) ‖ softmax(logits)) over the reference's columns, in float64."""
    p = torch.softmax(reference.double(), -1)
    q = torch.softmax(logits.double(), -1)[:, : reference.shape[1]]
    return (p * (p.log() - q.log())).sum(-1)


def test_drift_matches_a_float64_kl_on_random_logits():
    torch.manual_seed(0)
    reference = 3 * torch.randn(50, 40)
    old = reference + 0.5 * torch.randn(50, 40)
    full = torch.cat([old, 3 * torch.randn(50, 3)], 1)
    kl_old, kl_full, changed_old, changed_full = M.transition_drift(reference, old, full)
    assert torch.allclose(kl_old.double(), kl64(reference, old), rtol=1e-5, atol=1e-6)
    assert torch.allclose(kl_full.double(), kl64(reference, full), rtol=1e-5, atol=1e-6)
    assert bool((kl_full > kl_old).all())  # the new columns take mass from every old one
    assert changed_old.tolist() == (old.argmax(-1) != reference.argmax(-1)).float().tolist()
    assert changed_full.tolist() == (full.argmax(-1) != reference.argmax(-1)).float().tolist()
    assert 0 < changed_old.sum() < 50


def test_unchanged_transitions_drift_exactly_zero_and_new_rows_cost_their_mass():
    torch.manual_seed(1)
    reference, extra = 3 * torch.randn(20, 40), 3 * torch.randn(20, 2)
    kl_old, kl_full, changed_old, _ = M.transition_drift(
        reference, reference.clone(), torch.cat([reference, extra], 1)
    )
    assert torch.equal(kl_old, torch.zeros(20)) and torch.equal(changed_old, torch.zeros(20))
    full = torch.cat([reference, extra], 1).double()
    mass_new = torch.softmax(full, -1)[:, 40:].sum(-1)
    assert torch.allclose(kl_full.double(), -torch.log1p(-mass_new), rtol=1e-5, atol=1e-7)


def tiny() -> LlamaForCausalLM:
    return tiny_llama(char_tokenizer(), tied=True)


def with_two_rows(base: LlamaForCausalLM, perturb: float) -> LlamaForCausalLM:
    """The base with two new rows; perturb > 0 also moves the backbone (what a full-weight method does)."""
    model = copy.deepcopy(base)
    model.resize_token_embeddings(base.config.vocab_size + 2, mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[-2:] = torch.randn(2, base.config.hidden_size)
        model.model.layers[0].mlp.down_proj.weight.add_(
            perturb * torch.randn_like(model.model.layers[0].mlp.down_proj.weight)
        )
    return model


def independent_drift(base, adapted, encoded) -> tuple[float, float, float]:
    """Mean KL old / full and share of changed old-softmax argmaxes over every scored position, each example
    run alone through both models' forward passes."""
    vocab, kls_old, kls_full, changed = base.config.vocab_size, [], [], []
    with torch.no_grad():
        for example in encoded:
            ids = torch.tensor([example.ids])
            scored = slice(example.loss_from - 1, len(example.ids) - 1)
            p, q = base(ids).logits[0, scored], adapted(ids).logits[0, scored]
            kls_old.append(kl64(p, q[:, :vocab]))
            kls_full.append(kl64(p, q))
            changed.append(q[:, :vocab].argmax(-1) != p.argmax(-1))
    mean = lambda parts: torch.cat(parts).double().mean().item()
    return mean(kls_old), mean(kls_full), mean(changed)


@pytest.mark.parametrize("perturb", [0.0, 0.3])
def test_score_drift_against_the_models_own_logits(perturb):
    base, tokenizer = tiny(), char_tokenizer()
    adapted = with_two_rows(base, perturb)
    encoded = encode_texts(tokenizer, TEXTS, 32)
    pad, vocab = tokenizer.pad_token_id, len(tokenizer)
    reference = Reference(list(positions(base, encoded, pad_id=pad, batch_size=3)), head_of(base, vocab))
    scores = score(adapted, encoded, old_vocab=vocab, pad_id=pad, batch_size=3, reference=reference)
    kl_old, kl_full, changed = independent_drift(base, adapted, encoded)
    assert math.isclose(M.drift_of(scores, "example_kl_old"), kl_old, rel_tol=1e-4, abs_tol=1e-7)
    assert math.isclose(M.drift_of(scores, "example_kl_full"), kl_full, rel_tol=1e-4)
    assert M.drift_of(scores, "example_changed_old") == pytest.approx(changed, abs=1e-12)
    if perturb == 0.0:  # the backbone and the old rows untouched: every old transition bit for bit the base's
        assert M.drift_of(scores, "example_kl_old") == 0.0 == M.drift_of(scores, "example_changed_old")
    else:
        assert M.drift_of(scores, "example_kl_old") > 1e-4
    assert score(adapted, encoded, old_vocab=vocab, pad_id=pad, batch_size=3).example_kl_old is None


def test_a_reference_on_other_batches_is_refused():
    base, tokenizer = tiny(), char_tokenizer()
    encoded = encode_texts(tokenizer, TEXTS, 32)
    reference = Reference(list(positions(base, encoded, pad_id=0, batch_size=2)), head_of(base, len(tokenizer)))
    with pytest.raises(ValueError, match="reference's positions are not these examples'"):
        score(base, encoded, old_vocab=len(tokenizer), pad_id=0, batch_size=3, reference=reference)


def test_a_frozen_backbone_reference_is_its_own_old_logits_with_the_same_scores(monkeypatch):
    """score() skips the reference's head where it would give the adapted model's own old-softmax logits (the
    base's positions, equal old rows): every Scores field as when it computes them, and not when a row moved."""
    base, tokenizer = tiny(), char_tokenizer()
    adapted, encoded = with_two_rows(base, 0.0), encode_texts(tokenizer, TEXTS, 32)
    pad, vocab = tokenizer.pad_token_id, len(tokenizer)
    kept = list(positions(base, encoded, pad_id=pad, batch_size=3))
    reference, calls, call = Reference(kept, head_of(base, vocab)), [], Head.__call__
    monkeypatch.setattr(Head, "__call__", lambda head, hidden: calls.append(len(hidden)) or call(head, hidden))

    def scored(ref: Reference):
        calls.clear()
        return score(adapted, encoded, old_vocab=vocab, pad_id=pad, batch_size=3, at=kept, reference=ref), len(calls)

    own, own_calls = scored(reference)
    apart, apart_calls = scored(Reference(list(kept), reference.head))  # equal positions, not the same: computed
    assert apart_calls == own_calls + len(kept)  # one reference head per batch (a chunk each) saved
    for name, value in dataclasses.asdict(own).items():
        other = getattr(apart, name)
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, name
    assert M.drift_of(own, "example_kl_old") == 0.0 < M.drift_of(own, "example_kl_full")
    with torch.no_grad():  # an old row moved: the reference is no longer the model's own head
        adapted.get_output_embeddings().weight[5] += 0.1
    moved, moved_calls = scored(reference)
    assert moved_calls == apart_calls and M.drift_of(moved, "example_kl_old") > 0
