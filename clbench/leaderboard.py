"""The leaderboard: `clbench leaderboard --db clbench-results.duckdb --out leaderboard/out`.

Reads metric values from the `results` view and provenance from the `runs` table, and writes
index.html (self-contained: CSS, JS and SVG plots inline, nothing fetched), leaderboard.md and
leaderboard.csv. A row is one (task, method, model, settings, n_train) over its seeds; a cell is the
mean ± the half-width of its 95 % CI over seeds (clbench/stats.py), the best of each column bold,
rows not significantly different from it marked ≈ (Welch's t-test, p ≥ 0.05), rows that cannot
be tested (one seed on either side) marked ?. The page opens with an overview of every task's
headline metrics, coloured by rank; the metric legend comes after the results. Only
finished runs with metrics enter the tables; failed or partial runs are listed apart with their
reason. Every string that came from a task file, model id, config or the database reaches the
page through `esc` (HTML) or matplotlib's SVG writer (which escapes text), never raw.
"""

from __future__ import annotations

import html
import io
import json
import math
import tempfile
from importlib import resources
from pathlib import Path
from string import Template

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from clbench.errors import ClbenchError
from clbench.metrics import headline, higher_is_better, lookup
from clbench.records import open_store
from clbench.stats import finite, mean_ci, verdict, welch_p
from clbench.store import REPORTED, Store, now

KEY = ["task", "method", "model", "settings", "n_train"]
QUALITY = ("target_acc", "target_loss")  # what the plots put against forgetting, the first that ranks the runs
FORGETTING = ("forgetting_oldvocab", "forgetting_full")
SVG_STYLE = {"svg.fonttype": "none", "text.parse_math": False, "figure.dpi": 72, "font.size": 9}
MARKS = {"n.s.": " ≈", "1 seed": " ?"}  # a cell's verdict against its column's best; the best is bold instead
STICKY = 4  # a task table's first columns, fixed while it scrolls sideways: method, model, n_train, lr
CELLS_NOTE = (
    "Cells: mean ± half-width of the 95 % confidence interval over seeds (Student's t; no ± with one seed), "
    "[evaluation noise: the runs' mean bootstrap standard error over examples] where runs store one; "
    "**best** per column; ≈ not significantly different from the best (Welch's t-test, p ≥ 0.05); "
    "? not tested (one seed on either side)."
)


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def direction(metric: str) -> bool | None:
    """True: higher is better; False: lower; None: a metric clbench.metrics does not declare."""
    try:
        return higher_is_better(metric)
    except KeyError:
        return None


def arrow(metric: str) -> str:
    return {True: " ↑", False: " ↓", None: ""}[direction(metric)]


def definition(metric: str) -> str:
    """The declared definition (a family member's is its family's); "" for a metric nobody declared."""
    return lookup(metric).definition if direction(metric) is not None else ""


# ---------------------------------------------------------------- data


def load(store: Store) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """→ (values: one row per finished run × metric, with provenance; runs kept out with reasons; all runs)."""
    runs = store.query(
        "SELECT run_id, task, method, model, seed, status, reason, config, versions, git_commit, finished_at FROM runs "
        f"WHERE {REPORTED}"
    )
    values = store.query("SELECT run_id, metric, value FROM results WHERE status = 'finished' AND metric IS NOT NULL")
    configs = runs.config.map(json.loads)
    runs["n_train"] = configs.map(lambda c: c.get("budget", {}).get("n_train"))
    runs["lr"] = configs.map(lambda c: (c.get("method_config") or {}).get("lr"))
    runs["settings"] = configs.map(settings)
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
    """What besides task, method, model and n_train makes runs different experiments."""
    parts = [f"{k}={v}" for k, v in sorted(config.get("method_config", {}).items())]
    parts += [f"{k}={config[k]}" for k in ("init", "profile") if config.get(k) is not None]
    return ", ".join(parts)


