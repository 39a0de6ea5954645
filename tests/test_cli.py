"""The command line: every user error is one line on stderr, exit 2, and leaves the DB alone."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import run_row

from clbench.cli import main
from clbench.store import Store


@pytest.fixture
def db(tmp_path):
    """A results DB with one recorded run."""
    path = tmp_path / "prior.duckdb"
    Store(path).record(run_row("prior"), {"target_acc": 0.5})
    return path


def _error(capsys, argv) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("clbench: error: ")
    assert "Traceback" not in err
    return lines[0].removeprefix("clbench: error: ")


RUN_ERRORS = [
    (
        ["--task", "arithmetc", "--method", "et"],
        "unknown task 'arithmetc' (did you mean 'arithmetic'?); known: arithmetic",
    ),
    (["--task", "arithmetic", "--method", "ett"], "unknown method 'ett' (did you mean 'et'?); known: et, fft"),
    (["--task", "arithmetic", "--method", "et,nope"], "unknown method 'nope'; known: et, fft"),
    (
        ["--task", "arithmetic", "--method", "et", "--seeds", "1,x"],
        "--seeds must be comma-separated integers, got '1,x'",
    ),
    (
        ["--task", "arithmetic", "--method", "et", "--seeds", "1,1"],
        "--seeds must be distinct non-negative integers, got '1,1'",
    ),
    (
        ["--task", "arithmetic", "--method", "et", "--seeds", "-1"],
        "--seeds must be distinct non-negative integers, got '-1'",
    ),
    (["--task", "arithmetic", "--method", "et", "--seeds", ""], "--seeds must be comma-separated integers, got ''"),
    (
        ["--task", "arithmetic", "--method", "et", "--set", "bad=1"],
        "method 'et' has no option 'bad'; options: lr, weight_decay",
    ),
    (
        ["--task", "arithmetic", "--method", "et", "--set", "lr=abc"],
        "method 'et' option 'lr' needs a float, got 'abc'",
    ),
    (["--task", "arithmetic", "--method", "et", "--set", "lr"], "--set takes KEY=VALUE, got 'lr'"),
    (
        ["--task", "arithmetic", "--method", "et,fft", "--set", "lr=1e-3"],
        "--set applies to one method; name a single --method with it",
    ),
    (
        ["--task", "arithmetic", "--method", "et", "--n-train", "0"],
        "argument --n-train: expected a positive integer, got '0' (see `clbench run --help`)",
    ),
    (
        ["--task", "arithmetic", "--method", "et", "--n-train", "x"],
        "argument --n-train: expected a positive integer, got 'x' (see `clbench run --help`)",
    ),
    (["--task", "arithmetic,arithmetic", "--method", "et"], "task list 'arithmetic,arithmetic' names one task twice"),
    (["--task", "", "--method", "et"], "empty task list ''"),
    (["--method", "et"], "the following arguments are required: --task (see `clbench run --help`)"),
]


@pytest.mark.parametrize("args, message", RUN_ERRORS, ids=[" ".join(a) for a, _ in RUN_ERRORS])
def test_run_errors(capsys, db, args, message):
    before = db.read_bytes()
    got = _error(capsys, ["run", *args, "--db", str(db)])
    # "known: ..." lists grow as tasks and methods are added: require the listed ones, in order
    head, _, known = got.partition("; known: ")
    want_head, _, want_known = message.partition("; known: ")
    assert head == want_head
    assert [n for n in known.split(", ") if n in want_known.split(", ")] == (
        want_known.split(", ") if want_known else [""]
    )
    assert db.read_bytes() == before


def test_unknown_subcommand(capsys):
    message = _error(capsys, ["frobnicate"])
    assert message.startswith("argument command: invalid choice: 'frobnicate'")


def test_no_subcommand(capsys):
    assert _error(capsys, []) == "the following arguments are required: command (see `clbench --help`)"


def test_results_on_a_missing_file(capsys, tmp_path):
    missing = tmp_path / "missing.duckdb"
    assert (
        _error(capsys, ["results", "--db", str(missing)])
        == f"results database {missing} does not exist (run `clbench run` first)"
    )
    assert not missing.exists()


def test_results_on_a_corrupt_file(capsys, tmp_path):
    path = tmp_path / "corrupt.duckdb"
    path.write_bytes(b"\x00not a database" * 100)
    assert _error(capsys, ["results", "--db", str(path)]).startswith(f"cannot open results database {path}")
    assert path.read_bytes() == b"\x00not a database" * 100


def test_ls_tasks(capsys):
    assert main(["ls", "tasks"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert ["arithmetic", "v1", "builtin:arith-llama"] in [line.split()[:3] for line in out.splitlines()]


def test_ls_methods(capsys):
    assert main(["ls", "methods"]) == 0
    out, _ = capsys.readouterr()
    names = [line.split()[0] for line in out.splitlines()]
    assert {"et", "fft"} <= set(names)
    assert names == sorted(names)
    assert "[lr=0.03, weight_decay=0.0]" in out.splitlines()[names.index("et")]


def test_validate(capsys):
    assert main(["validate"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert any(
        line == "ok  arithmetic v1: 1 new tokens, 600 train, 300 target, 500 old-text, 100 validation"
        for line in out.splitlines()
    )


def test_validate_reports_a_broken_extra_task(capsys, tmp_path):
    (tmp_path / "broken.yaml").write_text("name: broken\nversion: 0\n")
    message = _error(capsys, ["validate", "--task-dir", str(tmp_path)])
    assert message.startswith("task file broken.yaml: ")


def test_run_and_results_end_to_end(capsys, tmp_path, tiny_builtin, small_task_file):
    db = tmp_path / "r.duckdb"
    argv = [
        "run",
        "--task",
        "small",
        "--method",
        "et",
        "--model",
        "builtin:tiny",
        "--task-dir",
        str(small_task_file.parent),
        "--db",
        str(db),
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert f"1 runs: 1 finished, 0 already in {db}, 0 failed" in err
    assert "small" in out and "et" in out
    assert main(argv) == 0
    _, err = capsys.readouterr()
    assert f"1 runs: 0 finished, 1 already in {db}, 0 failed" in err
    assert main(["results", "--db", str(db), "--task", "small"]) == 0
    out, _ = capsys.readouterr()
    assert "builtin:tiny" in out
    assert main(["results", "--db", str(db), "--task", "nothing-here"]) == 0
    assert capsys.readouterr().out == "(no finished runs)\n"


def test_subprocess_error_has_no_traceback(tmp_path):
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, "-m", "clbench.cli", "run", "--task", "nope", "--method", "et"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("clbench: error: unknown task 'nope'; known: ")
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n")
    assert os.listdir(tmp_path) == []  # no results file appeared in the working directory


@pytest.mark.parametrize("command", ["run", "sweep"])
@pytest.mark.parametrize("device, message", [("tpu", "unknown device 'tpu'"), ("cuda", "no CUDA GPU")])
def test_bad_device_fails_before_any_work(command, device, message, capsys):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    extra = ["--n", "5"] if command == "sweep" else []
    assert main([command, "--task", "arithmetic", "--method", "et", "--device", device, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("clbench: error:") and message in err


@pytest.mark.parametrize("out", ["/proc/forbidden", "/sys/clbench-out"])
def test_leaderboard_to_an_unwritable_folder_is_one_line(capsys, db, out):
    before = db.read_bytes()
    message = _error(capsys, ["leaderboard", "--db", str(db), "--out", out])
    assert message.startswith(f"cannot write the leaderboard to {out}: ")
    assert db.read_bytes() == before
