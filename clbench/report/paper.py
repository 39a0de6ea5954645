"""The paper's three tables beside clbench's results: `clbench report --paper [--db DB] [--out FILE.md]`.

*Memory as a Markov Matrix* (ICML 2026) publishes one table per task family; TABLES holds its numbers, its
model and scale, once. A row of a comparison is one (task, model, profile, n_train) and method, from the
leaderboard's run groups (KEY in clbench/report/load.py), so runs of different profiles are never pooled.
Absolute numbers are not comparable across models and scales; a verdict is about a direction only: the sign of a
method's difference to the reference method (ET) in the paper against clbench's on the same rows, tested over
seeds with Welch's t (clbench/stats.py). The leaderboard page carries the same tables (html_section).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from clbench.errors import ClbenchError
from clbench.records import open_store
from clbench.report import sizes
from clbench.report.format import esc, fmt, fmt_ci, fmt_lr, md
from clbench.report.load import load
from clbench.stats import LEVEL, comparison, finite, group_p, mean_ci

REFERENCE = "et"  # every claim of the paper's tables compares a method with ET
HOLDS, REVERSED, NOT_SIGNIFICANT, NOT_RUN = "direction holds", "reversed", "not significant", "not run"
ONE_SEED = f"{NOT_SIGNIFICANT} (one seed, untested)"
NO_CLAIM = "—"  # the paper publishes no pair of numbers to take a direction from
NOT_MEASURED = "n/a"  # the method's runs have no such measure: after_new_loss of the control, which adds no token
PAPER_SCALE = "paper scale (GPU)"
CPU_SCALE = "CPU scale"
PAPER = "Memory as a Markov Matrix: Sample Efficient Knowledge Expansion via Token-to-Dictionary Mapping (ICML 2026)"


@dataclass(frozen=True)
class BaseNumber:
    """A number the paper gives for the base model: no verdict, only clbench's counterpart beside it."""

    label: str
    value: float
    metric: str | None  # clbench's counterpart (a property of the base, the same in every run); None: not measured
    note: str = ""


@dataclass(frozen=True)
class Table:
    number: int
    title: str
    model: str  # the paper's model, as clbench's `--profile paper` names it
    scale: str
    tasks: tuple[str, ...]  # the clbench tasks that redo it
    methods: tuple[str, ...]  # its methods, in its order, and after et those clbench adds without a paper number
    metrics: dict[str, str]  # clbench metric → the paper's column it is compared with
    published: dict[str, dict[str, dict[str, float]]]  # task → method → metric → the paper's number
    shown: tuple[str, ...] = ()  # clbench-only columns: numbers, no paper value, no verdict
    # clbench metric → the compared metric whose paper numbers give its direction: another measure of the same
    # claim, judged on the paper's sign but shown without a paper number (they are not in its units)
    measured_also: dict[str, str] = field(default_factory=dict)
    base: dict[str, tuple[BaseNumber, ...]] = field(default_factory=dict)  # task → the paper's base-model numbers
    note: str = ""


DRIFT_NOTE = (
    "forgetting_oldvocab is a loss difference on old text: a method can lower it by moving towards the old "
    "text's domain without keeping its transitions. drift_kl_oldvocab (mean KL(p_base ‖ p_adapted) per old-text "
    "position, old-vocabulary softmax) measures the claim itself, whether each old transition p(· | x<t) was "
    "kept: it is 0 exactly when it was, and no domain shift lowers it. The paper's forgetting direction is "
    "judged on both."
)
SIZES_HEADING = "Model size: the paper's scaling claims"
SIZES_INTRO = (
    "The paper reports that ET's sample complexity does not depend on the model's dimension and motivates ET by "
    "full fine-tuning forgetting more on larger models. clbench tests both on a family of arithmetic bases, one "
    "recipe at three widths (clbench/arith_llama.py FAMILY): et's N* (the smallest n_train from which "
    "gap_closed stays ≥ 0.5 at every larger n_train swept, per seed; et's lr beside it) and fft's forgetting at its tuned lr, as addition lost (old_skill_acc_delta) and as "
    "transition drift on old text (drift_kl_oldvocab), the widest base against the narrowest. A claim of no dependence is supported only as far as a difference is not found: the "
    "confidence intervals say how large one could be."
)
AFTER_THE_PAPER = (
    "distill (Token Distillation, Dobler et al. 2025: new input rows trained so that the frozen model's hidden "
    "states match its own on the original spelling) came after the paper: its row stands beside et with no paper "
    "number and no verdict."
)
CONTROL = (
    "nonew, the control (issue 37), trains as fft does on the task's training text with no new token (each new "
    "token's text as the base tokenizes it): what adapting to the corpus does without new states. after_new_loss "
    "is the new tokens' own measure, the loss of the 1 to 4 tokens after each new token (n/a where a method adds "
    "none). Both are shown with no paper number and no verdict."
)

