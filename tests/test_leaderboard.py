"""The leaderboard from a tiny results DB written through Store.record: exact tables, escaping, kept-out runs."""

import csv
import math
import statistics

import duckdb
import numpy as np
import pandas as pd
import pytest
from leaderboard_db import EVIL, SEEDED, record, seeds_db, tiny_db

from clbench.cli import main
from clbench.report.leaderboard import build
from clbench.report.load import aggregate, best_mask, load, rank_fractions
from clbench.report.plots import pareto_front, quality_metric
from clbench.report.summary import summary
from clbench.stats import welch_p
from clbench.store import Store


def test_pareto_front_keeps_exactly_the_undominated_points():
    x = np.array([0.0, 0.0, 0.3, 0.1, np.nan, 0.3])
    y = np.array([0.8, 0.9, 0.95, 0.5, 1.0, 0.95])
    # (0, .9) beats (0, .8) and (.1, .5); the two equal (.3, .95) points do not dominate each other
    assert pareto_front(x, y).tolist() == [False, True, True, False, False, True]


@pytest.fixture
def board(tmp_path):
    tiny_db(tmp_path / "r.duckdb")
    return build(tmp_path / "r.duckdb", tmp_path / "out")


def rows_of(out):
    with open(out / "leaderboard.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_csv_has_mean_std_and_counts_of_finished_runs_only(board):
    rows = {(r["task"], r["method"], r["n_train"], r["metric"]): r for r in rows_of(board)}
    et = rows[("arith", "et", "200", "target_acc")]
    # sample std of (0.8, 0.9) = 0.1 / sqrt(2), as pandas computes it
    assert (float(et["mean"]), et["std"], et["runs"], et["higher_is_better"]) == (
        (0.8 + 0.9) / 2,
        "0.0707106781186547",
        "2",
        "True",
    )
    # the failed fft seed 1 and the metric-less et seed 2 never count
    assert rows[("arith", "fft", "200", "target_acc")]["runs"] == "1"
    assert rows[("arith", "fft", "200", "target_acc")]["std"] == ""
    assert rows[("arith", "et", "200", "forgetting_full")]["higher_is_better"] == "False"
    assert len(rows) == 6 * 4  # 6 rows (arith: 4, evil task: 2) × 4 metrics


def test_markdown_marks_best_per_column_and_lists_kept_out_runs(board):
    text = (board / "leaderboard.md").read_text()
    arith = text.split("## arith\n")[1].split("## Failed")[0]
    # mean ± 95 % CI half-width (t(0.975, 1) · 0.07071 / √2 = 0.6353, to 2 digits); ? : the best (fft, 1 seed) is untestable
    assert (
        "| et       | tiny    |       200 | 0.01 |      2 | lr=0.01, init=random | 0.85 ± 0.64 ?  | **0 ± 0**" in arith
    )
    assert "**0.95**" in arith and "**0.01**" in arith  # fft's accuracy, et n=50's full forgetting
    assert "target_acc ↑" in arith and "forgetting_oldvocab ↓" in arith
    kept = text.split("## Failed or partial runs (not in the tables)\n")[1]
    assert "| bad      | arith  | fft      | tiny    |      1 | failed   | diverged: loss nan at step 3      |" in kept
    assert "| partial  | arith  | et       | tiny    |      2 | finished | partial: finished without metrics |" in kept


def test_every_injected_string_is_escaped_in_html_svg_and_markdown(board):
    page = (board / "index.html").read_text()
    assert page.count("<script") == 1  # the page's own sorting script, nothing injected
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert f"<h2>{escaped}</h2>" in page
    assert f"<td>{escaped}</td>" in page  # method and model cells
    assert "<text" in page and f"{escaped}" in page.split("<svg")[1]  # a plot label, as SVG text
    assert EVIL not in (board / "leaderboard.md").read_text()


def test_plots_sample_efficiency_only_for_a_swept_task_and_no_heat_map_without_stage_matrix(board):
    page = (board / "index.html").read_text()
    assert page.count("<svg") == 3  # arith: trade-off + sample efficiency; evil task: trade-off only
    assert page.count("Pareto front") == 2 * 2  # legend in both panels of each trade-off plot
    assert page.count("n_train (training examples)") == 2
    assert "after training stage" not in page


def test_stage_matrix_renders_as_heat_map_when_the_table_exists(tmp_path):
    record(tiny_db(tmp_path / "r.duckdb"), "seq0", "seq", "et", "tiny", 0, {"target_acc": 0.5})
    with duckdb.connect(str(tmp_path / "r.duckdb")) as db:  # the table clbench.store creates: stages by number
        db.executemany(
            "INSERT INTO stage_matrix VALUES (?, ?, ?, ?, ?)",
            [
                ("seq0", 1, 1, "target_acc", 0.9),
                ("seq0", 1, 2, "target_acc", 0.1),
                ("seq0", 2, 1, "target_acc", 0.7),
                ("seq0", 2, 2, "target_acc", 0.8),
            ],
        )
    page = (build(tmp_path / "r.duckdb", tmp_path / "out") / "index.html").read_text()
    heat = page.split("<h2>seq</h2>")[1].split("</section>")[0]
    assert heat.count("after training stage") == 1
    assert ">0.9<" in heat and ">0.1<" in heat
    assert page.count("<script") == 1


def test_cli_writes_the_three_files_and_rejects_a_missing_db(tmp_path, capsys):
    tiny_db(tmp_path / "r.duckdb")
    assert main(["leaderboard", "--db", str(tmp_path / "r.duckdb"), "--out", str(tmp_path / "o")]) == 0
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["index.html", "leaderboard.csv", "leaderboard.md"]
    assert main(["leaderboard", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "o2")]) == 2
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == f"clbench: error: results database {tmp_path / 'none.duckdb'} does not exist (run `clbench run` first)"
    )
    assert not (tmp_path / "o2").exists()


