"""What a results store promises, and the rules every store keeps, each written once.

Two stores keep this contract: `--db FILE.duckdb` (clbench/store.py: one DuckDB file, for one machine) and
`--db DIR/` (clbench/records.py: one immutable record per run, for many hosts on a shared filesystem). The
protocol and every reader type against `ResultStore` and never ask which one they hold. A store decides how it
writes; this module decides what it may write: when a claim still holds a run (`holds_off`), when a result may
land (`ensure_held`), what `add_metrics` may add (`missing`), what a merge copies (`takes`, `merged_choice`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, TypedDict, Unpack

import pandas as pd

from clbench.errors import ClbenchError
from clbench.owner import Owner

HEARTBEAT_SECONDS = 60.0
STALE_SECONDS = 600.0  # a claim from another host without a heartbeat for this long: its machine died


@dataclass(frozen=True)
class Claim:
    state: str  # claimed (this process runs it) | finished (nothing to do) | busy (a live process runs it)
    attempt: int = 0  # when claimed: 1 for a first run, n > 1 for a retry
    holder: Owner | None = None  # when busy: who runs it


@dataclass(frozen=True)
class Merged:
    runs: int  # runs copied in (new, or replacing a failed run the source has finished)
    kept: int  # runs of the source the database already had, finished or both failed: left as they were
    tuned: int  # tuning choices copied in, or made anew from both searches of a key
    tuned_kept: int  # the source's choices whose key is stored here with nothing to add: left as they were


class RunRows(TypedDict, total=False):
    """A run's rows besides its metrics: tuples in their table's columns after run_id (clbench/store.py)."""

    stage_matrix: list[tuple]  # (after_stage, eval_stage, metric, value)
    curves: list[tuple]  # (stage, step, loss, lr, grad_norm)
    samples: list[tuple]
    generations: list[tuple]


class ResultStore(Protocol):
    """A results store. Every error a user should see is one ClbenchError line; SIGKILL at any point leaves
    either the whole of a write or nothing of it visible."""

    path: Path  # the --db it was opened from

    def check(self) -> None:
        """Fail before any work if results could not be stored here; leaves nothing behind."""

    def status(self, run_id: str) -> str | None:
        """'finished', 'failed' or None (never recorded). Reads only."""

    def claim(self, run_id: str) -> Claim:
        """Hold run_id for this process as its next attempt, unless it is finished or another process that
        lives holds it (`holds_off`). Of processes racing for one run exactly one claims each attempt; a
        running attempt whose holder is gone is left as interrupted."""

    def heartbeat(self, run_id: str, attempt: int) -> AbstractContextManager[None]:
        """While the body runs, refresh the attempt's heartbeat every HEARTBEAT_SECONDS, so that other hosts
        see its holder alive."""

    def record(
        self, run: dict, metrics: dict[str, float], attempt: int | None = None, **rows: Unpack[RunRows]
    ) -> None:
        """Write one run (its runs row, metrics and `rows`) whole: a reader sees all of it or none. With
        `attempt` (from claim) nothing lands unless this process still holds it (`ensure_held`), and the
        attempt is closed with the run's status."""

    def add_metrics(self, run_id: str, metrics: dict[str, float], stage_matrix: list[tuple] = ()) -> int:
        """Add to a finished run the metrics and stage-matrix rows whose names it lacks (`missing`); a stored
        value is never replaced → how many metrics were added."""

    def record_lm_eval(self, run_id: str, rows: list[dict]) -> None:
        """Replace a run's lm-eval rows for the tasks in `rows`."""

    def record_tuned(self, row: dict) -> None:
        """Insert or replace one tuning choice (a rerun of `clbench tune` replaces it); chosen now unless the row
        says when (a merge copies a choice as it was made)."""

    def tuned(self, tune_key: str) -> dict | None:
        """A stored tuning choice whole: the row record_tuned stored, its search parsed (a list of points) and
        chosen_at a datetime; None where none is stored. What a run's lr, a resumed search and a merge read."""

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """DuckDB SQL over the tables of clbench/store.py's SCHEMA and its `results` view, whichever store
        holds them. Reads only; a store not yet written to is a ClbenchError."""


