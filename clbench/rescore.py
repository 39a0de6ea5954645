"""A finished run rebuilt from its record, and the metrics it lacks added to that record: `clbench rescore`.

    clbench rescore --db results.duckdb                    # every reported run without drift_kl_oldvocab
    clbench rescore --db results/ --task pseudowords --method fft,lora --missing drift_kl_oldvocab

clbench stores no adapted weights, so a run is trained again through the protocol (into a scratch store) from
the specification its record holds (spec.RunSpec.from_config). It must hash to its own run id (the same task
data, base weights and method config) and reproduce the quality metrics the record already holds; only then
are the metrics it lacks (a metric declared after the run was made) written beside them. A stored value is
never replaced, and a run that does not reproduce is left as it was. `clbench lm-eval --run` rebuilds the
same way.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clbench import metrics as M
from clbench.distributed import log
from clbench.errors import ClbenchError
from clbench.method import methods
from clbench.protocol import execute, plan
from clbench.provenance import differences
from clbench.spec import RunSpec
from clbench.storage import ResultStore
from clbench.store import Store
from clbench.taskspec import load_tasks

# how far a rebuilt quality metric may lie from the stored one, relative to max(1, |stored|): float rounding
# of the training run (2 CPU threads: about 1e-7; docs/reliability.md), well below any difference reported
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Rebuilt:
    metrics: dict[str, float]  # the rebuilt run's metrics
    stage_matrix: list[tuple]  # (after_stage, eval_stage, metric, value)
    largest_difference: float  # over metrics.reproduced(), relative to max(1, |stored|)
    captured: dict  # base, data, model, tokenizer of the rebuilt run
    elsewhere: list[str]  # what of the run's recorded versions and hardware differs here (provenance.differences)

    def why(self) -> str:
        """The sentence a refusal ends with: where the rebuild ran unlike the run."""
        if not self.elsewhere:
            return "it was made with these versions on this hardware"
        return "it was made with " + ", ".join(self.elsewhere)


def rebuild(store: ResultStore, run_id: str, session, task_dirs: list[Path]) -> Rebuilt:
    """The finished run `run_id` trained again from its record (module docstring)."""
    found = store.query("SELECT status, config, versions FROM runs WHERE run_id = ?", [run_id])
    if found.empty:
        raise ClbenchError(f"no run {run_id!r} in {store.path}")
    if found.status[0] != "finished":
        raise ClbenchError(f"run {run_id} is {found.status[0]}, not finished: nothing to rebuild")
    spec = RunSpec.from_config(json.loads(found.config[0]))  # every param, budget key and option as recorded
    planned = plan(spec, load_tasks(task_dirs).get(spec.task), methods().get(spec.method), session=session)
    if planned.run_id != run_id:  # before any training
        raise ClbenchError(
            f"run {run_id} no longer reproduces: its task file, base model or method changed (rebuilt config hashes to {planned.run_id})"
        )
    captured = {}
    with tempfile.TemporaryDirectory(prefix="clbench-rebuild-") as scratch:
        scratch_store = Store(Path(scratch) / "scratch.duckdb")
        outcome = execute(
            planned,
            store=scratch_store,
            session=session,
            on_adapted=lambda base, data, model, tokenizer: captured.update(
                base=base, data=data, model=model, tokenizer=tokenizer
            ),
        )
        matrix = scratch_store.query("SELECT after_stage, eval_stage, metric, value FROM stage_matrix")
        # where the rebuild ran, as its own record says: versions, CPU, accelerator, processes, batch sizes
        here = json.loads(scratch_store.query("SELECT versions FROM runs").versions[0])
    if outcome.status != "finished":
        raise ClbenchError(f"run {run_id}: the rebuild {outcome.status}: {outcome.reason}")
    stored = store.query("SELECT metric, value FROM metrics WHERE run_id = ?", [run_id]).set_index("metric").value
    difference = max(
        (
            abs(outcome.metrics[m] - stored[m]) / max(1.0, abs(stored[m]))
            for m in M.reproduced()
            if m in stored and m in outcome.metrics and math.isfinite(stored[m])
        ),
        default=0.0,
    )
    log(f"  rebuilt run {run_id}: largest difference from its stored quality metrics {difference:.3g}")
    elsewhere = differences(json.loads(found.versions[0] or "null"), here)  # as the config: JSON text
    return Rebuilt(
        outcome.metrics, [tuple(r) for r in matrix.itertuples(index=False)], difference, captured, elsewhere
    )


def selected(
    store: ResultStore, *, runs=None, tasks=None, method_names=None, split: str = "test", missing: str
) -> list[str]:
    """The finished runs to rescore: those named, or of these tasks and methods and split, that lack `missing`.
    A named run the store does not hold is bad input, not a run with nothing to add."""
    if runs:
        held = set(store.query(f"SELECT run_id FROM runs WHERE run_id IN ({', '.join('?' * len(runs))})", runs).run_id)
        if unknown := [run_id for run_id in runs if run_id not in held]:
            raise ClbenchError(f"no run {', '.join(map(repr, unknown))} in {store.path}")
    where, params = (
        ["r.status = 'finished'", "NOT EXISTS (SELECT 1 FROM metrics m WHERE m.run_id = r.run_id AND m.metric = ?)"],
        [missing],
    )
    for column, values in (("r.run_id", runs), ("r.task", tasks), ("r.method", method_names)):
        if values:
            where.append(f"{column} IN ({', '.join('?' * len(values))})")
            params += list(values)
    if not runs:
        where.append("coalesce(json_extract_string(r.config, '$.split'), 'test') = ?")
        params.append(split)
    ids = store.query(f"SELECT r.run_id FROM runs r WHERE {' AND '.join(where)} ORDER BY r.run_id", params)
    return ids.run_id.tolist()


def rescore(store: ResultStore, run_id: str, session, task_dirs: list[Path], *, tolerance: float = TOLERANCE) -> int:
    """Rebuild one run and add the metrics and stage-matrix rows its record lacks → how many metrics were added.
    A ClbenchError, and nothing written, where it does not reproduce within `tolerance`."""
    rebuilt = rebuild(store, run_id, session, task_dirs)
    if rebuilt.largest_difference > tolerance:
        raise ClbenchError(
            f"run {run_id} did not rebuild exactly (largest relative difference {rebuilt.largest_difference:.3g} "
            f"> {tolerance:g}): left as it was; {rebuilt.why()}"
        )
    return store.add_metrics(run_id, rebuilt.metrics, rebuilt.stage_matrix)
