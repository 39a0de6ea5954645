"""The record store: one immutable record file set per run, for many processes on a shared filesystem.

    clbench run --task all --method et --db results/        # a directory (or a path ending in /) selects it
    clbench results --db results/ ; clbench merge results/ --db all.duckdb

Layout of the store's directory:

    records/<run_id>/               a finished run: runs.parquet (its row: config, spec, versions, ...),
                                    metrics.parquet and, where it has them, stage_matrix, curves, samples,
                                    generations .parquet, in the columns of clbench/store.py's SCHEMA; metrics
                                    declared later, added by `clbench rescore`: metrics.added-<tag>.parquet
    failed/<run_id>.<attempt>/      a run that failed (diverged): its runs.parquet (the protocol records no
                                    metrics for it; other files there are not read)
    claims/<run_id>.<attempt>.json  one per attempt: who runs it, its heartbeat, how it ended
    lm_eval/<run_id>/<task>.parquet `clbench lm-eval` rows;  tuned/<tune_key>.json: `clbench tune`'s choices
    tmp/                            files being written; never read. A killed process may leave some behind:
                                    each claim deletes those untouched for TMP_STALE_SECONDS

Why it survives a cluster whose shared filesystem gives no working file locks (NFS, some Lustre mounts):
nothing here uses fcntl/flock or has two processes write one file.
- A record is written whole under tmp/ and renamed to records/<run_id>. rename(2) of a directory is atomic
  and fails where the target exists, so a reader sees a whole record or none, and of two processes that
  finished the same run exactly one record lands; the other's result is discarded.
- A claim is a hard link of a prepared file to claims/<run_id>.<n>.json; link(2) fails where the name
  exists, so of processes racing for attempt n exactly one holds it. The holder of the highest attempt
  owns the run; a process writes its record only while it still does.
- A heartbeat rewrites its own claim file by rename, so a reader never sees half a claim. Whether a claim
  is dead is clbench/storage.py's rule (`holds_off`), the same for both stores.
- Every other file (lm_eval, tuned) is written beside its name and renamed over it.

DuckDB stays the query surface: `query()` opens an in-memory DuckDB with one view per table of the
single-file store, over these files, so every reader (results, leaderboard, report, export, merge,
ad-hoc SQL) runs unchanged. `snapshot()` writes them into one DuckDB file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Unpack

import duckdb
import pandas as pd

from clbench import storage
from clbench.errors import ClbenchError, first_line
from clbench.faults import fault_point
from clbench.owner import Owner
from clbench.storage import Claim, Merged, ResultStore, RunRows, now
from clbench.store import PER_RUN, RESULTS_VIEW, SCHEMA, TABLES, Store, insert_run, insert_values, merge_files

RECORD_TABLES = ("runs", "metrics", "stage_matrix", *PER_RUN)  # the files of one record
MARKER = "clbench-records"  # in the store's directory: what makes it one
# a file under tmp/ is written and renamed within seconds; one untouched for this long was left by a killed process
TMP_STALE_SECONDS = 6 * 3600.0


def is_record_store(path: str | Path) -> bool:
    """--db DIR/ (an existing directory, or a path written with a trailing slash) selects the record store."""
    return str(path).endswith(("/", os.sep)) or Path(path).is_dir()


class RecordStore:
    """The record store (`--db DIR/`), keeping clbench/storage.py's ResultStore contract without a file lock."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ClbenchError(f"record store {self.path} is a file, not a directory")
        self._scratch_db = None  # an in-memory DuckDB with the tables, where records are staged (made once)
        self._scratch_lock = threading.Lock()

    def _scratch(self):
        if self._scratch_db is None:
            self._scratch_db = duckdb.connect(":memory:")
            self._scratch_db.execute(TABLES)
        return self._scratch_db

    # --- checks and reads ----------------------------------------------------------------------------

    def check(self) -> None:
        """Fail before any work if results could not be stored here. Writes nothing but a write test."""
        if not self.path.exists():
            if not self.path.parent.is_dir():
                raise ClbenchError(f"record store folder {self.path.parent} does not exist")
            probe = self.path.parent
        else:
            entries = {p.name for p in self.path.iterdir()}
            if entries and MARKER not in entries:
                raise ClbenchError(
                    f"{self.path} is not a clbench record store (no {MARKER} file in a non-empty folder)"
                )
            probe = self.path
        try:
            probe_file = probe / f".clbench-write-test-{uuid.uuid4().hex}"
            probe_file.touch()
            probe_file.unlink()
        except OSError as error:
            raise ClbenchError(f"cannot write the record store in {probe}: {error.strerror or error}") from None

    def status(self, run_id: str) -> str | None:
        if (self.path / "records" / run_id / "runs.parquet").exists():
            return "finished"
        if self._failed(run_id):
            return "failed"
        return None

    def _failed(self, run_id: str) -> list[Path]:
        folder = self.path / "failed"
        return sorted(folder.glob(f"{run_id}.*")) if folder.is_dir() else []

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        if not (self.path / MARKER).exists():
            raise storage.not_created("record store", self.path)
        with self.connect() as db:
            try:
                return db.execute(sql, params or []).df()
            except duckdb.Error as error:
                raise ClbenchError(f"record store {self.path}: {first_line(error)}") from None

    @contextmanager
    def connect(self):
        """An in-memory DuckDB whose tables are views over the record files (empty tables where none exist)."""
        db = duckdb.connect(":memory:")
        try:
            db.execute(TABLES)
            for table, sql in self._sources().items():
                db.execute(f"DROP TABLE {table}")
                db.execute(f"CREATE VIEW {table} AS {sql}")
            db.execute(RESULTS_VIEW)
            yield db
        finally:
            db.close()

    def _sources(self) -> dict[str, str]:
        """table → the SELECT over its files, for the tables that have any."""
        quote = lambda path: "'" + str(path).replace("'", "''") + "'"
        parquet = lambda pattern, extra="": f"read_parquet({quote(self.path / pattern)}, union_by_name = true{extra})"
        found = lambda pattern: next(self.path.glob(pattern), None) is not None
        sources = {}
        finished, failed = found("records/*/runs.parquet"), found("failed/*/runs.parquet")
        if finished or failed:
            parts = [f"SELECT * FROM {parquet('records/*/runs.parquet')}"] if finished else []
            if failed:  # a failed run shows only while no record of it finished, and only its latest attempt
                parts.append(
                    f"SELECT * EXCLUDE (filename) FROM {parquet('failed/*/runs.parquet', ', filename = true')} "
                    + (
                        "WHERE run_id NOT IN (SELECT run_id FROM " + parquet("records/*/runs.parquet") + ") "
                        if finished
                        else ""
                    )
                    + "QUALIFY row_number() OVER (PARTITION BY run_id ORDER BY "
                    + "CAST(regexp_extract(filename, '\\.(\\d+)[/\\\\]runs\\.parquet$', 1) AS INTEGER) DESC) = 1"
                )
            sources["runs"] = " UNION ALL BY NAME ".join(parts)
        for table in RECORD_TABLES[1:]:  # metrics, stage_matrix: also what rescore added (<table>.added-*.parquet)
            if found(f"records/*/{table}*.parquet"):
                sources[table] = f"SELECT * FROM {parquet(f'records/*/{table}*.parquet')}"
        if found("lm_eval/*/*.parquet"):
            sources["lm_eval"] = f"SELECT * FROM {parquet('lm_eval/*/*.parquet')}"
        if found("tuned/*.json"):
            sources["tuned"] = (
                "SELECT tune_key, task, method, model, profile, objective, lr, score, search::JSON AS search, "
                f"chosen_at::TIMESTAMP AS chosen_at FROM read_json({quote(self.path / 'tuned/*.json')}, "
                "columns = {tune_key: 'VARCHAR', task: 'VARCHAR', method: 'VARCHAR', model: 'VARCHAR', "
                "profile: 'VARCHAR', objective: 'VARCHAR', lr: 'DOUBLE', score: 'DOUBLE', search: 'VARCHAR', "
                "chosen_at: 'VARCHAR'})"
            )
        if found("claims/*.json"):
            sources["attempts"] = ATTEMPTS.format(claims=quote(self.path / "claims/*.json"))
        return sources

    def tuned(self, tune_key: str) -> dict | None:
        path = self.path / "tuned" / f"{tune_key}.json"
        if not path.exists():
            return None
        stored = json.loads(path.read_text())
        return stored | {
            "search": json.loads(stored["search"]),
            "chosen_at": datetime.fromisoformat(stored["chosen_at"]),
        }

    # --- claims and heartbeats -------------------------------------------------------------------------

    def claim(self, run_id: str) -> Claim:
        """Hold run_id as its next attempt, unless it is finished or a live process holds it (see the module)."""
        self.create()
        self._sweep_tmp()
        while True:
            if self.status(run_id) == "finished":
                return Claim("finished")
            attempt, held = self._latest(run_id)
            if held is not None and held["outcome"] == "running":
                holder = owner_of(held)
                if storage.holds_off(holder, datetime.fromisoformat(held["beat_at"] or held["started_at"])):
                    return Claim("busy", holder=holder)
            if self._create(self._claim_file(run_id, attempt + 1), self._attempt_row(run_id, attempt + 1)):
                return Claim("claimed", attempt + 1)
            # another process took attempt + 1 first: look again

    def heartbeat(self, run_id: str, attempt: int) -> AbstractContextManager[None]:
        return storage.beating(lambda: self._beat(run_id, attempt))

    def _beat(self, run_id: str, attempt: int) -> bool:
        """Rewrite the claim with a fresh beat_at; False (no more beats) once another process took it over."""
        row = self._read_claim(run_id, attempt)
        if row is None or owner_of(row) != Owner.me():
            return False
        self._write(self._claim_file(run_id, attempt), json.dumps(row | {"beat_at": now().isoformat()}))
        return True

    def _latest(self, run_id: str) -> tuple[int, dict | None]:
        """(the highest attempt number of run_id, its claim), (0, None) where it was never claimed."""
        numbers = [
            int(p.name[len(run_id) + 1 : -len(".json")]) for p in (self.path / "claims").glob(f"{run_id}.*.json")
        ]
        if not numbers:
            return 0, None
        return max(numbers), self._read_claim(run_id, max(numbers))

    def _claim_file(self, run_id: str, attempt: int) -> Path:
        return self.path / "claims" / f"{run_id}.{attempt}.json"

    def _read_claim(self, run_id: str, attempt: int) -> dict | None:
        try:
            return json.loads(self._claim_file(run_id, attempt).read_text())
        except FileNotFoundError:
            return None

    def _attempt_row(self, run_id: str, attempt: int, **changes) -> str:
        me, stamp = Owner.me(), now().isoformat()
        row = {"run_id": run_id, "attempt": attempt, "outcome": "running", "host": me.host, "pid": me.pid}
        row |= {"process_start": me.start, "started_at": stamp, "beat_at": stamp, "ended_at": None}
        return json.dumps(row | changes)

    def _holder(self, run_id: str, attempt: int) -> Owner | None:
        """Who holds the attempt: its claim's owner while it is the run's latest and running, else no one."""
        latest, row = self._latest(run_id)
        running = latest == attempt and row is not None and row["outcome"] == "running"
        return owner_of(row) if running else None

    # --- writes ----------------------------------------------------------------------------------------

    def record(
        self, run: dict, metrics: dict[str, float], attempt: int | None = None, **rows: Unpack[RunRows]
    ) -> None:
        """Write one run's record whole, then rename it into place (see the module). A finished run is recorded
        once: a second finished record of it is discarded with a ClbenchError."""
        self.create()
        run_id = run["run_id"]
        if attempt is not None:
            storage.ensure_held(run_id, attempt, self._holder(run_id, attempt))
        staged = self._stage(run, metrics, rows)
        fault_point("record")  # crash tests: SIGKILL here, the record written but not in place
        finished = run["status"] == "finished"
        target = self.path / "records" / run_id if finished else self.path / "failed" / f"{run_id}.{attempt or 0}"
        try:
            os.rename(staged, target)
        except OSError as error:
            shutil.rmtree(staged, ignore_errors=True)
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise ClbenchError(f"cannot write the record of run {run_id}: {error.strerror or error}") from None
            if finished:  # another process recorded it first: one record per run
                raise ClbenchError(
                    f"run {run_id} is already recorded by another process; this result is discarded"
                ) from None
        if attempt is not None:
            ended = {"outcome": run["status"], "ended_at": now().isoformat()}
            self._write(self._claim_file(run_id, attempt), self._attempt_row(run_id, attempt, **ended))

    def _stage(self, run: dict, metrics: dict[str, float], rows: RunRows) -> Path:
        """The record's files in a fresh folder under tmp/, in the single-file store's column types."""
        staged = self.path / "tmp" / f"{run['run_id']}.{uuid.uuid4().hex}"
        staged.mkdir()
        with self._scratch_lock:
            db = self._scratch()
            for table in RECORD_TABLES:
                db.execute(f"DELETE FROM {table}")
            insert_run(db, run, metrics, rows)
            for table in RECORD_TABLES:
                if table == "runs" or rows_in(db, table):
                    db.execute(f"COPY {table} TO '{staged / table}.parquet' (FORMAT parquet)")
        return staged

    def add_metrics(self, run_id: str, metrics: dict[str, float], stage_matrix: list[tuple] = ()) -> int:
        """Add to a finished run's record the metrics and stage-matrix rows whose names it lacks, as files of
        their own beside its others (metrics.added-<names>.parquet: created by link(2), so two processes adding
        the same names add them once); a stored file is never changed (clbench/rescore.py) → how many metrics."""
        folder = self.path / "records" / run_id
        if not (folder / "runs.parquet").exists():
            raise storage.not_finished(run_id, self.path)
        with self.connect() as db:
            new, rows = storage.missing(db, run_id, metrics, stage_matrix)
        if not new and not rows:
            return 0
        tag = hashlib.sha256(json.dumps([sorted(new), sorted({r[2] for r in rows})]).encode()).hexdigest()[:16]
        with self._scratch_lock:
            db = self._scratch()
            for table in ("metrics", "stage_matrix"):
                db.execute(f"DELETE FROM {table}")
            insert_values(db, run_id, new, rows)
            staged = []
            for table in ("metrics", "stage_matrix") if rows else ("metrics",):
                partial = self.path / "tmp" / f"{table}.{uuid.uuid4().hex}.parquet"
                db.execute(f"COPY {table} TO '{partial}' (FORMAT parquet)")
                staged.append((partial, folder / f"{table}.added-{tag}.parquet"))
        added = True
        for partial, target in staged:
            try:
                os.link(partial, target)
            except FileExistsError:  # another process added these very names first
                added = False
            finally:
                partial.unlink()
        return len(new) if added else 0

    def record_lm_eval(self, run_id: str, rows: list[dict]) -> None:
        """Replace a run's lm-eval rows for the tasks in `rows`, each task's file renamed into place."""
        self.create()
        folder = self.path / "lm_eval" / run_id
        folder.mkdir(exist_ok=True)
        for task in sorted({r["task"] for r in rows}):
            frame = pd.DataFrame([{"run_id": run_id, **r} for r in rows if r["task"] == task])
            partial = self.path / "tmp" / f"lm_eval.{uuid.uuid4().hex}.parquet"
            with self._scratch_lock:
                db = self._scratch()
                db.execute("DELETE FROM lm_eval")
                db.register("frame", frame)
                db.execute("INSERT INTO lm_eval BY NAME SELECT * FROM frame")
                db.unregister("frame")
                db.execute(f"COPY lm_eval TO '{partial}' (FORMAT parquet)")
            os.replace(partial, folder / f"{task.replace('/', '_')}.parquet")

    def record_tuned(self, row: dict) -> None:
        """Insert or replace one tuning choice (a rerun of `clbench tune` replaces it); chosen now unless the row
        says when (a merge copies a choice as it was made)."""
        self.create()
        chosen_at = (row.get("chosen_at") or now()).isoformat()
        stored = dict(row, search=json.dumps(row["search"], sort_keys=True), chosen_at=chosen_at)
        self._write(self.path / "tuned" / f"{row['tune_key']}.json", json.dumps(stored))

    def _write(self, path: Path, text: str) -> None:
        """text to path by a temporary file renamed over it: a reader sees the old or the new file, never half."""
        partial = self.path / "tmp" / f"{path.name}.{uuid.uuid4().hex}"
        partial.write_text(text)
        os.replace(partial, path)

    def _create(self, path: Path, text: str) -> bool:
        """text to path only if path does not exist, atomically: False where another process made it first."""
        partial = self.path / "tmp" / f"{path.name}.{uuid.uuid4().hex}"
        partial.write_text(text)
        try:
            os.link(partial, path)
            return True
        except FileExistsError:
            return False
        except OSError as error:  # a filesystem without hard links cannot hold claims atomically
            raise ClbenchError(
                f"record store {self.path}: cannot create a claim by link(2) ({error.strerror or error}); "
                "use a filesystem with hard links (NFS, Lustre, GPFS, local disks have them)"
            ) from None
        finally:
            partial.unlink()

    def _sweep_tmp(self) -> None:
        """Delete what killed processes left under tmp/ (nothing there is read; see TMP_STALE_SECONDS)."""
        cutoff = time.time() - TMP_STALE_SECONDS
        for entry in (self.path / "tmp").iterdir():
            try:
                if entry.lstat().st_mtime >= cutoff:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            except FileNotFoundError:  # another process swept it first
                continue

    def create(self) -> None:
        """The store's folders and its marker, where they are not yet: every write makes sure of them first."""
        for folder in ("records", "failed", "claims", "lm_eval", "tuned", "tmp"):
            (self.path / folder).mkdir(parents=True, exist_ok=True)
        (self.path / MARKER).touch()

    # --- one DuckDB file from the records ----------------------------------------------------------------

    def snapshot(self, into: Path) -> None:
        """Every table into a new single-file DuckDB store at `into` (written beside it, renamed into place)."""
        partial = into.parent / f".{into.name}.{uuid.uuid4().hex}.partial"
        target = str(partial).replace("'", "''")
        with self.connect() as db:
            db.execute(f"ATTACH '{target}' AS snapshot")
            db.execute("USE snapshot")
            db.execute(SCHEMA)
            for table in (*RECORD_TABLES, "lm_eval", "tuned", "attempts"):
                db.execute(f"INSERT INTO snapshot.{table} BY NAME SELECT * FROM memory.main.{table}")
            db.execute("USE memory")
            db.execute("DETACH snapshot")
        os.replace(partial, into)


