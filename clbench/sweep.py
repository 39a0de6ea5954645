"""Sample-efficiency curves: `clbench sweep --task T --method et,fft --n 10,50,200 --seeds 0,1,2`.

A sweep is run_one over methods × task-param grid × N × seeds with the task's budget otherwise
unchanged (same steps, so a small N is seen for more epochs). `--param KEY=V1,V2` makes the grid
(the cartesian product over every swept key), e.g. the paper's sample-complexity law:

    clbench sweep --task pseudowords --method et --param dictionary_size=1,2,4,8 --n 8,16,32,64,128 --seeds 0,1,2

Each point is an ordinary run in the store (its params are param_overrides), so a sweep resumes
like `run`: finished points are skipped. The curve reads N and the swept params back from each
run's recorded config. n_star and fit_law turn a dictionary_size sweep into the N*(s) table and
the fit N* ≈ c·s·ln T.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from clbench.metrics import headline
from clbench.protocol import Outcome, execute, plan
from clbench.spec import RunSpec
from clbench.storage import ResultStore

SPREAD = ["target_loss", "target_acc"]  # also reported as the standard deviation over seeds
TARGET_GAP = 0.5  # the default fraction of gap_closed that defines N*
LAW_PARAM = "dictionary_size"  # s in the paper's N* = O(s log T)


def grid(params: Mapping[str, list[str]]) -> list[dict[str, str]]:
    """Every combination of the swept params' values, the first key varying slowest; [{}] if none."""
    return [dict(zip(params, values)) for values in itertools.product(*params.values())]


def grid_specs(task, methods: list, ns: list[int], seeds: list[int], params=None, **how) -> list[RunSpec]:
    """The sweep's points as run specifications: methods × task-param grid × N × seeds; how: RunSpec.make's
    model, profile, init, budget_overrides, the same for every point."""
    return [
        RunSpec.make(task.name, method.name, seed=seed, n_train=n, param_overrides=point, **how)
        for method in methods
        for point in grid(params or {})
        for n in ns
        for seed in seeds
    ]


def sweep(
    task, methods: list, ns: list[int], seeds: list[int], *, store: ResultStore, session, params=None, **how
) -> list[Outcome]:
    """Every point planned (so checked) before the first trains, then each executed in this process."""
    by_name = {method.name: method for method in methods}
    specs = grid_specs(task, methods, ns, seeds, params, **how)
    plans = [plan(spec, task, by_name[spec.method], session=session, tuned_choice=store.tuned) for spec in specs]
    return [execute(planned, store=store, session=session) for planned in plans]


def curve(store: ResultStore, run_ids: list[str], by: list[str] | tuple = ()) -> pd.DataFrame:
    """Means over seeds (standard deviations for SPREAD), one row per (method, *by, n_train); by:
    task params read from each run's config (the swept ones)."""
    frame = store.query(
        "SELECT r.run_id, r.method, r.config, r.seed, m.metric, m.value "
        "FROM runs r JOIN metrics m USING (run_id) WHERE r.status = 'finished'"
    )
    shown = headline("curve")
    frame = frame[frame.run_id.isin(run_ids) & frame.metric.isin(shown)]
    if frame.empty:
        return pd.DataFrame()
    configs = frame.config.map(json.loads)
    frame = frame.assign(n_train=configs.map(lambda c: int(c["budget"]["n_train"])))
    frame = frame.assign(**{key: configs.map(lambda c, key=key: c["params"][key]) for key in by})
    index = ["method", *by, "n_train"]
    table = frame.pivot_table(index=index, columns="metric", values="value", aggfunc="mean")
    spread = frame[frame.metric.isin(SPREAD)].pivot_table(index=index, columns="metric", values="value", aggfunc="std")
    seeds = frame.groupby(index).seed.nunique().rename("seeds")
    columns = [table.get(m, None) for m in shown]
    columns += [spread[m].rename(f"{m}_sd") for m in SPREAD if m in spread]
    return pd.concat([seeds, *[c for c in columns if c is not None]], axis=1)


def crossing(points: Mapping[int, float], fraction: float = TARGET_GAP) -> tuple[int | None, int | None]:
    """(the last N below `fraction`, N*): N* is the smallest N from which the curve stays at or above
    `fraction` (≥) at every larger N of the grid, points: N → mean gap_closed.

    The last crossing, not the first: a curve that reaches the fraction and falls back below at a larger
    N has not learnt it there (on arith-llama-w256, et's 0.91 at N = 3 falls to 0.49 at N = 5 on every
    seed). NaN points (not computed) are left out, as if not swept. N* None: the largest N is below
    (censored: N* is above the largest N swept, or the method never stays there); the last N below
    None: every N reaches."""
    measured = sorted((n, value) for n, value in points.items() if not math.isnan(value))
    below = [i for i, (_, value) in enumerate(measured) if value < fraction]
    last = below[-1] if below else -1
    star = measured[last + 1][0] if last + 1 < len(measured) else None
    return (measured[last][0] if below else None), star


def n_star(points: Mapping[int, float], fraction: float = TARGET_GAP) -> int | None:
    """N* (crossing): the smallest N from which the mean gap_closed stays ≥ `fraction`; None where the
    largest N swept is below it (a lower bound only) or no point was computed."""
    return crossing(points, fraction)[1]


