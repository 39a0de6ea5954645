"""The leaderboard's page, index.html: self-contained (CSS, JS and SVG plots inline, nothing fetched).

It opens with an overview of every task's headline metrics, coloured by rank; then per task its table (every
metric), figures (clbench/report/plots.py), lm-eval checks and stored examples; the paper's tables
(clbench/report/paper.py); the metric legend; every run's provenance; the runs kept out, with their reason.
Every string that came from a task file, model id, config or the database reaches the page through `esc`
(HTML) or matplotlib's SVG writer (which escapes text), never raw.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from string import Template

import numpy as np
import pandas as pd

from clbench.metrics import headline
from clbench.report.format import (
    DRAWS_NOTE,
    KEPT_OUT_COLUMNS,
    LM_EVAL_HEADING,
    SEARCHES_HEADING,
    SEARCHES_NOTE,
    STICKY,
    arrow,
    definition,
    esc,
    fmt,
    html_table,
    lm_eval_cells,
    point_labels,
    pooled_draws,
    search_cells,
    table_rows,
    wide,
)
from clbench.report.load import GENERATION_COLUMNS, KEY, Board, direction, rank_fractions
from clbench.report.paper import html_section
from clbench.report.plots import task_plots
from clbench.store import now

SHOWN_EXAMPLES = 3  # per run and set, in the examples section
SHOWN_CHARACTERS = 120  # of an example's text
NONE_FINISHED = "<p>No finished runs.</p>"


def page(board: Board, db: str | Path) -> str:
    """index.html of a store's Board; db: the store's path as given, shown on the page."""
    sections, anchor_of = [], {}
    for t, task in enumerate(board.tasks):
        cells, best, _, metrics = wide(board.table, task)
        anchors = [f"prov-{t}-{i}" for i in range(len(cells))]
        anchor_of.update(zip((tuple(r) for r in cells[KEY].itertuples(index=False)), anchors))
        sections.append(task_section(board, t, task, cells, best, metrics, anchors))
    continuations = {} if board.generations is None else generations_html(board.generations)
    return page_template().substitute(
        generated=esc(now().isoformat(timespec="seconds")),
        db=esc(db),
        draws=f" {esc(DRAWS_NOTE)}" if board.tasks and pooled_draws(board.table) else "",
        overview=overview_table(board.table, board.tasks) if board.tasks else NONE_FINISHED,
        legend=metric_legend(sorted(set(board.table.metric))),
        sections=("".join(sections) or NONE_FINISHED) + html_section(board.values),
        provenance=provenance_table(board.provenance, anchor_of, continuations),
        kept_out=kept_out_table(board.kept_out),
    )


def task_section(
    board: Board, t: int, task: str, cells: pd.DataFrame, best: pd.DataFrame, metrics: list[str], anchors: list[str]
) -> str:
    """The t-th task's section: its table (wide: cells, best, metrics; each row's run count linked to its anchor
    in the provenance table), figures, lm-eval checks, the tuning choices and, where runs stored samples, examples."""
    figures = "".join(f'<figure class="plot">{p}</figure>' for p in task_plots(board, t, task, cells, metrics) if p)
    checks = board.checks.get(task)
    checks_table = "" if checks is None else html_table(lm_eval_cells(checks), pd.DataFrame(), [])
    checks_html = f'<h3>{LM_EVAL_HEADING}</h3><div class="scroll">{checks_table}</div>' if checks_table else ""
    examples = "" if board.samples is None else examples_html(board.samples, board.task_runs(task))
    table = html_table(cells.drop(columns="task"), best, metrics, anchors, sticky=STICKY)  # the heading names the task
    body = f'<div class="scroll">{table}</div>{figures}{checks_html}{searches_html(board, task)}{examples}'
    return f"<section><h2>{esc(task)}</h2>{body}</section>"


def searches_html(board: Board, task: str) -> str:
    """The task's tuning choices (format.search_cells), the chosen point bold; "" without any."""
    if board.searches is None:
        return ""
    cells = search_cells(board.searches, task, escape=esc, strong=lambda text: f"<strong>{text}</strong>")
    if cells.empty:
        return ""
    table = cells.to_html(index=False, escape=False, border=0, classes="sortable searches")
    return f'<h3>{SEARCHES_HEADING}</h3><p class="note">{esc(SEARCHES_NOTE)}</p><div class="scroll">{table}</div>'


