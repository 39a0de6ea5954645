"""`clbench report --paper` and the leaderboard's paper section, from a tiny results DB written through Store.record:
the verdicts' exact strings, the table cells, profiles kept apart, tuning runs left out, one-line errors."""

import math

import pandas as pd
import pytest
from leaderboard_db import EVIL, record

from clbench.cli import main
from clbench.report.leaderboard import build
from clbench.report.load import load
from clbench.report.paper import (
    HOLDS,
    NO_CLAIM,
    NOT_MEASURED,
    NOT_RUN,
    NOT_SIGNIFICANT,
    ONE_SEED,
    REVERSED,
    TABLES,
    claims,
    direction_verdict,
    draws_label,
    paper_sign,
    report,
    rows,
    verdict_cell,
)
from clbench.store import Store

ET_ACC, FFT_ACC = [0.80, 0.82, 0.84], [0.60, 0.62, 0.58]


def test_the_paper_sign_is_that_of_method_minus_et_and_absent_without_two_different_numbers():
    assert paper_sign(0.772, 0.814) == -1  # Table 1: fft's <spec> accuracy below et's
    assert paper_sign(4.40, 2.42) == 1  # Table 2: fft's test loss above et's
    assert paper_sign(None, 2.82) is None and paper_sign(2.3, None) is None  # Table 3: no FFT for Arabic
    assert paper_sign(0.0, 0.0) is None


def test_each_verdict_from_seed_values():
    assert direction_verdict(FFT_ACC, ET_ACC, -1) == HOLDS == "direction holds"
    assert direction_verdict(FFT_ACC, ET_ACC, 1) == REVERSED == "reversed"
    assert direction_verdict([3.0, 3.5, 2.6], [3.0, 3.1, 3.2], 1) == NOT_SIGNIFICANT == "not significant"
    assert direction_verdict([4.0], [3.0, 3.1, 3.2], 1) == ONE_SEED == "not significant (one seed, untested)"
    assert direction_verdict([], [3.0], 1) == direction_verdict([math.nan], [3.0], 1) == NOT_RUN == "not run"
    # et's forgetting is 0 on every seed: a constant side is still tested (Welch's t against fft's spread)
    assert direction_verdict([0.5, 0.6, 0.7], [0.0, 0.0, 0.0], 1) == HOLDS


def test_a_verdict_cell_carries_welchs_p_where_one_was_computed():
    # means 0.60 vs 0.82, both sd 0.02: t = 0.22 / √(2 · 0.02² / 3) = 13.47 on 4 df → p = 0.000176
    assert verdict_cell(FFT_ACC, ET_ACC, -1) == "direction holds (p = 0.00018)"
    assert verdict_cell(FFT_ACC, ET_ACC, 1) == "reversed (p = 0.00018)"
    assert verdict_cell([4.0], [3.0, 3.1], 1) == ONE_SEED
    assert verdict_cell([], [3.0, 3.1], 1) == NOT_RUN
    assert verdict_cell(FFT_ACC, ET_ACC, None) == NO_CLAIM == "—"


def test_groups_pooling_data_draws_are_judged_paired_by_draw_and_say_so():
    # fft − et per draw 0.5, 0.7, 0.6 (one seed a draw): paired t on 2 df, p = 0.00913; the draw effect (et 5.0 /
    # 5.2 / 5.1) never enters. Welch over the same runs: p = 0.0196.
    et, fft, draws = [5.0, 5.2, 5.1], [5.5, 5.9, 5.7], [0, 1, 2]
    assert verdict_cell(fft, et, 1, draws, draws) == "direction holds (p = 0.0091, paired by 3 data draws)"
    assert verdict_cell(fft, et, -1, draws, draws) == "reversed (p = 0.0091, paired by 3 data draws)"
    assert verdict_cell(fft, et, 1) == "direction holds (p = 0.02)"


def test_the_claims_come_from_the_published_numbers():
    assert claims(TABLES[2]) == [
        "xling-es target_loss: fft > et (5.56 vs 2.3)",
        "xling-es forgetting_oldvocab: fft > et (9.83 vs -0.04)",
        "xling-es drift_kl_oldvocab: fft > et (the same claim, measured as drift_kl_oldvocab)",
    ]
    assert claims(TABLES[0])[0] == "arithmetic target_acc: fft < et (0.772 vs 0.814)"
    assert len(claims(TABLES[1])) == 3 * 3  # fft, lora, pt against et on test loss, forgetting and drift