def n_star_between(points: Mapping[int, float], fraction: float = TARGET_GAP) -> float | None:
    """N* read between the grid's points: at the last crossing (crossing), the N where the straight line
    from the last point below to N* crosses `fraction`, in log N (the grid is geometric; gap_closed rises
    about linearly in log N). N* itself where no point is below (N* is at most the smallest N); None
    where not reached; NaN points are left out."""
    below, n = crossing(points, fraction)
    if n is None or below is None:
        return None if n is None else float(n)
    v0 = points[below]
    share = (fraction - v0) / (points[n] - v0)
    return math.exp(math.log(below) + share * (math.log(n) - math.log(below)))


def growth_exponent(n_stars: Mapping[int, float | None]) -> float:
    """b of N* ∝ s^b: the least-squares slope of ln N* on ln s over the s whose N* was reached; NaN
    with fewer than two. b = 1 is the law's linear growth in s, b = 0 no growth."""
    points = [(math.log(s), math.log(n)) for s, n in n_stars.items() if n is not None]
    if len(points) < 2:
        return math.nan
    mx, my = (sum(c) / len(points) for c in zip(*points))
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else math.nan


def n_star_table(table: pd.DataFrame, by: list[str] | tuple, fraction: float = TARGET_GAP) -> pd.DataFrame:
    """N* (n_star) and N* between the grid's points (n_star_between) per (method, *by) from curve()'s
    table (its gap_closed column); None where not reached."""
    keys, stars, between = [], [], []
    for key, group in table["gap_closed"].reset_index().groupby(["method", *by], sort=True):
        keys.append(key)
        points = dict(zip(group.n_train, group.gap_closed))
        stars.append(n_star(points, fraction))
        between.append(n_star_between(points, fraction))
    frame = pd.DataFrame(keys, columns=["method", *by])
    frame["n_star"] = pd.Series(stars, dtype=object)  # object: None stays None, not NaN
    frame["n_star_between"] = pd.Series(between, dtype=object)
    return frame


@dataclass(frozen=True)
class LawFit:
    """N* ≈ c·s·ln T, fitted by least squares through the origin over the s whose N* was reached."""

    c: float
    vocab: int  # T
    residuals: dict[int, float]  # s → N* − c·s·ln T
    unreached: list[int]  # s whose N* was not reached within the sweep: left out of the fit

    def predicted(self, s: float) -> float:
        return self.c * s * math.log(self.vocab)


def through_origin(x: list[float], y: list[float]) -> float:
    """The least-squares slope of y ≈ c·x with no intercept: Σ x·y / Σ x²; NaN with no point."""
    xx = sum(v * v for v in x)
    return sum(a * b for a, b in zip(x, y)) / xx if xx else math.nan


def fit_law(n_stars: Mapping[int, int | None], vocab: int) -> LawFit:
    """Fit N*(s) ≈ c·s·ln T. T is the base's vocabulary size |V|: clbench's reading of the paper's
    T (the number of old tokens a new one may combine), an assumption; the log is natural, so c is
    per nat. s with no N* (None) are left out and listed."""
    reached = {s: n for s, n in sorted(n_stars.items()) if n is not None}
    log_t = math.log(vocab)
    c = through_origin([s * log_t for s in reached], [float(n) for n in reached.values()])
    residuals = {s: n - c * s * log_t for s, n in reached.items()}
    return LawFit(c, vocab, residuals, sorted(s for s, n in n_stars.items() if n is None))


def law_report(stars: pd.DataFrame, vocab: int, fraction: float = TARGET_GAP) -> str:
    """The N*(s) table of a dictionary_size sweep and, per method, the fit N* ≈ c·s·ln T."""
    lines = [
        f"N*(s): smallest n_train from which the mean gap_closed stays ≥ {fraction} "
        f"(T = |V| = {vocab}, the base's vocabulary)"
    ]
    for method, part in stars.groupby("method", sort=True):
        fit = fit_law(dict(zip(part[LAW_PARAM], part.n_star)), vocab)
        lines.append(f"{method}:")
        for s, n in zip(part[LAW_PARAM], part.n_star):
            fitted = f"fit {fit.predicted(s):.1f}, residual {fit.residuals[s]:+.1f}" if n is not None else ""
            lines.append(
                f"  s = {s:<3} N* = {'not reached within the sweep' if n is None else n:<6} {fitted}".rstrip()
            )
        if fit.residuals:
            rms = math.sqrt(sum(r * r for r in fit.residuals.values()) / len(fit.residuals))
            lines.append(f"  N* ≈ {fit.c:.4g}·s·ln T  (least squares through the origin; rms residual {rms:.1f})")
        else:
            lines.append("  no fit: N* reached for no s")
        if "n_star_between" in part:
            between = dict(zip(part[LAW_PARAM], part.n_star_between))
            shown = ", ".join(f"s = {s}: {'—' if n is None else f'{n:.3g}'}" for s, n in between.items())
            b = growth_exponent(between)
            lines.append(f"  N* between the grid's points (log-linear): {shown}")
            lines.append(f"  N* ∝ s^b with b = {b:.2f} from those (b = 1: the law's linear growth in s; 0: none)")
    return "\n".join(lines)
