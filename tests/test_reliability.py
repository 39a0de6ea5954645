"""Nothing lost, nothing corrupted: crash and resume, concurrent writers, divergence, determinism.

Real `clbench run` processes on a tiny_cli local model (tests/tiny_setup.py) are SIGKILLed at named points
(clbench/faults.py, CLBENCH_TEST_FAULT) and the same command is run again.
"""

import os
import re
import signal
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import duckdb
import pytest
import torch
from conftest import run_row
from tiny_setup import clbench_process, cli_env, run_clbench

from clbench import storage
from clbench.cli import main
from clbench.data import Encoded
from clbench.errors import ClbenchError, DivergedError
from clbench.owner import Owner, start_token
from clbench.store import Store, now
from clbench.testing import MEMORY, NOT_REPRODUCIBLE
from clbench.train import train

SWEEP = ["--method", "et,fft", "--seeds", "0,1"]  # 4 runs of 6 steps each, in this order: et/0, et/1, fft/0, fft/1
# Wall-clock time and the process's memory high-water mark measure the machine and its load, not the
# computation; every other metric must repeat exactly.


def metrics_of(db) -> dict[str, dict[str, float]]:
    values: dict[str, dict[str, float]] = {}
    for run_id, metric, value in rows(db, "SELECT run_id, metric, value FROM metrics"):
        values.setdefault(run_id, {})[metric] = value
    return values


