"""`clbench results` and the end of `clbench run`: per task what fits 120 columns, the rest a flag away."""

from __future__ import annotations

import pytest
from leaderboard_db import record
from test_cli import _error

from clbench.cli import main, progress
from clbench.metrics import METRICS, headline
from clbench.report.format import arrow
from clbench.report.summary import WIDTH, summary
from clbench.store import Store

LEFT_OUT = "(--wide shows every column, --metrics a,b the ones named)"


@pytest.fixture
def db(tmp_path):
    """`words`: every summary headline metric, four methods at their own lr, et and fft also at n_train 50, three
    seeds each; `arith`: two methods, one seed, two metrics."""
    store = Store(tmp_path / "r.duckdb")
    every = headline("summary")
    groups = [("et", 3e-3, 200), ("fft", 3e-4, 200), ("lora", 1e-3, 200), ("ewc", 3e-4, 200)]
    for number, (method, lr, n_train) in enumerate(groups + [("et", 3e-3, 50), ("fft", 3e-4, 50)]):
        for seed in range(3):
            values = {name: rank + 0.01 * number + 0.003 * seed for rank, name in enumerate(every, 1)}
            run_id = f"w-{method}{n_train}-{seed}"
            record(store, run_id, "words", method, "meta-llama/Llama-3.2-3B", seed, values, lr=lr, n_train=n_train)
    for method, acc in (("et", 0.857), ("fft", 0.483)):
        record(
            store,
            f"a-{method}",
            "arith",
            method,
            "builtin:arith-llama",
            0,
            {"target_acc": acc, "forgetting_full": 0.2},
        )
    return tmp_path / "r.duckdb"


def test_each_task_shows_the_headline_metrics_that_fit_120_columns(db):
    lines = summary(Store(db)).splitlines()
    assert max(map(len, lines)) == 115 <= WIDTH
    # the summary ranks (clbench/metrics.py): what was learned, then what was forgotten, then the rest
    assert lines[:17] == [
        "task arith · model builtin:arith-llama · n_train 200 · lr 0.01 · seeds 1",
        "method    target_acc ↑      forgetting_full ↓",
        "--------  --------------  -------------------",
        "et        **0.857**                       0.2",
        "fft       0.483 ?                         0.2",
        "",
        "task words · model meta-llama/Llama-3.2-3B · seeds 3",
        "method      n_train      lr  target_loss ↓        target_acc ↑         after_new_loss ↓     forgetting_oldvocab ↓",
        "--------  ---------  ------  -------------------  -------------------  -------------------  -----------------------",
        "et               50  0.003   1.0430 ± 0.0075      2.0430 ± 0.0075      3.0430 ± 0.0075      4.0430 ± 0.0075",
        "et              200  0.003   **1.0030 ± 0.0075**  2.0030 ± 0.0075      **3.0030 ± 0.0075**  **4.0030 ± 0.0075**",
        "ewc             200  0.0003  1.0330 ± 0.0075      2.0330 ± 0.0075      3.0330 ± 0.0075      4.0330 ± 0.0075",
        "fft              50  0.0003  1.0530 ± 0.0075      **2.0530 ± 0.0075**  3.0530 ± 0.0075      4.0530 ± 0.0075",
        "fft             200  0.0003  1.0130 ± 0.0075      2.0130 ± 0.0075      3.0130 ± 0.0075      4.0130 ± 0.0075",
        "lora            200  0.001   1.0230 ± 0.0075      2.0230 ± 0.0075      3.0230 ± 0.0075      4.0230 ± 0.0075",
        f"left out: after_new_gap_closed, gap_closed and 12 more {LEFT_OUT}",
        "Cells: mean ± half-width of the 95 % confidence interval over seeds (Student's t; no ± with one seed), "
        "[evaluation",
    ]


