"""The leaderboard: `clbench leaderboard --db clbench-results.duckdb --out leaderboard/out`.

Writes index.html (clbench/report/page.py), leaderboard.md (the headline metrics,
clbench/report/format.py) and leaderboard.csv (every aggregate row) from a results store. A row is one
(task, method, model, settings, n_train) over its seeds (clbench/report/load.py; settings name a swept task
param too, so a sweep's points are never pooled as seeds); only finished runs with
metrics enter the tables; failed or partial runs are listed apart with their reason.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from clbench.errors import ClbenchError
from clbench.records import open_store
from clbench.report.format import markdown_board, pooled_draws
from clbench.report.load import KEY, load, read_board
from clbench.report.page import page


def build(db: str | Path, out: str | Path) -> Path:
    store, out = open_store(db), Path(out)
    loaded = load(store)  # a missing database is refused first, before any folder is made
    writable(out)
    board = read_board(store, *loaded)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(page(board, db), encoding="utf-8")
    (out / "leaderboard.md").write_text(markdown_board(board), encoding="utf-8")
    table = board.table if pooled_draws(board.table) else board.table.drop(columns="data_draws")  # 1 everywhere
    table.sort_values(KEY + ["metric"]).to_csv(out / "leaderboard.csv", index=False)
    return out


def writable(out: Path) -> None:
    """The output folder exists or can be made, and takes files: checked before any work."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as error:
        raise ClbenchError(f"cannot write the leaderboard to {out}: {error.strerror or error}") from None
