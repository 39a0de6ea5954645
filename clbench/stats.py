"""Seed statistics for the result tables: mean with a 95 % confidence interval, Welch's t-test, and
the verdict of a row against the best of its column.

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


def verdict(values: Sequence[float], best: Sequence[float], *, is_best: bool = False) -> str:
    """A row against the best row of its column: "best"; "1 seed" where either side has fewer than
    2 seeds (untested, not tied); "n.s." where Welch's p ≥ 0.05; "worse" where p < 0.05."""
    if is_best:
        return "best"
    p = welch_p(values, best)
    if p is None:
        return "1 seed"
    return "n.s." if p >= 1 - LEVEL else "worse"
