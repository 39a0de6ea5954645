"""A PROVENANCE table from a results database: per method and lr, each metric's mean ± 95 % CI half-width over its
runs (data draws × model seeds where a group pools draws) and Welch's p against a reference method's runs.

    python bench/compare_table.py --db leaderboard/pseudowords-cpu-v3/results.duckdb --task pseudowords \
        --against et --metrics target_loss,after_new_loss,forgetting_oldvocab,drift_kl_oldvocab [--by-draw] [--searches]

Reads the reported runs only (clbench.report.load: tuning runs on the validation split never enter). --by-draw adds,
per method, each data draw's mean over its seeds and the test paired by draw that the leaderboard's and the paper
report's verdicts use between groups that pool draws. --searches adds each method's stored lr search (the `tuned`
table): every point's validation score, the choice in bold, and where it sits (clbench.lrsearch.edge). The numbers
are the same functions the leaderboard uses (clbench.stats.mean_ci, welch_p, paired_p); this file only lays them out
for a PROVENANCE.
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np
import pandas as pd

from clbench.errors import ClbenchError
from clbench.records import open_store
from clbench.report.format import fmt, fmt_ci, no_spread
from clbench.report.load import load, searches
from clbench.stats import mean_ci, paired_p, welch_p


def figure(value: float, digits: int = 2) -> str:
    """value to `digits` significant figures, without an exponent's padding (3e-05 → 3e-5)."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    text = f"{value:.{digits}g}"
    return text.replace("e-0", "e-").replace("e+0", "e+")


def cell(values: np.ndarray, reference: np.ndarray | None) -> str:
    """mean ± CI (p = … against reference); "0" where every run is exactly 0 (a frozen backbone's old text)."""
    if len(values) and not values.any():
        return "0"
    mean, half = mean_ci(values)
    # a reference every run shares (the base's loss) varies only in its last bits: one number, not "± 1.4e-15"
    text = fmt(mean) if half is not None and no_spread(mean, half) else fmt_ci(mean, half)
    p = welch_p(values, reference) if reference is not None else None
    return text if p is None else f"{text} (p = {figure(p)})"


def table(values: pd.DataFrame, task: str, against: str, metrics: list[str]) -> pd.DataFrame:
    """One row per (method, lr) of `task`: runs, data draws and a cell per metric."""
    part = values[values.task == task]
    if part.empty:
        raise ClbenchError(f"no finished runs of {task} in this database")
    missing = sorted(set(metrics) - set(part.metric))
    if missing:
        raise ClbenchError(
            f"no runs of {task} store {', '.join(missing)}; stored: {', '.join(sorted(set(part.metric)))}"
        )
    reference = part[part.method == against]
    if reference.empty:
        raise ClbenchError(f"no runs of {against} on {task} to test against")
    rows = []
    for (method, lr), group in part.groupby(["method", "lr"], sort=False, dropna=False):
        row = {"method": method, "lr": figure(lr, 3), "runs": group.run_id.nunique()}
        row["data draws"] = ",".join(str(int(d)) for d in sorted(group.data_seed.dropna().unique()))
        for metric in metrics:
            mine = group[group.metric == metric].value.to_numpy(float)
            theirs = None if method == against else reference[reference.metric == metric].value.to_numpy(float)
            row[metric] = cell(mine, theirs) if len(mine) else "n/a"
        rows.append(row)
    return pd.DataFrame(rows)


def by_draw(values: pd.DataFrame, task: str, metric: str, against: str) -> pd.DataFrame:
    """method × data draw: the mean of `metric` over that draw's seeds (and how many), and the paired t-test of the
    method's draw means against the reference's on the draws both ran. Seeds of one draw share its data, so the
    pooled interval treats runs as more independent than they are where draws differ; pairing by draw is the check
    that does not (2 degrees of freedom with 3 draws: it detects only large, consistent differences)."""
    part = values[(values.task == task) & (values.metric == metric)]
    grouped = part.groupby(["method", "lr", "data_seed"]).value.agg(["mean", "count"]).reset_index()
    grouped["cell"] = [f"{m:.4g} ({n})" for m, n in zip(grouped["mean"], grouped["count"])]
    wide = grouped.pivot(index=["method", "lr"], columns="data_seed", values="cell").fillna("")
    wide.columns = [f"draw {int(c)}" for c in wide.columns]
    reference = part[part.method == against].groupby("data_seed").value.mean()
    paired = []
    for method, lr in wide.index:
        mine = grouped[(grouped.method == method) & (grouped.lr == lr)].set_index("data_seed")["mean"]
        common = mine.index.intersection(reference.index)
        p = paired_p(mine[common], reference[common]) if method != against else None
        paired.append("" if p is None else figure(p))
    wide[f"paired p vs {against} (draws)"] = paired
    return wide.reset_index()


def search_table(store, task: str, order: list[str]) -> pd.DataFrame:
    """One row per stored search of `task`: every lr searched with its mean validation score over the search's
    seeds (the choice in bold), the choice and where it sits. Methods in `order` first, in that order."""
    found = searches(store)
    part = None if found is None else found[found.task == task]
    if part is None or part.empty:
        raise ClbenchError(f"no stored lr search of {task} in this database")
    rank = {method: i for i, method in enumerate(order)}
    part = part.sort_values("method", key=lambda m: m.map(lambda x: (rank.get(x, len(rank)), x)))
    rows = []
    for search in part.itertuples(index=False):
        cells = [(p["lr"], f"{figure(p['lr'], 3)}: {p['mean']:.4f}") for p in search.search]
        points = ", ".join(f"**{cell}**" if lr == search.lr else cell for lr, cell in cells)
        seeds = sorted({seed for p in search.search for seed in p["seeds"]})
        rows.append(
            {
                "method": search.method,
                f"lr: mean validation {search.objective} over seeds": points,
                "seeds": ",".join(map(str, seeds)),
                "chosen": f"{figure(search.lr, 3)} ({search.where})",
            }
        )
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    return "\n".join([head, rule] + ["| " + " | ".join(map(str, r)) + " |" for r in frame.itertuples(index=False)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--against", default="et")
    parser.add_argument("--metrics", default="target_loss,after_new_loss,forgetting_oldvocab,drift_kl_oldvocab")
    parser.add_argument("--by-draw", action="store_true")
    parser.add_argument("--searches", action="store_true")
    args = parser.parse_args(argv)
    metrics = [m for m in args.metrics.split(",") if m]
    try:
        store = open_store(args.db)
        values = load(store)[0]
        print(markdown(table(values, args.task, args.against, metrics)))
        if args.searches:
            order = list(dict.fromkeys(values[values.task == args.task].method))
            print("\nThe lr searches (the `tuned` table):\n")
            print(markdown(search_table(store, args.task, order)))
        if args.by_draw:
            for metric in metrics:
                print(f"\n{metric}, each data draw's mean over its seeds (runs):\n")
                print(markdown(by_draw(values, args.task, metric, args.against)))
    except ClbenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