# --- claims ------------------------------------------------------------------------------------------------


def holds_off(holder: Owner, beat: datetime) -> bool:
    """Whether a running attempt keeps this process off its run: it is another process's, and that one lives.
    This host's processes can be looked at (a dead or reused pid frees the run at once); another host's only
    through the attempt's last heartbeat (`beat`, or its start), stale after STALE_SECONDS. This process's
    own earlier attempt (one that raised) holds nothing."""
    me = Owner.me()
    if holder == me:
        return False
    if holder.host == me.host:
        return holder.alive()
    return (now() - beat).total_seconds() < STALE_SECONDS


def ensure_held(run_id: str, attempt: int, holder: Owner | None) -> None:
    """A result lands only while its process holds the attempt (holder: who does, None where no one runs it):
    a wrongly retried run yields one record, never two."""
    if holder != Owner.me():
        raise ClbenchError(
            f"run {run_id}: attempt {attempt} is no longer held by this process; its result is discarded"
        )


@contextmanager
def beating(beat: Callable[[], bool]) -> Iterator[None]:
    """While the body runs, call beat() every HEARTBEAT_SECONDS from a thread, until it answers False."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(HEARTBEAT_SECONDS) and beat():
            pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# --- what a write may add --------------------------------------------------------------------------------


def missing(db, run_id: str, metrics: dict[str, float], stage_matrix: list[tuple]) -> tuple[dict, list[tuple]]:
    """Of a run's metrics and stage-matrix rows, those whose metric names db (a DuckDB connection with the
    store's tables) holds for it nowhere yet: all `add_metrics` may add."""
    held = {m for (m,) in db.execute("SELECT metric FROM metrics WHERE run_id = ?", [run_id]).fetchall()}
    in_matrix = {
        m for (m,) in db.execute("SELECT DISTINCT metric FROM stage_matrix WHERE run_id = ?", [run_id]).fetchall()
    }
    new = {k: float(v) for k, v in sorted(metrics.items()) if k not in held}
    return new, [tuple(r) for r in stage_matrix if r[2] not in in_matrix]


def not_finished(run_id: str, path: Path) -> ClbenchError:
    return ClbenchError(f"run {run_id} is not a finished run of {path}: no metrics added")


def not_created(what: str, path: Path) -> ClbenchError:
    return ClbenchError(f"{what} {path} does not exist (run `clbench run` first)")


# --- merging -----------------------------------------------------------------------------------------------


def check_merge(into: ResultStore, source: ResultStore) -> None:
    """Fail before any write if `source` could not be merged into `into`. Writes nothing."""
    if not source.path.exists():
        raise ClbenchError(f"results database {source.path} does not exist")
    if into.path.exists() and into.path.resolve() == source.path.resolve():
        raise ClbenchError(f"cannot merge {source.path} into itself")
    source.check()
    into.check()


def takes(here: str | None, there: str) -> bool:
    """Whether a merge copies a source's run in, given its status here (None: absent) and there. A run id
    hashes the run's whole config, so the same id is the same run: what is here stays, unless it failed here
    and finished there."""
    return here is None or (here != "finished" and there == "finished")


def merged_choice(here: dict | None, row: dict, combine) -> dict | None:
    """A source's tuning choice `row` (its search parsed) for a key stored here as `here` ({search, objective,
    chosen_at}; None: no choice stored): the row to store, or None to keep here's. Both stored on one objective:
    combine(here's search, there's) → (search, its choice). On two objectives (a task's tune_metric changed between
    the searches) the later choice stands whole: means of two metrics are never joined into one search."""
    if here is None:
        return row
    if here["objective"] != row["objective"]:
        return row if row["chosen_at"] > here["chosen_at"] else None
    made = combine(here["search"], row["search"]) if combine else None
    if made is None:
        return None
    search, best = made
    return row | {"lr": best["lr"], "score": best["mean"], "search": search}


def now() -> datetime:
    return datetime.now()