def paper_db(path) -> Store:
    """arithmetic: fft below et on all three metrics (holds); pseudowords at --profile cpu: fft's loss below et's
    (reversed), its forgetting above (holds), lora not significant, pt one seed, plus a tuning run that must not
    count and a --profile paper et run of its own; xling-de (no paper numbers) with an injected model name."""
    store = Store(path)
    arith = {"et": [(a, 1.0, 0.0) for a in ET_ACC], "fft": list(zip(FFT_ACC, [0.30, 0.40, 0.35], [-0.7, -0.6, -0.65]))}
    for method, seeds in arith.items():
        for seed, (acc, skill, delta) in enumerate(seeds):
            values = {
                "target_acc": acc,
                "old_skill_acc": skill,
                "old_skill_acc_delta": delta,
                "old_skill_acc_base": 1.0,
            }
            record(store, f"a-{method}{seed}", "arithmetic", method, "builtin:arith-llama", seed, values)
    words = {  # target_loss, forgetting_oldvocab, forgetting_full, drift_kl_oldvocab per seed
        "et": [(3.0, 0.0, 0.2, 0.0), (3.1, 0.0, 0.3, 0.0), (3.2, 0.0, 0.4, 0.0)],
        "distill": [(2.8, 0.0, 0.1, 0.0), (2.9, 0.0, 0.2, 0.0)],  # after the paper: no paper number, no verdict
        "fft": [(2.0, 0.5, 0.5, 0.02), (2.1, 0.6, 0.6, 0.03), (2.2, 0.7, 0.7, 0.04)],
        "lora": [(3.0, 0.1, 0.1, -0.02), (3.5, 0.1, 0.2, -0.03), (2.6, 0.2, 0.2, -0.04)],  # made up: below et's
        "pt": [(4.0, 0.3, 5.0, 0.5)],
        "nonew": [(3.6, 0.2, 0.2, 0.1), (3.8, 0.3, 0.3, 0.2)],  # the control: no paper number, no verdict
    }
    after_new = {"et": [4.0, 4.1, 4.2], "fft": [4.5, 4.6, 4.7]}  # the control adds no token: it has none
    small = "builtin:smollm2-135m"
    for method, seeds in words.items():
        for seed, (loss, fo, ff, kl) in enumerate(seeds):
            values = {"target_loss": loss, "forgetting_oldvocab": fo, "forgetting_full": ff, "old_loss_base": 3.5}
            values["drift_kl_oldvocab"] = kl
            if method in after_new:
                values["after_new_loss"] = after_new[method][seed]
            record(store, f"w-{method}{seed}", "pseudowords", method, small, seed, values, profile="cpu", n_train=256)
    tune = {"target_loss": 99.0, "forgetting_oldvocab": 99.0}
    record(store, "w-tune", "pseudowords", "fft", small, 3, tune, profile="cpu", n_train=256, split="validation")
    paper = {"target_loss": 2.5, "forgetting_oldvocab": 0.0, "old_loss_base": 2.4}
    record(store, "w-paper", "pseudowords", "et", "meta-llama/Llama-3.1-8B", 0, paper, profile="paper", n_train=1000)
    for method, loss in (("et", 2.0), ("fft", 2.5)):
        record(store, f"de-{method}", "xling-de", method, EVIL, 0, {"target_loss": loss, "forgetting_oldvocab": 0.0})
    return store


@pytest.fixture
def values(tmp_path):
    return load(paper_db(tmp_path / "r.duckdb"))[0]


def cells(frame, columns):
    return [tuple(r) for r in frame[columns].itertuples(index=False)]


