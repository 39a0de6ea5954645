"""What a result record says about where it came from."""

from __future__ import annotations

import importlib.metadata
import math
import platform
import subprocess
from functools import cache
from pathlib import Path

from clbench import distributed

PACKAGES = ("clbench", "torch", "transformers", "tokenizers", "peft", "datasets", "lm_eval", "duckdb")


@cache
def versions() -> dict[str, str | None]:
    """The packages' versions and the CPU's model: a CPU run rebuilt on another CPU can round differently, and
    training carries that far (docs/reliability.md), so the record says which CPU made it."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found | {"cpu": cpu_model()}


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def hardware(model, batch_size: int) -> dict[str, str | int]:
    """Where a run trained and in which batches: the accelerator (its GPUs' model and count over every process, or
    cpu), the processes, the batch per optimizer step and each process's share of it. A run rebuilt on other
    hardware or split over other processes rounds otherwise; the record says what it had."""
    processes = distributed.processes()
    # device_map spreads one model over several GPUs (and may offload part of it to the CPU)
    gpus = sorted({p.device for p in model.parameters() if p.device.type != "cpu"}, key=str)
    accelerator = "cpu"
    if gpus:
        import torch

        names = sorted({torch.cuda.get_device_name(d) if d.type == "cuda" else d.type for d in gpus})
        accelerator = f"{gpus[0].type}: {' + '.join(names)} × {len(gpus) * processes}"
    return {
        "accelerator": accelerator,
        "processes": processes,
        "batch_size": batch_size,  # no gradient accumulation: the examples of one optimizer step
        "batch_size_per_process": math.ceil(batch_size / processes),
    }


def differences(recorded: dict | None, here: dict) -> list[str]:
    """Each entry of `here` that a run's recorded versions lack or hold otherwise, as 'name recorded (here value)'."""
    recorded = recorded or {}
    return [
        f"{name} {recorded.get(name) or 'not recorded'} (here {value})"
        for name, value in here.items()
        if recorded.get(name) != value
    ]


@cache
def git_commit() -> str | None:
    """The commit of the clbench checkout, with '+dirty' for uncommitted changes; None if not a checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
