"""Results in DuckDB: one row per run, metrics in long form, and the `results` view; per run also its
training curves (every step) and, with `--log-samples`, its per-example records.

`results(run_id, task, method, model, seed, metric, value, status)` is the stable query surface.

Reliability (README "Reliability"):
- A run's row, its metrics, curves and samples are written in one transaction, so a reader never sees
  a finished run without them, and a process killed mid-write leaves nothing of that write.
- DuckDB admits one writing process at a time: every access opens the file briefly and retries
  while another process holds the lock (up to LOCK_WAIT_SECONDS); reads open it read-only.
- Before training, a run is claimed: an `attempts` row (run_id, attempt, outcome='running', host,
  pid, process start token) committed under that lock, so of several processes racing for one run
  exactly one trains it; the others see a live holder and leave it ("busy"). A 'running' attempt
  whose holder is gone (clbench/storage.py `holds_off`: SIGKILL, crash, reboot, a reused pid, or
  another host's heartbeat older than STALE_SECONDS) is marked 'interrupted' and the run is retried
  as attempt n+1. The final write checks that this process still holds its attempt and writes
  nothing otherwise, so even a wrongly retried run yields one record, never two.
- `check()` runs before any work and writes nothing: bad input never touches the database.
"""

from __future__ import annotations

import json
import tempfile
import time
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Unpack

import duckdb
import pandas as pd

from clbench import storage
from clbench.errors import ClbenchError, first_line
from clbench.faults import fault_point
from clbench.owner import Owner
from clbench.storage import Claim, Merged, RunRows, now

# the split a run scored: a tuning run (config.split = 'validation') is scored on validation data and
# never reported; runs from before the split existed scored the test sets
SPLIT = "coalesce(json_extract_string(config, '$.split'), 'test')"
REPORTED = f"{SPLIT} = 'test'"  # the runs reported as results