def owner_of(claim: dict) -> Owner:
    return Owner(claim["host"], claim["pid"], claim["process_start"])


def rows_in(db, table: str) -> int:
    return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


# the attempts table from the claim files; an attempt still 'running' below a later one was interrupted
ATTEMPTS = """
SELECT run_id, attempt::INTEGER AS attempt,
       CASE WHEN outcome = 'running' AND attempt < max(attempt) OVER (PARTITION BY run_id) THEN 'interrupted'
            ELSE outcome END AS outcome,
       host, pid::INTEGER AS pid, process_start, started_at::TIMESTAMP AS started_at,
       beat_at::TIMESTAMP AS beat_at, ended_at::TIMESTAMP AS ended_at
FROM read_json({claims}, columns = {{run_id: 'VARCHAR', attempt: 'INTEGER', outcome: 'VARCHAR', host: 'VARCHAR',
     pid: 'INTEGER', process_start: 'VARCHAR', started_at: 'VARCHAR', beat_at: 'VARCHAR', ended_at: 'VARCHAR'}})
"""


def open_store(path: str | Path) -> ResultStore:
    """--db: a DuckDB file (clbench.store.Store, for one machine) or, for a directory or a path ending in "/",
    the record store (many processes, any number of hosts, one shared filesystem)."""
    return RecordStore(path) if is_record_store(path) else Store(path)