def test_lm_eval_checks_are_tabled_per_row_with_mean_and_ci(tmp_path):
    store = tiny_db(tmp_path / "r.duckdb")
    row = lambda task, base, adapted: {
        "task": task,
        "metric": "bits_per_byte",
        "base": base,
        "adapted": adapted,
        "delta": adapted - base,
        "lm_eval_version": "0.4.13",
        "task_version": "1.0",
        "task_hash": "h",
    }
    store.record_lm_eval("et0", [row("clbench_old_text", 1.5, 1.5)])
    store.record_lm_eval("et1", [row("clbench_old_text", 1.5, 2.0)])
    store.record_lm_eval("bad", [row(EVIL, 1.0, 9.0)])  # a failed run's checks never show
    out = build(tmp_path / "r.duckdb", tmp_path / "out")
    text = (out / "leaderboard.md").read_text()
    checks = text.split("### lm-eval checks (in-process, full softmax)\n")[1]
    # adapted (1.5, 2.0): CI half-width t(0.975, 1) · 0.3536 / √2 = 3.177, the mean to its decimal place
    assert (
        "| et       | tiny    | lr=0.01, init=random |       200 | clbench_old_text | bits_per_byte    |    1.5 | 1.8 ± 3.2 | 0.2 ± 3.2                |      2 |"
        in checks
    )
    assert text.count("### lm-eval checks") == 1 and EVIL not in text and "&lt;script" not in checks


def test_plots_use_target_loss_where_no_run_gets_a_completion_exactly_right(tmp_path):
    store = tiny_db(tmp_path / "r.duckdb")
    m = lambda loss, fo: {"target_acc": 0.0, "target_loss": loss, "forgetting_oldvocab": fo, "forgetting_full": fo}
    record(store, "w0", "words", "et", "tiny", 0, m(5.0, 0.0))
    record(store, "w1", "words", "fft", "tiny", 0, m(4.0, 0.5))
    table = aggregate(load(store)[0])
    assert quality_metric(table[table.task == "words"]) == "target_loss"
    assert quality_metric(table[table.task == "arith"]) == "target_acc"  # accuracies 0.5–0.95 rank the runs
    assert quality_metric(table[table.task == "nothing"]) is None
    page = (build(tmp_path / "r.duckdb", tmp_path / "out") / "index.html").read_text()
    words = page.split("<h2>words</h2>")[1].split("<section>")[0]
    assert "target_loss ↓" in words and "target_acc ↑" not in words.split("<svg")[1]


