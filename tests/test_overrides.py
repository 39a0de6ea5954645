"""--param and --budget: a task's params and budget changed from the command line, checked by its schemas."""

from __future__ import annotations

import json

import pytest

from clbench.cli import main
from clbench.store import Store
from clbench.testing import TASK


@pytest.fixture
def common(tiny_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    return [
        "run",
        "--task",
        TASK,
        "--task-dir",
        str(tiny_cli.tasks),
        "--db",
        str(tmp_path / "r.duckdb"),
        "--method",
        "et",
    ]


def test_overrides_are_part_of_the_config_and_the_run_id(common, tmp_path, capsys):
    assert main([*common, "--budget", "steps=3", "--param", "n_test=12"]) == 0
    assert main(common) == 0
    capsys.readouterr()
    configs = [json.loads(c) for c in Store(tmp_path / "r.duckdb").query("SELECT config FROM runs").config]
    overridden = next(c for c in configs if c["budget"]["steps"] == 3)
    plain = next(c for c in configs if c["budget"]["steps"] == 6)
    assert overridden["params"]["n_test"] == 12 and plain["params"]["n_test"] == 20
    assert Store(tmp_path / "r.duckdb").query("SELECT count(DISTINCT run_id) AS n FROM runs").n[0] == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--budget", "stepz=3"], "task 'tiny-arith' has no budget key 'stepz' (did you mean 'steps'?); known: "),
        (["--param", "n_tset=3"], "task 'tiny-arith' has no param 'n_tset' (did you mean 'n_test'?); known: "),
        (["--budget", "steps=-1"], "task 'tiny-arith' --budget: steps: Input should be greater than 0"),
        (["--budget", "steps=many"], "task 'tiny-arith' --budget: steps: Input should be a valid integer"),
        (["--param", "n_test"], "--param takes KEY=VALUE, got 'n_test'"),
    ],
)
def test_a_bad_override_is_one_line_and_writes_nothing(common, tmp_path, capsys, flags, message):
    assert main([*common, *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert err.startswith(f"clbench: error: {message}")
    assert not (tmp_path / "r.duckdb").exists()
