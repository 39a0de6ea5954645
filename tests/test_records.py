"""The record store (--db DIR/): one immutable record per run, claims by atomic create, no file locks.

The multi-process tests run real `clbench run` processes with an LD_PRELOAD shim whose fcntl/flock/lockf
succeed and lock nothing (what a lockless NFS mount gives); the slow one runs 32 processes as 4 hosts.
"""

import json
import os
import shutil
import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import run_row
from test_reliability import dead_pid
from tiny_setup import clbench_process, cli_env, run_clbench

from clbench.errors import ClbenchError
from clbench.owner import Owner, start_token
from clbench.records import TMP_STALE_SECONDS, RecordStore, merge, open_store
from clbench.store import Store, now
from clbench.testing import NOT_REPRODUCIBLE

PUBLISHED = Path(__file__).parent.parent / "leaderboard" / "pseudowords-cpu" / "results.duckdb"
SHIM = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
#include <sys/file.h>
#include <dlfcn.h>
/* file locks that succeed and lock nothing: every other fcntl command goes to libc */
static int (*real_fcntl)(int, int, ...);
int fcntl(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    if (cmd == F_SETLK || cmd == F_SETLKW || cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW) return 0;
    if (!real_fcntl) real_fcntl = dlsym(RTLD_NEXT, "fcntl");
    return real_fcntl(fd, cmd, arg);
}
int fcntl64(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    return fcntl(fd, cmd, arg);
}
int flock(int fd, int op) { return 0; }
int lockf(int fd, int cmd, off_t len) { return 0; }
"""


@pytest.fixture(scope="module")
def no_locks(tmp_path_factory) -> str:
    """The shim, compiled: LD_PRELOAD it and a process's file locks always succeed, holding nothing."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the lockless shim")
    root = tmp_path_factory.mktemp("shim")
    (root / "nolock.c").write_text(SHIM)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", root / "nolock.so", root / "nolock.c", "-ldl"], check=True)
    return str(root / "nolock.so")


def record(store, run_id: str, *, status: str = "finished", attempt=None, metrics=None, **rows) -> None:
    metrics = {"target_loss": 1.5} if metrics is None else metrics
    store.record(run_row(run_id, status=status), metrics, attempt=attempt, **rows)


def frames(store, sql: str):
    found = store.query(sql)
    return found.sort_values(list(found.columns)).reset_index(drop=True)


# --- the store, in process -------------------------------------------------------------------------------


def test_a_directory_or_trailing_slash_selects_the_record_store(tmp_path):
    assert isinstance(open_store(tmp_path), RecordStore)
    assert isinstance(open_store(f"{tmp_path}/new/"), RecordStore)
    assert isinstance(open_store(tmp_path / "r.duckdb"), Store)


def test_records_read_as_the_single_file_store_reads_them(tmp_path):
    """The same writes to both stores give the same tables through DuckDB, to the value and the type."""
    curves = [(1, 0, 2.5, 1e-3, 0.5), (1, 1, 2.25, 1e-3, 0.25)]
    generations = [(0, "target", "2*3=", "6", "6", 0)]
    matrix = [(0, 0, "loss_oldvocab", 1.0), (1, 1, "target_loss", 0.5)]
    stores = [Store(tmp_path / "r.duckdb"), RecordStore(tmp_path / "records")]
    for store in stores:
        record(store, "a1", metrics={"target_loss": 1.5, "forgetting_full": -0.25}, curves=curves)
        record(store, "b2", status="failed", metrics={})  # as the protocol records a diverged run
        record(store, "c3", generations=generations, stage_matrix=matrix)
        store.record_lm_eval("a1", [LM_EVAL_ROW])
        store.record_tuned(TUNED_ROW)
    for table in ("runs", "metrics", "curves", "generations", "stage_matrix", "lm_eval", "results"):
        file_rows, record_rows = (frames(s, f"SELECT * FROM {table}") for s in stores)
        assert len(file_rows) > 0
        assert file_rows.dtypes.to_dict() == record_rows.dtypes.to_dict(), table
        assert file_rows.equals(record_rows), table
    tuned = [s.query("SELECT tune_key, lr, score, search FROM tuned").to_dict("records") for s in stores]
    assert [[r | {"search": json.loads(r["search"])} for r in t] for t in tuned] == [[TUNED_ROW_STORED]] * 2
    choices = [s.tuned("k1") for s in stores]  # each store chose at its own time: chosen_at is compared apart
    assert all(isinstance(c.pop("chosen_at"), datetime) for c in choices) and choices[0] == choices[1]
    assert choices[0] == TUNED_ROW and [s.tuned("k2") for s in stores] == [None, None]
    assert [s.status("a1") for s in stores] == ["finished", "finished"]
    assert [s.status("b2") for s in stores] == ["failed", "failed"]