def aggregate(values: pd.DataFrame) -> pd.DataFrame:
    """One row per KEY × metric: mean and sample std over runs, runs counted, the group's lr; the
    seed statistics (n_seeds: finite values, ci95: CI half-width), eval_se (the mean of the runs'
    `<metric>_se`, where they store one), and p_vs_best / verdict against the best row of the
    task's column (compare_with_best)."""
    grouped = values.groupby(KEY + ["metric"], dropna=False)
    table = grouped.value.agg(mean="mean", std="std").reset_index()
    table["runs"] = grouped.run_id.nunique().values
    table["higher_is_better"] = table.metric.map(direction)
    table["lr"] = grouped.lr.first().values
    samples = [finite(v) for v in grouped.value.apply(list)]
    table["n_seeds"] = [len(s) for s in samples]
    table["ci95"] = np.array([mean_ci(s)[1] for s in samples], dtype=float)  # None (one seed) → NaN, empty in CSV
    table["eval_se"] = evaluation_noise(table, values)
    table["p_vs_best"], table["verdict"] = compare_with_best(table, samples)
    return table


def evaluation_noise(table: pd.DataFrame, values: pd.DataFrame) -> list[float]:
    """Per table row, the mean over its runs of `<metric>_se`; NaN where no run stores one."""
    se = values[values.metric.str.endswith("_se")].assign(metric=lambda f: f.metric.str[: -len("_se")])
    means = se.groupby(KEY + ["metric"], dropna=False).value.mean().rename("eval_se").reset_index()
    return table[KEY + ["metric"]].merge(means, on=KEY + ["metric"], how="left").eval_se.tolist()


def compare_with_best(table: pd.DataFrame, samples: list[np.ndarray]) -> tuple[list[float], list[str]]:
    """Per row: Welch's p against the best row of its task's column (of tied best means, the one with
    most seeds), NaN where untested, and the verdict; "" where the column ranks nothing (best_mask)."""
    p_values, verdicts = [np.nan] * len(table), [""] * len(table)
    for _, part in table.groupby(["task", "metric"], dropna=False):
        best = best_mask(part["mean"], part.metric.iloc[0])
        if not best.any():
            continue
        reference = part[best].n_seeds.idxmax()
        for i in part.index:
            if table.n_seeds[i] == 0:
                continue
            p = None if best[i] else welch_p(samples[i], samples[reference])
            p_values[i] = np.nan if p is None else p
            verdicts[i] = verdict(samples[i], samples[reference], is_best=bool(best[i]))
    return p_values, verdicts