def test_arithmetic_rows_put_the_papers_numbers_beside_clbenchs_with_verdicts(values):
    table = rows(TABLES[0], values)
    assert cells(table, ["model", "profile", "scale", "n_train", "method", "seeds"]) == [
        ("builtin:arith-llama", "default", "CPU scale", "200", "et", "0,1,2"),
        ("builtin:arith-llama", "default", "CPU scale", "200", "fft", "0,1,2"),
    ]
    assert cells(table, ["target_acc: paper", "target_acc: clbench", "target_acc: verdict"]) == [
        ("0.814", "0.820 ± 0.050", "(reference)"),
        ("0.772", "0.600 ± 0.050", "direction holds (p = 0.00018)"),
    ]
    assert cells(
        table, ["old_skill_acc_delta: paper", "old_skill_acc_delta: clbench", "old_skill_acc_delta: verdict"]
    ) == [
        ("0", "0 ± 0", "(reference)"),
        ("-1", "-0.65 ± 0.12", "direction holds (p = 0.002)"),
    ]


def test_pseudoword_rows_keep_profiles_apart_and_leave_tuning_runs_out(values):
    table = rows(TABLES[1], values)
    assert cells(table, ["model", "profile", "scale", "n_train", "method", "seeds"]) == [
        ("builtin:smollm2-135m", "cpu", "CPU scale", "256", m, s)
        for m, s in (("et", "0,1,2"), ("distill", "0,1"), ("fft", "0,1,2"), ("lora", "0,1,2"), ("pt", "0"))
        + (("nonew", "0,1"),)
    ] + [
        ("meta-llama/Llama-3.1-8B", "paper", "paper scale (GPU)", "1000", m, "0" if m == "et" else "")
        for m in ("et", "distill", "fft", "lora", "pt", "nonew")
    ]
    assert cells(table, ["target_loss: paper", "target_loss: clbench", "target_loss: verdict"]) == [
        ("2.42", "3.10 ± 0.25", "(reference)"),
        ("", "2.85 ± 0.64", NO_CLAIM),
        ("4.4", "2.10 ± 0.25", "reversed (p = 0.00026)"),  # not 99: the validation-split run never counts
        ("7.63", "3.0 ± 1.1", "not significant (p = 0.82)"),
        ("3.79", "4", ONE_SEED),
        ("", "3.7 ± 1.3", NO_CLAIM),
        ("2.42", "2.5", "(reference)"),
        ("", NOT_RUN, NO_CLAIM),
        ("4.4", NOT_RUN, NOT_RUN),
        ("7.63", NOT_RUN, NOT_RUN),
        ("3.79", NOT_RUN, NOT_RUN),
        ("", NOT_RUN, NO_CLAIM),
    ]
    assert table["forgetting_oldvocab: verdict"].tolist()[:6] == [
        "(reference)",
        NO_CLAIM,
        "direction holds (p = 0.0091)",
        "not significant (p = 0.057)",
        ONE_SEED,
        NO_CLAIM,
    ]
    # the new tokens' own measure beside them, n/a for runs without it (the control adds no token)
    assert table["after_new_loss: clbench"].tolist()[:6] == [
        "4.10 ± 0.25",
        NOT_MEASURED,
        "4.60 ± 0.25",
        NOT_MEASURED,
        NOT_MEASURED,
        NOT_MEASURED,
    ]
    assert "after_new_loss: verdict" not in table and "after_new_loss: paper" not in table
    assert table["forgetting_full: clbench"].tolist()[:3] == ["0.30 ± 0.25", "0.15 ± 0.64", "0.60 ± 0.25"]
    # the same claim measured as drift: the paper's direction (fft, lora, pt forget more than et), no paper number
    assert cells(table, ["drift_kl_oldvocab: clbench", "drift_kl_oldvocab: verdict"])[:5] == [
        ("0 ± 0", "(reference)"),
        ("0 ± 0", NO_CLAIM),
        ("0.030 ± 0.025", "direction holds (p = 0.035)"),  # t = 0.03 / (0.01 / √3) on 2 df
        ("-0.030 ± 0.025", "reversed (p = 0.035)"),
        ("0.5", ONE_SEED),
    ]
    assert "drift_kl_oldvocab: paper" not in table
    assert "forgetting_full: verdict" not in table and "forgetting_full: paper" not in table