TABLES = """
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
    finished_at TIMESTAMP,
    spec JSON                     -- the run's inputs as asked (clbench/spec.py RunSpec); NULL before it existed
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
-- every training step of a run: stage 1..n (a plain task has one), step 0.. within it
CREATE TABLE IF NOT EXISTS curves (
    run_id VARCHAR NOT NULL,
    stage INTEGER NOT NULL,
    step INTEGER NOT NULL,
    loss DOUBLE,                  -- the task loss of the step's batch (a method's penalty not included)
    lr DOUBLE,                    -- the learning rate the step's update used (warm-up, then cosine decay)
    grad_norm DOUBLE,             -- the gradient's total norm before clipping (penalty included)
    PRIMARY KEY (run_id, stage, step)
);
-- `clbench run --log-samples`: per target and old-text example (clbench/samples.py)
CREATE TABLE IF NOT EXISTS samples (
    run_id VARCHAR NOT NULL,
    eval_set VARCHAR NOT NULL,    -- target | old_text
    example INTEGER NOT NULL,     -- index in the set
    prompt VARCHAR,               -- '' for old text
    completion VARCHAR,           -- the scored text
    nll_old DOUBLE,               -- Σ NLL over its old-vocabulary targets, old softmax
    n_old INTEGER,
    nll_full DOUBLE,              -- Σ NLL over all its scored positions, full softmax
    n_full INTEGER,
    base_nll_old DOUBLE,          -- old text: the base's nll_old on the same tokens; NULL for target
    expected VARCHAR,             -- the token at the first completion position
    prediction_old VARCHAR,       -- the adapted model's argmax there, old softmax
    prediction_full VARCHAR,      -- and full softmax
    PRIMARY KEY (run_id, eval_set, example)
);
-- a few free-running greedy continuations per run (protocol.sample_generations), to read beside its numbers
CREATE TABLE IF NOT EXISTS generations (
    run_id VARCHAR NOT NULL,
    number INTEGER NOT NULL,      -- 0, 1, ...: the order they were made in
    source VARCHAR NOT NULL,      -- target (cut before its first new token) | old_text (cut at half)
    prompt VARCHAR NOT NULL,      -- the reference prefix given
    generated VARCHAR NOT NULL,   -- the greedy continuation
    reference VARCHAR NOT NULL,   -- the reference's own next tokens
    new_tokens INTEGER NOT NULL,  -- new tokens among the generated ones
    PRIMARY KEY (run_id, number)
);
CREATE TABLE IF NOT EXISTS attempts (
    run_id VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,     -- 1, 2, ...: a retried run has several
    outcome VARCHAR NOT NULL,     -- running | finished | failed | interrupted (its process died)
    host VARCHAR NOT NULL,
    pid INTEGER NOT NULL,
    process_start VARCHAR,        -- boot id + kernel start time of the pid: a reused pid is another process
    started_at TIMESTAMP NOT NULL,
    beat_at TIMESTAMP,            -- refreshed every HEARTBEAT_SECONDS while running: liveness seen from other hosts
    ended_at TIMESTAMP,           -- NULL while running and for an interrupted attempt
    PRIMARY KEY (run_id, attempt)
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
-- `clbench tune`: per (tune_key, method) the lr chosen on the validation split, and the search behind it
CREATE TABLE IF NOT EXISTS tuned (
    tune_key VARCHAR PRIMARY KEY, -- spec.tune_key: the run config but lr, seed and split
    task VARCHAR NOT NULL,
    method VARCHAR NOT NULL,
    model VARCHAR NOT NULL,
    profile VARCHAR,
    objective VARCHAR NOT NULL,   -- the validation metric minimised (the task's tune_metric)
    lr DOUBLE NOT NULL,           -- the choice: lowest mean objective over the seeds; ties to the smaller lr
    score DOUBLE NOT NULL,        -- its mean objective
    search JSON NOT NULL,         -- [{{lr, seeds, mean, values, run_ids}}] for every point searched, by lr
    chosen_at TIMESTAMP NOT NULL
);
"""
RESULTS_VIEW = f"""
CREATE OR REPLACE VIEW results AS
    SELECT r.run_id, r.task, r.method, r.model, r.seed, m.metric, m.value, r.status
    FROM runs r LEFT JOIN metrics m USING (run_id) WHERE {REPORTED};
"""
SCHEMA = TABLES + RESULTS_VIEW

# columns added since the first databases were written: added to an older file on its next write, and not
# required of a file that is only read
MIGRATIONS = "ALTER TABLE runs ADD COLUMN IF NOT EXISTS spec JSON;"
OPTIONAL = {"runs": {"spec"}}

LOCK_WAIT_SECONDS = 120.0


