"""The reports' numbers: finished runs read from a results store, and their aggregates over seeds.

load() reads metric values from the `results` view and provenance from the `runs` table; aggregate() makes
one row per run group (KEY) × metric: mean and std over seeds, the 95 % CI half-width (clbench/stats.py),
the evaluation noise runs store, and the verdict against the best row of the task's column. read_board()
adds the optional per-run tables a database may hold (stage matrix, curves, samples, generations, lm-eval
checks) and the tuning choices behind the lrs: everything the leaderboard shows. Only reported runs enter the
tables (tuning runs on the validation split never do; their choices and searches are shown beside them); only
finished runs with metrics are aggregated, the rest are kept out with their reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from clbench.lrsearch import edge
from clbench.metrics import higher_is_better
from clbench.stats import finite, group_p, mean_ci, same, verdict
from clbench.storage import ResultStore
from clbench.store import REPORTED

KEY = ["task", "method", "model", "settings", "n_train"]  # a run group: one row of the tables, over its seeds
# Task params that draw the experiment's data as the seed draws its training: runs that differ in one are pooled
# as one row's runs (an interval over data draws × model seeds), never made different rows (swept_params).
DRAWS = ("data_seed",)
GENERATION_COLUMNS = ["source", "prompt", "generated", "reference", "new_tokens"]


def direction(metric: str) -> bool | None:
    """True: higher is better; False: lower; None: a metric clbench.metrics does not declare."""
    try:
        return higher_is_better(metric)
    except KeyError:
        return None


# ---------------------------------------------------------------- runs and their values


def load(store: ResultStore) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """→ (values: one row per finished run × metric, with provenance; runs kept out with reasons; all runs)."""
    runs = store.query(
        "SELECT run_id, task, task_version, method, model, seed, status, reason, config, versions, git_commit, "
        "finished_at FROM runs "
        f"WHERE {REPORTED}"
    )
    values = store.query("SELECT run_id, metric, value FROM results WHERE status = 'finished' AND metric IS NOT NULL")
    configs = runs.config.map(json.loads)
    runs["n_train"] = configs.map(lambda c: c.get("budget", {}).get("n_train"))
    runs["lr"] = configs.map(lambda c: (c.get("method_config") or {}).get("lr"))
    runs["data_seed"] = configs.map(lambda c: (c.get("params") or {}).get("data_seed"))
    runs["settings"] = [
        ", ".join(filter(None, parts))
        for parts in zip(versions(runs), swept_params(runs.task, configs), configs.map(settings))
    ]
    runs["profile"] = configs.map(lambda c: c.get("profile") or "")  # "": the task's default
    runs["clbench"] = runs.versions.map(lambda v: (json.loads(v) or {}).get("clbench") if v else None)
    with_metrics = set(values.run_id)
    kept_out = runs[(runs.status != "finished") | ~runs.run_id.isin(with_metrics)].copy()
    kept_out["reason"] = [
        r.reason
        if isinstance(r.reason, str) and r.reason
        else f"status {r.status}"
        if r.status != "finished"
        else "partial: finished without metrics"
        for r in kept_out.itertuples()
    ]
    finished = runs[(runs.status == "finished") & runs.run_id.isin(with_metrics)]
    return values.merge(finished, on="run_id"), kept_out, runs


def settings(config: dict) -> str:
    """What besides task, method, model, n_train and a swept task param (swept_params) makes runs different
    experiments."""
    parts = [f"{k}={v}" for k, v in sorted(config.get("method_config", {}).items())]
    parts += [f"{k}={config[k]}" for k in ("init", "profile") if config.get(k) is not None]
    return ", ".join(parts)


def versions(runs: pd.DataFrame) -> list[str]:
    """Per run, "task version N" where its task's runs here are of more than one version (a task's version
    changes what its measures read: its runs are never one row's seeds); "" elsewhere."""
    mixed = runs.groupby("task").task_version.transform("nunique") > 1
    return [f"task version {v}" if m else "" for v, m in zip(runs.task_version, mixed)]


def swept_params(tasks: pd.Series, configs: pd.Series) -> list[str]:
    """Per run, "key=value, ..." of its task params whose values differ between the runs of its task here (a
    sweep's points, e.g. dictionary_size); "" where none do. They join the run's settings, so runs that differ in
    a task param are different rows, never one row's seeds; DRAWS excepted."""
    params = [c.get("params") or {} for c in configs]
    shown = [""] * len(params)
    for rows in pd.Series(range(len(params))).groupby(tasks.to_numpy()).groups.values():
        keys = sorted({key for row in rows for key in params[row]})
        varying = [
            k
            for k in keys
            if k not in DRAWS and len({json.dumps(params[row].get(k), sort_keys=True) for row in rows}) > 1
        ]
        for row in rows:
            shown[row] = ", ".join(f"{k}={params[row].get(k)}" for k in varying)
    return shown