# The paper's numbers in clbench's units: accuracies as fractions (the paper's % / 100), losses in nats per token.
TABLES = (
    Table(
        number=1,
        title="Arithmetic: a new operator, a <spec> b = a*b",
        model="meta-llama/Llama-3.2-3B",
        scale="the paper's set-up (clbench: `--profile paper`)",
        tasks=("arithmetic",),
        methods=("et", "fft"),
        metrics={
            "target_acc": "<spec> accuracy",
            "old_skill_acc": "addition accuracy after training",
            "old_skill_acc_delta": "addition accuracy, after − before",
        },
        published={
            "arithmetic": {
                "et": {"target_acc": 0.814, "old_skill_acc": 1.0, "old_skill_acc_delta": 0.0},
                "fft": {"target_acc": 0.772, "old_skill_acc": 0.0, "old_skill_acc_delta": -1.0},
            }
        },
        base={
            "arithmetic": (
                BaseNumber("accuracy on a*b", 0.635, "target_acc_oracle"),
                BaseNumber("addition accuracy", 1.0, "old_skill_acc_base"),
            )
        },
    ),
    Table(
        number=2,
        title="Pseudo-words: invented words standing for English words",
        model="meta-llama/Llama-3.1-8B",
        scale="N = 1000 training sentences, 100 pseudo-words, WikiText-103 (clbench: `--profile paper`)",
        tasks=("pseudowords",),
        methods=("et", "distill", "fft", "lora", "pt", "nonew"),
        metrics={"target_loss": "test loss", "forgetting_oldvocab": "WikiText forgetting"},
        shown=("forgetting_full", "after_new_loss"),
        measured_also={"drift_kl_oldvocab": "forgetting_oldvocab"},
        published={
            "pseudowords": {
                "et": {"target_loss": 2.42, "forgetting_oldvocab": 0.0},
                "fft": {"target_loss": 4.40, "forgetting_oldvocab": 1.24},
                "lora": {"target_loss": 7.63, "forgetting_oldvocab": 8.36},
                "pt": {"target_loss": 3.79, "forgetting_oldvocab": 0.69},
            }
        },
        base={"pseudowords": (BaseNumber("WikiText loss", 2.42, "old_loss_base"),)},
        note=(
            "The paper's forgetting is compared with forgetting_oldvocab (old-vocabulary softmax), under which "
            "ET's forgetting is 0 by construction, as the paper's is; forgetting_full (the softmax over old and "
            "new tokens) is shown beside it without a paper number or verdict. "
            + DRIFT_NOTE
            + " "
            + AFTER_THE_PAPER
            + " "
            + CONTROL
        ),
    ),
    Table(
        number=3,
        title="Cross-lingual vocabulary expansion",
        model="Qwen/Qwen2.5-3B",
        scale="the paper's set-up (clbench: `--profile paper`)",
        tasks=("xling-es", "xling-ar", "xling-de"),
        methods=("et", "distill", "fft", "nonew"),
        metrics={"target_loss": "loss", "forgetting_oldvocab": "English forgetting"},
        shown=("forgetting_full", "after_new_loss"),
        measured_also={"drift_kl_oldvocab": "forgetting_oldvocab"},
        published={
            "xling-es": {
                "et": {"target_loss": 2.30, "forgetting_oldvocab": -0.04},
                "fft": {"target_loss": 5.56, "forgetting_oldvocab": 9.83},
            },
            "xling-ar": {"et": {"target_loss": 2.82, "forgetting_oldvocab": 0.0}},
        },
        note=(
            "The paper publishes FFT for Spanish only and nothing for German (xling-de): those cells have no "
            "direction to test. Its forgetting is compared with forgetting_oldvocab; forgetting_full is shown "
            "beside it without a paper number or verdict. " + DRIFT_NOTE + " " + AFTER_THE_PAPER + " " + CONTROL
        ),
    ),
)

