"""Results to share: one self-describing record per run, as Parquet or JSON Lines, or on the Hugging Face hub.

clbench export --format parquet --out results.parquet --task arithmetic
clbench push --repo ORG/NAME

Every run in the `runs` table is a record, tuning runs included; `split` says which data a run scored
('validation' for `clbench tune`'s runs, which are never reported as results; 'test' otherwise).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from clbench import hub
from clbench.errors import ClbenchError, first_line
from clbench.records import open_store
from clbench.store import SPLIT

FORMATS = {"parquet": "PARQUET", "jsonl": "JSON"}  # DuckDB's COPY writes JSON as one object per line
SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
REPO_FILE = "clbench-results.parquet"

# each record field: (its SQL over runs r and the per-run metric maps m, what it is); the order is the files'
FIELDS = {
    "run_id": ("r.run_id", "the run's id: a hash of its resolved config"),
    "task": ("r.task", "task name (tasks/NAME.yaml)"),
    "task_version": ("r.task_version", "the task file's version"),
    "method": ("r.method", "method name (baselines/NAME.py)"),
    "model": ("r.model", "base model: builtin:NAME, a local path or a Hugging Face id"),
    "seed": ("r.seed", "the run's seed"),
    "split": (SPLIT, "'test' for reported results; 'validation' for a `clbench tune` run, never reported"),
    "status": ("r.status", "finished | failed"),
    "reason": ("r.reason", "why a failed run failed (null otherwise)"),
    "metrics": ("coalesce(m.metrics, MAP {})", "metric name → value (docs/metrics.md); empty for a failed run"),
    "config": ("r.config", "the resolved configuration the run_id hashes (JSON)"),
    "versions": (
        "r.versions",
        "package versions, CPU model, accelerator, processes and batch sizes the run ran with (JSON)",
    ),
    "model_fingerprint": ("r.model_fingerprint", "hash of the base model's weights and tokenizer"),
    "data_fingerprint": ("r.data_fingerprint", "hash of the task's whole data"),
    "git_commit": ("r.git_commit", "clbench's commit, '+dirty' with uncommitted changes"),
    "started_at": ("r.started_at", "when the run started (local time)"),
    "finished_at": ("r.finished_at", "when it was recorded (local time)"),
}

RECORDS = f"""
WITH m AS (SELECT run_id, map_from_entries(list((metric, value) ORDER BY metric)) AS metrics FROM metrics GROUP BY run_id)
SELECT {", ".join(f"{sql} AS {name}" for name, (sql, _) in FIELDS.items())}
FROM runs r LEFT JOIN m USING (run_id)
WHERE (?::VARCHAR[] IS NULL OR list_contains(?, r.task)) AND (?::VARCHAR[] IS NULL OR list_contains(?, r.method))
ORDER BY r.run_id
"""


def out_format(out: str | Path | None, fmt: str | None) -> str:
    """The format to write: `fmt` where given, else the one `out`'s suffix names, else Parquet.

    A file named for one format and written in the other would be misread by whoever opens it by its name."""
    named = SUFFIXES.get(Path(out).suffix.lower()) if out else None
    if fmt and named and fmt != named:
        raise ClbenchError(f"--out {out} names a {named} file but --format is {fmt}; give one that agrees")
    return fmt or named or "parquet"


def export(
    db: str | Path,
    out: str | Path,
    fmt: str | None = None,
    *,
    tasks: list[str] | None = None,
    methods: list[str] | None = None,
) -> int:
    """Write the runs of `db` (only those of `tasks` and `methods` where given) to `out`, in `fmt` or the format
    its suffix names (`out_format`); → how many.

    Written to a new file beside `out` and renamed over it, so `out` is never left half-written."""
    fmt = out_format(out, fmt)
    out, store = Path(out), open_store(db)
    store.check()
    if out.is_dir():
        raise ClbenchError(f"cannot write {out}: it is a directory")
    try:  # a real write test, as Store.check's: permission bits do not stop root, a read-only mount does
        tempfile.TemporaryFile(dir=out.parent).close()
    except OSError as error:
        raise ClbenchError(f"cannot write {out}: {error.strerror or error}") from None
    # DuckDB creates the temporary file itself, so it gets the user's umask like any other output
    partial = out.parent / f".{out.name}.{os.getpid()}.partial"
    target = str(partial).replace("'", "''")
    try:
        written = store.query(
            f"COPY ({RECORDS}) TO '{target}' (FORMAT {FORMATS[fmt]})", [tasks, tasks, methods, methods]
        ).iloc[0, 0]
        if not written:
            raise ClbenchError(f"no runs in {db}{_filters(tasks, methods)}; nothing written")
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return int(written)


def _filters(tasks: list[str] | None, methods: list[str] | None) -> str:
    named = [f"{flag} {','.join(names)}" for flag, names in (("--task", tasks), ("--method", methods)) if names]
    return f" match {' and '.join(named)}" if named else ""


def push(db: str | Path, repo: str, *, private: bool = False, token: str | None = None) -> str:
    """Export `db` as Parquet with a dataset card to the Hugging Face dataset `repo` (created if missing);
    → the repo's URL. token None: huggingface_hub's own (HF_TOKEN, or a saved `hf auth login`)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ClbenchError(f"--repo {repo!r}: {str(error).splitlines()[0]}") from None
    if repo.count("/") != 1:
        raise ClbenchError(f"--repo takes ORG/NAME (the dataset's owner and name), got {repo!r}")
    with tempfile.TemporaryDirectory() as folder:
        runs = export(db, Path(folder) / REPO_FILE, "parquet")  # a bad database fails before the network is asked
        (Path(folder) / "README.md").write_text(card(runs))
        if not hub.reachable():
            raise ClbenchError(
                f"could not reach {hub.ENDPOINT} to push {repo}: no connection (or HF_HUB_OFFLINE is set); "
                "`clbench export` writes the same file here"
            )
        api = HfApi(endpoint=hub.ENDPOINT, token=token)
        try:
            url = api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
            api.upload_folder(
                repo_id=repo, repo_type="dataset", folder_path=folder, commit_message=f"clbench push: {runs} runs"
            )
        # HfHubHTTPError subclasses the HTTP client's own error class, which connection failures raise:
        # named through it, the clause holds whichever client (requests, httpx) this huggingface_hub uses
        except (OSError, *HfHubHTTPError.__bases__) as error:
            what = (
                f"{hub.ENDPOINT} refused"
                if isinstance(error, HfHubHTTPError)
                else f"could not reach {hub.ENDPOINT} to"
            )
            raise ClbenchError(f"{what} push {repo}: {first_line(error)}") from None
    return str(url)


def card(runs: int) -> str:
    """The dataset card (README.md): what the records are and how to read them."""
    fields = "\n".join(f"| `{name}` | {description} |" for name, (_, description) in FIELDS.items())
    return f"""---
configs:
- config_name: default
  data_files: {REPO_FILE}
tags:
- clbench
- continual-learning
---
# clbench results

{runs} runs of clbench, a benchmark of continual learning (vocabulary expansion) in language models: one record
per run, exported by `clbench push` from a clbench results database.

Tuning runs (`clbench tune`, scored on the validation split) are included: keep `split == 'test'` for the
reported results, and `status == 'finished'` for runs that completed.

| field | meaning |
|---|---|
{fields}

```python
import pandas as pd
runs = pd.read_parquet("{REPO_FILE}")
runs = runs[(runs.split == "test") & (runs.status == "finished")]
runs["metrics"] = runs.metrics.map(dict)  # pyarrow reads a map as (name, value) pairs
```
"""
