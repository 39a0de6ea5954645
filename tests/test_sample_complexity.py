"""The sample-complexity law: sweeps over task params, N*(s) and the fit N* ≈ c·s·ln T (clbench/sweep.py).

python -m pytest -q tests/test_sample_complexity.py
"""

import json
import math

import pandas as pd
import pytest

from clbench.cli import main
from clbench.store import Store
from clbench.sweep import (
    crossing,
    fit_law,
    grid,
    growth_exponent,
    law_report,
    n_star,
    n_star_between,
    n_star_table,
    through_origin,
)
from clbench.testing import TASK


def test_n_star_is_the_smallest_n_from_which_the_curve_stays_at_the_fraction():
    curve = {8: 0.1, 16: 0.6, 32: 0.4, 64: 0.9}  # non-monotone: 16 reaches 0.5, 32 falls back, 64 reaches again
    assert n_star(curve, 0.5) == 64
    assert crossing(curve, 0.5) == (32, 64)  # the last N below, N*
    assert n_star(curve, 0.35) == 16  # 32's 0.4 stays above 0.35
    assert n_star(curve, 0.4) == 16  # staying is ≥
    assert n_star(curve, 0.95) is None  # the largest N is below: not reached within the sweep
    assert n_star({8: 0.6, 16: 0.7, 32: 0.4}, 0.5) is None  # reached early, below at the end: censored too
    assert n_star({64: 0.9, 8: 0.6}, 0.5) == 8  # the smallest N, whatever order the points come in
    assert crossing({64: 0.9, 8: 0.6}, 0.5) == (None, 8)  # no point below
    assert n_star({8: math.nan, 16: 0.5}) == 16  # the default fraction is 0.5
    assert n_star({8: 0.6, 16: math.nan, 32: 0.7}) == 8  # a NaN point is left out, as if not swept
    assert n_star({8: 0.6, 16: math.nan}) == 8 and n_star({8: math.nan}) is None
    # arith-llama-w256, et, seed 1 (leaderboard/arithmetic-sizes): 0.92 at N = 3, 0.49 at 5, 0.65 at 50
    w256 = {1: 0.3085, 2: 0.3163, 3: 0.9166, 5: 0.4865, 10: 0.9882, 20: 0.9969, 50: 0.6533, 100: 0.9994, 200: 0.9988}
    assert n_star(w256) == 10 and n_star(w256, 0.7) == 100


def test_n_star_between_the_grid_points_is_read_on_a_log_n_line():
    # 0.5 lies a quarter of the way from 0.4 (N = 16) to 0.8 (N = 64): 16 · 4^0.25 = 16·√2
    assert n_star_between({8: 0.1, 16: 0.4, 64: 0.8}, 0.5) == pytest.approx(16 * 2**0.5)
    assert n_star_between({16: 0.4, 32: 0.5}, 0.5) == pytest.approx(32.0)  # a point on the fraction is N*
    assert n_star_between({16: 0.6, 32: 0.9}, 0.5) == 16.0  # already reached: at most the smallest N
    assert n_star_between({16: 0.1, 32: 0.4}, 0.5) is None
    assert n_star_between({8: math.nan, 16: 0.2, 32: 0.6}, 0.5) == pytest.approx(16 * 2**0.75)
    # crosses at 16, falls back at 32, crosses again at 64: read at the last crossing, a quarter of the way from
    # 0.4 to 0.8 between 32 and 64 (32 · 2^0.25)
    assert n_star_between({8: 0.1, 16: 0.6, 32: 0.4, 64: 0.8}, 0.5) == pytest.approx(32 * 2**0.25)
    assert n_star_between({8: 0.1, 16: 0.6, 32: 0.4}, 0.5) is None  # fallen back at the largest N


def test_growth_exponent_is_the_slope_in_log_log():
    assert growth_exponent({1: 10, 2: 20, 4: 40}) == pytest.approx(1.0)  # linear in s
    assert growth_exponent({1: 64, 8: 64}) == pytest.approx(0.0)
    assert growth_exponent({1: 10, 4: 20, 8: None}) == pytest.approx(0.5)  # unreached s left out
    assert math.isnan(growth_exponent({1: 10, 2: None}))


def test_fit_through_the_origin_and_its_residuals():
    assert through_origin([1.0, 2.0], [10.0, 30.0]) == pytest.approx(14.0)  # (10 + 60) / (1 + 4)
    assert math.isnan(through_origin([], []))
    log_t = math.log(100)
    exact = fit_law({1: 16, 2: 32, 4: 64, 8: None}, vocab=100)
    assert exact.c == pytest.approx(16 / log_t) and exact.unreached == [8]
    assert exact.residuals == pytest.approx({1: 0.0, 2: 0.0, 4: 0.0}, abs=1e-9)
    assert exact.predicted(8) == pytest.approx(128)
    # c = (1·10 + 2·30) / ((1 + 4)·ln T) = 14 / ln T; residuals 10 − 14, 30 − 28
    rough = fit_law({1: 10, 2: 30}, vocab=100)
    assert rough.c == pytest.approx(14 / log_t)
    assert rough.residuals == pytest.approx({1: -4.0, 2: 2.0})
    assert math.isnan(fit_law({1: None}, vocab=100).c)


