"""Security defaults: no remote code or pickle weights unless asked, no shell, nothing world-writable."""

import ast
import os
import stat
from pathlib import Path

import pytest

from clbench import arith_llama, models
from clbench.cli import main

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for folder in ("clbench", "baselines", "tasks") for p in (ROOT / folder).rglob("*.py"))
TINY_RECIPE = arith_llama.Recipe(layers=1, hidden=16, mlp=32, heads=2, steps=2, batch_size=4)


def test_remote_code_runs_only_when_passed_and_weights_come_from_safetensors(tiny_cli, tmp_path, monkeypatch):
    calls: list[tuple[str, dict]] = []

    def spy(kind, real):
        def load(*args, **kwargs):
            calls.append((kind, kwargs))
            return real(*args, **kwargs)

        return load

    monkeypatch.setattr(
        models.AutoModelForCausalLM, "from_pretrained", spy("model", models.AutoModelForCausalLM.from_pretrained)
    )
    monkeypatch.setattr(
        models.AutoTokenizer, "from_pretrained", spy("tokenizer", models.AutoTokenizer.from_pretrained)
    )
    assert main(tiny_cli.run_args(tmp_path / "r.duckdb", "--method", "et")) == 0
    assert [(kind, kw["trust_remote_code"]) for kind, kw in calls] == [("tokenizer", False), ("model", False)]
    assert calls[1][1]["use_safetensors"] is True
    calls.clear()
    assert main(tiny_cli.run_args(tmp_path / "r.duckdb", "--method", "et", "--trust-remote-code")) == 0
    assert [(kind, kw["trust_remote_code"]) for kind, kw in calls] == [("tokenizer", True), ("model", True)]


def keyword(call: ast.Call, name: str):
    value = next((k.value for k in call.keywords if k.arg == name), None)
    return value.value if isinstance(value, ast.Constant) else value


UNSAFE = {  # what a call must not be, judged on the parsed source (docstrings and comments do not count)
    "a shell": lambda name, call: name in ("os.system", "os.popen") or keyword(call, "shell") is True,
    "a subprocess command that is not an argument list": lambda name, call: (
        name.startswith("subprocess.") and not (call.args and isinstance(call.args[0], (ast.List, ast.Tuple)))
    ),
    "torch.load without weights_only=True": lambda name, call: (
        name == "torch.load" and keyword(call, "weights_only") is not True
    ),
    "unpickling, unsafe YAML or eval/exec": lambda name, call: (
        name in ("pickle.load", "pickle.loads", "yaml.load", "yaml.unsafe_load", "eval", "exec")
    ),
    "remote code or pickle weights switched on": lambda name, call: (
        keyword(call, "trust_remote_code") is True or keyword(call, "use_safetensors") is False
    ),
}


@pytest.mark.parametrize("why", UNSAFE)
def test_no_unsafe_call_in_the_source(why):
    assert len(SOURCES) > 10, "sources not found"
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in SOURCES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and UNSAFE[why](ast.unparse(node.func), node)
    ]
    assert not found, f"{why}: {found}"


def test_the_source_scan_catches_what_it_forbids():
    bad = "os.system(c); subprocess.run(c, shell=True); subprocess.run(c); torch.load(f); eval(s); f(trust_remote_code=True)"
    calls = [node for node in ast.walk(ast.parse(bad)) if isinstance(node, ast.Call)]
    assert {why for why, rule in UNSAFE.items() for call in calls if rule(ast.unparse(call.func), call)} == set(UNSAFE)
    fine = "subprocess.run(['git', 'status']); torch.load(f, weights_only=True); model.eval(); yaml.safe_load(s)"
    assert not [
        c
        for c in ast.walk(ast.parse(fine))
        if isinstance(c, ast.Call)
        for rule in UNSAFE.values()
        if rule(ast.unparse(c.func), c)
    ]


@pytest.mark.slow  # builds a (tiny-recipe) base model into the cache: the default tier forbids base builds
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o000])
def test_results_and_caches_follow_the_umask_and_are_never_world_writable(umask, tiny_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    # a builtin model, so the run writes the model cache too
    monkeypatch.setitem(
        models.BUILTIN, "tiny-arith-llama", lambda log: arith_llama.load_or_build(TINY_RECIPE, log=log)
    )
    db = tmp_path / "results" / "r.duckdb"
    db.parent.mkdir()
    previous = os.umask(umask)
    try:
        assert main(tiny_cli.run_args(db, "--method", "et", "--model", "builtin:tiny-arith-llama")) == 0
    finally:
        os.umask(previous)
    written = [*(tmp_path / "cache").rglob("*"), *db.parent.iterdir()]
    assert any(p.suffix == ".safetensors" for p in written) and db in written
    allowed = 0o777 & ~(umask | 0o002)  # the user's umask, and never writable by others even under umask 000
    too_open = {
        str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
        for p in written
        if stat.S_IMODE(p.stat().st_mode) & ~allowed
    }
    assert not too_open
    assert stat.S_IMODE(db.stat().st_mode) == 0o666 & allowed  # created with exactly the umask's bits
