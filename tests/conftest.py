"""Shared fixtures for the default (fast, CPU, offline) tier.

Everything here is tiny and in-process: a 1-layer Llama over the 17-token character vocabulary
of clbench.arith, built in milliseconds. No test may build the arithmetic base by its recipe
(the `_no_real_base` guard turns that into a test failure; loading the shipped base is allowed, it
takes a fraction of a second) or touch ~/.cache.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

import clbench.arith_llama
from clbench.arith import char_tokenizer
from clbench.taskspec import builtin_task_dir

# tiny_setup's fixtures (tiny_cli) for every test module, without an import each module must not use
pytest_plugins = ["tiny_setup"]

HIDDEN = 16


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


def tiny_llama(tokenizer, *, tied: bool, hidden: int = HIDDEN, seed: int = 0) -> LlamaForCausalLM:
    """A 1-layer, 2-head Llama over `tokenizer`'s vocabulary; the same weights for the same seed."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


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


SMALL_PARAMS = {"n_test": 20, "n_old_skill": 10, "n_old_text": 10, "n_replay": 10}


def write_task(directory: Path, name: str = "small", *, raw: dict | None = None, text: str | None = None) -> Path:
    """Write `name`.yaml (raw dict or literal text) with tasks/arithmetic.py beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(builtin_task_dir() / "arithmetic.py", directory / "arithmetic.py")
    path = directory / f"{name}.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def arithmetic_raw() -> dict:
    """tasks/arithmetic.yaml as a dict, read at test time (the task file may gain fields)."""
    return yaml.safe_load((builtin_task_dir() / "arithmetic.yaml").read_text(encoding="utf-8"))


def small_raw(name: str = "small") -> dict:
    """The arithmetic task shrunk to seconds: 3 steps of 4 examples, 8 training examples, tiny eval sets."""
    raw = arithmetic_raw()
    raw["name"] = name
    raw["budget"] = {"n_train": 8, "steps": 3, "batch_size": 4, "eval_batch_size": 16}
    # shrink only the params the current generator knows about
    raw["params"] = {**raw.get("params", {}), **{k: v for k, v in SMALL_PARAMS.items() if k in raw.get("params", {})}}
    raw.pop("profiles", None)
    return raw


@pytest.fixture
def small_task_file(tmp_path) -> Path:
    return write_task(tmp_path / "tasks", raw=small_raw())


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