def test_the_n_star_table_and_the_law_report():
    index = pd.MultiIndex.from_tuples(
        [("et", 1, 8), ("et", 1, 16), ("et", 2, 8), ("et", 2, 16), ("et", 4, 8), ("et", 4, 16)],
        names=["method", "dictionary_size", "n_train"],
    )
    table = pd.DataFrame({"gap_closed": [0.7, 0.9, 0.2, 0.6, 0.1, 0.3]}, index=index)
    stars = n_star_table(table, ["dictionary_size"], 0.5)
    assert stars.to_dict("records") == [
        {"method": "et", "dictionary_size": 1, "n_star": 8, "n_star_between": 8.0},
        {"method": "et", "dictionary_size": 2, "n_star": 16, "n_star_between": pytest.approx(8 * 2**0.75)},
        {"method": "et", "dictionary_size": 4, "n_star": None, "n_star_between": None},
    ]
    # c = (1·8 + 2·16) / (5·ln 100) = 8 / ln 100: the line passes through both points
    assert law_report(stars, 100, 0.5).splitlines() == [
        "N*(s): smallest n_train from which the mean gap_closed stays ≥ 0.5 (T = |V| = 100, the base's vocabulary)",
        "et:",
        "  s = 1   N* = 8      fit 8.0, residual +0.0",
        "  s = 2   N* = 16     fit 16.0, residual +0.0",
        "  s = 4   N* = not reached within the sweep",
        "  N* ≈ 1.737·s·ln T  (least squares through the origin; rms residual 0.0)",
        "  N* between the grid's points (log-linear): s = 1: 8, s = 2: 13.5, s = 4: —",
        "  N* ∝ s^b with b = 0.75 from those (b = 1: the law's linear growth in s; 0: none)",
    ]


def test_grid_is_the_cartesian_product():
    assert grid({}) == [{}]
    assert grid({"a": ["1", "2"], "b": ["x", "y"]}) == [
        {"a": "1", "b": "x"},
        {"a": "1", "b": "y"},
        {"a": "2", "b": "x"},
        {"a": "2", "b": "y"},
    ]


def test_a_sweep_over_a_task_param_stores_every_point_and_resumes(tiny_cli, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    db = tmp_path / "r.duckdb"
    argv = ["sweep", "--task", TASK, "--task-dir", str(tiny_cli.tasks), "--db", str(db), "--method", "et"]
    argv += ["--param", "n_test=12,14", "--n", "4,8", "--budget", "steps=2"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "4 runs: 4 finished" in err
    configs = [json.loads(c) for c in Store(db).query("SELECT config FROM runs").config]
    points = sorted((c["params"]["n_test"], c["budget"]["n_train"], c["budget"]["steps"]) for c in configs)
    assert points == [(12, 4, 2), (12, 8, 2), (14, 4, 2), (14, 8, 2)]
    assert all(c["params"]["n_old_text"] == 20 for c in configs)  # the task's other params are as in its file
    header = out.splitlines()[1].split()
    assert header[:3] == ["method", "n_test", "n_train"]  # the curve groups by the swept param
    assert main(argv) == 0
    assert "4 runs: 0 finished, 4 already in" in capsys.readouterr().err


def test_a_sweep_point_at_a_set_lr_is_the_run_of_the_same_flags(tiny_cli, tmp_path, capsys):
    """--set reaches every point: `clbench run --n-train N --set lr=X` names the very run the sweep made."""
    common = ["--task", TASK, "--task-dir", str(tiny_cli.tasks), "--db", str(tmp_path / "r.duckdb"), "--method", "et"]
    common += ["--set", "lr=0.05", "--budget", "steps=2"]
    assert main(["sweep", *common, "--n", "4,8"]) == 0
    assert "2 runs: 2 finished" in capsys.readouterr().err
    assert main(["run", *common, "--n-train", "8"]) == 0
    assert "1 runs: 0 finished, 1 already in" in capsys.readouterr().err
    configs = [json.loads(c) for c in Store(tmp_path / "r.duckdb").query("SELECT config FROM runs").config]
    assert sorted((c["budget"]["n_train"], c["method_config"]["lr"]) for c in configs) == [(4, 0.05), (8, 0.05)]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--param", "n_test=12,12"], "--param n_test: give the key once, with distinct non-empty values"),
        (["--param", "n_test=12", "--param", "n_test=14"], "--param n_test: give the key once"),
        (["--param", "n_test=12,0"], "task 'tiny-arith' params: n_test: Input should be greater than 0"),
        (["--param", "n_tset=12"], "task 'tiny-arith' has no param 'n_tset' (did you mean 'n_test'?)"),
        (["--budget", "stepz=2"], "task 'tiny-arith' has no budget key 'stepz'"),
        (["--method", "et,fft", "--set", "lr=1"], "--set applies to one method; name a single --method with it"),
        (["--set", "lr=1", "--tuned"], "the lr is given twice: by an option (lr=...) and by --tuned"),
    ],
)
def test_a_bad_sweep_param_is_one_line_and_runs_nothing(tiny_cli, tmp_path, capsys, flags, message):
    argv = ["sweep", "--task", TASK, "--task-dir", str(tiny_cli.tasks), "--db", str(tmp_path / "r.duckdb")]
    assert main([*argv, "--method", "et", "--n", "4", *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"clbench: error: {message}")
    assert not (tmp_path / "r.duckdb").exists()


def test_the_leaderboard_plots_a_dictionary_size_sweep(tmp_path):
    from leaderboard_db import record

    from clbench.report.leaderboard import build

    store = Store(tmp_path / "r.duckdb")
    gaps = {(1, 8): 0.6, (1, 16): 0.8, (2, 8): 0.3, (2, 16): 0.7}  # N*(1) = 8, N*(2) = 16: k = 40 / 5 = 8
    for (s, n), gap in gaps.items():
        record(
            store, f"r{s}-{n}", "pw", "et", "tiny", 0, {"gap_closed": gap}, n_train=n, params={"dictionary_size": s}
        )
    page = (build(tmp_path / "r.duckdb", tmp_path / "out") / "index.html").read_text()
    assert "s (dictionary_size)" in page and "N* ≈ 8·s (rms 0)" in page
    assert "et · tiny · s=1" in page and "et · tiny · s=2" in page
