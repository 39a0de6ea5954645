"""Metrics: pure functions, each with its formula, sign and direction.

Losses are natural-log NLL per token. Forgetting is adapted − base, so positive = worse.
"Old-vocabulary softmax" normalises over the base vocabulary V only (the paper's view that a
new token u is never emitted: p(u | ·) = 0); "full softmax" normalises over V ∪ U.
"""

from __future__ import annotations

import torch

# name → (higher_is_better, definition). The leaderboard and docs read this table.
METRICS: dict[str, tuple[bool, str]] = {
    "target_loss": (False, "mean NLL per scored token on held-out target examples, old-vocabulary softmax, over completion positions whose target is an old token"),
    "target_loss_full": (False, "as target_loss with the full softmax, over every completion position"),
    "target_loss_init": (False, "target_loss of the expanded model before training (new rows at their initialisation)"),
    "target_acc": (True, "exact match of the whole completion (greedy, old-vocabulary argmax) on held-out target examples"),
    "old_loss_base": (False, "mean NLL per token of the base model on old-vocabulary text"),
    "forgetting_oldvocab": (False, "old-text NLL, adapted (old-vocabulary softmax) − base"),
    "forgetting_full": (False, "old-text NLL, adapted (full softmax) − base"),
    "old_skill_acc": (True, "exact match on the old-skill probe, adapted model, old-vocabulary argmax"),
    "old_skill_acc_base": (True, "exact match on the old-skill probe, base model"),
    "old_skill_acc_delta": (True, "old_skill_acc − old_skill_acc_base"),
    "old_skill_acc_delta_full": (True, "as old_skill_acc_delta with the adapted model's argmax over the full vocabulary"),
    "final_train_loss": (False, "training loss of the last step"),
    "train_seconds": (False, "wall time of the training loop"),
    "trainable_params": (False, "number of parameters the optimizer updates"),
    "tokens_seen": (False, "non-padding tokens processed in training"),
    "tokens_per_second": (True, "tokens_seen / train_seconds"),
    "peak_mem_mb": (False, "peak memory: CUDA max allocated, or on CPU the process's resident high-water mark"),
}


def higher_is_better(metric: str) -> bool:
    # per-group accuracies (target_acc_seen, ...) inherit from target_acc
    base = metric if metric in METRICS else metric.rsplit("_", 1)[0]
    return METRICS[base][0]


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """NLL of each target under softmax(logits); logits [P, V], targets [P] → [P] (float64)."""
    return -torch.log_softmax(logits.double(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def mean_nll(nll_sum: float, n_tokens: int) -> float:
    """Σ NLL / number of scored tokens; NaN when nothing was scored."""
    return nll_sum / n_tokens if n_tokens else float("nan")


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
