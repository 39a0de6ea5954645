"""Security defaults: no remote code or pickle weights unless asked, no shell, nothing world-writable."""

import os
import re
import stat
from pathlib import Path

import pytest

from clbench import arith, models
from clbench.cli import main
from tiny_setup import TASK, tiny  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for folder in ("clbench", "baselines", "tasks") for p in (ROOT / folder).rglob("*.py"))
TINY_RECIPE = arith.Recipe(layers=1, hidden=16, mlp=32, heads=2, steps=2, batch_size=4)


def test_remote_code_runs_only_when_passed_and_weights_come_from_safetensors(tiny, tmp_path, monkeypatch):
    calls: list[tuple[str, dict]] = []

    def spy(kind, real):
        def load(*args, **kwargs):
            calls.append((kind, kwargs))
            return real(*args, **kwargs)
        return load

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", spy("model", models.AutoModelForCausalLM.from_pretrained))
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", spy("tokenizer", models.AutoTokenizer.from_pretrained))
    assert main(tiny.run_args(tmp_path / "r.duckdb", "--method", "et")) == 0
    assert [(kind, kw["trust_remote_code"]) for kind, kw in calls] == [("tokenizer", False), ("model", False)]
    assert calls[1][1]["use_safetensors"] is True
    calls.clear()
    assert main(tiny.run_args(tmp_path / "r.duckdb", "--method", "et", "--trust-remote-code")) == 0
    assert [(kind, kw["trust_remote_code"]) for kind, kw in calls] == [("tokenizer", True), ("model", True)]


@pytest.mark.parametrize("pattern, why", [
    (r"shell\s*=\s*True|os\.system\(|os\.popen\(", "a shell command line"),
    (r"subprocess\.\w+\(\s*[^\[\s]", "a subprocess command that is not an argument list"),
    (r"torch\.load\((?![^)]*weights_only\s*=\s*True)", "torch.load without weights_only=True"),
    (r"pickle\.loads?\(|yaml\.load\(|yaml\.unsafe_load|(?<![.\w])(eval|exec)\(", "unpickling, unsafe YAML or builtin eval/exec"),
    (r"trust_remote_code\s*=\s*True|use_safetensors\s*=\s*False", "remote code or pickle weights switched on in code"),
])
def test_no_unsafe_call_in_the_source(pattern, why):
    assert SOURCES, "no sources found"
    found = [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(pattern, line)]
    assert not found, f"{why}: {found}"


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_results_and_caches_follow_the_umask_and_are_never_world_writable(umask, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    # a builtin model, so the run writes the model cache too
    monkeypatch.setitem(models.BUILTIN, "tiny-arith-llama", lambda log: arith.load_or_build(TINY_RECIPE, log=log))
    db = tmp_path / "results" / "r.duckdb"
    db.parent.mkdir()
    previous = os.umask(umask)
    try:
        assert main(tiny.run_args(db, "--method", "et", "--model", "builtin:tiny-arith-llama")) == 0
    finally:
        os.umask(previous)
    written = [p for p in [*(tmp_path / "cache").rglob("*"), *db.parent.iterdir()]]
    assert any(p.suffix == ".safetensors" for p in written) and db in written
    allowed = 0o777 & ~(umask | 0o002)  # the user's umask, and never writable by others even under umask 000
    too_open = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in written if stat.S_IMODE(p.stat().st_mode) & ~allowed}
    assert not too_open
    assert stat.S_IMODE(db.stat().st_mode) == 0o666 & allowed  # created with exactly the umask's bits