def test_three_seeds_give_a_95_ci_and_a_not_significant_verdict(tmp_path):
    out = build(seeds_db(tmp_path / "r.duckdb").path, tmp_path / "out")
    rows = {(r["method"], r["metric"]): r for r in rows_of(out)}
    et, lora, fft, pt = (rows[(m, "target_loss")] for m in ("et", "lora", "fft", "pt"))
    et_losses = [seed[0] for seed in SEEDED[("et", 0.01)]]
    assert float(et["ci95"]) == pytest.approx(
        4.302652729749462 * statistics.stdev(et_losses) / math.sqrt(3), rel=1e-12
    )
    assert float(et["ci95"]) == pytest.approx(0.11383749100790277, rel=1e-12)
    assert float(et["p_vs_best"]) == pytest.approx(0.6709631037316779, rel=1e-9)  # Welch, et vs lora (test_stats)
    assert float(et["eval_se"]) == pytest.approx((0.010 + 0.012 + 0.014) / 3, rel=1e-12)
    assert [(r["verdict"], r["n_seeds"], r["lr"]) for r in (et, lora, fft, pt)] == [
        ("n.s.", "3", "0.01"),
        ("best", "3", "0.001"),
        ("worse", "3", "0.0001"),
        ("1 seed", "1", "0.1"),
    ]
    assert float(fft["p_vs_best"]) < 0.05 and lora["p_vs_best"] == pt["p_vs_best"] == pt["ci95"] == ""
    assert rows[("et", "forgetting_oldvocab")]["ci95"] == "0.0"  # three zeros: a zero-width interval, not "no CI"

    text = (out / "leaderboard.md").read_text()
    table = text.split("## words\n\n")[1].strip()
    assert table.splitlines()[2:] == [
        "| et       | tiny    |       200 | 0.01   |      3 | lr=0.01, init=random   | 5.23 ± 0.11 [0.012] ≈   | 0 ± 0 ?                 | **0.110 ± 0.025**   |",
        "| fft      | tiny    |       200 | 0.0001 |      3 | lr=0.0001, init=random | 6.10 ± 0.25 [0.03]      | 1.00 ± 0.25 ?           | 1.030 ± 0.075       |",
        "| lora     | tiny    |       200 | 0.001  |      3 | lr=0.001, init=random  | **5.20 ± 0.25 [0.022]** | 0.120 ± 0.050 ?         | 0.130 ± 0.025 ≈     |",
        "| pt       | tiny    |       200 | 0.1    |      1 | lr=0.1, init=random    | 5.9 ?                   | **-0.1**                | 40 ?                |",
    ]
    assert "target_loss_se" not in table  # folded into target_loss's cells as [eval SE]

    page = (out / "index.html").read_text()
    overview = page.split('<table class="sortable overview"')[1].split("</table>")[0]
    # lora best (rank 0), et 2nd of 4, pt 3rd, fft worst: the colour follows the rank
    assert overview.count('data-rank="0"><strong class="best">5.20 ± 0.25 [0.022]</strong>') == 1
    assert 'data-rank="0.333">5.23 ± 0.11 [0.012] ≈<' in overview and 'data-rank="1">6.10 ± 0.25 [0.03]<' in overview
    assert (
        page.index('id="overview"')
        < page.index("<section>")
        < page.index('id="metrics"')
        < page.index('class="dataframe legend"')
    )


def test_results_summary_shows_lr_seeds_and_the_same_cells(tmp_path):
    lines = summary(seeds_db(tmp_path / "r.duckdb"), wide=True).splitlines()
    assert lines[0].split() == [
        "task", "method", "model", "n_train", "lr", "seeds",
        "target_loss", "↓", "forgetting_oldvocab", "↓", "forgetting_full", "↓",
    ]  # fmt: skip
    assert lines[2:6] == [
        "words   et        tiny           200  0.01          3  5.23 ± 0.11 [0.012] ≈    0 ± 0 ?                  **0.110 ± 0.025**",
        "words   fft       tiny           200  0.0001        3  6.10 ± 0.25 [0.03]       1.00 ± 0.25 ?            1.030 ± 0.075",
        "words   lora      tiny           200  0.001         3  **5.20 ± 0.25 [0.022]**  0.120 ± 0.050 ?          0.130 ± 0.025 ≈",
        "words   pt        tiny           200  0.1           1  5.9 ?                    **-0.1**                 40 ?",
    ]
    assert lines[6].startswith("Cells: mean ± half-width of the 95 % confidence interval over seeds")
    assert "settings" not in lines[0]  # shown only where rows would look alike


