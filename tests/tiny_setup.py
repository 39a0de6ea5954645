"""A tiny local model and task, so tests can run real `clbench` commands — in subprocesses too — in seconds.

The model is a local directory (clbench.testing.save_tiny_model: a 1-layer random Llama over clbench's character
tokenizer), so a subprocess finds it through `--model`/the task file with no hook; the task is
clbench.testing.write_tiny_task's (tasks/arithmetic.py's generator under a tiny budget), written to a task folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from clbench.testing import TASK, save_tiny_model, write_tiny_task


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
    write_tiny_task(root / "tasks", model)
    return Tiny(model, root / "tasks")