def test_cross_lingual_rows_mark_tasks_not_run_and_cells_without_a_paper_claim(values):
    table = rows(TABLES[2], values)
    assert cells(
        table, ["task", "model", "method", "target_loss: paper", "target_loss: clbench", "target_loss: verdict"]
    ) == [
        ("xling-es", "—", "et", "2.3", NOT_RUN, "(reference)"),
        ("xling-es", "—", "distill", "", NOT_RUN, NO_CLAIM),
        ("xling-es", "—", "fft", "5.56", NOT_RUN, NOT_RUN),
        ("xling-es", "—", "nonew", "", NOT_RUN, NO_CLAIM),
        ("xling-ar", "—", "et", "2.82", NOT_RUN, "(reference)"),
        ("xling-ar", "—", "distill", "", NOT_RUN, NO_CLAIM),
        ("xling-ar", "—", "fft", "", NOT_RUN, NO_CLAIM),  # the paper has no FFT for Arabic
        ("xling-ar", "—", "nonew", "", NOT_RUN, NO_CLAIM),
        ("xling-de", EVIL, "et", "", "2", "(reference)"),
        ("xling-de", EVIL, "distill", "", NOT_RUN, NO_CLAIM),
        ("xling-de", EVIL, "fft", "", "2.5", NO_CLAIM),
        ("xling-de", EVIL, "nonew", "", NOT_RUN, NO_CLAIM),
    ]


