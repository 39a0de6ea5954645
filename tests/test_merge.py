"""`clbench merge`: runs and tuning choices of several results databases in one, exactly, atomically."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys

import duckdb
import pytest

from clbench.cli import main
from clbench.lrsearch import merged_search
from clbench.records import RecordStore, merge
from clbench.store import Merged, Store
from tests.leaderboard_db import record

CURVE = [(1, 0, 2.5, 0.01, 1.25), (1, 1, 2.0, 0.005, 0.5)]  # stage, step, loss, lr, grad_norm


def point(lr: float, mean: float, seeds=(0,)) -> dict:
    return {"lr": lr, "seeds": list(seeds), "values": [mean] * len(seeds), "mean": mean, "run_ids": [f"r{lr}"]}


def tuned(store: Store, key: str, search: list[dict], objective: str = "target_loss") -> None:
    best = min(search, key=lambda p: (p["mean"], p["lr"]))
    store.record_tuned(
        {"tune_key": key, "task": "arith", "method": "et", "model": "tiny", "profile": None,
         "objective": objective, "lr": best["lr"], "score": best["mean"], "search": search}
    )  # fmt: skip


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def rows(store: Store, sql: str) -> list[tuple]:
    return [tuple(r) for r in store.query(sql).itertuples(index=False)]


@pytest.fixture
def two(tmp_path):
    here, there = Store(tmp_path / "here.duckdb"), Store(tmp_path / "there.duckdb")
    record(here, "et0", "arith", "et", "tiny", 0, {"target_loss": 1.5})
    record(here, "fft1", "arith", "fft", "tiny", 1, {}, status="failed", reason="diverged: loss nan at step 3")
    record(there, "fft1", "arith", "fft", "tiny", 1, {"target_loss": 0.75, "forgetting_full": 0.125})
    record(there, "et0", "arith", "et", "tiny", 0, {"target_loss": 9.0})  # the same id: the same run, kept here
    record(there, "lora2", "arith", "lora", "tiny", 2, {"target_loss": 1.0 / 3})
    there.record({**_run(there, "lora2")}, {"target_loss": 1.0 / 3}, curves=CURVE)
    return here, there


def _run(store: Store, run_id: str) -> dict:
    row = store.query("SELECT * FROM runs WHERE run_id = ?", [run_id]).iloc[0].to_dict()
    return row | {"config": json.loads(row["config"]), "versions": json.loads(row["versions"])}


def test_merge_copies_what_is_missing_replaces_failed_keeps_finished(two):
    here, there = two
    assert merge(here, there) == Merged(runs=2, kept=1, tuned=0, tuned_kept=0)
    assert rows(here, "SELECT run_id, status, reason FROM runs ORDER BY run_id") == [
        ("et0", "finished", None),
        ("fft1", "finished", None),
        ("lora2", "finished", None),
    ]
    assert rows(here, "SELECT run_id, metric, value FROM metrics ORDER BY run_id, metric") == [
        ("et0", "target_loss", 1.5),  # here's, not there's 9.0
        ("fft1", "forgetting_full", 0.125),
        ("fft1", "target_loss", 0.75),
        ("lora2", "target_loss", 1.0 / 3),
    ]
    assert rows(here, "SELECT run_id, stage, step, loss, lr, grad_norm FROM curves ORDER BY step") == [
        ("lora2", *c) for c in CURVE
    ]
    copied, original = _run(here, "lora2"), _run(there, "lora2")
    assert copied == original  # config, versions, fingerprints, commit, timestamps: the same record


def test_merge_twice_changes_nothing(two):
    here, there = two
    merge(here, there)
    before = rows(here, "SELECT * FROM metrics ORDER BY ALL")
    assert merge(here, there) == Merged(runs=0, kept=3, tuned=0, tuned_kept=0)
    assert rows(here, "SELECT * FROM metrics ORDER BY ALL") == before


def test_merge_tuning_choices_join_searches_on_the_same_seeds(tmp_path):
    here, there = Store(tmp_path / "here.duckdb"), Store(tmp_path / "there.duckdb")
    tuned(here, "k-both", [point(0.01, 2.0), point(0.1, 3.0)])
    tuned(there, "k-both", [point(0.001, 1.5)])  # a point past here's lower edge, and better
    tuned(there, "k-new", [point(0.3, 4.0)])
    tuned(here, "k-seeds", [point(0.01, 2.0)])
    tuned(there, "k-seeds", [point(0.001, 0.5, seeds=(0, 1))])  # other seeds: not comparable
    assert merge(here, there, combine=merged_search) == Merged(runs=0, kept=0, tuned=2, tuned_kept=1)
    choices = rows(here, "SELECT tune_key, lr, score, search FROM tuned ORDER BY tune_key")
    assert [(key, lr, score) for key, lr, score, _ in choices] == [
        ("k-both", 0.001, 1.5),
        ("k-new", 0.3, 4.0),
        ("k-seeds", 0.01, 2.0),
    ]
    assert [p["lr"] for p in json.loads(choices[0][3])] == [0.001, 0.01, 0.1]


@pytest.mark.parametrize("kind", [Store, RecordStore])
def test_merge_never_joins_searches_of_two_objectives_the_later_choice_stands(tmp_path, kind):
    """A task's tune_metric changed between two databases' searches of one key (xling: target_bpb, then
    target_loss): joined, the old search's bpb means would compete with the new one's losses."""
    old, new, into = Store(tmp_path / "old.duckdb"), Store(tmp_path / "new.duckdb"), kind(tmp_path / "into")
    tuned(old, "k", [point(0.003, 2.9), point(0.01, 3.9)], objective="target_bpb")  # the lower mean, of bpb
    tuned(new, "k", [point(0.01, 6.1), point(0.03, 6.2)], objective="target_loss")
    assert merge(into, old, combine=merged_search) == Merged(runs=0, kept=0, tuned=1, tuned_kept=0)
    assert merge(into, new, combine=merged_search) == Merged(runs=0, kept=0, tuned=1, tuned_kept=0)
    assert merge(into, old, combine=merged_search) == Merged(runs=0, kept=0, tuned=0, tuned_kept=1)
    choice = rows(into, "SELECT objective, lr, score, search FROM tuned")
    assert [(objective, lr, score) for objective, lr, score, _ in choice] == [("target_loss", 0.01, 6.1)]
    assert [p["lr"] for p in json.loads(choice[0][3])] == [0.01, 0.03]


def test_merged_search_is_none_when_there_adds_nothing():
    here = [point(0.01, 2.0), point(0.1, 3.0)]
    assert merged_search(here, here) is None
    assert merged_search(here, []) is None
    assert merged_search(here, [point(0.01, 2.0, seeds=(1,))]) is None
    search, best = merged_search(here, [point(0.03, 1.0)])
    assert [p["lr"] for p in search] == [0.01, 0.03, 0.1] and best["lr"] == 0.03


def test_merge_reads_an_older_database_without_newer_tables_or_columns(tmp_path):
    here, old = Store(tmp_path / "here.duckdb"), Store(tmp_path / "old.duckdb")
    record(old, "old0", "arith", "et", "tiny", 0, {"target_loss": 0.25})
    old.record(_run(old, "old0"), {"target_loss": 0.25}, curves=CURVE)
    with duckdb.connect(str(old.path)) as db:  # as clbench wrote it before these tables and grad_norm existed
        for table in ("generations", "samples", "tuned", "lm_eval", "stage_matrix"):
            db.execute(f"DROP TABLE {table}")
        db.execute("ALTER TABLE curves DROP COLUMN grad_norm")
    assert merge(here, old) == Merged(runs=1, kept=0, tuned=0, tuned_kept=0)
    assert rows(here, "SELECT run_id, step, loss, grad_norm IS NULL FROM curves ORDER BY step") == [
        ("old0", 0, 2.5, True),
        ("old0", 1, 2.0, True),
    ]
    assert rows(here, "SELECT run_id, metric, value FROM metrics") == [("old0", "target_loss", 0.25)]


def test_cli_merge_prints_counts(two, capsys):
    here, there = two
    assert main(["merge", str(there.path), "--db", str(here.path)]) == 0
    assert capsys.readouterr().out == (
        f"{there.path}: 2 runs copied, 1 already in {here.path}; 0 tuning choices copied or extended, 0 kept as they were\n"
    )


@pytest.mark.parametrize("bad", ["missing", "itself", "text", "foreign"])
def test_cli_merge_bad_source_is_one_line_and_writes_nothing(two, tmp_path, capsys, bad):
    here, there = two
    sources = {
        "missing": tmp_path / "nope.duckdb",
        "itself": here.path,
        "text": tmp_path / "notes.txt",
        "foreign": tmp_path / "foreign.duckdb",
    }
    (tmp_path / "notes.txt").write_text("not a database\n")
    with duckdb.connect(str(tmp_path / "foreign.duckdb")) as db:
        db.execute("CREATE TABLE runs (x INTEGER)")
    before = md5(here.path)
    # the good source comes first: a bad one later must stop the merge before anything is copied
    assert main(["merge", str(there.path), str(sources[bad]), "--db", str(here.path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clbench: error: ") and err.count("\n") == 1
    assert md5(here.path) == before


def test_a_merge_killed_before_commit_leaves_the_database_as_it_was(two, tmp_path):
    here, there = two
    before = {t: rows(here, f"SELECT * FROM {t} ORDER BY ALL") for t in ("runs", "metrics", "curves", "tuned")}
    env = {**os.environ, "CLBENCH_TEST_FAULT": "merge:kill"}
    killed = subprocess.run(
        [sys.executable, "-m", "clbench.cli", "merge", str(there.path), "--db", str(here.path)],
        env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert {t: rows(here, f"SELECT * FROM {t} ORDER BY ALL") for t in before} == before
    assert merge(here, there) == Merged(runs=2, kept=1, tuned=0, tuned_kept=0)  # and it merges as if never tried