HEADER = (
    f"Published numbers of *{PAPER}* beside clbench's results. Absolute numbers are not comparable across "
    "models and scales (clbench's CPU-scale rows use small offline models): they are shown side by side, and the "
    "verdicts are about directions only. A verdict takes the sign of a method's difference to et in the paper "
    "and compares it with clbench's difference between the same two methods on the same (task, model, profile, "
    f"n_train), over seeds with Welch's t-test (p < {1 - LEVEL:.2g}): **{HOLDS}**: clbench's difference has "
    f"the paper's sign and is significant; **{REVERSED}**: the opposite sign, significant; **{NOT_SIGNIFICANT}**: "
    f"p ≥ {1 - LEVEL:.2g}, or one seed on either side (untested); **{NOT_RUN}**: no finished run of one of the "
    f"two methods; {NO_CLAIM}: the paper gives no pair of numbers. Scale: {PAPER_SCALE} for `--profile paper` "
    f"rows, {CPU_SCALE} for `--profile cpu` and the task's default; runs of different profiles are never pooled. "
    "clbench cells: mean ± half-width of the 95 % confidence interval over seeds (no ± with one seed). "
    "Accuracies are fractions (the paper's % / 100). Only reported runs count (tuning runs on the validation "
    "split never do)."
)


# ---------------------------------------------------------------- verdicts (pure)


def paper_sign(value: float | None, reference: float | None) -> int | None:
    """The sign of the paper's (method − reference) on a metric; None without both numbers or with equal ones."""
    if value is None or reference is None or value == reference:
        return None
    return 1 if value > reference else -1


def direction_verdict(
    values: Sequence[float],
    reference: Sequence[float],
    sign: int,
    draws: Sequence | None = None,
    reference_draws: Sequence | None = None,
) -> str:
    """clbench's runs of a method and of the reference against the paper's sign of their difference, tested by
    clbench.stats.group_p (paired by data draw where both groups pool draws; draws: each value's draw)."""
    x, y = finite(values), finite(reference)
    if len(x) == 0 or len(y) == 0:
        return NOT_RUN
    p, _ = group_p(values, reference, draws, reference_draws)
    if p is None:
        return ONE_SEED
    if p >= 1 - LEVEL:
        return NOT_SIGNIFICANT
    return HOLDS if np.sign(x.mean() - y.mean()) == sign else REVERSED


def verdict_cell(
    values: Sequence[float],
    reference: Sequence[float],
    sign: int | None,
    draws: Sequence | None = None,
    reference_draws: Sequence | None = None,
) -> str:
    """A verdict with its test's p where one was computed (and the test, where it is paired by draw); NO_CLAIM
    where the paper gives no direction."""
    if sign is None:
        return NO_CLAIM
    text = direction_verdict(values, reference, sign, draws, reference_draws)
    p, n = group_p(values, reference, draws, reference_draws) if text != NOT_RUN else (None, 0)
    if p is None:
        return text
    test = f", {comparison(n)}" if n else ""
    return f"{text} (p = {p:.2g}{test})"


def claims(table: Table) -> list[str]:
    """The paper's directions, e.g. "xling-es target_loss: fft > et (5.56 vs 2.3)"."""
    lines = []
    for task, methods in table.published.items():
        reference = methods.get(REFERENCE, {})
        for method in table.methods:
            for metric in table.metrics:
                sign = paper_sign(methods.get(method, {}).get(metric), reference.get(metric))
                if method != REFERENCE and sign is not None:
                    relation = ">" if sign > 0 else "<"
                    numbers = f"{fmt(methods[method][metric])} vs {fmt(reference[metric])}"
                    lines.append(f"{task} {metric}: {method} {relation} {REFERENCE} ({numbers})")
                    lines += [
                        f"{task} {also}: {method} {relation} {REFERENCE} (the same claim, measured as {also})"
                        for also, compared in table.measured_also.items()
                        if compared == metric
                    ]
    return lines


def scale(profile: str | None) -> str:
    return PAPER_SCALE if profile == "paper" else CPU_SCALE


def profile_label(model: str, profile: str) -> str:
    """A block's profile as the tables show it: "default" for the task's own, "—" where nobody ran the task."""
    return profile or ("—" if model == "—" else "default")


# ---------------------------------------------------------------- comparison tables


def rows(table: Table, values: pd.DataFrame) -> pd.DataFrame:
    """From load()'s values, one row per (task, model, profile, n_train) × method run group of the table's tasks
    and methods; a method the block lacks gets a row of "not run" cells, a task nobody ran one such row per method."""
    out = []
    for task in table.tasks:
        part = values[(values.task == task) & values.method.isin(table.methods)]
        if part.empty:
            out += [
                block_row(table, task, ("—", "", None), method, None, None, is_reference=method == REFERENCE)
                for method in table.methods
            ]
            continue
        for (model, profile, n_train), block in compared_blocks(part):
            # a task's version changes what its measures read: a block compares on its newest version only (a
            # database merged from tables of two versions holds both; the older is a superseded measurement)
            block = block[block.task_version == block.task_version.max()]
            groups = dict(list(block.groupby(["method", "settings"], dropna=False)))
            reference = pick_reference(groups)
            for method in table.methods:
                mine = sorted(k for k in groups if k[0] == method) or [None]
                for key in mine:
                    out.append(
                        block_row(
                            table,
                            task,
                            (model, profile, n_train),
                            method,
                            None if key is None else groups[key],
                            None if reference is None else groups[reference],
                            is_reference=method == REFERENCE and key == reference,
                        )
                    )
    return pd.DataFrame(out)