LM_EVAL_ROW = {
    "task": "clbench_old_text",
    "metric": "bits_per_byte",
    "base": 1.0,
    "adapted": 1.25,
    "delta": 0.25,
    "lm_eval_version": "0.4",
    "task_version": "1",
    "task_hash": "h",
}
TUNED_ROW = {
    "tune_key": "k1",
    "task": "arithmetic",
    "method": "et",
    "model": "builtin:tiny",
    "profile": None,
    "objective": "target_loss",
    "lr": 3e-3,
    "score": 1.25,
    "search": [{"lr": 3e-3, "seeds": [0], "values": [1.25], "mean": 1.25, "run_ids": ["x"]}],
}
TUNED_ROW_STORED = {k: TUNED_ROW[k] for k in ("tune_key", "lr", "score", "search")}


def test_a_finished_run_is_recorded_once_and_a_later_finish_of_a_failed_one_shows(tmp_path):
    store = RecordStore(tmp_path / "s")
    record(store, "r1", status="failed")
    assert store.query("SELECT run_id, status FROM runs").values.tolist() == [["r1", "failed"]]
    record(store, "r1", metrics={"target_loss": 2.0})
    with pytest.raises(
        ClbenchError, match="^run r1 is already recorded by another process; this result is discarded$"
    ):
        record(store, "r1", metrics={"target_loss": 9.0})
    assert store.query("SELECT run_id, status FROM runs").values.tolist() == [["r1", "finished"]]
    assert store.query("SELECT metric, value FROM metrics").values.tolist() == [["target_loss", 2.0]]
    assert not any((tmp_path / "s" / "tmp").iterdir())  # the discarded record's files are gone


def test_a_claim_sweeps_what_killed_writers_left_under_tmp(tmp_path):
    store = RecordStore(tmp_path / "s")
    store.claim("r0")
    scratch = tmp_path / "s" / "tmp"
    (scratch / "r9.dead").mkdir()
    (scratch / "r9.dead" / "runs.parquet").write_text("half")
    (scratch / "claim.dead").write_text("{}")
    (scratch / "r8.being-written").mkdir()
    stale = time.time() - TMP_STALE_SECONDS - 60
    for entry in ("r9.dead", "claim.dead"):
        os.utime(scratch / entry, (stale, stale))
    assert store.claim("r1").state == "claimed"
    assert sorted(p.name for p in scratch.iterdir()) == ["r8.being-written"]  # a fresh one may be mid-write


def test_claims_finished_busy_dead_and_stale(tmp_path, monkeypatch):
    store = RecordStore(tmp_path / "s")
    assert (store.claim("r1").state, store.claim("r1").attempt) == ("claimed", 2)  # our own earlier attempt: retried
    parent = Owner(Owner.me().host, os.getppid(), start_token(os.getppid()))
    claims = tmp_path / "s" / "claims"
    row = json.loads((claims / "r1.2.json").read_text())
    (claims / "r1.2.json").write_text(json.dumps(row | {"pid": parent.pid, "process_start": parent.start}))
    claim = store.claim("r1")
    assert (claim.state, claim.holder) == ("busy", parent)  # a live process of this host holds it
    (claims / "r1.2.json").write_text(json.dumps(row | {"pid": dead_pid()}))
    assert store.claim("r1").attempt == 3  # its holder died
    away = json.loads((claims / "r1.3.json").read_text()) | {"host": "node-7"}
    for silent_for, state in [(60, "busy"), (3600, "claimed")]:
        beat = (now() - timedelta(seconds=silent_for)).isoformat()
        (claims / "r1.3.json").write_text(json.dumps(away | {"beat_at": beat}))
        assert store.claim("r1").state == state  # another host: judged by its heartbeat
    assert store.query("SELECT attempt, outcome FROM attempts ORDER BY attempt").values.tolist() == [
        [1, "interrupted"],
        [2, "interrupted"],
        [3, "interrupted"],
        [4, "running"],
    ]
    record(store, "r1", attempt=4)
    assert store.claim("r1").state == "finished"
    assert store.query("SELECT outcome FROM attempts WHERE attempt = 4").outcome.tolist() == ["finished"]