def test_results_summary_names_the_settings_where_rows_would_look_alike(tmp_path):
    store = tiny_db(tmp_path / "r.duckdb")
    with duckdb.connect(str(tmp_path / "r.duckdb")) as db:  # et seed 1 as another init: its own group
        db.execute("UPDATE runs SET config = json_merge_patch(config, '{\"init\": \"mean\"}') WHERE run_id = 'et1'")
    lines = summary(store, task="arith", wide=True).splitlines()
    assert lines[0].split()[:7] == ["task", "method", "model", "n_train", "lr", "seeds", "settings"]
    assert sum("lr=0.01, init=mean" in line for line in lines) == 1


def test_each_task_shows_its_tuning_choices_with_the_chosen_point_and_where_it_sits(tmp_path):
    store = tiny_db(tmp_path / "r.duckdb")
    point = lambda lr, mean: {"lr": lr, "seeds": [0, 1], "values": [mean, mean], "mean": mean, "run_ids": ["v"]}
    tuned = lambda key, task, method, search, lr: {
        "tune_key": key,
        "task": task,
        "method": method,
        "model": "tiny",
        "profile": None,
        "objective": "target_loss",
        "lr": lr,
        "score": min(p["mean"] for p in search),
        "search": search,
    }
    store.record_tuned(tuned("k1", "arith", "et", [point(0.03, 1.25), point(0.001, 2.0), point(0.1, math.inf)], 0.03))
    store.record_tuned(tuned("k2", "arith", "fft", [point(1e-4, 0.5), point(3e-4, 0.75)], 1e-4))
    store.record_tuned(tuned("k3", EVIL, EVIL, [point(0.01, 1.0)], 0.01))
    out = build(store.path, tmp_path / "out")
    text = (out / "leaderboard.md").read_text()
    arith = text.split("## arith\n")[1].split("\n## ")[0]
    chosen = arith.split("### Learning rates chosen on validation (clbench tune)\n")[1]
    # points by lr, the choice bold; a diverged point is a point searched, so 0.03 sits inside its search
    assert (
        "| et       | tiny    |           | target_loss | 0,1     | 0.001 2.0000 · **0.03 1.2500** · 0.1 inf |   0.03   | inside   |"
        in chosen
    )
    assert (
        "| fft      | tiny    |           | target_loss | 0,1     | **0.0001 0.5000** · 0.0003 0.7500        |   0.0001 | low edge |"
        in chosen
    )
    page = (out / "index.html").read_text()
    assert "<td><strong>0.0001 0.5000</strong> · 0.0003 0.7500</td>" in page
    assert "<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page.split("<h3>Learning rates chosen")[2]
    assert page.count("<script") == 1 and EVIL not in text and text.count("### Learning rates chosen") == 2


def test_a_base_property_stored_a_few_ulps_apart_ranks_nothing_and_near_ties_share_the_best():
    # xling-de's target_bpb_base as runs from two processes stored it: one number, 1.7e-8 relative apart
    base = pd.Series([3.2287070052617133, 3.2287070608247506, 3.2287070052617133, np.nan])
    assert best_mask(base, "target_bpb_base").tolist() == [False, False, False, False]
    loss = pd.Series([2.0, 2.0 + 1e-9, 2.5, np.nan])
    assert best_mask(loss, "target_loss").tolist() == [True, True, False, False]
    assert best_mask(pd.Series([0.7, 0.9, 0.9 - 1e-5]), "target_top1").tolist() == [False, True, False]


def test_the_colour_rank_ties_what_best_mask_ties():
    # before: 2.0 and 2.0 + 1e-9 ranked 1 and 2, so a row bolded as best was coloured second
    loss = rank_fractions(pd.Series([2.0, 2.0 + 1e-9, 2.5, 3.0, np.nan]), "target_loss")
    assert loss.iloc[:4].tolist() == [0.0, 0.0, 2 / 3, 1.0] and np.isnan(loss.iloc[4])
    assert rank_fractions(pd.Series([0.7, 0.9, 0.9 - 1e-5]), "target_top1").tolist() == [1.0, 0.0, 0.5]
    assert rank_fractions(pd.Series([1.0, 1.0 + 1e-9]), "target_loss").isna().all()  # one value: nothing to rank
    assert rank_fractions(pd.Series([3.2287070052617133, 3.2287070608247506]), "target_bpb_base").isna().all()


