"""Sweeps through submitit's local executor: jobs are separate processes writing to one store."""

import pytest

from clbench.arith import char_tokenizer
from clbench.errors import ClbenchError
from clbench.executors import RunRequest, execute
from clbench.spec import RunSpec
from clbench.store import Store
from clbench.taskspec import builtin_task_dir
from clbench.testing import tiny_llama


@pytest.fixture
def grid(tmp_path):
    """A tiny arithmetic task file and a tiny local model directory: no builtin hooks needed in workers."""
    generator = builtin_task_dir() / "arithmetic.py"
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "tiny-arith.yaml").write_text(
        "name: tiny-arith\nversion: 1\ndescription: arithmetic, tiny budget\n"
        f"generator: {generator}:build\nmodel: {tmp_path / 'model'}\n"
        "budget: {n_train: 20, steps: 2, batch_size: 4, eval_batch_size: 64}\n"
        "params: {n_test: 12, n_old_skill: 8, n_old_text: 8, n_replay: 8}\n"
    )
    tokenizer = char_tokenizer()
    tiny_llama(tokenizer, tied=False).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    db = str(tmp_path / "r.duckdb")
    return [
        RunRequest(RunSpec.make("tiny-arith", method, seed=seed, n_train=n), db, task_dirs=(str(tmp_path / "tasks"),))
        for method in ("et", "fft")
        for n in (5, 10)
        for seed in (0, 1)
    ], db


def test_sweep_jobs_reach_one_store_once(grid, tmp_path):
    requests, db = grid
    first = execute(requests, "local", workers=2, folder=tmp_path / "jobs")
    assert sorted(status for _, status, _ in first) == ["finished"] * 8
    runs = Store(db).query("SELECT run_id, method, seed, status FROM runs")
    assert len(runs) == 8 and set(runs.run_id) == {run_id for run_id, _, _ in first}
    # a rerun of the same grid, split differently, finds every point done
    again = execute(requests, "local", workers=1, folder=tmp_path / "jobs")
    assert [status for _, status, _ in again] == ["skipped"] * 8
    assert len(Store(db).query("SELECT * FROM runs")) == 8


def test_a_failing_job_is_one_clear_error(grid, tmp_path):
    requests, db = grid
    bad = [RunRequest(RunSpec.make("tiny-arith", "et", n_train=10_000), db, task_dirs=requests[0].task_dirs)]
    with pytest.raises(ClbenchError, match=r"^sweep job .* did not complete .*n_train 10000 exceeds"):
        execute(bad, "local", folder=tmp_path / "jobs")


def test_unknown_executor():
    with pytest.raises(ClbenchError, match="unknown executor 'k8s'"):
        execute([], "k8s")
