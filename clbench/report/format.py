"""The reports' text: numbers as cells, run groups as table rows, tables as HTML and Markdown, leaderboard.md.

A cell is the mean ± the half-width of its 95 % CI over seeds, the digits cut where the interval says they
are noise; the best of each column bold, rows not significantly different from it marked ≈, rows that
cannot be tested marked ? (CELLS_NOTE). Every string that came from a task file, model id, config or the
database is escaped here (`esc` for HTML, `md` for Markdown) before any markup is added around it.
"""

from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd

from clbench.metrics import headline, lookup
from clbench.report.load import KEY, Board, direction

MARKS = {"n.s.": " ≈", "1 seed": " ?"}  # a cell's verdict against its column's best; the best is bold instead
STICKY = 4  # a task table's first columns, fixed while it scrolls sideways: method, model, n_train, lr
KEPT_OUT_COLUMNS = ["run_id", "task", "method", "model", "seed", "status", "reason"]
CELLS_NOTE = (
    "Cells: mean ± half-width of the 95 % confidence interval over seeds (Student's t; no ± with one seed), "
    "[evaluation noise: the runs' mean bootstrap standard error over examples] where runs store one; "
    "**best** per column; ≈ not significantly different from the best (Welch's t-test, p ≥ 0.05); "
    "? not tested (one seed on either side)."
)
DRAWS_COLUMN = "data draws"
DRAWS_NOTE = (
    "Where a row pools several data draws (data draws: the task's data_seed, e.g. which word each pseudo-word "
    "stands for and which sentences), its runs are data draws × model seeds and its interval is over all of them as "
    "if each run were independent: the seeds of one draw share its data, so where draws differ the interval is "
    "narrower than their spread. Its test against a row that also pools draws (≈, ?) is therefore not Welch's over "
    "runs but a t-test paired by draw, on each draw's mean over its seeds (2 degrees of freedom with 3 draws: it "
    "sees only large or consistent differences; a difference common to a draw's runs cancels). "
    "bench/compare_table.py --by-draw prints each draw's mean."
)
LM_EVAL_HEADING = "lm-eval checks (in-process, full softmax)"
SEARCHES_HEADING = "Learning rates chosen on validation (clbench tune)"
SEARCHES_NOTE = (
    "Each choice is the lr with the lowest mean validation objective over the seeds searched; a cell is one lr "
    "and that mean (inf: a seed diverged), the choice marked. where: a choice on an edge of its search was never "
    "compared with an lr beyond it."
)


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def md(value) -> str:
    """Markdown cell text: HTML-escaped (Markdown renders inline HTML) and the column bar escaped."""
    return esc(value).replace("|", "\\|")


def arrow(metric: str) -> str:
    return {True: " ↑", False: " ↓", None: ""}[direction(metric)]


def definition(metric: str) -> str:
    """The declared definition (a family member's is its family's); "" for a metric nobody declared."""
    return lookup(metric).definition if direction(metric) is not None else ""


# ---------------------------------------------------------------- cells


def fmt(value: float) -> str:
    if pd.isna(value):
        return ""
    if abs(value) >= 1000:  # counts and rates: no exponent, which would also sort wrongly as text
        return f"{value:.0f}"
    return f"{value:.4g}"


def no_spread(mean: float, half: float) -> bool:
    """Every seed gave the same value, up to the rounding of their mean: an interval below 1e-12 of the mean."""
    return half <= 1e-12 * max(1.0, abs(mean))


def fmt_ci(mean: float, half: float | None) -> str:
    """The cell "mean ± half": the half-width to 2 significant digits and the mean to the same decimal place
    (digits below the interval's are noise); the mean alone (fmt) without an interval; "± 0" where
    every seed gave the same value (no_spread)."""
    if half is None or pd.isna(half) or pd.isna(mean):
        return fmt(mean)
    if no_spread(mean, half):
        return f"{fmt(mean)} ± 0"
    places = max(0, 1 - math.floor(math.log10(half)))
    return f"{round(mean, places) + 0.0:.{places}f} ± {half:.{places}f}"  # + 0.0: no "-0.00"


def cell_text(stats) -> str:
    """A table cell from an aggregate row: mean ± CI, [eval SE] where stored, the verdict's mark."""
    text = fmt_ci(stats["mean"], stats["ci95"])
    if pd.notna(stats.get("eval_se", np.nan)):
        text += f" [{fmt(stats['eval_se'])}]"
    return text + MARKS.get(stats.get("verdict", ""), "")