def quality_metric(task_table: pd.DataFrame) -> str | None:
    """target_acc, unless every run of the task scores 0 on it: exact match of a whole free-text
    completion (pseudo-word and language tasks at small budgets) — then target_loss, which still
    ranks them. None when the task has neither."""
    for metric in QUALITY:
        means = task_table.loc[task_table.metric == metric, "mean"].dropna()
        if len(means) and (metric != "target_acc" or (means != 0).any()):
            return metric
    return None


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Points not dominated by another: lower x (forgetting) and higher y (quality), one strictly.

    NaN points are never on the front.
    """
    ok = ~(np.isnan(x) | np.isnan(y))
    front = ok.copy()
    for i in np.flatnonzero(ok):
        others = ok & (x <= x[i]) & (y >= y[i]) & ((x < x[i]) | (y > y[i]))
        front[i] = not others.any()
    return front


def best_mask(means: pd.Series, metric: str) -> pd.Series:
    """Rows holding the best mean of a column (ties all marked).

    Nothing is marked where the metric declares no direction or every row has the same value
    (a property of the base model, such as old_loss_base, ranks nothing).
    """
    better = direction(metric)
    if better is None or means.dropna().nunique() < 2:
        return pd.Series(False, index=means.index)
    best = means.max() if better else means.min()
    return means == best


def fmt(value: float) -> str:
    if pd.isna(value):
        return ""
    if abs(value) >= 1000:  # counts and rates: no exponent, which would also sort wrongly as text
        return f"{value:.0f}"
    return f"{value:.4g}"


def fmt_ci(mean: float, half: float | None) -> str:
    """The cell "mean ± half": the half-width to 2 significant digits and the mean to the same decimal place
    (digits below the interval's are noise); the mean alone (fmt) without an interval; "± 0" where
    every seed gave the same value."""
    if half is None or pd.isna(half) or pd.isna(mean):
        return fmt(mean)
    if half == 0:
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


def metric_order(metrics) -> list[str]:
    """The leaderboard's headline metrics first, in their rank order; the rest alphabetically."""
    present, first = set(metrics), headline("leaderboard")
    return [m for m in first if m in present] + sorted(present - set(first))


def wide(table: pd.DataFrame, task: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, list[str]]:
    """A task's rows: (cells (cell_text), best flags, means, metric columns), rows in KEY order.

    Columns: task, method, model, n_train, lr (the STICKY ones after task), runs, settings, metrics.
    A `<metric>_se` column whose metric is shown is folded into that metric's cells."""
    part = table[table.task == task]
    present = set(part.metric)
    metrics = [m for m in metric_order(present) if not (m.endswith("_se") and m[: -len("_se")] in present)]
    rows = part[KEY].drop_duplicates().sort_values(KEY[1:], na_position="last").reset_index(drop=True)
    groups = part.groupby(KEY, dropna=False).agg(runs=("runs", "max"), lr=("lr", "first"))
    keys = [tuple(r) for r in rows[KEY].itertuples(index=False)]
    rows["lr"] = [fmt_lr(groups.lr[k]) for k in keys]
    rows["runs"] = [groups.runs[k] for k in keys]
    cells = rows[["task", "method", "model", "n_train", "lr", "runs", "settings"]].copy()
    best, means = pd.DataFrame(index=rows.index), pd.DataFrame(index=rows.index)
    for metric in metrics:
        m = part[part.metric == metric].set_index(KEY)
        stats = [m.loc[k] if k in m.index else None for k in keys]
        means[metric] = [s["mean"] if s is not None else np.nan for s in stats]
        cells[metric] = ["" if s is None else cell_text(s) for s in stats]
        best[metric] = [s is not None and s["verdict"] == "best" for s in stats]
    return cells, best, means, metrics


# ---------------------------------------------------------------- plots


def svg(fig: Figure, salt: str) -> str:
    """The figure as inline SVG; `salt` keeps element ids unique across the figures of one page."""
    buffer = io.StringIO()
    with rc_context({"svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


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


def tradeoff_plot(points: pd.DataFrame, quality: str | None, salt: str) -> str | None:
    """Target quality vs each forgetting metric, one panel each, the Pareto front drawn."""
    panels = [f for f in FORGETTING if f in points]
    if quality not in points or not panels:
        return None
    with rc_context(SVG_STYLE):
        fig = Figure(figsize=(5.2 * len(panels), 4))
        for ax, forgetting in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
            x, y = points[forgetting].to_numpy(float), points[quality].to_numpy(float)
            front = pareto_front(x, y if direction(quality) else -y)
            ax.scatter(x[~front], y[~front], color="tab:gray", label="dominated")
            ax.scatter(x[front], y[front], color="tab:red", marker="D", label="Pareto front")
            order = np.argsort(x[front])
            ax.step(x[front][order], y[front][order], where="post", color="tab:red", alpha=0.5)
            for xi, yi, text in zip(x, y, points.label):
                if not (np.isnan(xi) or np.isnan(yi)):
                    ax.annotate(text, (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.set_xlabel(f"{forgetting}{arrow(forgetting)}")
            ax.set_ylabel(f"{quality}{arrow(quality)}")
            ax.margins(x=0.25, y=0.1)
            ax.legend(loc="best", fontsize=7)
            ax.grid(alpha=0.3)
        return svg(fig, salt)


def sample_efficiency_plot(part: pd.DataFrame, quality: str | None, salt: str) -> str | None:
    """Metric vs n_train, one line per (method, model, settings), where a task has a sweep."""
    shown = [m for m in (quality, "forgetting_oldvocab") if m in set(part.metric)]
    if part.n_train.nunique() < 2 or not shown:  # nothing to draw: no figure (matplotlib refuses 0 panels)
        return None
    with rc_context(SVG_STYLE):
        fig = Figure(figsize=(5.2 * len(shown), 4))
        for ax, metric in zip(fig.subplots(1, len(shown), squeeze=False)[0], shown):
            rows = part[part.metric == metric]
            for (method, model, setting), line in rows.groupby(["method", "model", "settings"], dropna=False):
                line = line.sort_values("n_train")
                ax.errorbar(
                    line.n_train,
                    line["mean"],
                    yerr=line["std"].fillna(0),
                    marker="o",
                    capsize=3,
                    label=f"{method} · {model} · {setting}",
                )
            # log scale with the swept values as ticks (the default log labels are mathtext, off here)
            sizes = sorted(rows.n_train.dropna().unique())
            ax.set_xscale("log")
            ax.set_xticks(sizes, [str(int(n)) for n in sizes])
            ax.minorticks_off()
            ax.set_xlabel("n_train (training examples)")
            ax.set_ylabel(f"{metric}{arrow(metric)}")
            ax.legend(fontsize=6)
            ax.grid(alpha=0.3)
        return svg(fig, salt)


def dictionary_sweep_plot(part: pd.DataFrame, salt: str) -> str | None:
    """Where a task's runs sweep dictionary_size (s) and n_train: gap_closed vs n_train per s, and
    N*(s) (clbench/sweep.py n_star, the default fraction) against s with the least-squares line
    through the origin N* ≈ k·s (k = c·ln T, T fixed by the model), one line per method · model."""
    gaps = part[part.metric == "gap_closed"]
    if gaps.empty:
        return None
    from clbench.sweep import LAW_PARAM, TARGET_GAP, n_star, through_origin

    s = gaps.config.map(lambda c: json.loads(c).get("params", {}).get(LAW_PARAM))
    if s.isna().any() or s.nunique() < 2 or gaps.n_train.nunique() < 2:
        return None
    means = gaps.assign(s=s).groupby(["method", "model", "s", "n_train"]).value.mean().reset_index()
    with rc_context(SVG_STYLE):
        fig = Figure(figsize=(10.4, 4))
        curves, law = fig.subplots(1, 2)
        for (method, model), lines in means.groupby(["method", "model"]):
            stars = {}
            for size, line in lines.groupby("s"):
                curves.plot(line.n_train, line.value, marker="o", label=f"{method} · {model} · s={size}")
                stars[size] = n_star(dict(zip(line.n_train, line.value)))
            reached = {k: v for k, v in stars.items() if v is not None}
            slope = through_origin(list(reached), [float(v) for v in reached.values()])
            rms = math.sqrt(np.mean([(v - slope * k) ** 2 for k, v in reached.items()])) if reached else math.nan
            dots = law.plot(list(reached), list(reached.values()), "o", label=f"{method} · {model}: N*(s)")
            if reached:
                xs = np.array([0, max(stars)])
                law.plot(xs, slope * xs, "--", color=dots[0].get_color(), label=f"N* ≈ {slope:.3g}·s (rms {rms:.3g})")
        curves.axhline(TARGET_GAP, color="gray", lw=0.8)
        curves.set_xscale("log")
        curves.set_xlabel("n_train (training examples)")
        curves.set_ylabel(f"gap_closed{arrow('gap_closed')}")
        law.set_xlabel("s (dictionary_size)")
        law.set_ylabel(f"N*: smallest n_train with gap_closed ≥ {TARGET_GAP}")
        for ax in (curves, law):
            ax.legend(fontsize=6)
            ax.grid(alpha=0.3)
        return svg(fig, salt)


def has_table(store: Store, name: str) -> bool:
    return bool(store.query("SELECT count(*) AS n FROM information_schema.tables WHERE table_name = ?", [name]).n[0])


def stage_matrix(store: Store) -> pd.DataFrame | None:
    """The sequential runs' stage × task matrix, if this database has the table."""
    if not has_table(store, "stage_matrix"):
        return None
    return store.query("SELECT run_id, after_stage, eval_stage, metric, value FROM stage_matrix")


def per_run_table(store: Store, name: str) -> pd.DataFrame | None:
    """A table of per-run rows (curves, samples), if this database has it."""
    return store.query(f"SELECT * FROM {name}") if has_table(store, name) else None


GENERATION_COLUMNS = ["source", "prompt", "generated", "reference", "new_tokens"]


def generations(store: Store) -> dict[str, str]:
    """run_id → its stored greedy continuations as an HTML table, every string escaped; {} without the table."""
    if not has_table(store, "generations"):
        return {}
    rows = store.query(f"SELECT run_id, {', '.join(GENERATION_COLUMNS)} FROM generations ORDER BY run_id, number")
    return {
        run_id: part[GENERATION_COLUMNS].map(esc).to_html(index=False, escape=False, border=0, classes="generations")
        for run_id, part in rows.groupby("run_id")
    }


def lm_eval_table(store: Store, values: pd.DataFrame, task: str) -> pd.DataFrame | None:
    """A task's lm-eval checks of finished runs: base, adapted and delta (mean ± 95 % CI) per row and lm-eval metric."""
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
    stats = grouped.agg(
        base=("base", "mean"),
        adapted=("adapted", "mean"),
        adapted_ci=("adapted", half),
        delta=("delta", "mean"),
        delta_ci=("delta", half),
        runs=("run_id", "nunique"),
    ).reset_index()
    stats["base"] = stats.base.map(fmt)
    stats["adapted"] = [fmt_ci(m, h) for m, h in zip(stats.adapted, stats.adapted_ci)]
    stats["delta (adapted − base)"] = [fmt_ci(m, h) for m, h in zip(stats.delta, stats.delta_ci)]
    return stats.drop(columns=["adapted_ci", "delta", "delta_ci", "runs"]).assign(runs=stats.runs)


def heatmap(cells: pd.DataFrame, title: str, metric: str, salt: str) -> str:
    grid = cells.pivot_table(index="after_stage", columns="eval_stage", values="value", aggfunc="mean")
    with rc_context(SVG_STYLE):
        fig = Figure(figsize=(1.2 + 0.9 * grid.shape[1], 1.0 + 0.6 * grid.shape[0]))
        ax = fig.subplots()
        image = ax.imshow(
            grid.to_numpy(float), cmap="viridis_r" if direction(metric) is False else "viridis", aspect="auto"
        )
        ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], rotation=30, ha="right")
        ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
        for (i, j), v in np.ndenumerate(grid.to_numpy(float)):
            ax.text(j, i, fmt(v), ha="center", va="center", fontsize=7, color="white")
        ax.set_xlabel("evaluated on stage")
        ax.set_ylabel("after training stage")
        ax.set_title(f"{title}: {metric}{arrow(metric)}", fontsize=8)
        fig.colorbar(image, ax=ax)
        return svg(fig, salt)


# ---------------------------------------------------------------- output


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


def rank_fractions(means: pd.Series, metric: str) -> pd.Series:
    """Per row, its rank in the column scaled to 0 (best) … 1 (worst), ties sharing the better rank;
    NaN where the column ranks nothing (best_mask) or the row has no value."""
    if not best_mask(means, metric).any():
        return pd.Series(np.nan, index=means.index)
    ranks = means.rank(method="min", ascending=not direction(metric))
    worst = ranks.max()
    return (ranks - 1) / (worst - 1) if worst > 1 else ranks * 0.0


def rank_colour(fraction: float) -> str:
    """Green (best) through yellow to a pale orange (worst); the marks, not the colour, carry the verdict."""
    return f"hsl({140 - 110 * fraction:.0f}, 60%, {72 + 14 * fraction:.0f}%)"


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


def md(value) -> str:
    """Markdown cell text: HTML-escaped (Markdown renders inline HTML) and the column bar escaped."""
    return esc(value).replace("|", "\\|")


def build(db: str | Path, out: str | Path) -> Path:
    store, out = open_store(db), Path(out)
    values, kept_out, runs = load(store)  # a missing database is refused first, before any folder is made
    writable(out)
    table = aggregate(values)
    tasks = sorted(table.task.unique())
    provenance = values.drop_duplicates("run_id").sort_values(KEY + ["seed"])
    matrix = stage_matrix(store)
    curves, samples = per_run_table(store, "curves"), per_run_table(store, "samples")

    sections, md_sections, index_rows = [], [], []
    for t, task in enumerate(tasks):
        cells, best, _, metrics = wide(table, task)
        anchors = [f"prov-{t}-{i}" for i in range(len(cells))]
        index_rows += [(a, tuple(r)) for a, r in zip(anchors, cells[KEY].itertuples(index=False))]
        points = cells[KEY].assign(label=point_labels(cells))
        quality = quality_metric(table[table.task == task])
        for metric in (quality, *FORGETTING):
            if metric in metrics:
                means = table[(table.task == task) & (table.metric == metric)].set_index(KEY)["mean"]
                points[metric] = [means.get(tuple(r), np.nan) for r in cells[KEY].itertuples(index=False)]
        plots = [
            tradeoff_plot(points, quality, f"{t}-tradeoff"),
            sample_efficiency_plot(table[table.task == task], quality, f"{t}-sweep"),
            dictionary_sweep_plot(values[values.task == task], f"{t}-law"),
        ]
        if matrix is not None:
            plots += heatmaps(matrix, runs[runs.task == task], t)
        task_runs = provenance[provenance.task == task]
        if curves is not None:
            plots.append(curves_plot(curves, task_runs, f"{t}-curves"))
        figures = "".join(f'<figure class="plot">{p}</figure>' for p in plots if p)
        cells = cells.drop(columns="task")  # the section heading names it
        checks, no_best = lm_eval_table(store, values, task), pd.DataFrame()
        checks_html = (
            ""
            if checks is None
            else f'<h3>lm-eval checks (in-process, full softmax)</h3><div class="scroll">{html_table(checks, no_best, [])}</div>'
        )
        checks_md = (
            ""
            if checks is None
            else f"\n### lm-eval checks (in-process, full softmax)\n\n{markdown_table(checks, no_best, [])}\n"
        )
        board = html_table(cells, best, metrics, anchors, sticky=STICKY)
        sections.append(
            f'<section><h2>{esc(task)}</h2><div class="scroll">{board}</div>{figures}{checks_html}'
            f"{examples_html(samples, task_runs) if samples is not None else ''}</section>"
        )
        md_sections.append(f"## {md(task)}\n\n{markdown_table(cells, best, metrics)}\n{checks_md}")

    out.mkdir(parents=True, exist_ok=True)
    legend = metric_legend(sorted(set(table.metric)))
    page = page_template().substitute(
        generated=esc(now().isoformat(timespec="seconds")),
        db=esc(db),
        overview=overview_table(table, tasks) if tasks else "<p>No finished runs.</p>",
        legend=legend,
        sections=("".join(sections) or "<p>No finished runs.</p>") + paper_section(values),
        provenance=provenance_table(provenance, {r: a for a, r in index_rows}, generations(store)),
        kept_out=kept_out_table(kept_out),
    )
    (out / "index.html").write_text(page, encoding="utf-8")
    md_kept = (
        ""
        if kept_out.empty
        else "\n## Failed or partial runs (not in the tables)\n\n"
        + kept_out[["run_id", "task", "method", "model", "seed", "status", "reason"]].map(md).to_markdown(index=False)
        + "\n"
    )
    directions = (
        f"Higher is better: ↑, lower is better: ↓ (clbench.metrics.METRICS). {CELLS_NOTE} lr: the group's "
        "method_config.lr. Headline metrics; every metric is in index.html and leaderboard.csv.\n\n"
    )
    (out / "leaderboard.md").write_text(
        "# clbench leaderboard\n\n" + directions + "\n".join(md_sections) + md_kept, encoding="utf-8"
    )
    table.sort_values(KEY + ["metric"]).to_csv(out / "leaderboard.csv", index=False)
    return out


def paper_section(values: pd.DataFrame) -> str:
    """The paper's three tables beside these results (clbench/paper.py), after the per-task sections."""
    from clbench.paper import html_section  # clbench.paper imports this module

    return html_section(values)


def writable(out: Path) -> None:
    """The output folder exists or can be made, and takes files: checked before any work."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as error:
        raise ClbenchError(f"cannot write the leaderboard to {out}: {error.strerror or error}") from None


CURVES = {"loss": "training loss (task)", "grad_norm": "gradient norm (before clipping)", "lr": "learning rate"}
CURVE_POINTS = 200  # a curve is drawn as at most this many bin means: every step of long runs would make MBs of SVG
SHOWN_EXAMPLES = 3  # per run and set, in the examples section
SHOWN_CHARACTERS = 120  # of an example's text


def curves_plot(curves: pd.DataFrame, task_runs: pd.DataFrame, salt: str) -> str | None:
    """A task's training curves, one panel per quantity: a faint line per run (seed) and the mean over
    a row's seeds in bold, one colour per row. Steps run on through a sequential task's stages."""
    runs, rows = table_rows(task_runs)
    part = curves.merge(runs, on="run_id").sort_values(["run_id", "stage", "step"])
    if part.empty:
        return None
    part["x"] = part.groupby("run_id").cumcount()
    width = int(part.x.max()) + 1
    part["bin"] = part.x * min(CURVE_POINTS, width) // width
    binned = part.groupby(["row", "run_id", "bin"])[["x", *CURVES]].mean().reset_index()
    with rc_context(SVG_STYLE):
        fig = Figure(figsize=(5.2 * len(CURVES), 3.6))
        axes = fig.subplots(1, len(CURVES))
        for row, lines in binned.groupby("row"):
            colour, label = f"C{row % 10}", rows.label[row]
            mean = lines.groupby("bin")[["x", *CURVES]].mean()
            for ax, column in zip(axes, CURVES):
                for _, run in lines.groupby("run_id"):
                    ax.plot(run.x, run[column], color=colour, alpha=0.25, lw=0.8)
                ax.plot(mean.x, mean[column], color=colour, lw=1.6, label=label)
        for ax, (column, name) in zip(axes, CURVES.items()):
            if column != "loss":  # lrs and norms of different methods lie orders of magnitude apart
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # default log labels are mathtext
                ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel("training step")
            ax.set_ylabel(name)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=6)
        return svg(fig, salt)


def table_rows(task_runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(run_id → row number, seed), and per row number its label (point_labels): a row is a KEY, as in the tables."""
    runs = task_runs[["run_id", "seed", *KEY]].assign(row=task_runs.groupby(KEY, dropna=False, sort=True).ngroup())
    rows = runs.drop_duplicates("row").sort_values("row").set_index("row")
    return runs[["run_id", "seed", "row"]], rows.assign(label=point_labels(rows))


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


def heatmaps(matrix: pd.DataFrame, task_runs: pd.DataFrame, t: int) -> list[str]:
    joined = matrix.merge(task_runs[["run_id", "method", "model", "settings"]], on="run_id")
    return [
        heatmap(cells, f"{method} · {model}", metric, f"{t}-heat-{i}")
        for i, ((method, model, setting, metric), cells) in enumerate(
            joined.groupby(["method", "model", "settings", "metric"])
        )
    ]


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
    columns = ["run_id", "task", "method", "model", "seed", "status", "reason"]
    return kept_out[columns].map(esc).to_html(index=False, escape=False, border=0, classes="sortable failed")


def page_template() -> Template:
    # string.Template: $name placeholders, so the page's CSS and JS braces need no escaping
    return Template(resources.files("clbench").joinpath("leaderboard.html").read_text(encoding="utf-8"))
