"""Metrics: each declared once (name, direction, definition, where it is a headline column), then
the pure functions that compute them, each with its formula, sign and direction.

Losses are natural-log NLL per token. Forgetting is adapted − base, so positive = worse.
"Old-vocabulary softmax" normalises over the base vocabulary V only (the paper's view that a
new token u is never emitted: p(u | ·) = 0); "full softmax" normalises over V ∪ U.
Adding a metric: docs/metrics.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from clbench import cl_metrics
from clbench.errors import ClbenchError
from clbench.registry import Registry

# the tables that show headline metrics: `clbench results`, the leaderboard's tables, `clbench sweep`'s curve
VIEWS = ("summary", "leaderboard", "curve")
BOOTSTRAP_RESAMPLES = 1000  # evaluation-noise estimates (bootstrap_se)


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    definition: str  # one sentence; the leaderboard's legend and docs/metrics.md show it
    # view → rank: a headline column of that view, in ascending rank (steps of 10 leave room between)
    headline: Mapping[str, int] = field(default_factory=dict)
    # a task's own metric, computed from the run's other values: → a float, or None where it does not apply
    compute: Callable[[Mapping[str, float]], float | None] | None = None
    # a built-in metric's computation from the run's scores (RunScores): → a float, None where it does not
    # apply, or {name: value} for a family (target_acc and target_acc_<group>)
    score: Callable[[RunScores], float | Mapping[str, float] | None] | None = None
    # the loop checks each loss before its update, yet the last update can still leave weights whose outputs
    # overflow: a run whose value of this metric is not finite diverged, and is no result (DivergedError)
    diverges: bool = False
    # its rank in the line each run logs when it ends (protocol.evaluate_adapted); None: not in that line
    logged: int | None = None
    # a run rebuilt from its record must reproduce it (clbench/rescore.py); timings and memory never repeat exactly
    reproduced: bool = False
    # a sequential task stores its value on every stage's target set after every stage (stage_cells), and its
    # transfer metrics summarise that matrix (avg_, bwt_, fwt_, forgetting_<stage>: clbench/cl_metrics.py)
    transfer: bool = False


METRICS: Registry[Metric] = Registry("metric")
_declared_in: dict[str, Path] = {}  # metric name → the task hook file that registered it
_loading: list[Path] = []  # the task hook file being executed, if any


def register_metric(
    metric: str,
    *,
    higher_is_better: bool,
    definition: str,
    headline: Mapping[str, int] | None = None,
    compute: Callable[[Mapping[str, float]], float | None] | None = None,
    score: Callable[[RunScores], float | Mapping[str, float] | None] | None = None,
    diverges: bool = False,
    logged: int | None = None,
    reproduced: bool = False,
    transfer: bool = False,
) -> Metric:
    """Declare a metric; a second declaration of a name is an error, except by the same task
    hook file run again (each Task object of a file executes it)."""
    headline = dict(headline or {})
    if unknown := sorted(set(headline) - set(VIEWS)):
        raise ClbenchError(
            f"metric {metric!r}: unknown headline view(s) {', '.join(unknown)}; known: {', '.join(VIEWS)}"
        )
    if _loading and metric in METRICS and _declared_in.get(metric) == _loading[-1]:
        return METRICS.get(metric)  # the first run's declaration stands: the same file declares the same
    declared = METRICS.register(
        metric,
        Metric(
            metric,
            higher_is_better,
            definition,
            headline,
            compute,
            score,
            diverges=diverges,
            logged=logged,
            reproduced=reproduced,
            transfer=transfer,
        ),
    )
    if _loading:
        _declared_in[metric] = _loading[-1]
    return declared


@contextlib.contextmanager
def declared_by(hook_file: Path) -> Iterator[list[Metric]]:
    """The metrics a task's hook module registers while it runs (taskspec.Task: the task's own)."""
    own: list[Metric] = []
    _loading.append(hook_file)
    try:
        yield own
    finally:
        _loading.pop()
        own += [METRICS.get(name) for name, path in _declared_in.items() if path == hook_file]


def lookup(name: str) -> Metric:
    """The declared metric; a family member (target_acc_seen, forgetting_target_acc_spec) that is not
    declared itself is its family's (the name less its last `_suffix`). Unknown: "did you mean"."""
    family = name.rsplit("_", 1)[0]
    return METRICS.get(family if name not in METRICS and family in METRICS else name)


def higher_is_better(metric: str) -> bool:
    """As lookup(metric).higher_is_better; KeyError for a metric nobody declared."""
    try:
        return lookup(metric).higher_is_better
    except ClbenchError as error:
        raise KeyError(str(error)) from None


def headline(view: str) -> list[str]:
    """The headline columns of a view, in rank order."""
    if view not in VIEWS:
        raise ClbenchError(f"unknown headline view {view!r}; known: {', '.join(VIEWS)}")
    shown = [METRICS.get(name) for name in METRICS if view in METRICS.get(name).headline]
    return [m.name for m in sorted(shown, key=lambda m: m.headline[view])]