def test_report_writes_markdown_with_escaped_names_and_the_base_numbers(tmp_path, capsys):
    paper_db(tmp_path / "r.duckdb")
    out = tmp_path / "paper.md"
    assert main(["report", "--paper", "--db", str(tmp_path / "r.duckdb"), "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    text = out.read_text()
    assert text == report(tmp_path / "r.duckdb")
    assert text.startswith("# clbench against the paper's tables\n\nPublished numbers of *Memory as a Markov Matrix")
    assert "verdicts are about directions only" in text
    assert "## Table 1: Arithmetic: a new operator, a &lt;spec&gt; b = a*b\n" in text
    assert EVIL not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    base = text.split("## Table 2")[1].split("## Table 3")[0].split("Base model (no verdict):")[1]
    assert (
        "| pseudowords | WikiText loss       |    2.42 | old_loss_base    | builtin:smollm2-135m    | cpu       |       3.5 |"
        in base
    )
    assert (
        "| pseudowords | WikiText loss       |    2.42 | old_loss_base    | meta-llama/Llama-3.1-8B | paper     |       2.4 |"
        in base
    )


def test_report_refuses_a_missing_or_empty_db_and_a_missing_flag_in_one_line(tmp_path, capsys):
    missing = tmp_path / "none.duckdb"
    assert main(["report", "--paper", "--db", str(missing)]) == 2
    assert (
        capsys.readouterr().err
        == f"clbench: error: results database {missing} does not exist (run `clbench run` first)\n"
    )
    empty = tmp_path / "empty.duckdb"
    record(Store(empty), "failed", "arithmetic", "et", "tiny", 0, {}, status="failed", reason="diverged")
    assert main(["report", "--paper", "--db", str(empty)]) == 2
    assert (
        capsys.readouterr().err
        == f"clbench: error: results database {empty} has no finished runs to compare with the paper\n"
    )
    assert main(["report", "--db", str(empty)]) == 2
    assert capsys.readouterr().err == "clbench: error: report: say which report; the one so far is --paper\n"
    paper_db(tmp_path / "r.duckdb")
    assert main(["report", "--paper", "--db", str(tmp_path / "r.duckdb"), "--out", str(tmp_path / "no" / "x.md")]) == 2
    assert (
        capsys.readouterr().err
        == f"clbench: error: cannot write the report to {tmp_path / 'no' / 'x.md'}: No such file or directory\n"
    )


def test_leaderboard_page_carries_the_paper_section_after_the_tasks_and_before_the_legend(tmp_path):
    paper_db(tmp_path / "r.duckdb")
    page = (build(tmp_path / "r.duckdb", tmp_path / "out") / "index.html").read_text()
    section = page.split('<h2 id="paper">')[1].split("</section>")[0]
    assert page.rindex("<h2>xling-de</h2>") < page.index('<h2 id="paper">') < page.index('id="metrics"')
    assert page.count("<script") == 1 and EVIL not in page
    assert "<td>reversed (p = 0.00026)</td>" in section and "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in section
    assert section.count("<h3>Table ") == 3 and "<code>--profile paper</code>" in section


# ---------------------------------------------------------------- the size axis


def size_db(path) -> Store:
    """et's gap_closed over n_train per seed on the three widths (N* = 50, 50, 50 | ≤ 10, 50, 50 | 50, 50, never),
    fft's addition lost and drift per seed on the narrowest and widest only; a second fft lr on the widest, one seed."""
    store = Store(path)
    curves = {  # model → per seed: gap_closed at n_train 10, 50, 200
        "builtin:arith-llama-w64": [(0.1, 0.6, 0.9), (0.2, 0.5, 0.9), (0.3, 0.7, 0.8)],
        "builtin:arith-llama": [(0.5, 0.6, 0.9), (0.2, 0.55, 0.9), (0.1, 0.6, 0.95)],
        "builtin:arith-llama-w256": [(0.1, 0.6, 0.9), (0.2, 0.5, 0.9), (0.1, 0.2, 0.4)],
    }
    for model, seeds in curves.items():
        for seed, gaps in enumerate(seeds):
            for n, gap in zip((10, 50, 200), gaps):
                record(store, f"s-{model}-{seed}-{n}", "arithmetic", "et", model, seed, {"gap_closed": gap}, n_train=n)
    lost = {"builtin:arith-llama-w64": (-0.20, -0.25, -0.22), "builtin:arith-llama-w256": (-0.50, -0.45, -0.55)}
    drift = {"builtin:arith-llama-w64": (0.10, 0.12, 0.11), "builtin:arith-llama-w256": (0.12, 0.08, 0.10)}
    for model, deltas in lost.items():
        for seed, delta in enumerate(deltas):
            values = {"old_skill_acc_delta": delta, "drift_kl_oldvocab": drift[model][seed]}
            record(store, f"f-{model}-{seed}", "arithmetic", "fft", model, seed, values, lr=1e-4)
    record(store, "f-other-lr", "arithmetic", "fft", "builtin:arith-llama-w256", 0, {"old_skill_acc_delta": 0.0})
    return store


def test_size_rows_and_verdicts_compare_the_widest_base_with_the_narrowest(tmp_path):
    from clbench.report import sizes

    values = load(size_db(tmp_path / "s.duckdb"))[0]
    table = sizes.size_rows(values)
    assert table.to_dict("records") == [
        {"model": "builtin:arith-llama-w64", "et lr": "0.01", "et N*: seeds": 3, "et N*": "50 ± 0", "fft addition lost: seeds": 3,
         "fft addition lost": "-0.223 ± 0.063", "fft drift: seeds": 3, "fft drift": "0.110 ± 0.025"},
        {"model": "builtin:arith-llama", "et lr": "0.01", "et N*: seeds": 3, "et N*": "50 ± 0 (1 reached at the smallest n_train, above 1)", "fft addition lost: seeds": 0,
         "fft addition lost": "not run", "fft drift: seeds": 0, "fft drift": "not run"},
        {"model": "builtin:arith-llama-w256", "et lr": "0.01", "et N*: seeds": 3, "et N*": "50 ± 0 (1 not reached)",
         "fft addition lost: seeds": 3, "fft addition lost": "-0.50 ± 0.12", "fft drift: seeds": 3,
         "fft drift": "0.100 ± 0.050"},
    ]  # fmt: skip
    assert sizes.verdicts(values, direction_verdict) == [
        "sample complexity independent of width: untested (on some seed N* lies outside the sweep's n_train)",
        "larger models forget more under fine-tuning: fft's addition lost, builtin:arith-llama-w256 vs "
        "builtin:arith-llama-w64: direction holds (p = 0.0036)",
        "larger models forget more under fine-tuning: fft's drift, builtin:arith-llama-w256 vs "
        "builtin:arith-llama-w64: not significant (p = 0.5)",
    ]
    reached = values[~((values.model == "builtin:arith-llama-w256") & (values.seed == 2))]
    assert sizes.verdicts(reached, direction_verdict)[0] == (
        "sample complexity independent of width: et's N* builtin:arith-llama-w256 vs builtin:arith-llama-w64: "
        "no significant difference (p = 1)"
    )


def test_an_n_star_reached_at_one_example_is_measured_not_censored_and_a_fall_back_moves_it():
    from clbench.report import sizes

    model = sizes.family()[0]
    # seed 0 stays ≥ 0.5 from n_train 1, seed 1 from 3, seed 2 from 2 on (censored there); seed 3 reaches at 1, falls
    # back at 2 and stays from 3; seed 4 reaches at 1 and falls back at 3, its largest n_train (not reached)
    curves = [{1: 0.6, 3: 0.9}, {1: 0.2, 3: 0.7}, {2: 0.8, 3: 0.9}, {1: 0.6, 2: 0.3, 3: 0.9}, {1: 0.6, 3: 0.4}]
    rows = [
        {"task": "arithmetic", "method": "et", "model": model, "metric": "gap_closed", "seed": seed, "n_train": n,
         "value": gap}
        for seed, curve in enumerate(curves)
        for n, gap in curve.items()
    ]  # fmt: skip
    stars = sizes.n_stars(pd.DataFrame(rows), model)
    assert stars[:2] == [1.0, 3.0] and math.isnan(stars[2]) and stars[3:] == [3.0, math.inf]


def test_a_sweeps_one_method_points_stay_out_of_the_comparison_where_the_base_has_a_compared_n_train(tmp_path):
    values = load(size_db(tmp_path / "s.duckdb"))[0]
    table = rows(TABLES[0], values)
    # w64 and w256 hold fft at n_train 200: their et-only points 10 and 50 are the N* sweep's; the middle base has
    # no compared n_train, so each of its points keeps its rows, fft "not run"
    assert cells(table, ["model", "n_train", "method", "seeds"]) == [
        ("builtin:arith-llama", "10", "et", "0,1,2"),
        ("builtin:arith-llama", "10", "fft", ""),
        ("builtin:arith-llama", "50", "et", "0,1,2"),
        ("builtin:arith-llama", "50", "fft", ""),
        ("builtin:arith-llama", "200", "et", "0,1,2"),
        ("builtin:arith-llama", "200", "fft", ""),
        ("builtin:arith-llama-w256", "200", "et", "0,1,2"),
        ("builtin:arith-llama-w256", "200", "fft", "0,1,2"),
        ("builtin:arith-llama-w256", "200", "fft", "0"),  # its other lr
        ("builtin:arith-llama-w64", "200", "et", "0,1,2"),
        ("builtin:arith-llama-w64", "200", "fft", "0,1,2"),
    ]


def test_a_group_pooling_data_draws_names_them_beside_its_seeds():
    pooled = pd.DataFrame({"seed": [1, 0, 0, 1], "data_seed": [0, 0, 2, 2]})
    assert draws_label(pooled) == "0,1 × data 0,2"
    assert draws_label(pooled.assign(data_seed=2)) == "0,1"
    assert draws_label(pooled.drop(columns="data_seed")) == "0,1"  # values read before data draws were


def test_a_block_holding_two_task_versions_compares_on_the_newest_only(tmp_path):
    """A database merged from a table and its republication on a new task version (arithmetic and
    arithmetic-sizes share the shipped base's runs at n_train 200): the older runs are not a second row."""
    store = Store(tmp_path / "v.duckdb")
    for version, et_acc, fft_acc in [(1, [0.5, 0.5, 0.5], [0.7, 0.7, 0.7]), (2, ET_ACC, FFT_ACC)]:
        for seed in range(3):
            for method, acc in [("et", et_acc), ("fft", fft_acc)]:
                metrics = {"target_acc": acc[seed]}
                record(
                    store,
                    f"{method}{seed}v{version}",
                    "arithmetic",
                    method,
                    "tiny",
                    seed,
                    metrics,
                    task_version=version,
                )
    table = rows(TABLES[0], load(store)[0])
    assert cells(table, ["method", "seeds", "target_acc: clbench", "target_acc: verdict"]) == [
        ("et", "0,1,2", "0.820 ± 0.050", "(reference)"),
        ("fft", "0,1,2", "0.600 ± 0.050", "direction holds (p = 0.00018)"),
    ]