class Store:
    """The single-file store (`--db FILE.duckdb`), keeping clbench/storage.py's ResultStore contract."""

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
                raise ClbenchError(f"cannot open results database {self.path}: {first_line(error)}") from None
            except duckdb.Error as error:
                raise ClbenchError(f"cannot open results database {self.path}: {first_line(error)}") from None
        try:
            if not read_only:
                connection.execute(SCHEMA)
                connection.execute(MIGRATIONS)
            yield connection
        except duckdb.Error as error:
            raise ClbenchError(f"results database {self.path}: {first_line(error)}") from None
        finally:
            connection.close()

    def check(self) -> None:
        """Fail before any work if results could not be stored here. Writes nothing.

        An existing file must be a clbench results database (a DuckDB file with our tables, or none
        yet); a new one must be creatable in its folder (a real write test: permission bits do not
        stop root, a read-only mount or /sys does)."""
        if not self.path.exists():
            try:
                tempfile.TemporaryFile(dir=self.path.parent).close()
            except OSError as error:
                raise ClbenchError(
                    f"cannot create results database in {self.path.parent}: {error.strerror or error}"
                ) from None
            return
        with self._connect(read_only=True) as db:
            found = _columns(db)
        if not found:
            return  # an empty DuckDB file: the tables are created on the first write
        with duckdb.connect(":memory:") as memory:
            expected = _columns(memory.execute(SCHEMA))
        for table in ("runs", "metrics"):
            lacking = sorted(expected[table] - found.get(table, set()) - OPTIONAL.get(table, set()))
            if lacking:
                raise ClbenchError(
                    f"{self.path} is not a clbench results database (table {table} lacks {', '.join(lacking)})"
                )

    def status(self, run_id: str) -> str | None:
        if not self.path.exists():
            return None
        with self._connect(read_only=True) as db:
            try:
                row = db.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
            except duckdb.CatalogException:
                return None  # an empty database: nothing recorded yet
        return row[0] if row else None

    def claim(self, run_id: str) -> Claim:
        """Mark run_id as running in this process, unless it is finished or a live process holds it.

        One transaction under DuckDB's single-writer lock, so of processes racing for a run exactly one
        claims it. A 'running' attempt whose process is gone — or is this process, whose earlier
        attempt raised — is marked interrupted, and the run is claimed again as the next attempt."""
        me = Owner.me()
        with self._connect() as db:
            db.execute("BEGIN TRANSACTION")
            if db.execute("SELECT 1 FROM runs WHERE run_id = ? AND status = 'finished'", [run_id]).fetchone():
                db.execute("ROLLBACK")
                return Claim("finished")
            last = db.execute(
                "SELECT attempt, outcome, coalesce(beat_at, started_at), host, pid, process_start FROM attempts"
                " WHERE run_id = ? ORDER BY attempt DESC LIMIT 1",
                [run_id],
            ).fetchone()
            attempt = 1
            if last:
                previous, outcome, beat, holder = last[0], last[1], last[2], Owner(*last[3:])
                if outcome == "running":
                    if storage.holds_off(holder, beat):
                        db.execute("ROLLBACK")
                        return Claim("busy", holder=holder)
                    db.execute(
                        "UPDATE attempts SET outcome = 'interrupted' WHERE run_id = ? AND attempt = ?",
                        [run_id, previous],
                    )
                attempt = previous + 1
            db.execute(
                "INSERT INTO attempts VALUES (?, ?, 'running', ?, ?, ?, ?, ?, NULL)",
                [run_id, attempt, me.host, me.pid, me.start, now(), now()],
            )
            db.execute("COMMIT")
        return Claim("claimed", attempt)

    def heartbeat(self, run_id: str, attempt: int) -> AbstractContextManager[None]:
        return storage.beating(lambda: self._beat(run_id, attempt))

    def _beat(self, run_id: str, attempt: int) -> bool:
        try:
            with self._connect() as db:
                db.execute(
                    "UPDATE attempts SET beat_at = ? WHERE run_id = ? AND attempt = ?", [now(), run_id, attempt]
                )
        except ClbenchError:
            pass  # a missed beat only ages the claim; the next one may get the lock
        return True

    def record(
        self, run: dict, metrics: dict[str, float], attempt: int | None = None, **rows: Unpack[RunRows]
    ) -> None:
        """Insert or replace one run with all its rows in one transaction; with `attempt` the same transaction
        closes that attempt with the run's status."""
        with self._connect() as db:
            db.execute("BEGIN TRANSACTION")
            if attempt is not None:
                _close_attempt(db, run, attempt)
            for table in ("metrics", "stage_matrix", *PER_RUN, "runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", [run["run_id"]])
            insert_run(db, run, metrics, rows)
            fault_point("record")  # crash tests: SIGKILL here, mid-transaction
            db.execute("COMMIT")

    def add_metrics(self, run_id: str, metrics: dict[str, float], stage_matrix: list[tuple] = ()) -> int:
        """Add to a finished run the metrics and stage-matrix rows (after, eval, metric, value) whose names it
        lacks, in one transaction; a stored value is never replaced (clbench/rescore.py) → how many metrics."""
        with self._connect() as db:
            db.execute("BEGIN TRANSACTION")
            status = db.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
            if status is None or status[0] != "finished":
                raise storage.not_finished(run_id, self.path)
            new, rows = storage.missing(db, run_id, metrics, stage_matrix)
            insert_values(db, run_id, new, rows)
            db.execute("COMMIT")
        return len(new)

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

    def record_tuned(self, row: dict) -> None:
        """Insert or replace one tuning choice (a rerun of `clbench tune` replaces it); chosen now unless the row
        says when (a merge copies a choice as it was made)."""
        row = dict(row, search=json.dumps(row["search"], sort_keys=True), chosen_at=row.get("chosen_at") or now())
        columns = list(row)
        with self._connect() as db:
            db.execute("BEGIN TRANSACTION")
            db.execute("DELETE FROM tuned WHERE tune_key = ?", [row["tune_key"]])
            db.execute(
                f"INSERT INTO tuned ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                [row[c] for c in columns],
            )
            db.execute("COMMIT")

    def tuned(self, tune_key: str) -> dict | None:
        if not self.path.exists():
            return None
        with self._connect(read_only=True) as db:
            try:
                return _choice(db, tune_key)
            except duckdb.CatalogException:
                return None  # a database from before `tune`, or an empty one

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        if not self.path.exists():
            raise storage.not_created("results database", self.path)
        with self._connect(read_only=True) as db:
            return db.execute(sql, params or []).df()