def test_a_result_whose_claim_was_taken_over_is_not_written(tmp_path, monkeypatch):
    store = RecordStore(tmp_path / "s")
    attempt = store.claim("r1").attempt
    other = Owner("node-7", 1, None)
    monkeypatch.setattr(Owner, "me", classmethod(lambda cls: other))
    assert store.claim("r1").state == "busy"  # from node-7 our claim is another host's, with a fresh heartbeat
    beat = json.loads((tmp_path / "s" / "claims" / "r1.1.json").read_text())
    stale = (now() - timedelta(hours=1)).isoformat()
    (tmp_path / "s" / "claims" / "r1.1.json").write_text(json.dumps(beat | {"beat_at": stale}))
    assert store.claim("r1").attempt == 2  # node-7 judged it stale (our heartbeat thread stalled) and took it over
    monkeypatch.undo()
    with pytest.raises(ClbenchError, match="^run r1: attempt 1 is no longer held by this process"):
        record(store, "r1", attempt=attempt)
    assert store.status("r1") is None


def test_the_published_database_merges_into_a_record_store_and_back(tmp_path):
    """A published results.duckdb is readable and mergeable into the record store, and the store's records
    merge back into a DuckDB file: every run, metric and curve point survives both ways."""
    records, back = RecordStore(tmp_path / "s"), Store(tmp_path / "back.duckdb")
    published = Store(PUBLISHED)
    merged = merge(records, published)
    count = len(published.query("SELECT run_id FROM runs"))
    assert (merged.runs, merged.kept) == (count, 0) and count >= 27
    assert merge(records, published).runs == 0  # a second merge finds everything there
    merge(back, records)
    columns = ", ".join(published.query("SELECT * FROM runs LIMIT 0").columns)  # a file from before `spec`
    for sql in [
        "SELECT * FROM results",
        f"SELECT {columns} FROM runs",
        "SELECT * FROM curves",
        "SELECT tune_key, lr FROM tuned",
    ]:
        expected = frames(published, sql)
        assert frames(records, sql).equals(expected) and frames(back, sql).equals(expected), sql


# --- processes: kills, overlapping grids, no working locks ---------------------------------------------------


