"""Metrics: pure functions, each with its formula, sign and direction.

Losses are natural-log NLL per token. Forgetting is adapted − base, so positive = worse.
"Old-vocabulary softmax" normalises over the base vocabulary V only (the paper's view that a
new token u is never emitted: p(u | ·) = 0); "full softmax" normalises over V ∪ U.
"""

from __future__ import annotations

import math

import torch

# name → (higher_is_better, definition). The leaderboard and docs read this table.
METRICS: dict[str, tuple[bool, str]] = {
    "target_loss": (
        False,
        "mean NLL per scored token on held-out target examples, old-vocabulary softmax, over completion positions whose target is an old token",
    ),
    "target_loss_full": (False, "as target_loss with the full softmax, over every completion position"),
    "target_loss_init": (
        False,
        "target_loss of the expanded model before training (new rows at their initialisation)",
    ),
    "target_acc": (
        True,
        "exact match of the whole completion (greedy, old-vocabulary argmax) on held-out target examples",
    ),
    "old_loss_base": (False, "mean NLL per token of the base model on old-vocabulary text"),
    "forgetting_oldvocab": (False, "old-text NLL, adapted (old-vocabulary softmax) − base"),
    "forgetting_full": (False, "old-text NLL, adapted (full softmax) − base"),
    "old_skill_acc": (True, "exact match on the old-skill probe, adapted model, old-vocabulary argmax"),
    "old_skill_acc_base": (True, "exact match on the old-skill probe, base model"),
    "old_skill_acc_delta": (True, "old_skill_acc − old_skill_acc_base"),
    "old_skill_acc_delta_full": (
        True,
        "as old_skill_acc_delta with the adapted model's argmax over the full vocabulary",
    ),
    "final_train_loss": (False, "training loss of the last step"),
    "train_seconds": (False, "wall time of the training loop"),
    "trainable_params": (False, "number of parameters the optimizer updates"),
    "tokens_seen": (False, "non-padding tokens processed in training"),
    "tokens_per_second": (True, "tokens_seen / train_seconds"),
    "peak_mem_mb": (False, "peak memory: CUDA max allocated, or on CPU the process's resident high-water mark"),
    "target_bpb": (
        False,
        "bits per UTF-8 byte of the held-out target completions: Σ NLL (full softmax, every completion position incl. eos) / ln 2 / bytes; compares across tokenizers",
    ),
    "target_bpb_base": (
        False,
        "target_bpb of the base model with the base tokenizer on the same text (meaningful where the base tokenizer covers the text, e.g. byte-level BPE)",
    ),
    # sequential tasks (clbench/cl_metrics.py): GEM's average, backward and forward transfer over the stage × task matrix
    "avg_target_acc": (True, "mean over stages of target_acc after the last stage"),
    "bwt_target_acc": (
        True,
        "GEM backward transfer of target_acc: mean over stages but the last of (after the last stage − right after its own)",
    ),
    "fwt_target_acc": (
        True,
        "GEM forward transfer of target_acc: mean over stages but the first of (before its own training − untrained)",
    ),
    "forgetting_target_acc": (
        False,
        "per stage (suffix): best target_acc after its own stage and before the last − after the last (Chaudhry et al. 2018)",
    ),
    "avg_target_loss": (False, "mean over stages of target_loss after the last stage"),
    "bwt_target_loss": (True, "backward transfer of target_loss, negated so that positive = better"),
    "fwt_target_loss": (True, "forward transfer of target_loss, negated so that positive = better"),
    "forgetting_target_loss": (
        False,
        "per stage (suffix): target_loss after the last stage − best (lowest) before it",
    ),
}


def higher_is_better(metric: str) -> bool:
    # per-group accuracies (target_acc_seen, ...) inherit from target_acc
    base = metric if metric in METRICS else metric.rsplit("_", 1)[0]
    return METRICS[base][0]


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """NLL of each target under softmax(logits) = logsumexp(logits) − logits[target]; logits [P, V],
    targets [P] → [P] float64 (for summing). Computed in float32 (bf16/fp16 logits are upcast): on
    SmolLM2's 49,152 logits it is within 2e-8 nats per token of a float64 reference on average
    (a float32 log-softmax, lm-eval's, under-counts by 1.6e-5), while a float64 log-softmax cost 2.6×
    as much time (0.23 s per 1,024 positions here)."""
    logits = logits.float()
    return (torch.logsumexp(logits, dim=-1) - logits.gather(-1, targets[:, None]).squeeze(-1)).double()


def mean_nll(nll_sum: float, n_tokens: int) -> float:
    """Σ NLL / number of scored tokens; NaN when nothing was scored."""
    return nll_sum / n_tokens if n_tokens else float("nan")


def first_match(correct: torch.Tensor, example_of: torch.Tensor, n_examples: int) -> torch.Tensor:
    """An example is right iff the argmax at its first scored position (the next token after the
    prompt) is right: a top-1 accuracy that varies where whole-completion exact match is always 0.

    correct [P] bool, example_of [P] example index of each position, positions of one example in order."""
    index = torch.arange(len(example_of))
    first = torch.full((n_examples,), len(example_of), dtype=torch.long).scatter_reduce(
        0, example_of, index, reduce="amin"
    )
    return torch.cat([correct, torch.zeros(1, dtype=torch.bool)])[first]  # an example with no position: wrong


def gap_closed(method_loss: float, no_learning: float, oracle: float) -> float:
    """(no_learning − method) / (no_learning − oracle): 0 = learned nothing, 1 = as good as the base
    reading what each new token stands for; > 1 beats that oracle, < 0 is worse than not learning.
    NaN where the oracle is no better than not learning (no gap to close)."""
    gap = no_learning - oracle
    return (no_learning - method_loss) / gap if gap > 0 else float("nan")


def exact_match(correct: torch.Tensor, example_of: torch.Tensor, n_examples: int) -> torch.Tensor:
    """An example is right iff every scored position's argmax is right.

    Under teacher forcing this equals greedy decoding: greedy output first differs from the
    answer exactly where the teacher-forced argmax first does.
    correct [P] bool, example_of [P] long → [n_examples] bool.
    """
    wrong = torch.zeros(n_examples, dtype=torch.long).index_add_(0, example_of, (~correct).long())
    return wrong == 0


def accuracy(hits: torch.Tensor) -> float:
    return hits.double().mean().item() if len(hits) else float("nan")


def forgetting(adapted: float, base: float) -> float:
    """adapted − base: positive means the adapted model is worse on old material."""
    return adapted - base


def bits_per_byte(nll_sum: float, n_bytes: int) -> float:
    """Σ NLL in nats / ln 2 / UTF-8 bytes of the scored text: independent of how it was tokenized."""
    return nll_sum / math.log(2) / n_bytes if n_bytes else float("nan")
