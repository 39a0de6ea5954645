"""`clbench run --lm-eval` and `clbench lm-eval --run` end to end on a tiny saved model (no network)."""

import shutil
from pathlib import Path

import duckdb
import pytest
from test_lmeval import tiny_model

import clbench.tasks
from clbench.arith import char_tokenizer
from clbench.cli import main

MINI_TASK = """
name: mini-arith
version: 1
description: "arithmetic, small enough for a test"
generator: arithmetic.py:build
model: builtin:arith-llama
init: random
budget: {n_train: 16, steps: 20, batch_size: 8, eval_batch_size: 64}
params: {n_test: 10, n_old_skill: 20, n_old_text: 30, n_replay: 0}
"""


@pytest.fixture
def task_dir(tmp_path):
    folder = tmp_path / "tasks"
    folder.mkdir(parents=True)
    shutil.copy(Path(clbench.tasks.__file__).parent / "arithmetic.py", folder)  # the generator beside its task file
    (folder / "mini-arith.yaml").write_text(MINI_TASK)
    return str(folder)


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    tokenizer = char_tokenizer()
    tiny_model(tokenizer).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return str(tmp_path / "tiny")


def lm_eval_rows(db):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT * FROM lm_eval ORDER BY ALL").fetchall()


def test_run_with_lm_eval_then_rebuilt_run_gives_identical_rows(model_dir, task_dir, tmp_path, capsys):
    db = tmp_path / "r.duckdb"
    run = [
        "run",
        "--task",
        "mini-arith",
        "--method",
        "fft",
        "--model",
        model_dir,
        "--db",
        str(db),
        "--task-dir",
        task_dir,
    ]
    assert main(run + ["--lm-eval", "clbench_old_text"]) == 0
    in_process = lm_eval_rows(db)
    (run_id,) = {r[0] for r in in_process}
    assert [r[1:3] for r in in_process] == [
        ("clbench_old_text", m) for m in ("bits_per_byte", "byte_perplexity", "word_perplexity")
    ]
    assert all(r[5] == r[4] - r[3] and r[5] != 0 for r in in_process)  # delta = adapted − base, fft moved it

    # the adapted model rebuilt from the run's config through the protocol scores bit-identically
    assert (
        main(["lm-eval", "--run", run_id, "--tasks", "clbench_old_text", "--db", str(db), "--task-dir", task_dir]) == 0
    )
    assert lm_eval_rows(db) == in_process
    assert "largest difference from its stored quality metrics 0" in capsys.readouterr().err

    # a resumed run with rows already there neither retrains nor rescores
    assert main(run + ["--lm-eval", "clbench_old_text"]) == 0
    err = capsys.readouterr().err
    assert "1 runs: 0 finished, 1 already in" in err and "rebuilt" not in err

    assert main(["lm-eval", "--run", "nope", "--tasks", "clbench_old_text", "--db", str(db)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"clbench: error: no run 'nope' in {db}"
    assert main(["lm-eval", "--run", run_id, "--tasks", "clbench_old_text,clbench_old_text", "--db", str(db)]) == 2
    assert lm_eval_rows(db) == in_process


def test_a_run_with_budget_and_param_overrides_rebuilds_exactly(model_dir, task_dir, tmp_path, capsys):
    """`lm-eval --run` retrains what was recorded, overrides included: before the run specification it rebuilt
    this run at the task's 20 steps and 10 test examples and refused it as no longer reproducing."""
    db = tmp_path / "r.duckdb"
    made = ["run", "--task", "mini-arith", "--method", "fft", "--model", model_dir, "--db", str(db)]
    overrides = ["--budget", "steps=3", "--param", "n_test=6", "--set", "lr=0.002", "--task-dir", task_dir]
    assert main(made + overrides) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        ((run_id, config),) = con.execute("SELECT run_id, config FROM runs").fetchall()
    assert '"steps": 3' in config and '"n_test": 6' in config
    capsys.readouterr()
    assert (
        main(["lm-eval", "--run", run_id, "--tasks", "clbench_old_text", "--db", str(db), "--task-dir", task_dir]) == 0
    )
    err = capsys.readouterr().err
    assert f"rebuilt run {run_id}: largest difference from its stored quality metrics 0\n" in err
    assert ", n_train 16, 3 steps)" in err  # the recorded budget, not the task file's 20 steps
    assert [r[1] for r in lm_eval_rows(db)] == ["clbench_old_text"] * 3