def logged() -> list[str]:
    """The metrics each run logs when it ends, in their logged rank."""
    shown = [m for m in METRICS.registered() if m.logged is not None]
    return [m.name for m in sorted(shown, key=lambda m: m.logged)]


def divergence_checked() -> list[str]:
    """The metrics whose non-finite value makes a run diverged, in the order declared."""
    return [m.name for m in METRICS.registered() if m.diverges]


def reproduced() -> list[str]:
    """The quality metrics a rebuilt run must reproduce (clbench/rescore.py)."""
    return [m.name for m in METRICS.registered() if m.reproduced]


def transfer_metrics() -> list[str]:
    """The metrics a sequential task's transfer metrics summarise, in the order declared."""
    return [m.name for m in METRICS.registered() if m.transfer]


def computed(metrics: list[Metric], values: Mapping[str, float]) -> dict[str, float]:
    """The values of metrics computed from a run's others (a task's own), where they apply."""
    results = {m.name: m.compute(values) for m in metrics if m.compute is not None}
    return {name: value for name, value in results.items() if value is not None}


@dataclass(frozen=True)
class RunScores:
    """Everything a run's built-in metrics are computed from, gathered once (clbench/protocol.py
    evaluate_adapted). Each *Scores is a clbench.evaluate.Scores of one model on one set; None where the
    run has no such set."""

    target: Any = None  # the adapted model on the held-out target examples (expanded tokenizer)
    old: Any = None  # the adapted model on old text (base tokenizer)
    skill: Any = None  # the adapted model on the old-skill probe
    base_old: Any = None  # the base on old text
    base_skill: Any = None  # the base on the old-skill probe
    at_init: Any = None  # the expanded model before training on the target examples
    no_learning: Any = None  # the base on the target examples, base tokenizer: learning nothing
    oracle: Any = None  # the base on the target examples with each new token replaced by its meaning
    adapted_oracle: Any = None  # the adapted model on that oracle version
    groups: tuple = ()  # each target example's group (data.Example.group), for target_acc_<group>
    train: Any = None  # clbench.train.TrainResult, summed over stages
    trainable: int = 0
    exact_match: bool = False  # the task scores exact match (target_acc and its references)
    emits_new: bool = False  # trained under the full softmax, so decoding may emit a new token
    memory: Mapping[str, float] = field(default_factory=dict)  # clbench/memory.py PeakMemory.metrics
    recovery: Mapping[str, float] = field(default_factory=dict)  # clbench/explain.py meaning_recovery


def scored(scores: RunScores, names: list[str] | None = None) -> dict[str, float]:
    """Every built-in metric (or those named) that applies to these scores, each by its declared score."""
    values: dict[str, float] = {}
    for name in names if names is not None else METRICS.names():
        metric = METRICS.get(name)
        if metric.score is None:
            continue
        value = metric.score(scores)
        if isinstance(value, Mapping):
            values.update(value)
        elif value is not None:
            values[name] = value
    return values


def target_accuracies(r: RunScores) -> dict[str, float]:
    """target_acc and, per group of the target examples, target_acc_<group>."""
    values = {"target_acc": accuracy(r.target.hits_old)}
    for group in sorted({g for g in r.groups if g}):
        members = torch.tensor([g == group for g in r.groups])
        values[f"target_acc_{group}"] = accuracy(r.target.hits_old[members])
    return values


def alike(r: RunScores) -> bool:
    """Per-token losses compare only where the completions tokenize alike with and without the new tokens
    (the new token sits in the prompt); elsewhere (xling) bits per byte compare."""
    return r.no_learning.n_full == r.target.n_full == r.target.n_old


def gap_closed_of(r: RunScores) -> float | None:
    if r.oracle is None:
        return None
    return gap_closed(r.target.loss_old, r.no_learning.loss_old, r.oracle.loss_old) if alike(r) else math.nan


def gap_closed_se_of(r: RunScores) -> float | None:
    closed = gap_closed_of(r)
    if closed is None or not math.isfinite(closed):  # NaN: the oracle is no better than learning nothing
        return None
    return bootstrap_gap_closed_se(*(per_example(s) for s in (r.target, r.no_learning, r.oracle)))


AFTER_NEW = 4  # after_new_loss: the targets 1 … AFTER_NEW tokens after a new token


def after_new_mask(scores, k: int | None = None) -> torch.Tensor | None:
    """Scored positions k tokens after a new token (None: 1 … AFTER_NEW) whose target is an old token."""
    since = scores.position_since_new
    if since is None:
        return None
    near = (since >= 1) & (since <= AFTER_NEW) if k is None else since == k
    return near & ~torch.isnan(scores.position_nll_old)


