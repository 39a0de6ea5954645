"""Results in DuckDB: one row per run, metrics in long form, and the `results` view.

`results(run_id, task, method, model, seed, metric, value, status)` is the stable query surface.
A run's row and its metrics are written in one transaction, so a reader never sees a finished
run without its metrics. DuckDB admits one writing process at a time: every write opens the
file briefly and retries while another process holds the lock.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import duckdb
import pandas as pd

from clbench.errors import ClbenchError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    task VARCHAR NOT NULL,
    task_version INTEGER NOT NULL,
    method VARCHAR NOT NULL,
    model VARCHAR NOT NULL,
    seed INTEGER NOT NULL,
    status VARCHAR NOT NULL,      -- finished | failed
    reason VARCHAR,               -- why a run failed
    config JSON NOT NULL,         -- the resolved configuration the run_id hashes
    model_fingerprint VARCHAR,
    data_fingerprint VARCHAR,
    versions JSON,
    git_commit VARCHAR,
    started_at TIMESTAMP,
    finished_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id VARCHAR NOT NULL,
    metric VARCHAR NOT NULL,
    value DOUBLE,
    PRIMARY KEY (run_id, metric)
);
-- sequential tasks: the value of `metric` on stage eval_stage (0 = old text) after training
-- stages 1..after_stage (0 = before any training)
CREATE TABLE IF NOT EXISTS stage_matrix (
    run_id VARCHAR NOT NULL,
    after_stage INTEGER NOT NULL,
    eval_stage INTEGER NOT NULL,
    metric VARCHAR NOT NULL,
    value DOUBLE,
    PRIMARY KEY (run_id, after_stage, eval_stage, metric)
);
CREATE TABLE IF NOT EXISTS lm_eval (
    run_id VARCHAR NOT NULL,
    task VARCHAR NOT NULL,        -- lm-eval task name
    metric VARCHAR NOT NULL,      -- lm-eval metric, ",filter" appended unless the filter is 'none'
    base DOUBLE,                  -- the base model
    adapted DOUBLE,               -- the run's adapted model (full softmax over V ∪ U)
    delta DOUBLE,                 -- adapted − base
    lm_eval_version VARCHAR,
    task_version VARCHAR,
    task_hash VARCHAR,            -- sha256 over documents, prompts and targets, as lm-eval's tracker computes it
    PRIMARY KEY (run_id, task, metric)
);
CREATE OR REPLACE VIEW results AS
    SELECT r.run_id, r.task, r.method, r.model, r.seed, m.metric, m.value, r.status
    FROM runs r LEFT JOIN metrics m USING (run_id);
"""

LOCK_WAIT_SECONDS = 120.0


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.is_dir():
            raise ClbenchError(f"results database {self.path} is a directory")
        if not self.path.parent.is_dir():
            raise ClbenchError(f"results database folder {self.path.parent} does not exist")

    @contextmanager
    def _connect(self, read_only: bool = False):
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                connection = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.IOException as error:
                if "lock" in str(error).lower() and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                raise ClbenchError(f"cannot open results database {self.path}: {_first_line(error)}") from None
            except duckdb.Error as error:
                raise ClbenchError(f"cannot open results database {self.path}: {_first_line(error)}") from None
        try:
            if not read_only:
                connection.execute(SCHEMA)
            yield connection
        except duckdb.Error as error:
            raise ClbenchError(f"results database {self.path}: {_first_line(error)}") from None
        finally:
            connection.close()

    def status(self, run_id: str) -> str | None:
        if not self.path.exists():
            return None
        with self._connect(read_only=True) as db:
            row = db.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
        return row[0] if row else None

    def record(self, run: dict, metrics: dict[str, float], stage_matrix: list[tuple] = ()) -> None:
        """Insert or replace one run, its metrics and its stage matrix atomically."""
        row = dict(run, config=json.dumps(run["config"], sort_keys=True), versions=json.dumps(run["versions"]))
        columns = list(row)
        with self._connect() as db:
            db.execute("BEGIN TRANSACTION")
            db.execute("DELETE FROM metrics WHERE run_id = ?", [run["run_id"]])
            db.execute("DELETE FROM stage_matrix WHERE run_id = ?", [run["run_id"]])
            db.execute("DELETE FROM runs WHERE run_id = ?", [run["run_id"]])
            db.execute(
                f"INSERT INTO runs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                [row[c] for c in columns],
            )
            if metrics:
                db.executemany(
                    "INSERT INTO metrics VALUES (?, ?, ?)", [(run["run_id"], k, float(v)) for k, v in sorted(metrics.items())]
                )
            if stage_matrix:
                db.executemany("INSERT INTO stage_matrix VALUES (?, ?, ?, ?, ?)", [(run["run_id"], *row) for row in stage_matrix])
            db.execute("COMMIT")

    def record_lm_eval(self, run_id: str, rows: list[dict]) -> None:
        """Replace a run's lm-eval rows for the tasks in `rows`, atomically."""
        columns = ["task", "metric", "base", "adapted", "delta", "lm_eval_version", "task_version", "task_hash"]
        with self._connect() as db:
            db.execute("BEGIN TRANSACTION")
            for task in sorted({r["task"] for r in rows}):
                db.execute("DELETE FROM lm_eval WHERE run_id = ? AND task = ?", [run_id, task])
            db.executemany(
                f"INSERT INTO lm_eval (run_id, {', '.join(columns)}) VALUES (?{', ?' * len(columns)})",
                [[run_id] + [r[c] for c in columns] for r in rows],
            )
            db.execute("COMMIT")

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        if not self.path.exists():
            raise ClbenchError(f"results database {self.path} does not exist (run `clbench run` first)")
        with self._connect(read_only=True) as db:
            return db.execute(sql, params or []).df()


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def now() -> datetime:
    return datetime.now()