# ---------------------------------------------------------------- aggregates over seeds


def aggregate(values: pd.DataFrame) -> pd.DataFrame:
    """One row per KEY × metric: mean and sample std over runs, runs and data draws (DRAWS) counted, the group's lr; the
    seed statistics (n_seeds: finite values, ci95: CI half-width), eval_se (the mean of the runs'
    `<metric>_se`, where they store one), and p_vs_best / verdict against the best row of the
    task's column (compare_with_best)."""
    grouped = values.groupby(KEY + ["metric"], dropna=False)
    table = grouped.value.agg(mean="mean", std="std").reset_index()
    table["runs"] = grouped.run_id.nunique().values
    table["data_draws"] = grouped.data_seed.nunique().values
    table["higher_is_better"] = table.metric.map(direction)
    table["lr"] = grouped.lr.first().values
    samples = [np.asarray(v, dtype=float) for v in grouped.value.apply(list)]
    draws = grouped.data_seed.apply(list).tolist()  # each value's data draw, for the test paired by draw
    table["n_seeds"] = [len(finite(s)) for s in samples]
    table["ci95"] = np.array([mean_ci(s)[1] for s in samples], dtype=float)  # None (one seed) → NaN, empty in CSV
    table["eval_se"] = evaluation_noise(table, values)
    table["p_vs_best"], table["verdict"] = compare_with_best(table, samples, draws)
    return table


def evaluation_noise(table: pd.DataFrame, values: pd.DataFrame) -> list[float]:
    """Per table row, the mean over its runs of `<metric>_se`; NaN where no run stores one."""
    se = values[values.metric.str.endswith("_se")].assign(metric=lambda f: f.metric.str[: -len("_se")])
    means = se.groupby(KEY + ["metric"], dropna=False).value.mean().rename("eval_se").reset_index()
    return table[KEY + ["metric"]].merge(means, on=KEY + ["metric"], how="left").eval_se.tolist()


def compare_with_best(
    table: pd.DataFrame, samples: list[np.ndarray], draws: list[list]
) -> tuple[list[float], list[str]]:
    """Per row: the p of clbench.stats.group_p against the best row of its task's column (of tied best means, the
    one with most seeds; paired by data draw where both pool draws), NaN where untested, and the verdict; "" where
    the column ranks nothing (best_mask)."""
    p_values, verdicts = [np.nan] * len(table), [""] * len(table)
    for _, part in table.groupby(["task", "metric"], dropna=False):
        best = best_mask(part["mean"], part.metric.iloc[0])
        if not best.any():
            continue
        reference = part[best].n_seeds.idxmax()
        for i in part.index:
            if table.n_seeds[i] == 0:
                continue
            mine, theirs = (samples[i], draws[i]), (samples[reference], draws[reference])
            p = None if best[i] else group_p(mine[0], theirs[0], mine[1], theirs[1])[0]
            p_values[i] = np.nan if p is None else p
            verdicts[i] = verdict(mine[0], theirs[0], is_best=bool(best[i]), draws=mine[1], best_draws=theirs[1])
    return p_values, verdicts


def best_mask(means: pd.Series, metric: str) -> pd.Series:
    """Rows holding the best mean of a column (ties all marked).

    Nothing is marked where the metric declares no direction or every row has the same value up to
    float rounding (a property of the base model, such as old_loss_base, ranks nothing, though runs made in
    different processes store it a few ulps apart). A mean within float rounding of the best is a tie.
    """
    better, values = direction(metric), means.dropna()
    if better is None or all(same(v, values.iloc[0]) for v in values):
        return pd.Series(False, index=means.index)
    best = values.max() if better else values.min()
    return means.map(lambda m: same(m, best))


def rank_fractions(means: pd.Series, metric: str) -> pd.Series:
    """Per row, its rank in the column scaled to 0 (best) … 1 (worst), ties sharing the better rank;
    NaN where the column ranks nothing (best_mask) or the row has no value.

    Ties are best_mask's: means within float rounding (stats.same) share a rank, so a row the table
    bolds as best is always coloured as best."""
    if not best_mask(means, metric).any():
        return pd.Series(np.nan, index=means.index)
    sign = 1.0 if direction(metric) else -1.0
    values = means.dropna()

    def rank(m: float) -> float:
        return 1.0 + sum(sign * (v - m) > 0 and not same(v, m) for v in values)

    ranks = means.map(lambda m: np.nan if pd.isna(m) else rank(m))
    worst = ranks.max()
    return (ranks - 1) / (worst - 1) if worst > 1 else ranks * 0.0