def wait_for(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def records_of(root: Path) -> dict[str, dict[str, float]]:
    store = RecordStore(root)
    values: dict[str, dict[str, float]] = {}
    for run_id, metric, value in store.query("SELECT run_id, metric, value FROM metrics").values.tolist():
        values.setdefault(run_id, {})[metric] = value
    return values


def check_consistent(root: Path, runs: int) -> None:
    """Every run recorded exactly once and whole, every query agreeing, nothing half-written left visible."""
    store = RecordStore(root)
    assert sorted(p.name for p in (root / "records").iterdir()) == sorted(
        store.query("SELECT run_id FROM runs WHERE status = 'finished'").run_id
    )
    assert store.query("SELECT count(*) n, count(DISTINCT run_id) d FROM runs").values.tolist() == [[runs, runs]]
    per_run = store.query(
        "SELECT r.method, count(*) n FROM metrics JOIN runs r USING (run_id) GROUP BY run_id, r.method"
    )
    # no record without its metrics: each method's runs hold the same number (fft's new_token_loss beside et's)
    assert len(per_run) == runs and (per_run.groupby("method").n.nunique() == 1).all()
    steps = store.query("SELECT run_id, count(*) n FROM curves GROUP BY run_id").n
    assert len(steps) == runs and set(steps) == {6}
    assert store.query("SELECT count(*) FROM attempts WHERE outcome = 'finished'").iloc[0, 0] == runs
    assert len(store.query("SELECT * FROM results")) == per_run.n.sum()


def test_lockless_writers_with_kills_record_every_run_once(tiny_cli, no_locks, tmp_path):
    """4 processes on one store over overlapping grids, locks doing nothing; one killed mid-training and one
    mid-record (its record staged, not yet in place); a rerun finishes what they left."""
    root = tmp_path / "store"
    env = cli_env(tmp_path / "cache", LD_PRELOAD=no_locks)
    grids = [("et,fft", "0,1"), ("fft,et", "1,0"), ("et", "0,1"), ("fft", "1,0")]
    faults = ["train-step:kill@2", "record:kill@1", None, None]
    start = lambda grid, fault: clbench_process(
        tiny_cli.run_args(f"{root}/", "--method", grid[0], "--seeds", grid[1]),
        {**env, "CLBENCH_TEST_FAULT": fault} if fault else env,
    )
    # the two to be killed first, each holding a run before the others start: then both surely die
    processes = [start(grids[0], faults[0])]
    wait_for(lambda: len(list((root / "claims").glob("*.json"))) >= 1)
    processes.append(start(grids[1], faults[1]))
    wait_for(lambda: len(list((root / "claims").glob("*.json"))) >= 2)
    processes += [start(grid, fault) for grid, fault in zip(grids[2:], faults[2:])]
    codes = [p.wait(timeout=600) for p in processes]
    errors = [p.communicate()[1] for p in processes]
    assert codes[:2] == [-signal.SIGKILL] * 2 and codes[2:] == [0, 0], errors
    rerun = run_clbench(tiny_cli.run_args(f"{root}/", "--method", "et,fft", "--seeds", "0,1"), env, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    check_consistent(root, runs=4)
    # the concurrent, killed, lockless grid gives the same numbers as one clean process
    clean = run_clbench(tiny_cli.run_args(f"{tmp_path / 'clean'}/", "--method", "et,fft", "--seeds", "0,1"), env)
    assert clean.returncode == 0, clean.stderr
    reproducible = lambda values: {
        r: {m: v for m, v in ms.items() if m not in NOT_REPRODUCIBLE} for r, ms in values.items()
    }
    assert reproducible(records_of(root)) == reproducible(records_of(tmp_path / "clean"))


@pytest.mark.slow
@pytest.mark.stress  # opt-in: `pytest -m stress tests/test_records.py` (minutes of 2 cores; conftest.py)
def test_32_processes_as_4_hosts_without_locks(tiny_cli, no_locks, tmp_path):
    """32 `clbench run` processes, 8 per simulated host (own UTS namespace, own hostname: another host's pids
    cannot be seen, only heartbeats), overlapping grids of 16 runs, no working locks, 4 SIGKILLed mid-run and
    4 mid-record; reruns finish the rest. Numbers: docs/reliability.md."""
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --uts is not permitted here: hosts cannot be simulated")
    root = tmp_path / "store"
    env = cli_env(tmp_path / "cache", LD_PRELOAD=no_locks)
    seeds = ["0,1,2,3,4,5,6,7", "7,6,5,4,3,2,1,0", "0,2,4,6,1,3,5,7", "1,3,5,7,0,2,4,6"]
    faults = dict.fromkeys((1, 9, 17, 25), "train-step:kill@4")
    faults |= dict.fromkeys((2, 10, 18, 26), "record:kill@1")

    def start(number: int) -> subprocess.Popen:
        grid = ("--method", "et,fft" if number % 2 else "fft,et", "--seeds", seeds[number % 4])
        wrapped = ["unshare", "--uts", "sh", "-c", f'hostname node-{number % 4} && exec "$@"', "sh"]
        fault = faults.get(number)
        return subprocess.Popen(
            [*wrapped, "python3", "-m", "clbench.cli", *tiny_cli.run_args(f"{root}/", *grid)],
            env={**env, "CLBENCH_TEST_FAULT": fault} if fault else env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    # the 8 to be killed first, each holding a run before the others start: then each surely dies
    processes = {}
    for number in faults:
        processes[number] = start(number)
        wait_for(lambda: len(list((root / "claims").glob("*.json"))) >= len(processes), timeout=300)
    processes |= {number: start(number) for number in range(32) if number not in faults}
    processes = [processes[number] for number in range(32)]
    results = [(p.wait(timeout=1800), p.communicate()[1]) for p in processes]
    killed = [code for code, _ in results if code == -signal.SIGKILL]
    assert len(killed) == 8 and all(code in (0, -signal.SIGKILL) for code, _ in results), [e for _, e in results]
    for host in range(4):  # a dead process's claim is seen dead from its own host at once (elsewhere: after
        # STALE_SECONDS without a heartbeat), so each host reruns the grid
        rerun = subprocess.run(
            ["unshare", "--uts", "sh", "-c", f'hostname node-{host} && exec "$@"', "sh", "python3", "-m", "clbench.cli"]
            + tiny_cli.run_args(f"{root}/", "--method", "et,fft", "--seeds", "0,1,2,3,4,5,6,7"),
            env=env, text=True, capture_output=True, timeout=1800,
        )  # fmt: skip
        assert rerun.returncode == 0, rerun.stderr
    check_consistent(root, runs=16)
    attempts = RecordStore(root).query("SELECT count(*) FROM attempts").iloc[0, 0]
    print(f"\n32 processes / 4 hosts / no locks: 16 runs recorded once each; {attempts} attempts; 8 killed")
