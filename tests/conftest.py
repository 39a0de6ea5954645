"""Shared fixtures for the default (fast, CPU, offline) tier.

Everything here is tiny and in-process: a 1-layer Llama over the 17-token character vocabulary
of clbench.arith, built in milliseconds. No test may build the arithmetic base by its recipe
(the `_no_real_base` guard turns that into a test failure; loading the shipped base is allowed, it
takes a fraction of a second) or touch ~/.cache.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

import clbench.arith_llama
from clbench.arith import char_tokenizer
from clbench.testing import small_raw, tiny_llama, write_task_file

# tiny_setup's fixtures (tiny_cli) for every test module, without an import each module must not use
pytest_plugins = ["tiny_setup"]


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory) -> Path:
    # one per test session: a slow test that builds the real base builds it once, then reuses it
    return tmp_path_factory.mktemp("clbench-cache")


@pytest.fixture(autouse=True)
def _isolated_env(_session_cache, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(_session_cache))
    # the CLI's default --db comes from $CLBENCH_DB: never a file in the working directory
    monkeypatch.setenv("CLBENCH_DB", str(_session_cache / "default-results.duckdb"))


@pytest.fixture(autouse=True)
def _no_real_base(request, monkeypatch):
    """Default-tier tests must not build the arithmetic base (70–100 s, builtin:arith-local); slow tests may."""
    if request.node.get_closest_marker("slow"):
        return

    def refuse(*args, **kwargs):
        raise AssertionError("a default-tier test tried to build the arithmetic base model")

    monkeypatch.setattr(clbench.arith_llama, "load_or_build", refuse)


@pytest.fixture
def tiny():
    """tiny(tied=...) → (model, tokenizer): a fresh random tiny Llama and character tokenizer."""

    def make(*, tied: bool, seed: int = 0):
        tokenizer = char_tokenizer()
        return tiny_llama(tokenizer, tied=tied, seed=seed), tokenizer

    return make


@pytest.fixture
def tiny_builtin(monkeypatch):
    """Registers 'builtin:tiny' (untied) and 'builtin:tiny-tied' in clbench.models.BUILTIN."""
    import clbench.models

    for name, tied in (("tiny", False), ("tiny-tied", True)):
        monkeypatch.setitem(
            clbench.models.BUILTIN,
            name,
            lambda log, tied=tied: (tiny_llama(char_tokenizer(), tied=tied), char_tokenizer()),
        )
    return "builtin:tiny"


@pytest.fixture
def small_task_file(tmp_path) -> Path:
    return write_task_file(tmp_path / "tasks", raw=small_raw())


def run_row(
    run_id: str, *, status: str = "finished", seed: int = 0, method: str = "et", reason: str | None = None
) -> dict:
    """A complete `runs` row for Store.record, as the protocol writes it."""
    return {
        "run_id": run_id,
        "task": "arithmetic",
        "task_version": 1,
        "method": method,
        "model": "builtin:tiny",
        "seed": seed,
        "status": status,
        "reason": reason,
        "config": {"seed": seed, "method": method},
        "model_fingerprint": "m" * 16,
        "data_fingerprint": "d" * 16,
        "versions": {"torch": "x"},
        "git_commit": None,
        "started_at": datetime(2025, 1, 1, 12, 0, 0),
        "finished_at": datetime(2025, 1, 1, 12, 5, 0),
    }


# tiers the README's test command leaves out, each run only when `-m` names it: .ci/run runs `-m slow` beside it
# (the real bases: minutes), stress only by hand (many processes for many minutes)
TIERS = ("slow", "stress")


def pytest_collection_modifyitems(config, items):
    named = config.option.markexpr or ""
    left_out = [item for item in items if any(item.get_closest_marker(t) and t not in named for t in TIERS)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item not in left_out]