# ---------------------------------------------------------------- the optional per-run tables


def has_table(store: ResultStore, name: str) -> bool:
    return bool(store.query("SELECT count(*) AS n FROM information_schema.tables WHERE table_name = ?", [name]).n[0])


def stage_matrix(store: ResultStore) -> pd.DataFrame | None:
    """The sequential runs' stage × task matrix, if this database has the table."""
    if not has_table(store, "stage_matrix"):
        return None
    return store.query("SELECT run_id, after_stage, eval_stage, metric, value FROM stage_matrix")


def per_run_table(store: ResultStore, name: str) -> pd.DataFrame | None:
    """A table of per-run rows (curves, samples), if this database has it."""
    return store.query(f"SELECT * FROM {name}") if has_table(store, name) else None


def generations(store: ResultStore) -> pd.DataFrame | None:
    """The stored greedy continuations: run_id and GENERATION_COLUMNS, in each run's order; None without the table."""
    if not has_table(store, "generations"):
        return None
    return store.query(f"SELECT run_id, {', '.join(GENERATION_COLUMNS)} FROM generations ORDER BY run_id, number")


def searches(store: ResultStore) -> pd.DataFrame | None:
    """The stored tuning choices (`clbench tune`), one row per tune key: task, method, model, profile, objective,
    lr (the choice), score, search (its points, by lr) and where the choice sits in it (lrsearch.edge); None
    without the table."""
    if not has_table(store, "tuned"):
        return None
    rows = store.query(
        "SELECT task, method, model, coalesce(profile, '') AS profile, objective, lr, score, search FROM tuned "
        "ORDER BY task, method, model, profile, tune_key"
    )
    rows["search"] = [sorted(json.loads(s), key=lambda point: point["lr"]) for s in rows.search]
    rows["where"] = [edge(s, lr) for s, lr in zip(rows.search, rows.lr)]
    return rows


def lm_eval_checks(store: ResultStore, values: pd.DataFrame, task: str) -> pd.DataFrame | None:
    """A task's lm-eval checks of finished runs, per run group and lm-eval metric: the means of base, adapted and
    delta, the 95 % CI half-widths of the last two over runs, runs counted. None without any."""
    if not has_table(store, "lm_eval"):
        return None
    checks = store.query(
        "SELECT run_id, task AS lm_eval_task, metric AS lm_eval_metric, base, adapted, delta FROM lm_eval"
    )
    runs = values.drop_duplicates("run_id")[["run_id", *KEY]]
    part = checks.merge(runs[runs.task == task], on="run_id")
    if part.empty:
        return None
    grouped = part.groupby([*KEY[1:], "lm_eval_task", "lm_eval_metric"], dropna=False)
    half = lambda v: mean_ci(v)[1]
    return grouped.agg(
        base=("base", "mean"),
        adapted=("adapted", "mean"),
        adapted_ci=("adapted", half),
        delta=("delta", "mean"),
        delta_ci=("delta", half),
        runs=("run_id", "nunique"),
    ).reset_index()


# ---------------------------------------------------------------- everything the leaderboard shows


@dataclass(frozen=True)
class Board:
    """One store's material for the leaderboard: load()'s three frames, their aggregate, and the optional tables."""

    values: pd.DataFrame  # one row per finished run × metric, with provenance
    kept_out: pd.DataFrame  # runs not in the tables, with their reason
    runs: pd.DataFrame  # every reported run
    table: pd.DataFrame  # aggregate(values)
    provenance: pd.DataFrame  # one row per finished run, in KEY and seed order
    matrix: pd.DataFrame | None  # stage_matrix
    curves: pd.DataFrame | None
    samples: pd.DataFrame | None
    generations: pd.DataFrame | None
    checks: dict[str, pd.DataFrame | None]  # task → lm_eval_checks
    searches: pd.DataFrame | None  # the tuning choices behind the lrs (searches)

    @property
    def tasks(self) -> list[str]:
        return sorted(self.table.task.unique())

    def task_runs(self, task: str) -> pd.DataFrame:
        return self.provenance[self.provenance.task == task]


def read_board(store: ResultStore, values: pd.DataFrame, kept_out: pd.DataFrame, runs: pd.DataFrame) -> Board:
    """The Board of a store, from its load()."""
    table = aggregate(values)
    return Board(
        values=values,
        kept_out=kept_out,
        runs=runs,
        table=table,
        provenance=values.drop_duplicates("run_id").sort_values(KEY + ["seed"]),
        matrix=stage_matrix(store),
        curves=per_run_table(store, "curves"),
        samples=per_run_table(store, "samples"),
        generations=generations(store),
        checks={task: lm_eval_checks(store, values, task) for task in sorted(table.task.unique())},
        searches=searches(store),
    )