def test_runs_that_differ_in_a_swept_task_param_are_never_pooled_as_seeds(tmp_path):
    """A dictionary_size sweep (s = 1, 2 × n_train 8, 16 × seeds 0, 1): one row per (s, n_train), its two seeds
    pooled; a param with one value across the task's runs (n_test) stays out of the settings."""
    store = Store(tmp_path / "r.duckdb")
    gaps = {1: {8: (0.5, 0.7), 16: (0.8, 0.9)}, 2: {8: (0.1, 0.2), 16: (0.4, 0.6)}}
    for s, by_n in gaps.items():
        for n, seeds in by_n.items():
            for seed, gap in enumerate(seeds):
                params = {"dictionary_size": s, "n_test": 12}
                record(
                    store, f"r{s}-{n}-{seed}", "pw", "et", "tiny", seed, {"gap_closed": gap}, n_train=n, params=params
                )
    record(store, "other", "arith", "et", "tiny", 0, {"gap_closed": 0.3}, params={"n_test": 12})
    table = aggregate(load(store)[0])
    rows = table[table.task == "pw"][["settings", "n_train", "runs", "mean"]].to_dict("records")
    assert rows == [
        {"settings": "dictionary_size=1, lr=0.01, init=random", "n_train": 8, "runs": 2, "mean": pytest.approx(0.6)},
        {"settings": "dictionary_size=1, lr=0.01, init=random", "n_train": 16, "runs": 2, "mean": pytest.approx(0.85)},
        {"settings": "dictionary_size=2, lr=0.01, init=random", "n_train": 8, "runs": 2, "mean": pytest.approx(0.15)},
        {"settings": "dictionary_size=2, lr=0.01, init=random", "n_train": 16, "runs": 2, "mean": pytest.approx(0.5)},
    ]
    assert table[table.task == "arith"].settings.tolist() == ["lr=0.01, init=random"]  # no param varies there
    text = (build(tmp_path / "r.duckdb", tmp_path / "out") / "leaderboard.md").read_text()
    assert text.count("| dictionary_size=1, lr=0.01, init=random |") == 2
    assert text.count("| dictionary_size=2, lr=0.01, init=random |") == 2


def test_rows_pooling_data_draws_are_tested_against_the_best_paired_by_draw(tmp_path):
    """et and fft over data draws 0-2 × seeds 0, 1 with a large draw effect both share and fft 0.10-0.12 above et on
    every draw: Welch over the 6 runs a side calls them tied (p = 0.836), the page's test paired by draw does not
    (p = 0.00274, tests/test_stats.py); lora with draw 0 only is tested over runs."""
    store = Store(tmp_path / "r.duckdb")
    et = {0: (4.0, 4.02), 1: (5.0, 5.02), 2: (6.0, 6.02)}
    fft = {0: (4.10, 4.12), 1: (5.12, 5.14), 2: (6.11, 6.13)}
    for method, losses in (("et", et), ("fft", fft)):
        for draw, by_seed in losses.items():
            for seed, loss in enumerate(by_seed):
                params = {"data_seed": draw}
                record(
                    store, f"{method}{draw}{seed}", "pw", method, "tiny", seed, {"target_loss": loss}, params=params
                )
    for seed, loss in enumerate((5.05, 5.07)):
        record(store, f"lora{seed}", "pw", "lora", "tiny", seed, {"target_loss": loss}, params={"data_seed": 0})
    table = aggregate(load(store)[0]).set_index("method")
    assert table.loc["et", "verdict"] == "best"
    assert table.loc["fft", "verdict"] == "worse"
    assert table.loc["fft", "p_vs_best"] == pytest.approx(0.0027434893944260487, rel=1e-6)
    # lora: one draw, so Welch's over runs against et's six
    assert table.loc["lora", "p_vs_best"] == pytest.approx(welch_p([5.05, 5.07], [v for p in et.values() for v in p]))
    assert table.loc["lora", "verdict"] == "n.s."


