"""A tiny local model and task, so tests can run real `clbench` commands — in subprocesses too — in seconds.

The model is a local directory (a 1-layer random Llama over clbench's character tokenizer, saved with
save_pretrained), so a subprocess finds it through `--model`/the task file with no hook; the task is
tasks/arithmetic.py's generator under a tiny budget, written to a task folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import tiny_llama

from clbench.arith import char_tokenizer
from clbench.taskspec import builtin_task_dir

TASK = "tiny-arith"
BUDGET = {"n_train": 16, "steps": 6, "batch_size": 4, "eval_batch_size": 64}
PARAMS = {"n_test": 20, "n_old_skill": 20, "n_old_text": 20, "n_replay": 10}


def save_tiny_model(path: Path, *, tokenizer=None) -> Path:
    """conftest's tiny Llama (context 32), saved as a local model folder a subprocess can load."""
    tokenizer = tokenizer or char_tokenizer()
    tiny_llama(tokenizer, tied=False).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_task(
    task_dir: Path, model: Path, *, name: str = TASK, budget: dict | None = None, params: dict | None = None, **fields
) -> Path:
    """tasks/arithmetic.py's generator under the tiny budget; keyword fields override the file's top level
    (with another `generator`, `params` are that generator's alone)."""
    task_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(builtin_task_dir() / "arithmetic.py", task_dir / "arithmetic.py")
    arithmetic = "generator" not in fields
    spec = {
        "name": name,
        "version": 1,
        "description": "arithmetic under a tiny budget, for tests",
        "generator": "arithmetic.py:build",
        "model": str(model),
        "init": "random",
        "budget": {**BUDGET, **(budget or {})},
        "params": {**(PARAMS if arithmetic else {}), **(params or {})},
        **fields,
    }
    path = task_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def cli_env(cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLBENCH_")}
    # one thread: determinism does not hinge on it, but 2 shared cores do not stretch to 4 processes × 2 threads
    return {**env, "CLBENCH_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", **extra}


def clbench_process(args: list[str], env: dict[str, str], **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "clbench.cli", *args],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **popen,
    )


def run_clbench(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clbench.cli", *args], env=env, text=True, capture_output=True, timeout=timeout
    )


@dataclass(frozen=True)
class Tiny:
    model: Path
    tasks: Path

    def run_args(self, db: Path, *extra: str) -> list[str]:
        return ["run", "--task", TASK, "--task-dir", str(self.tasks), "--db", str(db), *extra]


@pytest.fixture(scope="session")
def tiny_cli(tmp_path_factory) -> Tiny:
    """The tiny model and the tiny-arith task, built once per test session (conftest.py makes it a fixture)."""
    root = tmp_path_factory.mktemp("tiny")
    model = save_tiny_model(root / "model")
    write_task(root / "tasks", model)
    return Tiny(model, root / "tasks")
