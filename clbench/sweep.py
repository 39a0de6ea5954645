"""Sample-efficiency curves: `clbench sweep --task T --method et,fft --n 10,50,200 --seeds 0,1,2`.

A sweep is run_one over methods × N × seeds with the task's budget otherwise unchanged (same
steps, so a small N is seen for more epochs). Each point is an ordinary run in the store, so a
sweep resumes like `run`: finished points are skipped. The curve reads N back from each run's
recorded config.
"""

from __future__ import annotations

import pandas as pd

from clbench.metrics import headline
from clbench.protocol import Outcome, run_one

SPREAD = ["target_loss", "target_acc"]  # also reported as the standard deviation over seeds


def sweep(task, methods: list, ns: list[int], seeds: list[int], *, store, session, **run_options) -> list[Outcome]:
    return [
        run_one(task, method, seed=seed, store=store, session=session, n_train=n, **run_options)
        for method in methods
        for n in ns
        for seed in seeds
    ]


def curve(store, run_ids: list[str]) -> pd.DataFrame:
    """Means over seeds (standard deviations for SPREAD), one row per (method, n_train)."""
    frame = store.query(
        "SELECT r.run_id, r.method, CAST(json_extract(r.config, '$.budget.n_train') AS INTEGER) AS n_train, r.seed, "
        "m.metric, m.value FROM runs r JOIN metrics m USING (run_id) WHERE r.status = 'finished'"
    )
    shown = headline("curve")
    frame = frame[frame.run_id.isin(run_ids) & frame.metric.isin(shown)]
    if frame.empty:
        return pd.DataFrame()
    table = frame.pivot_table(index=["method", "n_train"], columns="metric", values="value", aggfunc="mean")
    spread = frame[frame.metric.isin(SPREAD)].pivot_table(
        index=["method", "n_train"], columns="metric", values="value", aggfunc="std"
    )
    seeds = frame.groupby(["method", "n_train"]).seed.nunique().rename("seeds")
    columns = [table.get(m, None) for m in shown]
    columns += [spread[m].rename(f"{m}_sd") for m in SPREAD if m in spread]
    return pd.concat([seeds, *[c for c in columns if c is not None]], axis=1)
