"""Where a grid of runs executes: in this process, in local worker processes, or on SLURM.

    clbench sweep --task arithmetic --method et,fft --n 10,50,200 --seeds 0,1,2 --executor slurm \
        --workers 8 --slurm-partition gpu --gpus-per-job 1

The grid is cut into `workers` chunks; each chunk is one submitit job that runs its runs in
order with one Session, so a base model is loaded once per job, not once per run. Every job
writes to the same results store itself (clbench.store: one transaction per run, retried on
DuckDB's single-writer lock), so results arrive whatever order jobs finish in, and a rerun of
the same sweep skips what any job already finished. On SLURM the --db and --executor-folder
must be on a filesystem the compute nodes share.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clbench.errors import ClbenchError
from clbench.spec import RunSpec

# submitit's local and slurm executors (its debug executor stops in pdb on an error: not for users);
# `inline`, this very process, is clbench.sweep.sweep
EXECUTORS = ("local", "slurm")


@dataclass(frozen=True)
class RunRequest:
    """One grid point, picklable and self-contained: a job re-resolves names in its own process."""

    spec: RunSpec
    db: str
    device: str = "auto"
    task_dirs: tuple[str, ...] = ()


def run_chunk(requests: list[RunRequest]) -> list[tuple[str, str, str | None]]:
    """Runs requests in order with one Session → [(run_id, status, reason)]. The job entry point."""
    from clbench.method import methods
    from clbench.protocol import execute, plan
    from clbench.records import open_store
    from clbench.session import Session
    from clbench.taskspec import load_tasks

    session, tasks, registry = Session(device=requests[0].device if requests else "auto"), {}, methods()
    out = []
    for r in requests:
        if r.task_dirs not in tasks:
            tasks[r.task_dirs] = load_tasks([Path(d) for d in r.task_dirs])
        store = open_store(r.db)
        task, method = tasks[r.task_dirs].get(r.spec.task), registry.get(r.spec.method)
        planned = plan(r.spec, task, method, session=session, tuned_choice=store.tuned)
        outcome = execute(planned, store=store, session=session)
        out.append((outcome.run_id, outcome.status, outcome.reason))
    return out


def job_failure(text: str) -> str:
    """The one line that says why a job failed: its ClbenchError if it raised one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()] or ["no output"]
    errors = [line.split("ClbenchError: ", 1)[1] for line in lines if "ClbenchError: " in line]
    return errors[-1] if errors else lines[-1]


def execute(
    requests: list[RunRequest],
    executor: str,
    *,
    workers: int = 1,
    folder: str | Path = "clbench-jobs",
    timeout_min: int = 240,
    slurm_partition: str | None = None,
    gpus_per_job: int = 0,
) -> list[tuple[str, str, str | None]]:
    if executor not in EXECUTORS:
        raise ClbenchError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
    import submitit

    chunks = [requests[i::workers] for i in range(min(workers, len(requests)))]
    submitter = submitit.AutoExecutor(folder=str(folder), cluster=executor)
    parameters = {"timeout_min": timeout_min, "name": "clbench"}
    if executor == "slurm":
        parameters.update(gpus_per_node=gpus_per_job, slurm_array_parallelism=workers)
        if slurm_partition:
            parameters["slurm_partition"] = slurm_partition
    submitter.update_parameters(**parameters)
    with submitter.batch():
        jobs = [submitter.submit(run_chunk, chunk) for chunk in chunks]
    results = []
    for job in jobs:
        try:
            results += job.result()
        except submitit.core.utils.UncompletedJobError as error:  # FailedJobError is a subclass
            raise ClbenchError(
                f"sweep job {job.job_id} did not complete (logs in {folder}): {job_failure(str(error))}"
            ) from None
    return results
