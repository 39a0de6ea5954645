"""What a result record says about where it came from."""

from __future__ import annotations

import importlib.metadata
import subprocess
from functools import cache
from pathlib import Path

PACKAGES = ("clbench", "torch", "transformers", "tokenizers", "peft", "datasets", "lm_eval", "duckdb")


@cache
def versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


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
