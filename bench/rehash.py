"""Does every stored run still hash to its own id? Each finished run's config, resolved again by today's code
(`RunSpec.from_config` → `protocol.plan`: task file, generator, data fingerprints, base model, method options), must
give back its run id; no training (`clbench rescore` also retrains and compares metrics).

    python bench/rehash.py leaderboard/*/results.duckdb

A run of an older task version (a published task changes by a new version: its ids moved by design) is resolved
with the task file's version set back to its own: it rehashes when nothing but the version moved (same params,
data fingerprints, base, method options). Prints one line per database, task version and outcome ("same",
"same but the version", "differs in" the config keys that moved, or an error), with the first run id of any other
than "same". Exit 1 if any run differs or fails to resolve.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path

from clbench.errors import ClbenchError
from clbench.method import methods
from clbench.protocol import plan
from clbench.session import Session
from clbench.spec import RunSpec
from clbench.store import Store
from clbench.taskspec import load_tasks


def rehash(path: Path, tasks, session: Session) -> dict[tuple, list]:
    """(task, stored task version, outcome) → run ids (module docstring)."""
    found = defaultdict(list)
    runs = Store(path).query("SELECT run_id, config FROM runs WHERE status = 'finished'")
    for run_id, text in zip(runs.run_id, runs.config):
        config = json.loads(text)
        task, version = config["task"], config.get("task_version")
        try:
            resolved = tasks.get(task)
            current = resolved.spec.version
            if version != current:
                resolved = dataclasses.replace(resolved, spec=resolved.spec.model_copy(update={"version": version}))
            spec = RunSpec.from_config(config)
            planned = plan(spec, resolved, methods().get(spec.method), session=session)
            same = "same" if version == current else f"same but the version (task file: {current})"
            moved = sorted(k for k in config.keys() | planned.config.keys() if config.get(k) != planned.config.get(k))
            found[task, version, same if planned.run_id == run_id else f"differs in {', '.join(moved)}"].append(run_id)
        except ClbenchError as error:
            found[task, version, f"error: {error}"].append(run_id)
    return found


def main() -> int:
    tasks, session, bad = load_tasks(), Session(device="cpu"), 0
    for name in sys.argv[1:]:
        for (task, version, outcome), ids in sorted(rehash(Path(name), tasks, session).items(), key=str):
            print(f"{name}: {task} v{version}: {len(ids)} {outcome}" + ("" if outcome == "same" else f" ({ids[0]})"))
            bad += not outcome.startswith("same")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main())
