"""The leaderboard's figures, each a matplotlib Figure written as inline SVG (text escaped by matplotlib's writer).

Per task: target quality against forgetting with the Pareto front (tradeoff_plot), metrics against n_train
where a task sweeps it (sample_efficiency_plot), gap_closed and N*(s) where it sweeps dictionary_size
(dictionary_sweep_plot), a heatmap of the stage × task matrix per sequential run group, and training curves.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from clbench.report.format import arrow, fmt, point_labels, table_rows
from clbench.report.load import KEY, Board, direction

QUALITY = ("target_acc", "target_loss")  # what the plots put against forgetting, the first that ranks the runs
FORGETTING = ("forgetting_oldvocab", "forgetting_full")
SVG_STYLE = {"svg.fonttype": "none", "text.parse_math": False, "figure.dpi": 72, "font.size": 9}
CURVES = {"loss": "training loss (task)", "grad_norm": "gradient norm (before clipping)", "lr": "learning rate"}
CURVE_POINTS = 200  # a curve is drawn as at most this many bin means: every step of long runs would make MBs of SVG


def task_plots(board: Board, t: int, task: str, cells: pd.DataFrame, metrics: list[str]) -> list[str | None]:
    """The figures of the t-th task (None where one has nothing to draw); cells, metrics: its table (format.wide)."""
    part = board.table[board.table.task == task]
    quality = quality_metric(part)
    plots = [
        tradeoff_plot(tradeoff_points(part, cells, quality, metrics), quality, f"{t}-tradeoff"),
        sample_efficiency_plot(part, quality, f"{t}-sweep"),
        dictionary_sweep_plot(board.values[board.values.task == task], f"{t}-law"),
    ]
    if board.matrix is not None:
        plots += heatmaps(board.matrix, board.runs[board.runs.task == task], t)
    if board.curves is not None:
        plots.append(curves_plot(board.curves, board.task_runs(task), f"{t}-curves"))
    return plots


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


def tradeoff_points(part: pd.DataFrame, cells: pd.DataFrame, quality: str | None, metrics: list[str]) -> pd.DataFrame:
    """Per row of a task's table (cells): its KEY, label (point_labels), and its means of quality and of the
    FORGETTING metrics, where the task has them."""
    points = cells[KEY].assign(label=point_labels(cells))
    for metric in (quality, *FORGETTING):
        if metric in metrics:
            means = part[part.metric == metric].set_index(KEY)["mean"]
            points[metric] = [means.get(tuple(r), np.nan) for r in cells[KEY].itertuples(index=False)]
    return points


def svg(fig: Figure, salt: str) -> str:
    """The figure as inline SVG; `salt` keeps element ids unique across the figures of one page."""
    buffer = io.StringIO()
    with rc_context({"svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg", metadata={"Date": None}, bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


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
    # clbench.sweep imports the protocol, and with it transformers: loaded only where a task reports gap_closed
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
        law.set_ylabel(f"N*: smallest n_train from which gap_closed stays ≥ {TARGET_GAP}")
        for ax in (curves, law):
            ax.legend(fontsize=6)
            ax.grid(alpha=0.3)
        return svg(fig, salt)


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


def heatmaps(matrix: pd.DataFrame, task_runs: pd.DataFrame, t: int) -> list[str]:
    joined = matrix.merge(task_runs[["run_id", "method", "model", "settings"]], on="run_id")
    return [
        heatmap(cells, f"{method} · {model}", metric, f"{t}-heat-{i}")
        for i, ((method, model, setting, metric), cells) in enumerate(
            joined.groupby(["method", "model", "settings", "metric"])
        )
    ]


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
