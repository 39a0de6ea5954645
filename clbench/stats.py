"""Seed statistics for the result tables: mean with a 95 % confidence interval, the test between two run groups
(Welch's t over runs, or a t-test paired by data draw where both groups pool draws), and the verdict of a row against
the best of its column.

A run group's seeds are a small sample of the method's outcomes (3 seeds is common), so the
interval uses Student's t with n − 1 degrees of freedom, not the normal 1.96. One seed has no
interval: None, never ±0. NaN values (a metric a run could not compute) are left out first.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats

LEVEL = 0.95  # the confidence level of every interval and the test's threshold (p < 1 − LEVEL)
VERDICTS = ("best", "n.s.", "1 seed", "worse")
# relative difference below which two means are one number computed twice: a base's score evaluated in two
# processes differs in float rounding (1.7e-8 relative seen on target_bpb_base); far below any printed digit
ROUNDING = 1e-6


def same(a: float, b: float) -> bool:
    """Equal up to float rounding (ROUNDING, relative); NaN is never the same as anything."""
    return math.isclose(a, b, rel_tol=ROUNDING, abs_tol=0.0)


def finite(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    return array[~np.isnan(array)]


def mean_ci(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, half-width of its 95 % CI over seeds): t.ppf(0.975, n − 1) · s / √n, s the sample std.

    Half-width None with fewer than 2 values; mean NaN with none."""
    x = finite(values)
    if len(x) == 0:
        return math.nan, None
    if len(x) < 2:
        return float(x[0]), None
    half = stats.t.ppf(1 - (1 - LEVEL) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(half)


def welch_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's t-test (unequal variances) between two groups' seed values.

    None with fewer than 2 values on either side (no variance to test against). Where neither group
    varies, scipy gives p = 0 for different means and NaN for equal ones: here 1.0 where the means are the
    same up to float rounding (same), no difference."""
    x, y = finite(a), finite(b)
    if len(x) < 2 or len(y) < 2:
        return None
    if x.min() == x.max() and y.min() == y.max() and same(x[0], y[0]):
        return 1.0
    with warnings.catch_warnings():  # nearly constant groups: scipy warns of precision loss; the p-value stands
        warnings.simplefilter("ignore", RuntimeWarning)
        p = stats.ttest_ind(x, y, equal_var=False).pvalue
    return float(p)


def paired_p(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test of matched values a[i], b[i] (a pair with a NaN is left out).

    None with fewer than 2 pairs. Where every difference is the same, scipy gives NaN (all 0) or 0: here 1.0 where
    every difference is 0 up to float rounding (same), else 0.0."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    keep = ~(np.isnan(x) | np.isnan(y))
    x, y = x[keep], y[keep]
    if len(x) < 2:
        return None
    d = x - y
    if d.min() == d.max():
        return 1.0 if all(same(u, v) for u, v in zip(x, y)) else 0.0
    return float(stats.ttest_rel(x, y).pvalue)


def draw_means(values: Sequence[float], draws: Sequence, which: Sequence) -> dict:
    """Each of the data draws `which`: its mean over its runs' finite values; draws with none left out."""
    x, d = np.asarray(values, dtype=float), np.asarray(draws, dtype=object)
    keep = ~np.isnan(x)
    x, d = x[keep], d[keep]
    return {draw: float(x[d == draw].mean()) for draw in which if (d == draw).any()}


def paired_draws(draws: Sequence | None, other: Sequence | None) -> list:
    """The data draws two run groups are compared by: those both ran, where each group pools 2 or more draws and
    they share 2 or more; [] otherwise (the groups are compared over runs)."""
    if draws is None or other is None:
        return []
    mine, theirs = set(draws) - {None}, set(other) - {None}
    mine, theirs = {d for d in mine if d == d}, {d for d in theirs if d == d}  # NaN: a run with no data draw
    common = sorted(mine & theirs)
    return common if len(mine) > 1 and len(theirs) > 1 and len(common) > 1 else []


def group_p(
    a: Sequence[float], b: Sequence[float], a_draws: Sequence | None = None, b_draws: Sequence | None = None
) -> tuple[float | None, int]:
    """(p, n) of two run groups: where both pool data draws (paired_draws), the paired t-test of their draw means on
    the n draws they share — the seeds of one draw share its data, so the draw, not the run, is the unit the data
    varies by, and a difference common to a draw's runs cancels; else Welch's over runs, n = 0. a_draws, b_draws:
    each value's data draw (None where a group does not pool draws)."""
    common = paired_draws(a_draws, b_draws)
    if not common:
        return welch_p(a, b), 0
    mine, theirs = draw_means(a, a_draws, common), draw_means(b, b_draws, common)
    common = [d for d in common if d in mine and d in theirs]
    if len(common) < 2:
        return welch_p(a, b), 0
    return paired_p([mine[d] for d in common], [theirs[d] for d in common]), len(common)


def comparison(n: int) -> str:
    """The test group_p ran, as a verdict names it: "" for Welch's over runs (every table's default)."""
    return f"paired by {n} data draws" if n else ""


def verdict(
    values: Sequence[float],
    best: Sequence[float],
    *,
    is_best: bool = False,
    draws: Sequence | None = None,
    best_draws: Sequence | None = None,
) -> str:
    """A row against the best row of its column: "best"; "1 seed" where either side has fewer than
    2 seeds (untested, not tied); "n.s." where group_p's p ≥ 0.05; "worse" where p < 0.05."""
    if is_best:
        return "best"
    p, _ = group_p(values, best, draws, best_draws)
    if p is None:
        return "1 seed"
    return "n.s." if p >= 1 - LEVEL else "worse"