def test_wide_is_the_one_table_of_every_headline_metric(capsys, db):
    assert main(["results", "--db", str(db), "--wide"]) == 0
    out = capsys.readouterr().out
    assert out == summary(Store(db), wide=True) + "\n"
    header = out.splitlines()[0].split()
    columns = ["task", "method", "model", "n_train", "lr", "seeds"]
    assert header == columns + [part for m in headline("summary") for part in (m, arrow(m).strip())]
    assert max(map(len, out.splitlines())) == 483


def test_metrics_shows_exactly_those_in_the_order_given(capsys, db):
    assert main(["results", "--db", str(db), "--task", "arith", "--metrics", "forgetting_full,target_acc"]) == 0
    assert capsys.readouterr().out.splitlines()[:4] == [
        "task    method    model                  n_train    lr    seeds    forgetting_full ↓  target_acc ↑",
        "------  --------  -------------------  ---------  ----  -------  -------------------  --------------",
        "arith   et        builtin:arith-llama        200  0.01        1                  0.2  **0.857**",
        "arith   fft       builtin:arith-llama        200  0.01        1                  0.2  0.483 ?",
    ]


@pytest.mark.parametrize("command", [["results"], ["run", "--task", "arithmetic", "--method", "et"]])
def test_an_unknown_metric_is_one_line_with_did_you_mean(capsys, db, command):
    before = db.read_bytes()
    message = _error(capsys, [*command, "--db", str(db), "--metrics", "target_acc,targt_loss"])
    assert message == f"unknown metric 'targt_loss' (did you mean 'target_loss'?); known: {', '.join(METRICS.names())}"
    both = _error(capsys, [*command, "--db", str(db), "--metrics", "target_acc", "--wide"])
    assert both == "--wide shows every headline metric and --metrics the ones named: give one"
    assert db.read_bytes() == before


def test_the_time_left_is_the_mean_of_the_finished_runs_times_those_to_run():
    assert progress(1, 6, []) == "run 1/6"
    assert progress(3, 6, [120.0, 60.0]) == "run 3/6: about 6 min left"  # 4 runs × 90 s
    assert progress(2, 3, [50.0]) == "run 2/3: about 2 min left"  # 2 × 50 s: 1.67 min
    assert progress(6, 6, [20.0, 25.0]) == "run 6/6: under a minute left"


def test_run_announces_each_run_and_ends_with_the_fitted_table(capsys, tmp_path, tiny_builtin, small_task_file):
    db = tmp_path / "r.duckdb"
    argv = ["run", "--task", "small", "--method", "et,fft", "--model", tiny_builtin]
    assert main([*argv, "--task-dir", str(small_task_file.parent), "--db", str(db)]) == 0
    out, err = capsys.readouterr()
    announced = [line for line in err.splitlines() if line.startswith("run ")]
    assert announced == ["run 1/2", "run 2/2: under a minute left"]
    assert out.splitlines()[0] == "task small · model builtin:tiny · n_train 8 · seeds 1"
    assert max(map(len, out.splitlines())) <= WIDTH


def test_a_runs_logged_metrics_are_packed_into_lines_a_terminal_holds(capsys):
    """The line a run logs after evaluation (distributed.log_items): its items in order, two spaces apart, on as few
    lines of at most WIDTH characters as they fill, none split."""
    from clbench.distributed import log_items

    items = [f"metric_{i:02d} {i / 3:.4g}" for i in range(16)]
    log_items(items)
    lines = capsys.readouterr().err.splitlines()
    assert [len(line) for line in lines] == [109, 111, 30] and all(line.startswith("  ") for line in lines)
    assert "  ".join(line.strip() for line in lines) == "  ".join(items)
    # full: the next line's first item would not have fitted on the line before it
    assert all(len(line) + 2 + len(after.split("  ")[1]) > WIDTH for line, after in zip(lines, lines[1:]))
    log_items(["x " + "9" * 130])  # one item wider than the terminal stands alone, whole
    assert capsys.readouterr().err == "  x " + "9" * 130 + "\n"