def merge(into: ResultStore, source: ResultStore, combine=None) -> Merged:
    """source's runs and tuning choices into `into`, each either kind of store."""
    if isinstance(into, RecordStore):
        return merge_into_records(into, source, combine)
    if isinstance(source, RecordStore):  # its records as one DuckDB file, merged like any other
        storage.check_merge(into, source)
        with tempfile.TemporaryDirectory(prefix="clbench-merge-") as scratch:
            source.snapshot(Path(scratch) / "snapshot.duckdb")
            return merge_files(into, Store(Path(scratch) / "snapshot.duckdb"), combine)
    return merge_files(into, source, combine)


def merge_into_records(into: RecordStore, source: ResultStore, combine=None) -> Merged:
    """source's runs (a single-file store or another record store) into a record store by clbench/storage.py's
    rules (`takes`, `merged_choice`), each run taken written as a record. Each source table is read once, not per
    run."""
    storage.check_merge(into, source)
    into.create()
    runs = source.query("SELECT * FROM runs ORDER BY run_id")
    per_run = {
        table: dict(tuple(source.query(f"SELECT * FROM {table}").groupby("run_id")))
        for table in (*RECORD_TABLES[1:], "lm_eval")
    }
    rows_of = lambda table, run_id: per_run[table][run_id].drop(columns="run_id") if run_id in per_run[table] else None
    tuples = lambda frame: [] if frame is None else list(frame.itertuples(index=False, name=None))
    taken = kept = 0
    for run in runs.to_dict("records"):
        run_id = run["run_id"]
        if not storage.takes(into.status(run_id), run["status"]):
            kept += 1
            continue
        run = {k: None if pd.isna(v) else v.item() if hasattr(v, "item") else v for k, v in run.items()}
        run["config"], run["versions"] = json.loads(run["config"]), json.loads(run["versions"] or "null")
        if run.get("spec") is not None:
            run["spec"] = json.loads(run["spec"])
        metrics = rows_of("metrics", run_id)
        into.record(
            run,
            {} if metrics is None else dict(zip(metrics.metric, metrics.value)),
            stage_matrix=tuples(rows_of("stage_matrix", run_id)),
            **{table: tuples(rows_of(table, run_id)) for table in PER_RUN},
        )
        if (lm := rows_of("lm_eval", run_id)) is not None:
            into.record_lm_eval(run_id, lm.to_dict("records"))
        taken += 1
    return Merged(taken, kept, *_merge_tuned(into, source, combine))


def _merge_tuned(into: RecordStore, source: ResultStore, combine) -> tuple[int, int]:
    """source's tuning choices into `into` → (choices stored, choices kept as they were)."""
    tuned = kept = 0
    for row in source.query("SELECT * FROM tuned ORDER BY tune_key").to_dict("records"):
        there = row | {"search": json.loads(row["search"]) if isinstance(row["search"], str) else row["search"]}
        made = storage.merged_choice(into.tuned(row["tune_key"]), there, combine)
        if made is None:
            kept += 1
            continue
        into.record_tuned(made if made is there else made | {"chosen_at": None})  # a new choice from both: now
        tuned += 1
    return tuned, kept