def overview_table(table: pd.DataFrame, tasks: list[str]) -> str:
    """Every task's rows × the leaderboard's headline metrics, each cell coloured by its rank in the
    task's column (rank_colour), marked as in the task tables."""
    first = headline("leaderboard")
    columns = [m for m in first if m in set(table.metric)]
    header = ["task", "method", "lr", "runs", *columns]
    body = []
    for task in tasks:
        cells, best, means, metrics = wide(table, task)
        labels = point_labels(cells)
        ranked = {m: rank_fractions(means[m], m) for m in columns if m in metrics}
        for i in cells.index:
            row = [(esc(task), ""), (esc(labels[i]), ""), (esc(cells.lr[i]), ""), (esc(cells.runs[i]), "")]
            for m in columns:
                text = esc(cells[m][i]) if m in metrics else ""
                text = f'<strong class="best">{text}</strong>' if m in metrics and best[m][i] else text
                fraction = ranked[m][i] if m in ranked else np.nan
                style = "" if pd.isna(fraction) else f' style="background: {rank_colour(fraction)}"'
                rank = "" if pd.isna(fraction) else f' data-rank="{fraction:.3g}"'
                row.append((text, style + rank))
            body.append("<tr>" + "".join(f"<td{attrs}>{text}</td>" for text, attrs in row) + "</tr>")
    head = "".join(f"<th>{esc(c)}{esc(arrow(c))}</th>" for c in header)
    return (
        f'<table class="sortable overview" data-sticky="2"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def rank_colour(fraction: float) -> str:
    """Green (best) through yellow to a pale orange (worst); the marks, not the colour, carry the verdict."""
    return f"hsl({140 - 110 * fraction:.0f}, 60%, {72 + 14 * fraction:.0f}%)"


def examples_html(samples: pd.DataFrame, task_runs: pd.DataFrame) -> str:
    """Per run that stored samples (--log-samples): its most forgotten old-text examples (largest NLL
    increase per token over the base, full softmax) and its worst target examples (highest NLL per
    token, old softmax), SHOWN_EXAMPLES each."""
    runs, rows = table_rows(task_runs)
    part = samples.merge(runs, on="run_id").sort_values(["row", "seed", "run_id"])
    if part.empty:
        return ""
    per_token = lambda nll, n: np.where(n > 0, nll / n.where(n > 0, 1), np.nan)
    blocks = []
    for run_id, run in part.groupby("run_id", sort=False):
        old = run[run.eval_set == "old_text"]
        old = old.assign(
            **{
                "Δ NLL/token (old softmax)": per_token(old.nll_old - old.base_nll_old, old.n_old),
                "Δ NLL/token (full)": per_token(old.nll_full - old.base_nll_old, old.n_old),
            }
        )
        target = run[run.eval_set == "target"]
        target = target.assign(
            **{
                "NLL/token (old softmax)": per_token(target.nll_old, target.n_old),
                "NLL/token (full)": per_token(target.nll_full, target.n_full),
            }
        )
        tables = [
            ("most forgotten old text", worst(old, "Δ NLL/token (full)", ["Δ NLL/token (old softmax)"])),
            ("worst target examples", worst(target, "NLL/token (old softmax)", ["NLL/token (full)"])),
        ]
        title = f"{rows.label[run.row.iloc[0]]} · seed {run.seed.iloc[0]} · run {run_id}"
        blocks.append(f"<h4>{esc(title)}</h4>" + "".join(f"<p>{esc(n)}</p>{t}" for n, t in tables if t))
    return (
        f'<details class="examples"><summary>Examples ({len(blocks)} runs with --log-samples)</summary>'
        f"{''.join(blocks)}</details>"
    )


def worst(rows: pd.DataFrame, by: str, also: list[str]) -> str:
    """The SHOWN_EXAMPLES rows highest in `by` (ties by example number) as an escaped HTML table; "" for none."""
    if rows.empty:
        return ""
    top = rows.sort_values([by, "example"], ascending=[False, True], na_position="last").head(SHOWN_EXAMPLES)
    text = lambda whole: whole[:SHOWN_CHARACTERS] + ("…" if len(whole) > SHOWN_CHARACTERS else "")
    token = lambda t: "" if t is None or pd.isna(t) else json.dumps(t, ensure_ascii=False)  # quotes show spaces
    shown = pd.DataFrame(
        {
            "example": top.example.astype(str),
            "text": (top.prompt + top.completion).map(text),
            by: top[by].map(fmt),
            **{c: top[c].map(fmt) for c in also},
            "expected": top.expected.map(token),
            "predicted (old softmax)": top.prediction_old.map(token),
            "predicted (full)": top.prediction_full.map(token),
        }
    )
    return shown.map(esc).to_html(index=False, escape=False, border=0, classes="examples")


def generations_html(rows: pd.DataFrame) -> dict[str, str]:
    """run_id → its greedy continuations (load.generations) as an HTML table, every string escaped."""
    return {
        run_id: part[GENERATION_COLUMNS].map(esc).to_html(index=False, escape=False, border=0, classes="generations")
        for run_id, part in rows.groupby("run_id")
    }


def metric_legend(metrics: list[str]) -> str:
    rows = pd.DataFrame(
        {
            "metric": [esc(m) for m in metrics],
            "better": [{True: "higher ↑", False: "lower ↓", None: "undeclared"}[direction(m)] for m in metrics],
            "definition": [esc(definition(m)) for m in metrics],
        }
    )
    return rows.to_html(index=False, escape=False, border=0, classes="legend")


def provenance_table(runs: pd.DataFrame, anchor_of: dict[tuple, str], generated: dict[str, str]) -> str:
    """generated: run_id → its greedy continuations' table (generations), shown folded beside its config."""
    if runs.empty:
        return "<p>No finished runs.</p>"
    seen, first = set(), []
    for r in runs[KEY].itertuples(index=False):
        key = tuple(r)
        # the row's number within its task's table, as the anchor its run count links to
        first.append(
            f'<a id="{anchor_of[key]}">{int(anchor_of[key].rsplit("-", 1)[1]) + 1}</a>' if key not in seen else ""
        )
        seen.add(key)
    shown = pd.DataFrame(
        {
            "row": first,
            **{
                c: runs[c].map(esc).values
                for c in [
                    "task",
                    "method",
                    "model",
                    "settings",
                    "n_train",
                    "seed",
                    "run_id",
                    "clbench",
                    "git_commit",
                    "finished_at",
                ]
            },
            "config": [
                f"<details><summary>config</summary><pre>{esc(json.dumps(json.loads(c), indent=1, sort_keys=True))}</pre></details>"
                for c in runs.config
            ],
            "generations": [
                f"<details><summary>generations</summary>{generated[r]}</details>" if r in generated else ""
                for r in runs.run_id
            ],
        }
    )
    return shown.to_html(index=False, escape=False, border=0, classes="sortable provenance")


def kept_out_table(kept_out: pd.DataFrame) -> str:
    if kept_out.empty:
        return "<p>None.</p>"
    return kept_out[KEPT_OUT_COLUMNS].map(esc).to_html(index=False, escape=False, border=0, classes="sortable failed")


def page_template() -> Template:
    # string.Template: $name placeholders, so the page's CSS and JS braces need no escaping
    return Template(resources.files("clbench.report").joinpath("leaderboard.html").read_text(encoding="utf-8"))