def fmt_lr(lr) -> str:
    return "" if lr is None or pd.isna(lr) else f"{lr:g}"


# ---------------------------------------------------------------- rows


def metric_order(metrics) -> list[str]:
    """The leaderboard's headline metrics first, in their rank order; the rest alphabetically."""
    present, first = set(metrics), headline("leaderboard")
    return [m for m in first if m in present] + sorted(present - set(first))


def wide(table: pd.DataFrame, task: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """A task's rows: (cells (cell_text), best flags, means, metric columns), rows in KEY order.

    Columns: task, method, model, n_train, lr (the STICKY ones after task), runs, data draws (where a row pools
    several, pooled_draws), settings, metrics.
    A `<metric>_se` column whose metric is shown is folded into that metric's cells."""
    part = table[table.task == task]
    present = set(part.metric)
    metrics = [m for m in metric_order(present) if not (m.endswith("_se") and m[: -len("_se")] in present)]
    rows = part[KEY].drop_duplicates().sort_values(KEY[1:], na_position="last").reset_index(drop=True)
    groups = part.groupby(KEY, dropna=False).agg(runs=("runs", "max"), lr=("lr", "first"), draws=("data_draws", "max"))
    keys = [tuple(r) for r in rows[KEY].itertuples(index=False)]
    rows["lr"] = [fmt_lr(groups.lr[k]) for k in keys]
    rows["runs"] = [groups.runs[k] for k in keys]
    rows[DRAWS_COLUMN] = [groups.draws[k] for k in keys]
    shown = ["task", "method", "model", "n_train", "lr", "runs"] + [DRAWS_COLUMN] * pooled_draws(part) + ["settings"]
    cells = rows[shown].copy()
    best, means = pd.DataFrame(index=rows.index), pd.DataFrame(index=rows.index)
    for metric in metrics:
        m = part[part.metric == metric].set_index(KEY)
        stats = [m.loc[k] if k in m.index else None for k in keys]
        means[metric] = [s["mean"] if s is not None else np.nan for s in stats]
        cells[metric] = ["" if s is None else cell_text(s) for s in stats]
        best[metric] = [s is not None and s["verdict"] == "best" for s in stats]
    return cells, best, means, metrics


def pooled_draws(table: pd.DataFrame) -> bool:
    """Whether a row of these aggregates pools runs on more than one data draw (load.DRAWS)."""
    return bool((table.data_draws > 1).any())


def point_labels(rows: pd.DataFrame) -> list[str]:
    """Method, plus what tells its rows apart (model, the differing settings, n_train): short labels overlap less."""
    items = rows.settings.str.split(", ")
    shared = {m: set.intersection(*(set(i) for i in items[rows.method == m])) for m in rows.method.unique()}
    labels = []
    for r, own in zip(rows.itertuples(), items):
        parts = [
            r.method,
            *([r.model] if rows.model.nunique() > 1 else []),
            *(i for i in own if i not in shared[r.method]),
        ]
        labels.append(" · ".join(parts + ([f"n={r.n_train}"] if rows.n_train.nunique() > 1 else [])))
    return labels


def table_rows(task_runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(run_id → row number, seed), and per row number its label (point_labels): a row is a KEY, as in the tables."""
    runs = task_runs[["run_id", "seed", *KEY]].assign(row=task_runs.groupby(KEY, dropna=False, sort=True).ngroup())
    rows = runs.drop_duplicates("row").sort_values("row").set_index("row")
    return runs[["run_id", "seed", "row"]], rows.assign(label=point_labels(rows))


def lm_eval_cells(checks: pd.DataFrame) -> pd.DataFrame:
    """lm_eval_checks' rows as text: base, adapted and delta (adapted − base) as mean ± 95 % CI, runs last."""
    cells = checks.assign(
        base=checks.base.map(fmt), adapted=[fmt_ci(m, h) for m, h in zip(checks.adapted, checks.adapted_ci)]
    )
    cells["delta (adapted − base)"] = [fmt_ci(m, h) for m, h in zip(checks.delta, checks.delta_ci)]
    return cells.drop(columns=["adapted_ci", "delta", "delta_ci", "runs"]).assign(runs=checks.runs)


def search_cells(searches: pd.DataFrame, task: str, escape=md, strong=lambda text: f"**{text}**") -> pd.DataFrame:
    """A task's tuning choices (load.searches) as escaped cells; `strong` marks the chosen point. Empty
    without any."""
    part = searches[searches.task == task]

    def points(row) -> str:
        cells = [(escape(f"{p['lr']:g} {p['mean']:.4f}"), p["lr"] == row.lr) for p in row.search]
        return " · ".join(strong(text) if chosen else text for text, chosen in cells)

    return pd.DataFrame(
        {
            **{c: part[c].map(escape).tolist() for c in ["method", "model", "profile", "objective"]},
            "seeds": [escape(",".join(map(str, r.search[0]["seeds"]))) for r in part.itertuples()],
            "validation mean per lr": [points(r) for r in part.itertuples()],
            "chosen": [escape(fmt_lr(lr)) for lr in part.lr],
            "where": part["where"].map(escape).tolist(),
        }
    )


# ---------------------------------------------------------------- tables


def html_table(
    cells: pd.DataFrame, best: pd.DataFrame, metrics: list[str], links: list[str] | None = None, sticky: int = 0
) -> str:
    """A sortable table; every cell escaped here, best cells wrapped after escaping. Its first
    `sticky` columns stay in view while it scrolls sideways (the page's script places them)."""
    shown = pd.DataFrame({c: cells[c].map(esc) for c in cells.columns})
    for metric in metrics:
        shown[metric] = [f'<strong class="best">{v}</strong>' if b else v for v, b in zip(shown[metric], best[metric])]
    if links is not None:
        shown["runs"] = [f'<a href="#{a}">{v}</a>' for v, a in zip(shown["runs"], links)]
    shown.columns = [esc(c) + esc(arrow(c)) for c in cells.columns]
    table = shown.to_html(index=False, escape=False, classes="sortable", border=0, na_rep="")
    return table.replace("<table ", f'<table data-sticky="{sticky}" ', 1) if sticky else table


def markdown_table(cells: pd.DataFrame, best: pd.DataFrame, metrics: list[str]) -> str:
    """The headline metrics only (all of them are in index.html and leaderboard.csv)."""
    first = headline("leaderboard")
    metrics = [m for m in metrics if m in first] or metrics
    cells = cells[[c for c in cells.columns if c not in best.columns or c in metrics]]
    shown = pd.DataFrame({c: cells[c].map(md) for c in cells.columns})
    for metric in metrics:
        shown[metric] = [f"**{v}**" if b else v for v, b in zip(shown[metric], best[metric])]
    shown.columns = [md(c) + arrow(c) for c in cells.columns]
    return shown.to_markdown(index=False)


# ---------------------------------------------------------------- leaderboard.md


def markdown_board(board: Board) -> str:
    """leaderboard.md: per task its headline metrics, lm-eval checks and tuning choices, then the runs kept out of
    the tables."""
    sections = []
    for task in board.tasks:
        cells, best, _, metrics = wide(board.table, task)
        checks = board.checks.get(task)
        checks_md = (
            ""
            if checks is None
            else f"\n### {LM_EVAL_HEADING}\n\n{markdown_table(lm_eval_cells(checks), pd.DataFrame(), [])}\n"
        )
        chosen = pd.DataFrame() if board.searches is None else search_cells(board.searches, task)
        chosen_md = (
            f"\n### {SEARCHES_HEADING}\n\n{SEARCHES_NOTE}\n\n{chosen.to_markdown(index=False)}\n"
            if len(chosen)
            else ""
        )
        sections.append(
            f"## {md(task)}\n\n{markdown_table(cells.drop(columns='task'), best, metrics)}\n{checks_md}{chosen_md}"
        )
    kept = (
        ""
        if board.kept_out.empty
        else "\n## Failed or partial runs (not in the tables)\n\n"
        + board.kept_out[KEPT_OUT_COLUMNS].map(md).to_markdown(index=False)
        + "\n"
    )
    draws = f" {DRAWS_NOTE}" if pooled_draws(board.table) else ""
    directions = (
        f"Higher is better: ↑, lower is better: ↓ (clbench.metrics.METRICS). {CELLS_NOTE}{draws} lr: the group's "
        "method_config.lr. Headline metrics; every metric is in index.html and leaderboard.csv.\n\n"
    )
    return "# clbench leaderboard\n\n" + directions + "\n".join(sections) + kept
