"""The paper's two claims about model size, on the family of arithmetic bases (clbench/arith_llama.py FAMILY):
the same recipe, data and tokenizer at three widths.

- "the sample complexity does not depend on the model's dimension": N*, the smallest n_train from which
  gap_closed stays ≥ TARGET_GAP (clbench/sweep.py crossing), of et, per seed (each seed's own curve over
  n_train), per width, beside the lr(s) et ran at on it;
- "larger models forget more under fine-tuning": fft's addition lost (old_skill_acc_delta) per width, and its
  transition drift on old text (drift_kl_oldvocab: KL(base ‖ fine-tuned) under the old softmax, clbench/metrics.py).

Each claim's verdict compares the widest base with the narrowest over seeds (Welch's t, clbench/stats.py): the
forgetting claim on the paper's sign; the independence claim, which predicts no difference, says whether one
was found. The runs come from `clbench sweep` and `clbench run` on each base (docs/evidence.md has the commands).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from clbench.report.format import fmt_ci, fmt_lr
from clbench.stats import LEVEL, finite, mean_ci, welch_p

TASK = "arithmetic"
GAP = "gap_closed"
ADDITION_LOST = "old_skill_acc_delta"
# fft's forgetting measures: (name in the report, metric, the paper's sign of wider − narrower)
FORGETTING = (("addition lost", ADDITION_LOST, -1), ("drift", "drift_kl_oldvocab", 1))
INDEPENDENT, DEPENDS = "no significant difference", "differs"


def family() -> tuple[str, ...]:
    """The bases of the size axis, narrowest first, as runs name them."""
    from clbench.arith_llama import FAMILY  # torch and transformers: loaded only where a report asks for sizes

    return tuple(f"builtin:{name}" for name in sorted(FAMILY, key=lambda name: FAMILY[name].hidden))


def et_gaps(values: pd.DataFrame, model: str) -> pd.DataFrame:
    """et's gap_closed values on `model`: the N* curves' points."""
    return values[(values.task == TASK) & (values.method == "et") & (values.model == model) & (values.metric == GAP)]


def n_stars(values: pd.DataFrame, model: str) -> list[float]:
    """et's N* on `model`, one per seed whose curve has at least two n_train: inf where its largest n_train is below
    (N* above the sweep, or never), NaN
    where it is already reached at the curve's smallest n_train above 1 (censored: N* is at most that, not
    measured). Reached at n_train 1 it is measured: no fewer examples can teach anything (gap_closed 0)."""
    from clbench.sweep import TARGET_GAP, n_star  # the sweep's own definition of N*

    stars = []
    for _, seed in et_gaps(values, model).groupby("seed"):
        points = dict(zip(seed.n_train.astype(int), seed.value))
        if len(points) >= 2:
            found = n_star(points, TARGET_GAP)
            censored = found is not None and found == min(points) > 1
            stars.append(float("inf") if found is None else float("nan") if censored else float(found))
    return stars


def fft_values(values: pd.DataFrame, model: str, metric: str) -> np.ndarray:
    """fft's `metric` on `model` per seed: its run group at the largest n_train, the one of most seeds."""
    part = values[(values.task == TASK) & (values.method == "fft") & (values.model == model)]
    part = part[part.n_train == part.n_train.max()]
    if part.empty:
        return np.array([])
    groups = part.groupby("settings")
    chosen = max(groups.groups, key=lambda name: (groups.get_group(name).seed.nunique(), str(name)))
    group = groups.get_group(chosen)
    return finite(group[group.metric == metric].value)


def size_rows(values: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for model in family():
        stars = n_stars(values, model)
        reached = [s for s in stars if np.isfinite(s)]
        outside = (
            (sum(np.isinf(stars)), "not reached"),
            (sum(np.isnan(stars)), "reached at the smallest n_train, above 1"),
        )
        notes = "".join(f" ({count} {what})" for count, what in outside if count)
        row = {
            "model": model,
            "et lr": ", ".join(fmt_lr(lr) for lr in sorted(et_gaps(values, model).lr.dropna().unique())) or "—",
            "et N*: seeds": len(stars),
            "et N*": (fmt_ci(*mean_ci(reached)) if reached else "—") + notes if stars else "not run",
        }
        for name, metric, _ in FORGETTING:
            lost = fft_values(values, model, metric)
            row |= {f"fft {name}: seeds": len(lost), f"fft {name}": fmt_ci(*mean_ci(lost)) if len(lost) else "not run"}
        rows.append(row)
    return pd.DataFrame(rows)


def verdicts(values: pd.DataFrame, direction_verdict) -> list[str]:
    """One line per claim: the widest base against the narrowest; direction_verdict: the paper tables' own
    (clbench/report/paper.py), for the claim that has a direction."""
    narrow, wide = family()[0], family()[-1]
    lines = []
    x, y = n_stars(values, wide), n_stars(values, narrow)
    if not x or not y:
        lines.append("sample complexity independent of width: not run")
    elif not all(np.isfinite(x + y)):
        lines.append(
            "sample complexity independent of width: untested (on some seed N* lies outside the sweep's n_train)"
        )
    else:
        p = welch_p(x, y)
        found = "one seed, untested" if p is None else f"{INDEPENDENT if p >= 1 - LEVEL else DEPENDS} (p = {p:.2g})"
        lines.append(f"sample complexity independent of width: et's N* {wide} vs {narrow}: {found}")
    for name, metric, sign in FORGETTING:
        x, y = fft_values(values, wide, metric), fft_values(values, narrow, metric)
        if len(x) == 0 or len(y) == 0:
            lines.append(f"larger models forget more under fine-tuning, fft's {name}: not run")
            continue
        p, verdict = welch_p(x, y), direction_verdict(x, y, sign)
        lines.append(
            f"larger models forget more under fine-tuning: fft's {name}, {wide} vs {narrow}: {verdict}"
            + ("" if p is None else f" (p = {p:.2g})")
        )
    return lines
