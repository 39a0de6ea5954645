"""Learning rates chosen on validation data, never on what is reported.

    clbench tune --task pseudowords --method all --seeds 0
    clbench run --task pseudowords --method all --seeds 0,1,2 --tuned

Every (method, lr) point of the method's grid is an ordinary run of the protocol (the task's
budget, init and data) on the task's validation split: its target and old-text sets replaced by
validation examples and validation old text, disjoint from train, target, old and replay text.
Those runs are stored like any other, with config.split = "validation" (so tuning resumes like
`run`, and every point is inspectable), and never appear among results. For each method the
choice is the lr with the lowest mean of the task's `tune_metric` over the seeds; ties go to the
smaller lr; a point that diverged, or scored non-finite, is never chosen. The choice and its whole
search are stored in the `tuned` table, keyed by everything the run depends on but lr and seed,
so `clbench run --tuned` applies it exactly where it was made. A later `tune` of the same key
extends the stored search: its points on the same seeds are kept beside the new grid's, so
`--grid 1e-2` past an edge chooses among every point searched, not that one alone; a choice on an edge
of its search is said so, with the next point to try. The search's rules are clbench/lrsearch.py.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from clbench.errors import ClbenchError
from clbench.lrsearch import choose, edge, edge_hint, extended, mean
from clbench.method import MethodSpec
from clbench.metrics import higher_is_better
from clbench.protocol import execute, plan
from clbench.spec import RunSpec, tune_key
from clbench.store import Store
from clbench.taskspec import Task


@dataclass(frozen=True)
class Choice:
    method: str
    lr: float
    score: float
    objective: str
    search: list[dict]  # per grid point: lr, seeds, values, mean, run_ids


def tune(
    task: Task,
    methods: list[MethodSpec],
    *,
    seeds: list[int],
    store: Store,
    session,
    grid: list[float] | None = None,
    options: dict | None = None,
    log=lambda message: print(message, file=sys.stderr),
    **how,
) -> list[Choice]:
    """how: RunSpec.make's model, profile, init, n_train, param_overrides, budget_overrides (the same for every
    point). → one Choice per method, also stored."""
    objective = task.spec.tune_metric
    if higher_is_better(objective):
        raise ClbenchError(f"task {task.name!r}: tune_metric {objective!r} must be a lower-is-better metric")
    options = dict(options or {})
    if "lr" in options:
        raise ClbenchError("tune chooses the lr: give other method options only")
    grids = {m.name: list(grid or m.lr_grid) for m in methods}
    for method in methods:
        if not grids[method.name]:
            raise ClbenchError(f"method {method.name!r} declares no lr grid: give one with --grid")
    # every point is planned, so every input checked, before the first run trains or writes
    plans = {
        (method.name, lr, seed): plan(
            RunSpec.make(task.name, method.name, seed=seed, split="validation", options={**options, "lr": lr}, **how),
            task,
            method,
            session=session,
        )
        for method in methods
        for lr in grids[method.name]
        for seed in seeds
    }
    choices = []
    for method in methods:
        search = []
        for lr in grids[method.name]:
            outcomes = [execute(plans[method.name, lr, seed], store=store, session=session) for seed in seeds]
            values = [_value(store, o.run_id, objective) for o in outcomes]
            search.append(
                {
                    "lr": lr,
                    "seeds": seeds,
                    "values": values,
                    "mean": mean(values),
                    "run_ids": [o.run_id for o in outcomes],
                }
            )
            log(f"  tune {task.name} × {method.name}: lr {lr:g}  validation {objective} {mean(values):.4f}")
        first = plans[
            method.name, grids[method.name][0], seeds[0]
        ]  # the key and model of the choice (lr is not in the key)
        key = tune_key(first.config, options)
        search = extended(store.tuned_search(key), search, log=log)
        best = choose(search)
        if hint := edge_hint(search, best["lr"]):
            log(f"  tune {task.name} × {method.name}: {hint}")
        store.record_tuned(
            {
                "tune_key": key,
                "task": task.name,
                "method": method.name,
                "model": first.base.ref,
                "profile": how.get("profile"),
                "objective": objective,
                "lr": best["lr"],
                "score": best["mean"],
                "search": search,
            }
        )
        choices.append(Choice(method.name, best["lr"], best["mean"], objective, search))
    return choices


def _value(store: Store, run_id: str, metric: str) -> float:
    """A finished run's metric; +inf for a failed (diverged) run or one without it."""
    found = store.query(
        "SELECT m.value FROM runs r JOIN metrics m USING (run_id) "
        "WHERE r.run_id = ? AND r.status = 'finished' AND m.metric = ?",
        [run_id, metric],
    )
    return float(found.value.iloc[0]) if len(found) else math.inf


def table(choices: list[Choice]) -> str:
    """The searches side by side: one row per method, one column per lr, the choice marked *, and where the
    choice sits in its search (lrsearch.edge)."""
    lrs = sorted({point["lr"] for c in choices for point in c.search})
    header = ["method", *[f"{lr:g}" for lr in lrs], "chosen", "where"]
    rows = []
    for c in choices:
        by_lr = {point["lr"]: point["mean"] for point in c.search}
        cells = [
            ""
            if lr not in by_lr
            else f"{by_lr[lr]:.4f}{'*' if lr == c.lr else ''}"
            if math.isfinite(by_lr[lr])
            else "inf"
            for lr in lrs
        ]
        rows.append([c.method, *cells, f"{c.lr:g}", edge(c.search, c.lr)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    objective = choices[0].objective if choices else ""
    lines = [f"validation {objective} (mean over seeds) per lr; * = chosen"]
    lines += ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in [header, *rows]]
    return "\n".join(lines)