def test_data_draws_are_pooled_with_model_seeds_and_the_page_says_so(tmp_path):
    """data_seed 0, 1, 2 × seeds 0, 1 of one method: one row of 6 runs over 3 data draws, the interval over all six
    (Student's t on 5 degrees of freedom); a swept param beside it still splits rows. A store with one data draw
    shows no draws column or note."""
    store = Store(tmp_path / "r.duckdb")
    losses = {0: (4.0, 4.2), 1: (4.4, 4.6), 2: (3.8, 4.0)}
    for data_seed, by_seed in losses.items():
        for seed, loss in enumerate(by_seed):
            params = {"data_seed": data_seed, "dictionary_size": 2}
            record(store, f"d{data_seed}-{seed}", "pw", "et", "tiny", seed, {"target_loss": loss}, params=params)
    record(store, "s4", "pw", "et", "tiny", 0, {"target_loss": 5.0}, params={"data_seed": 0, "dictionary_size": 4})
    table = aggregate(load(store)[0])
    rows = table[["settings", "runs", "data_draws", "mean", "ci95"]].to_dict("records")
    values = [4.0, 4.2, 4.4, 4.6, 3.8, 4.0]
    half = 2.5705818366147395 * statistics.stdev(values) / math.sqrt(6)
    assert rows == [
        {
            "settings": "dictionary_size=2, lr=0.01, init=random",
            "runs": 6,
            "data_draws": 3,
            "mean": pytest.approx(4.1666666666666667),
            "ci95": pytest.approx(half),
        },
        {
            "settings": "dictionary_size=4, lr=0.01, init=random",
            "runs": 1,
            "data_draws": 1,
            "mean": 5.0,
            "ci95": pytest.approx(float("nan"), nan_ok=True),  # one run: no interval
        },
    ]
    out = build(tmp_path / "r.duckdb", tmp_path / "out")
    text = (out / "leaderboard.md").read_text()
    cells = [[c.strip() for c in line.split("|")] for line in text.splitlines() if "dictionary_size=2" in line]
    header = next([c.strip() for c in line.split("|")] for line in text.splitlines() if line.startswith("| method"))
    assert [dict(zip(header, row))["runs"] for row in cells] == ["6"]
    assert [dict(zip(header, row))["data draws"] for row in cells] == ["3"]
    assert "its runs are data draws × model seeds" in text and "a t-test paired by draw" in text
    assert "its runs are data draws × model seeds" in (out / "index.html").read_text()
    assert "data_draws" in (out / "leaderboard.csv").read_text().splitlines()[0].split(",")
    lines = summary(store, task="pw", wide=True).splitlines()
    seeds = [line.split()[5:8] for line in lines[2:4]]
    assert seeds == [["6", "(3", "data)"], ["1", "dictionary_size=4,", "lr=0.01,"]]  # s=4: one run, one draw

    single = Store(tmp_path / "one.duckdb")
    record(single, "a", "pw", "et", "tiny", 0, {"target_loss": 4.0}, params={"data_seed": 1})
    record(single, "b", "pw", "et", "tiny", 1, {"target_loss": 4.2}, params={"data_seed": 1})
    out = build(tmp_path / "one.duckdb", tmp_path / "out1")
    assert "data draws" not in (out / "leaderboard.md").read_text()
    assert "data draws" not in (out / "index.html").read_text()
    assert "data_draws" not in (out / "leaderboard.csv").read_text().splitlines()[0].split(",")


def test_runs_of_two_task_versions_are_never_pooled_as_seeds(tmp_path):
    """A database holding a task's runs before and after its version changed (what its measures read changed):
    one row per version, each over its own seeds; a task with one version names none."""
    store = Store(tmp_path / "r.duckdb")
    for version, losses in {1: (3.0, 3.2), 3: (4.0, 4.4)}.items():
        for seed, loss in enumerate(losses):
            record(store, f"v{version}-{seed}", "pw", "fft", "tiny", seed, {"target_loss": loss}, task_version=version)
    record(store, "other", "arith", "fft", "tiny", 0, {"target_loss": 1.0}, task_version=2)
    table = aggregate(load(store)[0])
    assert table[["task", "settings", "runs", "mean"]].to_dict("records") == [
        {"task": "arith", "settings": "lr=0.01, init=random", "runs": 1, "mean": 1.0},
        {"task": "pw", "settings": "task version 1, lr=0.01, init=random", "runs": 2, "mean": pytest.approx(3.1)},
        {"task": "pw", "settings": "task version 3, lr=0.01, init=random", "runs": 2, "mean": pytest.approx(4.2)},
    ]