def reproducible(values: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    return {run: {m: v for m, v in metrics.items() if m not in NOT_REPRODUCIBLE} for run, metrics in values.items()}


def rows(db, sql: str, params: list | None = None) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as connection:
        return connection.execute(sql, params or []).fetchall()


def _running(db) -> str:
    [(run_id,)] = rows(db, "SELECT run_id FROM attempts WHERE outcome = 'running'")
    return run_id


@pytest.fixture(scope="module")
def reference(tiny_cli, tmp_path_factory):
    """The sweep run once, uninterrupted, in its own process."""
    root = tmp_path_factory.mktemp("reference")
    done = run_clbench(tiny_cli.run_args(root / "results.duckdb", *SWEEP), cli_env(root / "cache"))
    assert done.returncode == 0, done.stderr
    return metrics_of(root / "results.duckdb")


def test_the_same_command_twice_gives_identical_metrics(tiny_cli, reference, tmp_path):
    again = run_clbench(tiny_cli.run_args(tmp_path / "results.duckdb", *SWEEP), cli_env(tmp_path / "cache"))
    assert again.returncode == 0, again.stderr
    second = metrics_of(tmp_path / "results.duckdb")
    assert len(second) == 4 and second.keys() == reference.keys()  # same configs → same run ids
    assert all(
        set(metrics) >= NOT_REPRODUCIBLE - MEMORY and len(set(metrics) & MEMORY) == 1 for metrics in second.values()
    )
    assert reproducible(second) == reproducible(reference)  # exact float equality, 16 metrics × 4 runs


@pytest.mark.parametrize("fault", ["train-step:kill@9", "record:kill@2"], ids=["mid-training", "mid-write"])
def test_a_killed_sweep_rerun_finishes_with_one_record_per_run(tiny_cli, reference, tmp_path, fault):
    # train-step@9: step 3 of the 2nd run (et, seed 1); record@2: inside the 2nd run's write, before COMMIT
    db, env = tmp_path / "results.duckdb", cli_env(tmp_path / "cache")
    killed = clbench_process(tiny_cli.run_args(db, *SWEEP), {**env, "CLBENCH_TEST_FAULT": fault})
    killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL

    # what the kill left: run 1 complete, run 2 claimed by the dead process, not one metric row of it
    [(finished,)] = rows(db, "SELECT run_id FROM runs")
    assert rows(db, "SELECT run_id, pid FROM attempts WHERE outcome = 'running'") == [
        (interrupted := _running(db), killed.pid)
    ]
    assert {run for (run,) in rows(db, "SELECT DISTINCT run_id FROM metrics")} == {finished}
    assert {run for (run,) in rows(db, "SELECT DISTINCT run_id FROM curves")} == {finished}  # its 6 steps alone
    assert interrupted in reference and interrupted != finished

    rerun = run_clbench(tiny_cli.run_args(db, *SWEEP), env)
    assert rerun.returncode == 0, rerun.stderr
    assert f"retrying run {interrupted} (attempt 2;" in rerun.stderr
    assert "4 runs: 3 finished, 1 already in" in rerun.stderr

    assert rows(db, "SELECT count(*), count(DISTINCT run_id) FROM runs WHERE status = 'finished'") == [(4, 4)]
    assert rows(db, "SELECT count(*) FROM runs WHERE status <> 'finished'") == [(0,)]
    assert rows(db, "SELECT count(*) FROM metrics WHERE run_id NOT IN (SELECT run_id FROM runs)") == [(0,)]
    assert rows(db, "SELECT count(*), count(DISTINCT run_id) FROM curves") == [(4 * 6, 4)]  # no step twice
    assert rows(db, "SELECT attempt, outcome FROM attempts WHERE run_id = ? ORDER BY attempt", [interrupted]) == [
        (1, "interrupted"),
        (2, "finished"),
    ]
    assert rows(
        db, "SELECT attempt, outcome, count(*) FROM attempts WHERE run_id <> ? GROUP BY ALL", [interrupted]
    ) == [(1, "finished", 3)]
    # the retried run is a whole, correct result: every metric as in the uninterrupted sweep
    assert reproducible(metrics_of(db)) == reproducible(reference)


@pytest.mark.slow
def test_four_processes_on_one_db_train_every_run_exactly_once(tiny_cli, reference, tmp_path):
    db = tmp_path / "results.duckdb"
    # 8 runs; a 0.2 s pause per step stretches each to ~1.2 s so the four processes overlap
    env = cli_env(tmp_path / "cache", CLBENCH_TEST_FAULT="train-step:sleep=0.2")
    processes = [
        clbench_process(tiny_cli.run_args(db, "--method", "et,fft", "--seeds", "0,1,2,3"), env) for _ in range(4)
    ]
    results = [(p.wait(timeout=600), *p.communicate()) for p in processes]
    assert [code for code, _, _ in results] == [0, 0, 0, 0], [err for _, _, err in results]

    trained = [int(re.search(r"8 runs: (\d+) finished", err).group(1)) for _, _, err in results]
    assert sum(trained) == 8  # each run trained by exactly one process
    # twice the reference's runs (et and fft, seeds 0 and 1), fft's with new_token_loss beside et's metrics
    metric_rows = 2 * sum(len(values) for values in reference.values())
    assert rows(db, "SELECT count(*), count(DISTINCT run_id) FROM runs WHERE status = 'finished'") == [(8, 8)]
    assert rows(db, "SELECT count(*), count(DISTINCT (run_id, metric)) FROM metrics") == [(metric_rows, metric_rows)]
    assert rows(db, "SELECT count(*), count(DISTINCT run_id) FROM attempts WHERE outcome = 'finished'") == [(8, 8)]
    assert rows(db, "SELECT count(*) FROM attempts") == [(8,)]  # no run claimed twice
    # the four seeds-0,1 runs equal the sequential sweep's: concurrency changed no number
    shared = {run: values for run, values in metrics_of(db).items() if run in reference}
    assert reproducible(shared) == reproducible(reference)
    print(
        f"\nconcurrent writers 4: runs trained per process {trained}; metric rows expected {metric_rows}, found "
        f"{rows(db, 'SELECT count(*) FROM metrics')[0][0]}"
    )


# --- the claim, in process ---------------------------------------------------------------------------


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_run_held_by_a_live_process_is_left_to_it(tmp_path, monkeypatch):
    store = Store(tmp_path / "r.duckdb")
    assert store.claim("r1").attempt == 1
    parent = Owner(Owner.me().host, os.getppid(), start_token(os.getppid()))
    monkeypatch.setattr(Owner, "me", classmethod(lambda cls: parent))  # now we are another live process
    claim = store.claim("r1")
    assert (claim.state, claim.holder.pid) == ("busy", os.getpid())


def test_a_run_held_by_a_dead_or_reused_pid_is_retried(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    me = Owner.me()
    store.claim("r1")
    store.claim("r2")
    with duckdb.connect(str(store.path)) as db:
        db.execute("UPDATE attempts SET pid = ? WHERE run_id = 'r1'", [dead_pid()])
        db.execute("UPDATE attempts SET process_start = 'another boot:1' WHERE run_id = 'r2'")  # our pid, reused
    assert (store.claim("r1").attempt, store.claim("r2").attempt) == (2, 2)
    assert rows(store.path, "SELECT run_id, attempt, outcome, pid FROM attempts ORDER BY ALL") == [
        (
            "r1",
            1,
            "interrupted",
            rows(store.path, "SELECT pid FROM attempts WHERE run_id = 'r1' AND attempt = 1")[0][0],
        ),
        ("r1", 2, "running", me.pid),
        ("r2", 1, "interrupted", me.pid),
        ("r2", 2, "running", me.pid),
    ]


@pytest.mark.parametrize("silent_for, state", [(60, "busy"), (3600, "claimed")])
def test_another_hosts_claim_is_judged_by_its_heartbeat(tmp_path, silent_for, state):
    store = Store(tmp_path / "r.duckdb")
    store.claim("r1")
    with duckdb.connect(str(store.path)) as db:
        db.execute("UPDATE attempts SET host = 'node-7', beat_at = ?", [now() - timedelta(seconds=silent_for)])
    assert store.claim("r1").state == state


def test_a_running_attempt_keeps_its_heartbeat_fresh(tiny_cli, tmp_path, monkeypatch):
    monkeypatch.setattr(storage, "HEARTBEAT_SECONDS", 0.05)
    monkeypatch.setenv("CLBENCH_TEST_FAULT", "train-step:sleep=0.1")  # 6 steps: 0.6 s of training
    assert main(tiny_cli.run_args(tmp_path / "r.duckdb", "--method", "et")) == 0
    [(started, beat)] = rows(tmp_path / "r.duckdb", "SELECT started_at, beat_at FROM attempts")
    assert (beat - started).total_seconds() >= 0.4


def test_a_result_whose_claim_was_taken_over_is_not_written(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    attempt = store.claim("r1").attempt
    with duckdb.connect(str(store.path)) as db:
        db.execute("UPDATE attempts SET pid = 1 WHERE run_id = 'r1'")  # another process took the run over
    with pytest.raises(ClbenchError, match="attempt 1 is no longer held by this process"):
        store.record(run_row("r1"), {"target_loss": 1.0}, attempt=attempt)
    assert rows(store.path, "SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM metrics)") == [(0, 0)]
    assert rows(store.path, "SELECT outcome FROM attempts") == [("running",)]


def test_a_results_db_from_before_attempts_is_used_as_it_is(tiny_cli, tmp_path):
    db = tmp_path / "results.duckdb"
    assert main(tiny_cli.run_args(db, "--method", "et")) == 0
    with duckdb.connect(str(db)) as connection:
        connection.execute("DROP TABLE attempts")
    assert main(tiny_cli.run_args(db, "--method", "et,fft")) == 0  # et is skipped, fft claimed and recorded
    assert rows(db, "SELECT count(*) FROM runs WHERE status = 'finished'") == [(2,)]
    assert rows(db, "SELECT attempt, outcome FROM attempts") == [(1, "finished")]


# --- divergence ---------------------------------------------------------------------------------------


def test_a_diverging_run_is_failed_with_its_reason_and_the_sweep_goes_on(tiny_cli, tmp_path, capsys):
    db = tmp_path / "results.duckdb"
    assert main(tiny_cli.run_args(db, "--method", "et")) == 0
    # lr 1e30 makes FFT's weights overflow: the loss of the 2nd step is NaN, for both seeds
    assert main(tiny_cli.run_args(db, "--method", "fft", "--seeds", "0,1", "--set", "lr=1e30")) == 1
    err = capsys.readouterr().err
    assert err.count("failed: non-finite training loss at step 1") == 2
    assert "2 runs: 0 finished, 0 already in" in err and "2 failed" in err
    assert rows(db, "SELECT method, seed, status, reason FROM runs ORDER BY method, seed") == [
        ("et", 0, "finished", None),
        ("fft", 0, "failed", "non-finite training loss at step 1"),
        ("fft", 1, "failed", "non-finite training loss at step 1"),
    ]
    assert rows(db, "SELECT DISTINCT method, status, metric FROM results WHERE method = 'fft'") == [
        ("fft", "failed", None)
    ]
    assert rows(
        db, "SELECT DISTINCT outcome FROM attempts WHERE run_id IN (SELECT run_id FROM runs WHERE method = 'fft')"
    ) == [("failed",)]
    # `clbench results` (the finished-only summary) has the ET row and no FFT row
    assert main(["results", "--db", str(db), "--wide"]) == 0
    table = capsys.readouterr().out
    assert " et " in table and "fft" not in table


class Exploding(torch.nn.Module):
    """Finite loss (~1e30) whose gradient norm overflows float32."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(4))

    def get_input_embeddings(self):  # where train() sends the inputs (clbench.devices.input_device)
        return SimpleNamespace(weight=self.scale)

    def forward(self, input_ids):
        return SimpleNamespace(logits=torch.nn.functional.one_hot(input_ids, 4).float() * self.scale * 1e30)


def test_an_exploding_gradient_ends_training_with_its_reason():
    model = Exploding()
    with pytest.raises(DivergedError, match=r"^non-finite gradient norm at step 0$"):
        train(
            model,
            [{"params": [model.scale]}],
            [Encoded([1, 2, 3], 1)] * 4,
            steps=3,
            batch_size=2,
            lr=1e-3,
            seed=0,
            pad_id=0,
        )
    assert torch.equal(model.scale, torch.ones(4))  # no update was applied