PER_RUN = ("curves", "samples", "generations")  # a run's rows of these tables, written with it in record()
# every table holding rows of one run: they travel with the run when databases are merged. attempts stays
# behind: it is the ledger of the processes of the machine that ran it, not a result
RUN_TABLES = ("runs", "metrics", "stage_matrix", *PER_RUN, "lm_eval")


def merge_files(into: Store, source: Store, combine=None) -> Merged:
    """Copy `source`'s runs (with every row of theirs in RUN_TABLES) and tuning choices into `into`, by
    clbench/storage.py's rules (`takes`, `merged_choice`; combine: lrsearch.merged_search). One transaction:
    a failure leaves `into` as it was; the source is only read. Tables or columns an older source lacks are
    skipped or read as NULL."""
    storage.check_merge(into, source)
    attached = str(source.path).replace("'", "''")
    with into._connect() as db:
        db.execute(f"ATTACH '{attached}' AS source (READ_ONLY)")
        db.execute("BEGIN TRANSACTION")
        try:
            merged = _merge(db, combine)
            fault_point("merge")  # crash tests: SIGKILL here, mid-transaction
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        finally:
            db.execute("DETACH source")
    return merged


def _merge(db, combine) -> Merged:
    present = {
        t for (t,) in db.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'source'").fetchall()
    }
    if "runs" not in present:
        return Merged(0, 0, 0, 0)  # an empty database: nothing to copy
    statuses = db.execute(
        "SELECT s.run_id, r.status, s.status FROM source.runs s LEFT JOIN runs r USING (run_id)"
    ).fetchall()
    taken = [run_id for run_id, here, there in statuses if storage.takes(here, there)]
    db.execute("CREATE TEMP TABLE taken AS SELECT unnest(?::VARCHAR[]) AS run_id", [taken])
    for table in RUN_TABLES[::-1]:  # a replaced failed run leaves no row of its own behind
        db.execute(f"DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM taken)")
    for table in RUN_TABLES:
        if table in present:
            db.execute(
                f"INSERT INTO {table} BY NAME SELECT * FROM source.{table} WHERE run_id IN (SELECT run_id FROM taken)"
            )
    db.execute("DROP TABLE taken")
    tuned, tuned_kept = _merge_tuned(db, combine) if "tuned" in present else (0, 0)
    return Merged(len(taken), len(statuses) - len(taken), tuned, tuned_kept)


def _choice(db, tune_key: str) -> dict | None:
    """ResultStore.tuned on an open connection (a merge reads it inside its transaction)."""
    cursor = db.execute("SELECT * FROM tuned WHERE tune_key = ?", [tune_key])
    row = cursor.fetchone()
    if row is None:
        return None
    choice = dict(zip([d[0] for d in cursor.description], row))
    return choice | {"search": json.loads(choice["search"])}


