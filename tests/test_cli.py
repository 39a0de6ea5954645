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
from clbench.testing import write_tiny_task


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
    (["--task", "arithmetic", "--method", "et,qqq"], "unknown method 'qqq'; known: et, fft"),
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
    assert ["arithmetic", "v2", "builtin:arith-llama"] in [line.split()[:3] for line in out.splitlines()]


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
        line == "ok  arithmetic v2: 1 new tokens, 600 train, 300 target, 500 old-text, 100 validation"
        for line in out.splitlines()
    )


def test_validate_reports_a_broken_extra_task(capsys, tmp_path):
    (tmp_path / "broken.yaml").write_text("name: broken\nversion: 0\n")
    message = _error(capsys, ["validate", "--task-dir", str(tmp_path)])
    assert message.startswith("task file broken.yaml: ")


def _validate_task(tmp_path, *, model: str = "builtin:arith-llama", **fields):
    """tiny_setup's task (tasks/arithmetic.py under a tiny budget) with some fields changed, in a folder no
    registry reads; → the path of its file."""
    return write_tiny_task(tmp_path / "elsewhere", model, **fields)


def test_validate_a_file_outside_the_registry(capsys, tmp_path):
    assert main(["validate", str(_validate_task(tmp_path))]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("ok  tiny-arith v1: 1 new tokens, 880 train, 20 target, 20 old-text, 100 validation\n", "")


def test_validate_names_a_new_token_the_vocabulary_has(capsys, tmp_path):
    path = _validate_task(tmp_path, params={"operator": "*"})
    assert _error(capsys, ["validate", str(path)]) == (
        "task 'tiny-arith' with builtin:arith-llama's tokenizer: new token(s) already in the base vocabulary: ['*']"
    )


def test_validate_names_each_set_with_unknown_text(capsys, tmp_path):
    path = _validate_task(tmp_path, params={"template": "{a}{op}{b}=-"})
    assert main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    prefix = "clbench: error: task 'tiny-arith' with builtin:arith-llama's tokenizer: "
    accepts = "`allow_unknown_tokens: true` in the task file accepts that"
    assert out == ""
    assert err.splitlines() == [
        f"{prefix}train example 0 '50<spec>8=-400': the tokenizer reads '-' as '<unk>' (16 of 16 examples; {accepts})",
        f"{prefix}target example 0 '43<spec>9=-387': the tokenizer reads '-' as '<unk>' (20 of 20 examples; {accepts})",
        f"{prefix}replay text example 0 '4*0=-0': the tokenizer reads '-' as '<unk>' (10 of 10 examples; {accepts})",
        f"{prefix}old text example 0 '70+0=-70': the tokenizer reads '-' as '<unk>' (20 of 20 examples; {accepts})",
        f"{prefix}old skill example 0 '28+40=-68': the tokenizer reads '-' as '<unk>' (20 of 20 examples; {accepts})",
        f"{prefix}target oracle example 0 '43*9=-387': the tokenizer reads '-' as '<unk>' (20 of 20 examples; {accepts})",
    ]
    path = _validate_task(tmp_path, params={"template": "{a}{op}{b}=-"}, allow_unknown_tokens=True)
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().err == ""


def test_validate_a_typo_of_a_required_key_suggests_it(capsys, tmp_path):
    path = _validate_task(tmp_path)
    path.write_text(path.read_text().replace("budget:", "budgt:"))
    assert _error(capsys, ["validate", str(path)]) == (
        "task file tiny-arith.yaml: budgt: Extra inputs are not permitted (did you mean 'budget'?)"
    )


def test_validate_a_hub_model_not_on_this_machine_leaves_its_tokenizer_unchecked(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    path = _validate_task(tmp_path, model="nobody/no-such-model")
    assert main(["validate", str(path), "--model", "nobody/no-such-model"]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == (
        "ok  tiny-arith v1: 1 new tokens, 880 train, 20 target, 20 old-text, 100 validation; "
        "tokenizer not checked: nobody/no-such-model not available offline\n",
        "",
    )


def test_validate_reads_a_profile_with_another_model(capsys):
    # the paper profile writes spaces, which the arithmetic base's characters do not include
    assert main(["validate", "arithmetic", "--profile", "paper", "--model", "builtin:arith-llama"]) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 6
    assert lines[0] == (
        "clbench: error: task 'arithmetic' with builtin:arith-llama's tokenizer: train example 0 '5 <spec> 8 = 40': "
        "the tokenizer reads ' ' as '<unk>' (200 of 200 examples; `allow_unknown_tokens: true` in the task file "
        "accepts that)"
    )
    assert _error(capsys, ["validate", "arithmetc"]).startswith(
        "unknown task 'arithmetc' (did you mean 'arithmetic'?)"
    )


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
    assert capsys.readouterr().out == "(no finished runs of task 'nothing-here'; finished runs here are of small)\n"


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