def compared_blocks(part: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """The (model, profile, n_train) blocks of one task's runs that a comparison is made on. Where some n_train of a
    (model, profile) holds two of the table's methods, its one-method n_trains are a sweep's points (et's N* curve,
    the size section), not comparisons: a row of "not run" for every other method there would be noise."""
    blocks = list(part.groupby(["model", "profile", "n_train"], dropna=False))
    compared = {key[:2] for key, block in blocks if block.method.nunique() > 1}
    return [(key, block) for key, block in blocks if key[:2] not in compared or block.method.nunique() > 1]


def pick_reference(groups: dict[tuple, pd.DataFrame]) -> tuple | None:
    """The reference method's run group: of several (other lrs or settings), the one with most seeds, ties by settings."""
    candidates = [k for k in groups if k[0] == REFERENCE]
    if not candidates:
        return None
    return min(candidates, key=lambda k: (-groups[k].run_id.nunique(), str(k[1])))


def draws_label(runs: pd.DataFrame) -> str:
    """The seeds of a run group, "0,1,2"; "0,1,2 × data 0,1,2" where it pools data draws (load.DRAWS)."""
    label = ",".join(str(s) for s in sorted(runs.seed.unique()))
    data = sorted(runs.data_seed.dropna().unique()) if "data_seed" in runs else []
    return label + (f" × data {','.join(str(int(d)) for d in data)}" if len(data) > 1 else "")


def block_row(
    table: Table,
    task: str,
    block: tuple,
    method: str,
    runs: pd.DataFrame | None,
    reference: pd.DataFrame | None,
    *,
    is_reference: bool = False,
) -> dict:
    """One method's row of a (model, profile, n_train) block: per metric the paper's number, clbench's and the
    verdict against the block's reference group; another group of the reference method has no direction."""
    model, profile, n_train = block
    published = table.published.get(task, {})
    row = {
        "task": task,
        "model": model,
        "profile": profile_label(model, profile),
        "scale": "—" if model == "—" else scale(profile),
        "n_train": "" if n_train is None or pd.isna(n_train) else str(int(n_train)),
        "method": method,
        "lr": "" if runs is None else fmt_lr(runs.lr.iloc[0]),
        "seeds": "" if runs is None else draws_label(runs),
    }
    for metric in (*table.metrics, *table.measured_also, *table.shown):
        mine, draws = run_values(runs, metric)
        compared = metric if metric in table.metrics else table.measured_also.get(metric)
        paper = published.get(method, {}).get(compared)
        if metric in table.metrics:
            row[f"{metric}: paper"] = "" if paper is None else fmt(paper)
        row[f"{metric}: clbench"] = fmt_ci(*mean_ci(mine)) if len(mine) else NOT_RUN if runs is None else NOT_MEASURED
        if compared is not None:
            sign = paper_sign(paper, published.get(REFERENCE, {}).get(compared))
            if method == REFERENCE:
                sign = None  # et against et: nothing the paper claims
            theirs, their_draws = run_values(reference, metric)
            verdict = verdict_cell(mine, theirs, sign, draws, their_draws)
            row[f"{metric}: verdict"] = "(reference)" if is_reference else verdict
    return row


def run_values(runs: pd.DataFrame | None, metric: str) -> tuple[np.ndarray, list]:
    """A run group's finite values of `metric` and each one's data draw."""
    if runs is None:
        return np.array([]), []
    part = runs[(runs.metric == metric) & runs.value.notna()]
    return part.value.to_numpy(float), part.data_seed.tolist() if "data_seed" in part else [None] * len(part)


def base_rows(table: Table, values: pd.DataFrame) -> pd.DataFrame:
    """The paper's base-model numbers beside clbench's mean of their counterpart per (task, model, profile)."""
    out = []
    for task, numbers in table.base.items():
        part = values[values.task == task]
        blocks = list(part.groupby(["model", "profile"], dropna=False)) if len(part) else [(("—", ""), part)]
        for number in numbers:
            for (model, profile), block in blocks:
                found = finite(block[block.metric == number.metric].value) if number.metric else np.array([])
                clbench = (fmt(found.mean()) if len(found) else NOT_RUN) if number.metric else number.note
                out.append(
                    {
                        "task": task,
                        "base model number": number.label,
                        "paper": fmt(number.value),
                        "clbench metric": number.metric or "—",
                        "model": model,
                        "profile": profile_label(model, profile),
                        "clbench": clbench,
                    }
                )
    return pd.DataFrame(out)


def heading(table: Table) -> str:
    return f"Table {table.number}: {table.title}"


def intro(table: Table) -> list[str]:
    compared = "; ".join(
        [f"{metric} ↔ the paper's {column}" for metric, column in table.metrics.items()]
        + [f"{also} ↔ the paper's {table.metrics[of]} (its direction)" for also, of in table.measured_also.items()]
    )
    lines = [
        f"Paper: {table.model}, {table.scale}. clbench tasks: {', '.join(table.tasks)}.",
        f"Compared: {compared}.",
    ]
    return lines + ([table.note] if table.note else [])


# ---------------------------------------------------------------- output


def markdown(values: pd.DataFrame, db: str | Path) -> str:
    parts = ["# clbench against the paper's tables", "", HEADER, "", f"Results database: {md(db)}.", ""]
    for table in TABLES:
        parts += [f"## {prose(heading(table))}", ""]
        parts += [" ".join(prose(line) for line in intro(table)), ""]
        parts += ["The paper's directions (each method against et):", ""]
        parts += [f"- {prose(line)}" for line in claims(table)] + [""]
        parts += [md_table(rows(table, values)), ""]
        if table.base:
            parts += ["Base model (no verdict):", "", md_table(base_rows(table, values)), ""]
    parts += [f"## {SIZES_HEADING}", "", prose(SIZES_INTRO), ""]
    parts += [f"- {prose(line)}" for line in sizes.verdicts(values, direction_verdict)] + [""]
    parts += [md_table(sizes.size_rows(values)), ""]
    return "\n".join(parts)


def prose(text: str) -> str:
    """Markdown text of this module's own sentences: <, > and & escaped (Markdown renders inline HTML), quotes kept."""
    return html.escape(text, quote=False)


def md_table(frame: pd.DataFrame) -> str:
    return frame.map(md).rename(columns=md).to_markdown(index=False)


def html_section(values: pd.DataFrame) -> str:
    """The same tables as one self-contained section of the leaderboard page, every string through `esc`."""
    parts = [f'<section><h2 id="paper">The paper\'s tables</h2><p class="note">{html_prose(HEADER)}</p>']
    for table in TABLES:
        parts.append(f"<h3>{esc(heading(table))}</h3>")
        parts += [f'<p class="note">{html_prose(line)}</p>' for line in intro(table)]
        parts.append("<ul>" + "".join(f"<li>{esc(line)}</li>" for line in claims(table)) + "</ul>")
        parts.append(f'<div class="scroll">{html_table(rows(table, values))}</div>')
        if table.base:
            parts.append(
                f'<p class="note">Base model (no verdict):</p><div class="scroll">{html_table(base_rows(table, values))}</div>'
            )
    parts.append(f'<h3>{esc(SIZES_HEADING)}</h3><p class="note">{html_prose(SIZES_INTRO)}</p>')
    parts.append(
        "<ul>" + "".join(f"<li>{esc(line)}</li>" for line in sizes.verdicts(values, direction_verdict)) + "</ul>"
    )
    parts.append(f'<div class="scroll">{html_table(sizes.size_rows(values))}</div>')
    return "".join(parts) + "</section>"


def html_prose(text: str) -> str:
    """This module's Markdown sentences as HTML: escaped first, then `code` and **bold** marked up."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(text))
    text = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", text)


def html_table(frame: pd.DataFrame) -> str:
    return frame.map(esc).rename(columns=esc).to_html(index=False, escape=False, border=0, classes="paper")


def report(db: str | Path, out: str | Path | None = None) -> str:
    """`clbench report --paper`: the Markdown, written to `out` if given; refused on a DB without finished runs."""
    values = load(open_store(db))[0]
    if values.empty:
        raise ClbenchError(f"results database {db} has no finished runs to compare with the paper")
    text = markdown(values, db)
    if out is not None:
        try:
            Path(out).write_text(text, encoding="utf-8")
        except OSError as error:
            raise ClbenchError(f"cannot write the report to {out}: {error.strerror or error}") from None
    return text