def after_new_losses(scores) -> dict[str, float] | None:
    """after_new_loss and after_new_loss_<k>, k = 1 … AFTER_NEW, where any such position is scored."""
    values = {}
    for k, name in [(None, "after_new_loss"), *((k, f"after_new_loss_{k}") for k in range(1, AFTER_NEW + 1))]:
        mask = after_new_mask(scores, k)
        if mask is not None and mask.any():
            values[name] = scores.position_nll_old[mask].mean().item()
    return values or None


def after_new_reference(scores, reference) -> float | None:
    """The mean old-softmax NLL of `reference` (another reading of the same examples) at the positions of
    after_new_loss, matched by example and completion index; None where it has no such positions or its
    targets there differ (the completions do not tokenize alike)."""
    mask = after_new_mask(scores)
    if reference is None or mask is None or not mask.any() or reference.position_index is None:
        return None
    nll = aligned(reference, scores.position_example[mask], scores.position_index[mask], scores.position_target[mask])
    return None if nll is None else nll.mean().item()


def aligned(scores, example: torch.Tensor, index: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
    """scores' old-softmax NLL at the positions (example, completion index), or None unless each is scored there
    with the same target."""
    width = int(max(scores.position_index.max(), index.max())) + 1
    keys = scores.position_example * width + scores.position_index
    order = keys.argsort()
    wanted = example * width + index
    found = torch.searchsorted(keys[order], wanted).clamp(max=len(keys) - 1)
    at = order[found]
    if not (torch.equal(keys[at], wanted) and torch.equal(scores.position_target[at], target)):
        return None
    return scores.position_nll_old[at]


def after_new_gap_closed(r: RunScores) -> float | None:
    losses = after_new_losses(r.target)
    nolearn = after_new_reference(r.target, r.no_learning) if alike(r) else None
    oracle = after_new_reference(r.target, r.oracle)
    if losses is None or nolearn is None or oracle is None:
        return None
    return gap_closed(losses["after_new_loss"], nolearn, oracle)


def finite_or_none(value: float | None) -> float | None:
    """NaN or no value: the metric does not apply (no gap to close; a resample without a finite spread)."""
    return value if value is not None and math.isfinite(value) else None


def per_example(scores) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example Σ NLL and scored positions under the old softmax: what a bootstrap resamples."""
    return scores.example_nll_old, scores.example_n_old


def markdown_table() -> str:
    """Every declared metric: docs/metrics.md holds this table (a test keeps the two equal)."""
    rows = ["| metric | better | headline in | definition |", "|---|---|---|---|"]
    for name in METRICS:
        m = METRICS.get(name)
        where = ", ".join(sorted(m.headline, key=VIEWS.index))
        rows.append(f"| `{name}` | {'higher' if m.higher_is_better else 'lower'} | {where} | {m.definition} |")
    return "\n".join(rows)


# ---------------------------------------------------------------- the declarations

# scored after training (clbench/protocol.py evaluate_adapted)
register_metric(
    "target_loss",
    higher_is_better=False,
    definition="mean NLL per scored token on held-out target examples, old-vocabulary softmax, over completion positions whose target is an old token",
    headline={"summary": 10, "leaderboard": 40, "curve": 10},
    score=lambda r: r.target.loss_old,
    diverges=True,
    logged=10,
    reproduced=True,
    transfer=True,
)
register_metric(
    "target_loss_full",
    higher_is_better=False,
    definition="as target_loss with the full softmax, over every completion position",
    score=lambda r: r.target.loss_full,
    diverges=True,
    reproduced=True,
)
register_metric(
    "target_loss_init",
    higher_is_better=False,
    definition="target_loss of the expanded model before training (new rows at their initialisation)",
    score=lambda r: r.at_init.loss_old,
)
register_metric(
    "target_acc",
    higher_is_better=True,
    definition="exact match of the whole completion (greedy, old-vocabulary argmax) on held-out target examples",
    headline={"summary": 11, "leaderboard": 10, "curve": 20},
    score=lambda r: target_accuracies(r) if r.exact_match else None,
    logged=40,
    reproduced=True,
    transfer=True,
)
# target_acc_<group> for every group of the target examples (data.Example.group); these two are headlines
register_metric(
    "target_acc_seen",
    higher_is_better=True,
    definition="target_acc over the target examples of group seen (arithmetic: pairs the base model saw with *)",
    headline={"summary": 30, "leaderboard": 20, "curve": 30},
)
register_metric(
    "target_acc_unseen",
    higher_is_better=True,
    definition="target_acc over the target examples of group unseen (arithmetic: pairs the base model never saw with *)",
    headline={"summary": 40, "leaderboard": 30, "curve": 40},
)
register_metric(
    "old_loss_base",
    higher_is_better=False,
    definition="mean NLL per token of the base model on old-vocabulary text",
    score=lambda r: r.base_old.loss_old,
)
register_metric(
    "forgetting_oldvocab",
    higher_is_better=False,
    definition="old-text NLL, adapted (old-vocabulary softmax) − base",
    headline={"summary": 13, "leaderboard": 60, "curve": 50},
    score=lambda r: forgetting(r.old.loss_old, r.base_old.loss_old),
    diverges=True,
    logged=60,
    reproduced=True,
)
register_metric(
    "forgetting_full",
    higher_is_better=False,
    definition="old-text NLL, adapted (full softmax) − base",
    headline={"summary": 70, "leaderboard": 70, "curve": 60},
    score=lambda r: forgetting(r.old.loss_full, r.base_old.loss_old),
    diverges=True,
    logged=70,
    reproduced=True,
)
# transition drift: the paper's forgetting. A loss difference on a corpus also measures how far the model moved
# towards or away from that corpus's domain; the drift of p(· | x<t) at each old-text position does not.
DRIFT = {
    "drift_kl_oldvocab": (
        "example_kl_old",
        "old text: mean over scored positions of KL(p_base ‖ p_adapted), both softmaxes over the base vocabulary V: how far each old transition p(· | x<t) moved (0: unchanged; exactly 0 where the backbone and the old rows are untouched); unlike forgetting_oldvocab it cannot be lowered by moving towards the old text's domain",
        {"summary": 16, "leaderboard": 62, "curve": 52},
    ),
    "drift_kl_full": (
        "example_kl_full",
        "as drift_kl_oldvocab with the adapted model's softmax over V ∪ U (the base puts no mass on U: for a method that only adds rows this is −log(1 − the mass the new tokens take) per position)",
        {"summary": 72, "leaderboard": 72},
    ),
    "drift_top1_changed_oldvocab": (
        "example_changed_old",
        "old text: share of scored positions whose greedy next token (argmax over V) differs from the base's",
        {"summary": 64, "leaderboard": 64},
    ),
    "drift_top1_changed_full": (
        "example_changed_full",
        "as drift_top1_changed_oldvocab with the adapted model's argmax over V ∪ U (a new token there is a change)",
        {},
    ),
}


def drift_of(scores, field_name: str) -> float | None:
    """A drift metric's mean over the scored positions; None where the scores carry no drift (no reference)."""
    per_example = getattr(scores, field_name)
    if per_example is None:
        return None
    return (per_example.sum() / scores.example_n_full.double().sum()).item()


for _name, (_field, _definition, _headline) in DRIFT.items():
    register_metric(
        _name,
        higher_is_better=False,
        definition=_definition,
        headline=_headline,
        score=lambda r, _field=_field: drift_of(r.old, _field),
    )
# a sequential task's stage × task matrix holds these beside old text's losses after every stage (stage_cells)
STAGE_DRIFT = ("drift_kl_oldvocab", "drift_kl_full")
register_metric(
    "old_skill_acc",
    higher_is_better=True,
    definition="exact match on the old-skill probe, adapted model, old-vocabulary argmax",
    score=lambda r: accuracy(r.skill.hits_old) if len(r.skill.hits_old) else None,
    reproduced=True,
)
register_metric(
    "old_skill_acc_base",
    higher_is_better=True,
    definition="exact match on the old-skill probe, base model",
    score=lambda r: accuracy(r.base_skill.hits_old) if len(r.skill.hits_old) else None,
)
register_metric(
    "old_skill_acc_delta",
    higher_is_better=True,
    definition="old_skill_acc − old_skill_acc_base",
    headline={"summary": 17, "leaderboard": 50},
    score=lambda r: accuracy(r.skill.hits_old) - accuracy(r.base_skill.hits_old) if len(r.skill.hits_old) else None,
)
register_metric(
    "old_skill_acc_delta_full",
    higher_is_better=True,
    definition="as old_skill_acc_delta with the adapted model's argmax over the full vocabulary",
    score=lambda r: accuracy(r.skill.hits_full) - accuracy(r.base_skill.hits_old) if len(r.skill.hits_old) else None,
)
register_metric(
    "final_train_loss",
    higher_is_better=False,
    definition="training loss of the last step",
    score=lambda r: r.train.final_loss,
)
register_metric(
    "train_seconds",
    higher_is_better=False,
    definition="wall time of the training loop",
    headline={"summary": 90, "leaderboard": 90},
    score=lambda r: r.train.seconds,
)
register_metric(
    "trainable_params",
    higher_is_better=False,
    definition="number of parameters the optimizer updates",
    headline={"summary": 80, "leaderboard": 80},
    score=lambda r: r.trainable,
)
register_metric(
    "tokens_seen",
    higher_is_better=False,
    definition="non-padding tokens processed in training",
    score=lambda r: r.train.tokens_seen,
)
register_metric(
    "tokens_per_second",
    higher_is_better=True,
    definition="tokens_seen / train_seconds",
    score=lambda r: r.train.tokens_seen / r.train.seconds if r.train.seconds else float("nan"),
)
register_metric(
    "peak_mem_mb",
    higher_is_better=False,
    definition="CUDA runs: torch.cuda.max_memory_allocated (MiB) from the run's training start to the end of its evaluation, stats reset at the start; CPU runs recorded before peak_rss_increase_mb stored the process's resident high-water mark here, which carries earlier runs' peaks",
    score=lambda r: r.memory.get("peak_mem_mb"),
)
register_metric(
    "peak_rss_increase_mb",
    higher_is_better=False,
    definition="CPU runs: the process's peak resident set (MiB), sampled every 50 ms from the run's training start to the end of its evaluation, minus its resident set at that start: what the run itself added (clbench/memory.py)",
    score=lambda r: r.memory.get("peak_rss_increase_mb"),
)
register_metric(
    "target_bpb",
    higher_is_better=False,
    definition="bits per UTF-8 byte of the held-out target completions: Σ NLL (full softmax, every scored position) / ln 2 / the bytes those positions cover; compares across tokenizers. For a method trained under the old softmax (et, et-dict, pt) it also scores what the method never trains: the new tokens where they are the target, and on a tied head the mass its new rows take as outputs (target_loss and after_new_loss are its measures)",
    headline={"summary": 26, "leaderboard": 41},
    score=lambda r: bits_per_byte(r.target.nll_full, r.target.n_bytes) if r.target.n_bytes else None,
)
register_metric(
    "target_bpb_base",
    higher_is_better=False,
    definition="target_bpb of the base model with the base tokenizer on the same text (meaningful where the base tokenizer covers the text, e.g. byte-level BPE)",
    headline={"summary": 27, "leaderboard": 42},
    score=lambda r: (
        bits_per_byte(r.no_learning.nll_full, r.no_learning.n_bytes)
        if r.no_learning is not None and r.no_learning.n_bytes
        else None
    ),
)
register_metric(
    "target_bpb_init",
    higher_is_better=False,
    definition="target_bpb of the expanded model before training (new rows at their initialisation): what adding the tokens costs or saves before any learning; between it and target_bpb is what training did",
    score=lambda r: bits_per_byte(r.at_init.nll_full, r.at_init.n_bytes) if r.at_init.n_bytes else None,
)
register_metric(
    "target_tokens_per_byte",
    higher_is_better=False,
    definition="scored tokens per UTF-8 byte they cover in the target completions, expanded tokenizer: what a new vocabulary saves",
    score=lambda r: r.target.n_full / r.target.n_bytes if r.target.n_bytes else None,
)
register_metric(
    "target_tokens_per_byte_base",
    higher_is_better=False,
    definition="target_tokens_per_byte with the base tokenizer, before expansion",
    score=lambda r: r.no_learning.n_full / r.no_learning.n_bytes if r.no_learning.n_bytes else None,
)
register_metric(
    "target_top1",
    higher_is_better=True,
    definition="next-token top-1: the old-vocabulary argmax at the first scored position (the token right after the prompt; with an empty prompt, the text's second token) is right",
    headline={"summary": 25, "leaderboard": 15},
    score=lambda r: accuracy(r.target.top1_old),
    logged=50,
)
# evaluation noise
NOISE = {  # evaluation noise of each of these, from per-example sums (forgetting: paired with the base)
    "target_loss": lambda r: bootstrap_se(r.target.example_nll_old, r.target.example_n_old),
    "forgetting_oldvocab": lambda r: bootstrap_se(
        r.old.example_nll_old, r.old.example_n_old, r.base_old.example_nll_old, r.base_old.example_n_old
    ),
    "forgetting_full": lambda r: bootstrap_se(
        r.old.example_nll_full, r.old.example_n_full, r.base_old.example_nll_old, r.base_old.example_n_old
    ),
    **{
        name: lambda r, _field=field_name: (
            None if getattr(r.old, _field) is None else bootstrap_se(getattr(r.old, _field), r.old.example_n_full)
        )
        for name, (field_name, _, _) in DRIFT.items()
    },
}
for _name, _score in NOISE.items():
    register_metric(
        f"{_name}_se",
        higher_is_better=False,
        definition=f"evaluation noise of {_name}: bootstrap standard error over the evaluation examples ({BOOTSTRAP_RESAMPLES} resamples, fixed seed{'; paired with the base on the same examples' if _name.startswith('forgetting') else ''})",
        score=_score,
    )
for _name, _paired, _score in (
    ("gap_closed", "no-learning and oracle references", lambda r: finite_or_none(gap_closed_se_of(r))),
    (
        "word_gap",
        "adapted oracle",
        lambda r: (
            bootstrap_se(*per_example(r.target), *per_example(r.adapted_oracle))
            if r.adapted_oracle is not None
            else None
        ),
    ),
):
    register_metric(
        f"{_name}_se",
        higher_is_better=False,
        definition=f"evaluation noise of {_name}: bootstrap standard error over the target examples ({BOOTSTRAP_RESAMPLES} resamples, fixed seed), resampled together with the {_paired} on the same examples",
        score=_score,
    )
# reference points, stored with every run (clbench/protocol.py base_references)
register_metric(
    "target_loss_nolearn",
    higher_is_better=False,
    definition="no-learning reference: target_loss of the unexpanded base on the same examples, each new token left as its old sub-word pieces (where the completions tokenize alike; else see target_bpb_base)",
    score=lambda r: r.no_learning.loss_old if alike(r) else None,
)
register_metric(
    "target_top1_nolearn",
    higher_is_better=True,
    definition="target_top1 of the no-learning reference",
    score=lambda r: accuracy(r.no_learning.top1_old),
)
register_metric(
    "target_loss_oracle",
    higher_is_better=False,
    definition="oracle reference, where the task knows what a new token stands for: target_loss of the base on the same examples with each new token replaced by its meaning (pseudowords: the word it replaced; arithmetic: *)",
    score=lambda r: r.oracle.loss_old if r.oracle is not None else None,
)
register_metric(
    "target_top1_oracle",
    higher_is_better=True,
    definition="target_top1 of the oracle reference",
    score=lambda r: accuracy(r.oracle.top1_old) if r.oracle is not None else None,
)
register_metric(
    "target_acc_nolearn",
    higher_is_better=True,
    definition="target_acc of the no-learning reference (tasks scored by exact match)",
    score=lambda r: accuracy(r.no_learning.hits_old) if r.exact_match else None,
)
register_metric(
    "target_acc_oracle",
    higher_is_better=True,
    definition="target_acc of the oracle reference (tasks scored by exact match): arithmetic, the base's accuracy on a*b",
    score=lambda r: accuracy(r.oracle.hits_old) if r.exact_match and r.oracle is not None else None,
)
register_metric(
    "gap_closed",
    higher_is_better=True,
    definition="(target_loss_nolearn − target_loss) / (target_loss_nolearn − target_loss_oracle): 0 learned nothing, 1 as good as the base reading the meaning; >1 beats it, <0 worse than not learning",
    headline={"summary": 15, "leaderboard": 35, "curve": 15},
    score=lambda r: finite_or_none(gap_closed_of(r)),
    logged=30,
)
register_metric(
    "target_loss_oracle_adapted",
    higher_is_better=False,
    definition="the adapted model's target_loss on the oracle version of the target examples (each new token replaced by its meaning)",
    score=lambda r: r.adapted_oracle.loss_old if r.adapted_oracle is not None else None,
)
register_metric(
    "word_gap",
    higher_is_better=False,
    definition="target_loss − target_loss_oracle_adapted, one model: what reading the new token still costs against reading its meaning; separates learning the word from adapting to the corpus",
    headline={"leaderboard": 36},
    score=lambda r: r.target.loss_old - r.adapted_oracle.loss_old if r.adapted_oracle is not None else None,
)
# the new states' own transitions (the paper's object): out of a new token, and into it
register_metric(
    "after_new_loss",
    higher_is_better=False,
    definition=f"the new tokens' outgoing transitions: mean NLL (old-vocabulary softmax) of the scored targets 1 to {AFTER_NEW} tokens after a new token (counted from the latest new token before them) in the held-out target examples; after_new_loss_<k>: k tokens after it",
    headline={"summary": 12, "leaderboard": 37, "curve": 12},
    score=lambda r: after_new_losses(r.target),
    logged=20,
)
register_metric(
    "after_new_loss_nolearn",
    higher_is_better=False,
    definition="after_new_loss of the unexpanded base at the same positions, each new token read as its old sub-word pieces (where the completions tokenize alike)",
    score=lambda r: after_new_reference(r.target, r.no_learning) if alike(r) else None,
)
register_metric(
    "after_new_loss_oracle",
    higher_is_better=False,
    definition="after_new_loss of the base at the same positions of the oracle version (each new token replaced by its meaning), where the task has one",
    score=lambda r: after_new_reference(r.target, r.oracle),
)
register_metric(
    "after_new_gap_closed",
    higher_is_better=True,
    definition="gap_closed at the positions of after_new_loss: (after_new_loss_nolearn − after_new_loss) / (after_new_loss_nolearn − after_new_loss_oracle)",
    headline={"summary": 14, "leaderboard": 38},
    score=lambda r: finite_or_none(after_new_gap_closed(r)),
)
register_metric(
    "new_token_loss",
    higher_is_better=False,
    definition="the new tokens' incoming transitions: mean NLL (full softmax) of each new token where it occurs in the target examples, prompt or completion (never predicted from bos alone); for methods trained under the full softmax only: one trained under the old softmax cannot emit a new token (not applicable)",
    headline={"leaderboard": 39},
    score=lambda r: (
        (r.target.new_nll_full / r.target.new_occurrences) if r.emits_new and r.target.new_occurrences else None
    ),
)
# greedy use of the new tokens, from the scoring pass's argmax
register_metric(
    "new_token_recall",
    higher_is_better=True,
    definition="share of the occurrences of a new token after the first position of a target example (prompt or completion) where the greedy next token given the reference prefix is that token; 0 by construction for a method trained under the old softmax, which decodes over the old vocabulary",
    score=lambda r: (
        (r.target.new_recalled / r.target.new_occurrences if r.emits_new else 0.0)
        if r.target.new_occurrences
        else None
    ),
)
register_metric(
    "new_token_false_use",
    higher_is_better=False,
    definition="share of old-text scored positions (no new token in the text) whose greedy next token, given the reference prefix, is a new token; 0 by construction for a method trained under the old softmax",
    score=lambda r: (r.old.new_emitted / r.old.n_full if r.emits_new else 0.0) if r.old.n_full else None,
)
# dictionary recovery, where the task knows what each new token stands for (clbench/explain.py: the rules)
register_metric(
    "meaning_recall_at_s",
    higher_is_better=True,
    definition="share of a new token's true words (those that are one base token) among the s atoms of its learned input row's OMP decomposition over the old input rows, s = its number of true words, all rows centred (minus the old rows' mean); mean over new tokens",
    score=lambda r: r.recovery.get("meaning_recall_at_s"),
)
register_metric(
    "meaning_rank_median",
    higher_is_better=False,
    definition="rank (1 = nearest) of each true word among the old input rows by cosine to the learned input row, all rows centred (minus the old rows' mean), so an untrained row reads at chance, (V + 1) / 2 of V old rows; median over every scored (token, word) pair",
    score=lambda r: r.recovery.get("meaning_rank_median"),
)
register_metric(
    "meaning_words_scored",
    higher_is_better=True,
    definition="(token, true word) pairs the recovery metrics score: true words that are one base token (with a leading space where new tokens are whole words)",
    score=lambda r: r.recovery.get("meaning_words_scored"),
)
# sequential tasks (clbench/cl_metrics.py): GEM's average, backward and forward transfer over the stage × task matrix
register_metric(
    "avg_target_acc", higher_is_better=True, definition="mean over stages of target_acc after the last stage"
)
register_metric(
    "bwt_target_acc",
    higher_is_better=True,
    definition="GEM backward transfer of target_acc: mean over stages but the last of (after the last stage − right after its own)",
)
register_metric(
    "fwt_target_acc",
    higher_is_better=True,
    definition="GEM forward transfer of target_acc: mean over stages but the first of (before its own training − untrained)",
)
register_metric(
    "forgetting_target_acc",
    higher_is_better=False,
    definition="per stage (suffix): best target_acc after its own stage and before the last − after the last (Chaudhry et al. 2018)",
)
register_metric(
    "avg_target_loss", higher_is_better=False, definition="mean over stages of target_loss after the last stage"
)
register_metric(
    "bwt_target_loss",
    higher_is_better=True,
    definition="backward transfer of target_loss, negated so that positive = better",
)
register_metric(
    "fwt_target_loss",
    higher_is_better=True,
    definition="forward transfer of target_loss, negated so that positive = better",
)
register_metric(
    "forgetting_target_loss",
    higher_is_better=False,
    definition="per stage (suffix): target_loss after the last stage − best (lowest) before it",
)


# ---------------------------------------------------------------- a sequential task's stage × task matrix


def stage_cells(old, targets: list) -> list[tuple[int, str, float]]:
    """One row of the stage × task matrix: (eval_stage, metric, value) for old text (eval_stage 0: its loss under
    either softmax and its STAGE_DRIFT) and for each stage's target set (eval_stage 1, 2, …). old, targets:
    clbench.evaluate.Scores of one model after one stage."""
    cells = [(0, "loss_oldvocab", old.loss_old), (0, "loss_full", old.loss_full)]
    cells += [(0, name, drift_of(old, DRIFT[name][0])) for name in STAGE_DRIFT]
    for number, target in enumerate(targets, 1):
        cells += [
            (number, "target_loss", target.loss_old),
            (number, "target_acc", accuracy(target.hits_old)),
            (number, "target_loss_full", target.loss_full),
        ]
    return cells


def transfer(matrix: list[tuple], stage_names: list[str]) -> dict[str, float]:
    """The transfer metrics of every transfer_metrics() from the stage × task matrix's
    (after_stage, eval_stage, metric, value) rows: avg_, bwt_, fwt_ and forgetting_<stage> (clbench/cl_metrics.py)."""
    values = {}
    for metric in transfer_metrics():
        cell = {(a, e): v for a, e, m, v in matrix if m == metric}
        R = [[cell[a, e] for e in range(1, len(stage_names) + 1)] for a in range(len(stage_names) + 1)]
        values.update(cl_metrics.summarize(R, metric, higher_is_better(metric), stage_names))
    return values


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
    first = first_position(example_of, n_examples)
    return torch.cat([correct, torch.zeros(1, dtype=torch.bool)])[first]  # an example with no position: wrong


def first_position(example_of: torch.Tensor, n_examples: int) -> torch.Tensor:
    """Per example, the index of its first scored position in example_of; len(example_of) for one with none."""
    index = torch.arange(len(example_of))
    return torch.full((n_examples,), len(example_of), dtype=torch.long).scatter_reduce(
        0, example_of, index, reduce="amin"
    )


def bootstrap_se(
    nll: torch.Tensor,
    counts: torch.Tensor,
    base_nll: torch.Tensor | None = None,
    base_counts: torch.Tensor | None = None,
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> float:
    """Evaluation noise: the standard deviation, over `resamples` bootstrap resamples of the
    examples, of Σ nll / Σ counts (a mean per-token loss), or with base_* of its difference from
    the base's on the same resampled examples (forgetting: a paired difference). Per-example sums
    in; a fixed seed, so the same scores give the same number. NaN for fewer than two examples."""
    n = len(nll)
    if n < 2:
        return float("nan")
    index = _resampled(n, resamples, seed)
    value = _resampled_loss(index, nll, counts)
    if base_nll is not None:
        value = value - _resampled_loss(index, base_nll, base_counts)
    return float(value.std())


def bootstrap_gap_closed_se(
    method: tuple[torch.Tensor, torch.Tensor],
    no_learning: tuple[torch.Tensor, torch.Tensor],
    oracle: tuple[torch.Tensor, torch.Tensor],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> float:
    """bootstrap_se of gap_closed: each (per-example Σ nll, counts) of the same examples resampled
    together, so the examples' shared difficulty cancels as it does in the ratio itself."""
    n = len(method[0])
    if n < 2:
        return float("nan")
    index = _resampled(n, resamples, seed)
    m, nolearn, best = (_resampled_loss(index, *pair) for pair in (method, no_learning, oracle))
    if bool((nolearn <= best).any()):  # some resample has no gap to close: the ratio has no finite spread
        return float("nan")
    return float(((nolearn - m) / (nolearn - best)).std())


def _resampled(n: int, resamples: int, seed: int) -> torch.Tensor:
    return torch.randint(n, (resamples, n), generator=torch.Generator().manual_seed(seed))


def _resampled_loss(index: torch.Tensor, nll: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return nll.double()[index].sum(1) / counts.double()[index].sum(1)


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


def new_token_recall(predicted: torch.Tensor, targets: torch.Tensor, new_ids: range) -> tuple[int, int]:
    """(recalled, occurrences): of the positions whose target is a new token, those whose greedy
    prediction is that very token. predicted[i] is the argmax at the position that predicts
    targets[i]: for one example's ids, predicted = argmax[:-1] and targets = ids[1:], so an
    occurrence at i > 0 is recalled iff the argmax at i − 1 is ids[i]. Another new token there is
    no recall (nor false use: the text has a new token there)."""
    is_new = (targets >= new_ids.start) & (targets < new_ids.stop)
    return int((is_new & (predicted == targets)).sum()), int(is_new.sum())


def new_token_emissions(predicted: torch.Tensor, new_ids: range) -> int:
    """How many greedy predictions are a new token (false use, on text that has none)."""
    return int(((predicted >= new_ids.start) & (predicted < new_ids.stop)).sum())


def accuracy(hits: torch.Tensor) -> float:
    return hits.double().mean().item() if len(hits) else float("nan")


def forgetting(adapted: float, base: float) -> float:
    """adapted − base: positive means the adapted model is worse on old material."""
    return adapted - base


def transition_drift(
    reference: torch.Tensor, old: torch.Tensor, full: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per position, how far a model's next-token distribution moved from a reference's: KL(p_ref ‖ p) with
    p over the reference's vocabulary V (`old`, logits [P, |V|]) and over V ∪ U (`full`, [P, |V| + |U|]; the
    reference puts no mass on U, so only V's terms count), and whether the argmax differs (1.0 or 0.0) in each.
    In float32 from logits of any dtype; identical logits give exactly 0 (identical log-softmaxes). A KL is
    ≥ 0: a rounding error below 0 is clamped to it."""
    log_p = torch.log_softmax(reference.float(), -1)
    p, vocab = log_p.exp(), reference.shape[-1]
    # the reference itself (a frozen backbone's old softmax): its log-softmax is log_p, so the KL is 0 as computed
    log_q = lambda logits: log_p if logits is reference else torch.log_softmax(logits.float(), -1)[:, :vocab]
    kl = lambda logits: (p * (log_p - log_q(logits))).sum(-1).clamp_min(0.0)
    greedy = reference.argmax(-1)
    return kl(old), kl(full), (old.argmax(-1) != greedy).float(), (full.argmax(-1) != greedy).float()


def bits_per_byte(nll_sum: float, n_bytes: int) -> float:
    """Σ NLL in nats / ln 2 / UTF-8 bytes of the scored text: independent of how it was tokenized."""
    return nll_sum / math.log(2) / n_bytes if n_bytes else float("nan")
