"""`clbench results` and the end of `clbench run`: the run groups' metrics as text a terminal holds.

By default one table per task, under a heading with its name and what every row shares (model, n_train, lr,
seeds): the `summary` headline metrics its runs have (clbench/metrics.py), in rank order, the lowest-ranked left
out until every line fits WIDTH characters, and a line naming what was left out. wide: every headline metric in
one table, however wide; metrics: exactly these, in one table. A cell is the leaderboard's (mean ± 95 % CI,
marks: format.CELLS_NOTE); settings besides lr are shown only where two rows would otherwise look the same.
"""

from __future__ import annotations

import textwrap

import pandas as pd

from clbench.distributed import WIDTH
from clbench.metrics import headline, lookup
from clbench.report.format import CELLS_NOTE, arrow, cell_text, fmt_lr
from clbench.report.load import KEY, aggregate, load

FLAGS = "--wide shows every column, --metrics a,b the ones named"
SHARED = ["model", "n_train", "lr", "seeds"]  # in a task's heading, not its table, where every row has the same


def summary(store, run_ids=None, task=None, *, wide: bool = False, metrics: list[str] | None = None) -> str:
    """The finished runs (of run_ids, of task, where given) as text; see the module's docstring."""
    values = load(store)[0]
    if run_ids is not None:
        values = values[values.run_id.isin(run_ids)]
    if task:
        matching = values[values.task == task]
        if matching.empty and not values.empty:  # most often a misspelt name: say which there are
            return (
                f"(no finished runs of task {task!r}; finished runs here are of {', '.join(sorted(set(values.task)))})"
            )
        values = matching
    if values.empty:
        return "(no finished runs)"
    table = aggregate(values)
    if wide or metrics:
        text = as_text(rows(table, metrics or headline_of(table)))
    else:
        text = "\n\n".join(fitted(table[table.task == name]) for name in sorted(set(table.task)))
    return text + "\n" + textwrap.fill(CELLS_NOTE, WIDTH - 1)


def metric_names(text: str) -> list[str]:
    """--metrics a,b → the names, each one clbench.metrics declares (or a member of a family it declares);
    an unknown name fails with "did you mean"."""
    names = list(dict.fromkeys(text.split(",")))
    for name in names:
        lookup(name)
    return names


def headline_of(table: pd.DataFrame) -> list[str]:
    """The `summary` headline metrics these runs have, in rank order."""
    return [m for m in headline("summary") if m in set(table.metric)]


def fitted(part: pd.DataFrame) -> str:
    """One task's table under a heading with its name and the columns every row shares; its headline metrics,
    the lowest-ranked left out until the table fits WIDTH (the first always shown)."""
    metrics = headline_of(part)
    table = rows(part, metrics)
    shared = [c for c in SHARED if table[c].nunique(dropna=False) == 1]
    heading = " · ".join([f"task {part.task.iloc[0]}", *(f"{c} {table[c].iloc[0]}" for c in shared)])
    table = table.drop(columns=["task", *shared])
    keys = table.shape[1] - len(metrics)
    kept = len(metrics)
    while kept > 1 and widest(as_text(table.iloc[:, : keys + kept])) > WIDTH:
        kept -= 1
    lines = [heading, as_text(table.iloc[:, : keys + kept])]
    return "\n".join(lines + ([left_out_line(metrics[kept:])] if kept < len(metrics) else []))


def left_out_line(names: list[str]) -> str:
    """The columns left out, as many named as the line holds."""
    for named in range(len(names), 0, -1):
        more = f" and {len(names) - named} more" if named < len(names) else ""
        line = f"left out: {', '.join(names[:named])}{more} ({FLAGS})"
        if len(line) <= WIDTH:
            break
    return line


def rows(table: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """One row per run group (KEY): task, method, model, n_train, lr, seeds, [settings], a column per metric."""
    groups = (
        table.groupby(KEY, dropna=False, sort=True)
        .agg(lr=("lr", "first"), seeds=("runs", "max"), draws=("data_draws", "max"))
        .reset_index()
    )
    seeds = groups.seeds
    if (groups.draws > 1).any():  # runs over data draws × model seeds (load.DRAWS)
        seeds = [f"{n} ({d} data)" if d > 1 else str(n) for n, d in zip(groups.seeds, groups.draws)]
    shown = groups[["task", "method", "model", "n_train"]].assign(lr=groups.lr.map(fmt_lr), seeds=seeds)
    if shown.drop(columns="seeds").duplicated().any():
        shown["settings"] = groups.settings
    for metric in metrics:
        shown[metric + arrow(metric)] = cells(table, groups, metric)
    return shown


def cells(table: pd.DataFrame, groups: pd.DataFrame, metric: str) -> list[str]:
    """A metric's cell per run group, the best bold; "" where a group has no value."""
    stats = table[table.metric == metric].set_index(KEY)
    texts = []
    for key in groups[KEY].itertuples(index=False):
        row = stats.loc[tuple(key)] if tuple(key) in stats.index else None
        text = "" if row is None else cell_text(row)
        texts.append(f"**{text}**" if row is not None and row["verdict"] == "best" else text)
    return texts


def as_text(table: pd.DataFrame) -> str:
    return table.to_markdown(index=False, tablefmt="simple")


def widest(text: str) -> int:
    return max(map(len, text.splitlines()))
