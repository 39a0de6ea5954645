"""clbench's cache folder, and publishing a built artefact into it atomically."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("CLBENCH_CACHE", Path.home() / ".cache" / "clbench"))


def publish(target: Path, write: Callable[[Path], None]) -> None:
    """write(staging) fills a fresh folder beside target, which is then renamed to target.

    write must create its completion marker last; a reader checks for the marker, so it never
    sees a half-written folder, and a crash leaves only a stray `.building-*` folder behind.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".building-"))
    try:
        write(staging)
        staging.rename(target)
    except OSError:  # another process finished the same build first
        if not target.exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