def _merge_tuned(db, combine) -> tuple[int, int]:
    """The attached source's tuning choices into db's → (choices stored, choices kept as they were)."""
    tuned = kept = 0
    cursor = db.execute("SELECT * FROM source.tuned ORDER BY tune_key")
    columns = [d[0] for d in cursor.description]
    for row in [dict(zip(columns, values)) for values in cursor.fetchall()]:
        here = _choice(db, row["tune_key"])
        there = row | {"search": json.loads(row["search"])}
        made = storage.merged_choice(here, there, combine)
        if made is None:
            kept += 1
            continue
        if made is not there:  # a new choice from both searches; a source's choice is copied as it was made
            made = made | {"chosen_at": now()}
        if here is not None:
            db.execute("DELETE FROM tuned WHERE tune_key = ?", [row["tune_key"]])
        row = made | {"search": json.dumps(made["search"], sort_keys=True)}
        db.execute(f"INSERT INTO tuned ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
        tuned += 1
    return tuned, kept


def _close_attempt(db, run: dict, attempt: int) -> None:
    """In record's transaction: the attempt ends with the run's status, if this process still holds it."""
    holder = db.execute(
        "SELECT host, pid, process_start FROM attempts WHERE run_id = ? AND attempt = ? AND outcome = 'running'",
        [run["run_id"], attempt],
    ).fetchone()
    storage.ensure_held(run["run_id"], attempt, Owner(*holder) if holder else None)
    db.execute(
        "UPDATE attempts SET outcome = ?, ended_at = ? WHERE run_id = ? AND attempt = ?",
        [run["status"], now(), run["run_id"], attempt],
    )


def insert_run(db, run: dict, metrics: dict[str, float], rows: RunRows) -> None:
    """One run's rows into the tables of TABLES: its runs row (config, versions and spec as JSON text), its
    metrics and the rows given. Both stores write this way."""
    if unknown := set(rows) - RunRows.__optional_keys__:  # **rows would take a misspelt table silently
        raise TypeError(f"record() got unexpected rows {sorted(unknown)}")
    row = dict(run, config=json.dumps(run["config"], sort_keys=True), versions=json.dumps(run["versions"]))
    if row.get("spec") is not None:
        row["spec"] = json.dumps(row["spec"], sort_keys=True)
    db.execute(
        f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
        list(row.values()),
    )
    insert_values(db, run["run_id"], metrics, rows.get("stage_matrix", ()))
    for table in PER_RUN:
        if rows.get(table):
            insert_frame(db, table, run["run_id"], rows[table])


def insert_values(db, run_id: str, metrics: dict[str, float], stage_matrix: list[tuple]) -> None:
    """A run's metrics and stage-matrix rows into db's tables: a new run's (insert_run) or those added to it."""
    if metrics:
        db.executemany(
            "INSERT INTO metrics VALUES (?, ?, ?)", [(run_id, k, float(v)) for k, v in sorted(metrics.items())]
        )
    if stage_matrix:
        db.executemany("INSERT INTO stage_matrix VALUES (?, ?, ?, ?, ?)", [(run_id, *r) for r in stage_matrix])


def insert_frame(db, table: str, run_id: str, rows: list[tuple]) -> None:
    """rows (the table's columns after run_id) as one INSERT from a data frame: executemany costs a
    statement per row, seconds for a run of thousands of steps."""
    columns = [c for (c,) in db.execute(f"SELECT name FROM pragma_table_info('{table}') ORDER BY cid").fetchall()]
    frame = pd.DataFrame.from_records(rows, columns=columns[1:]).assign(run_id=run_id)[columns]
    db.register("frame", frame)
    try:
        db.execute(f"INSERT INTO {table} SELECT * FROM frame")
    finally:
        db.unregister("frame")


def _columns(db) -> dict[str, set[str]]:
    rows = db.execute(
        "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'main'"
    ).fetchall()
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(table, set()).add(column)
    return found
