"""bench/compare_table.py, the PROVENANCE tables of the republished text tasks: cells as the leaderboard's functions
compute them (clbench.stats), pooled over data draws, and bad input as one line."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from leaderboard_db import record, seeds_db

from clbench.errors import ClbenchError
from clbench.report.load import load

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "compare_table.py"
spec = importlib.util.spec_from_file_location("compare_table", SCRIPT)
compare_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_table)


def test_cells_are_mean_ci_and_welch_p_against_the_reference(tmp_path):
    values = load(seeds_db(tmp_path / "r.duckdb"))[0]
    table = compare_table.table(values, "words", "et", ["target_loss", "forgetting_oldvocab"])
    rows = {(r.method, r.lr): r for r in table.itertuples()}
    # et 5.18, 5.27, 5.24: mean 5.23, t(0.975, 2) · s / √3 = 0.1138; lora's Welch p against it 0.671, fft's 0.00118
    assert rows["et", "0.01"].target_loss == "5.23 ± 0.11"
    assert rows["lora", "0.001"].target_loss == "5.20 ± 0.25 (p = 0.67)"
    assert rows["fft", "0.0001"].target_loss == "6.10 ± 0.25 (p = 0.0012)"
    assert rows["et", "0.01"].forgetting_oldvocab == "0"  # every run exactly 0: no interval to print
    assert rows["pt", "0.1"].target_loss == "5.9"  # one seed: no interval, nothing to test
    assert [r.runs for r in table.itertuples()] == [3, 3, 3, 1]


def test_a_value_every_run_shares_prints_as_one_number_not_its_rounding():
    # the base's old-text loss, the same in every run up to the last bits of a float sum
    shared = np.array([3.1381905007663051, 3.1381905007663051, 3.138190500766308])
    assert compare_table.cell(shared, None) == "3.138"
    assert compare_table.cell(shared, shared) == "3.138 (p = 1)"
    assert compare_table.cell(np.array([3.0, 3.5, 4.0]), None) == "3.5 ± 1.2"


def test_a_group_pools_its_data_draws_and_by_draw_shows_each(tmp_path):
    store = seeds_db(tmp_path / "r.duckdb")
    for seed, loss in enumerate((5.0, 5.1, 5.2)):
        values = {"target_loss": loss, "forgetting_oldvocab": 0.0}
        record(store, f"et-d1-{seed}", "words", "et", "tiny", seed, values, params={"data_seed": 1})
    values = load(store)[0]
    et = compare_table.table(values, "words", "et", ["target_loss"]).iloc[0]
    # seeds_db's et runs name no data_seed (one draw, none stated); the three runs of draw 1 join them: 6 runs
    assert (et.runs, et["data draws"]) == (6, "1")
    draws = compare_table.by_draw(values, "words", "target_loss", "et")
    assert draws[draws.method == "et"]["draw 1"].tolist() == ["5.1 (3)"]


def test_by_draw_pairs_each_method_with_the_reference_on_the_draws_both_ran(tmp_path):
    store = seeds_db(tmp_path / "r.duckdb")
    # et and fft on draws 0-2, one seed each: fft − et = 0.5, 0.7, 0.6 → paired t = 0.6 / (0.1 / √3) = 10.39, 2 df: p = 0.00913
    for draw, (et, fft) in enumerate([(5.0, 5.5), (5.2, 5.9), (5.1, 5.7)]):
        record(store, f"e{draw}", "drawn", "et", "tiny", 0, {"target_loss": et}, params={"data_seed": draw})
        record(store, f"f{draw}", "drawn", "fft", "tiny", 0, {"target_loss": fft}, params={"data_seed": draw})
    record(store, "l0", "drawn", "lora", "tiny", 0, {"target_loss": 5.0}, params={"data_seed": 0})
    draws = compare_table.by_draw(load(store)[0], "drawn", "target_loss", "et").set_index("method")
    assert draws.loc["fft", ["draw 0", "draw 1", "draw 2"]].tolist() == ["5.5 (1)", "5.9 (1)", "5.7 (1)"]
    column = "paired p vs et (draws)"
    assert (draws.loc["fft", column], draws.loc["et", column], draws.loc["lora", column]) == ("0.0091", "", "")


def test_bad_input_is_one_line(tmp_path, capsys):
    values = load(seeds_db(tmp_path / "r.duckdb"))[0]
    with pytest.raises(ClbenchError, match="no runs of et-dict on words"):
        compare_table.table(values, "words", "et-dict", ["target_loss"])
    with pytest.raises(ClbenchError, match="no runs of words store drift_kl_oldvocab"):
        compare_table.table(values, "words", "et", ["drift_kl_oldvocab"])
    assert compare_table.main(["--db", str(tmp_path / "r.duckdb"), "--task", "arith"]) == 1
    assert capsys.readouterr().err == "error: no finished runs of arith in this database\n"


def test_searches_show_every_point_the_choice_and_where_it_sits(tmp_path):
    store = seeds_db(tmp_path / "r.duckdb")
    points = [
        {"lr": lr, "seeds": [0], "values": [v], "mean": v, "run_ids": [f"t{i}"]}
        for i, (lr, v) in enumerate([(0.003, 5.31), (0.01, 5.2), (0.03, 5.25)])
    ]
    row = {"tune_key": "k1", "task": "words", "method": "et", "model": "tiny", "profile": "cpu"}
    store.record_tuned(dict(row, objective="target_loss", lr=0.01, score=5.2, search=points))
    edge = [dict(points[0], lr=1e-5, mean=4.0, values=[4.0]), dict(points[1], lr=3e-5, seeds=[0, 1])]
    store.record_tuned(
        dict(row, tune_key="k2", method="fft", objective="target_loss", lr=1e-5, score=4.0, search=edge)
    )
    table = compare_table.search_table(store, "words", ["fft", "et"])
    assert table.method.tolist() == ["fft", "et"]
    assert table.iloc[1].tolist() == ["et", "0.003: 5.3100, **0.01: 5.2000**, 0.03: 5.2500", "0", "0.01 (inside)"]
    assert table.iloc[0].tolist() == ["fft", "**1e-5: 4.0000**, 3e-5: 5.2000", "0,1", "1e-5 (low edge)"]
    with pytest.raises(ClbenchError, match="no stored lr search of arith"):
        compare_table.search_table(store, "arith", [])
