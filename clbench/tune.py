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
`--grid 1e-2` past an edge chooses among every point searched, not that one alone (each stored point read
again from its runs on the task's tune_metric of now); `--past-edges N` takes
up to N such steps itself, and a choice left on an edge of its search is said so, with the next point to try. The search's rules are clbench/lrsearch.py.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from clbench.errors import ClbenchError
from clbench.lrsearch import choose, edge, edge_hint, extended, mean, next_point
from clbench.method import MethodSpec
from clbench.metrics import higher_is_better
from clbench.protocol import execute, plan
from clbench.spec import RunSpec, tune_key
from clbench.storage import ResultStore
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
    store: ResultStore,
    session,
    grid: list[float] | None = None,
    options: dict | None = None,
    past_edges: int = 0,
    log=lambda message: print(message, file=sys.stderr),
    **how,
) -> list[Choice]:
    """how: RunSpec.make's model, profile, init, n_train, param_overrides, budget_overrides (the same for every
    point). past_edges: while a choice sits on an edge of its search, up to this many more points, each one grid
    step past it (lrsearch.next_point). → one Choice per method, also stored."""
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

    searcher = Searcher(task, seeds, store, session, options, how, objective, log)
    for method in methods:  # every point of the grids planned, so every input checked, before a run trains or writes
        for lr in grids[method.name]:
            searcher.plan(method, lr)
    return [searcher.choose(method, grids[method.name], past_edges) for method in methods]


@dataclass
class Searcher:
    """One `tune` command's searches: every point planned, run, scored and logged the same way."""

    task: Task
    seeds: list[int]
    store: ResultStore
    session: object
    options: dict
    how: dict
    objective: str
    log: Callable[[str], None]
    plans: dict = field(default_factory=dict)  # (method, lr, seed) → its plan

    def plan(self, method: MethodSpec, lr: float) -> list:
        """The point's runs, one per seed, planned once."""
        for seed in self.seeds:
            if (method.name, lr, seed) not in self.plans:
                options = {**self.options, "lr": lr}
                spec = RunSpec.make(
                    self.task.name, method.name, seed=seed, split="validation", options=options, **self.how
                )
                self.plans[method.name, lr, seed] = plan(spec, self.task, method, session=self.session)
        return [self.plans[method.name, lr, seed] for seed in self.seeds]

    def point(self, method: MethodSpec, lr: float) -> dict:
        outcomes = [execute(run, store=self.store, session=self.session) for run in self.plan(method, lr)]
        values = [_value(self.store, o.run_id, self.objective) for o in outcomes]
        self.log(f"  tune {self.task.name} × {method.name}: lr {lr:g}  validation {self.objective} {mean(values):.4f}")
        run_ids = [o.run_id for o in outcomes]
        return {"lr": lr, "seeds": self.seeds, "values": values, "mean": mean(values), "run_ids": run_ids}

    def rescored(self, point: dict) -> dict:
        """A stored point read again from its runs on this search's objective: a task's tune_metric may have
        changed since the point was searched, and a mean of another metric must not join the choice."""
        if "run_ids" not in point:
            return point
        values = [_value(self.store, run_id, self.objective) for run_id in point["run_ids"]]
        return {**point, "values": values, "mean": mean(values)}

    def choose(self, method: MethodSpec, grid: list[float], past_edges: int) -> Choice:
        """The grid searched (joined by the stored search of its key), then up to past_edges points past an
        edge; the choice stored."""
        search = [self.point(method, lr) for lr in grid]
        first = self.plans[method.name, grid[0], self.seeds[0]]  # the key and model (lr is not in the key)
        key = tune_key(first.config, self.options)
        stored = [self.rescored(point) for point in (self.store.tuned(key) or {"search": []})["search"]]
        search = extended(stored, search, log=self.log)
        best = choose(search)
        said = f"  tune {self.task.name} × {method.name}:"
        for _ in range(past_edges):
            lr = next_point(search, best["lr"])
            if lr is None:
                break
            self.log(f"{said} the choice {best['lr']:g} is on the {edge(search, best['lr'])}: one more point, {lr:g}")
            search = sorted([*search, self.point(method, lr)], key=lambda p: p["lr"])
            best = choose(search)
        if hint := edge_hint(search, best["lr"]):
            self.log(f"{said} {hint}")
        self.store.record_tuned(
            {
                "tune_key": key,
                "task": self.task.name,
                "method": method.name,
                "model": first.base.ref,
                "profile": self.how.get("profile"),
                "objective": self.objective,
                "lr": best["lr"],
                "score": best["mean"],
                "search": search,
            }
        )
        return Choice(method.name, best["lr"], best["mean"], self.objective, search)


def _value(store: ResultStore, run_id: str, metric: str) -> float:
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
