"""The arithmetic base ships with clbench: builtin:arith-llama loads it and builds nothing; a local build is compared."""

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from clbench import arith_llama, models
from clbench.cli import main
from clbench.errors import ClbenchError

# the shipped base on the arithmetic task's sets (measured; `clbench build-base` prints them)
SHIPPED_ACC = {"add_acc": 498 / 500, "mul_acc_seen": 1.0, "mul_acc_unseen": 46 / 88}
# the model-size axis (arith_llama.FAMILY): each member as shipped, its parameters and accuracies
FAMILY = {
    "arith-llama-w64": (133_568, {"add_acc": 1.0, "mul_acc_seen": 1.0, "mul_acc_unseen": 53 / 88}),
    "arith-llama": (529_280, SHIPPED_ACC),
    "arith-llama-w256": (2_107_136, {"add_acc": 1.0, "mul_acc_seen": 1.0, "mul_acc_unseen": 58 / 88}),
}


@pytest.fixture
def no_build(tmp_path, monkeypatch):
    """An empty cache, and building the recipe is an error."""
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))

    def refuse(*args, **kwargs):
        raise AssertionError("the arithmetic base was built")

    monkeypatch.setattr(arith_llama, "build", refuse)
    return tmp_path / "cache"


def test_the_builtin_base_on_an_empty_cache_is_the_shipped_one_and_builds_nothing(no_build):
    base = models.load_base("builtin:arith-llama", log=lambda msg: None)
    assert base.fingerprint == arith_llama.SHIPPED_FINGERPRINT
    assert sum(p.numel() for p in base.model.parameters()) == 529_280
    assert not no_build.exists()  # nothing written to the cache either


def test_the_shipped_base_is_the_recipe_s_and_the_readme_names_its_fingerprint():
    assert json.loads((arith_llama.SHIPPED / "recipe.json").read_text()) == asdict(arith_llama.Recipe())
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert f"`{arith_llama.SHIPPED_FINGERPRINT}`" in readme


def test_damaged_shipped_weights_are_one_error_line(tmp_path, monkeypatch):
    damaged = tmp_path / "arith-llama"
    model, tokenizer = arith_llama.load_shipped()
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    model.save_pretrained(damaged)
    tokenizer.save_pretrained(damaged)
    monkeypatch.setattr(arith_llama, "ASSETS", tmp_path)
    with pytest.raises(ClbenchError, match=f"not the shipped {arith_llama.SHIPPED_FINGERPRINT}; reinstall clbench"):
        arith_llama.load_shipped()


def test_compare_gives_the_largest_weight_difference_and_each_accuracy_difference():
    local = {"a": torch.tensor([1.0, 2.0, -3.0]), "b": torch.tensor([[0.5]])}
    shipped = {"a": torch.tensor([1.0, 2.25, -2.5]), "b": torch.tensor([[0.0]])}
    diff = arith_llama.compare(local, shipped, {"add_acc": 0.75, "mul_acc": 0.5}, {"add_acc": 0.5, "mul_acc": 0.625})
    assert diff == {"max_abs_weight_diff": 0.5, "add_acc_diff": 0.25, "mul_acc_diff": -0.125}
    same = arith_llama.compare(shipped, shipped, {"add_acc": 0.5}, {"add_acc": 0.5})
    assert same == {"max_abs_weight_diff": 0.0, "add_acc_diff": 0.0}


@pytest.mark.parametrize("local", [{"a": torch.zeros(3)}, {"a": torch.zeros(2), "b": torch.zeros(1)}])
def test_compare_refuses_tensors_of_another_recipe(local):
    with pytest.raises(ClbenchError, match="another recipe, not comparable"):
        arith_llama.compare(local, {"a": torch.zeros(2), "b": torch.zeros(1, 1)}, {}, {})


def test_the_shipped_base_scores_on_the_arithmetic_task():
    assert arith_llama.accuracies(*arith_llama.load_shipped()) == SHIPPED_ACC


def test_build_base_reports_how_far_the_local_build_lands_from_the_shipped_one(no_build, monkeypatch, capsys):
    local, tokenizer = arith_llama.load_shipped()
    with torch.no_grad():
        local.model.embed_tokens.weight[4, 0] += 0.5  # row 4 is `0`
    monkeypatch.setattr(arith_llama, "load_or_build", lambda force: (local, tokenizer))
    assert main(["build-base"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0]
        == f"local build: fingerprint {models.fingerprint(local)}; shipped base: {arith_llama.SHIPPED_FINGERPRINT}"
    )
    assert lines[1] == "largest weight difference: 0.5"
    assert lines[2:] == [
        "add_acc: local 0.978, shipped 0.996 (-0.018)",
        "mul_acc_seen: local 0.972, shipped 1.000 (-0.028)",
        "mul_acc_unseen: local 0.477, shipped 0.523 (-0.045)",
        "runs use the shipped base (builtin:arith-llama); --model builtin:arith-local uses this build",
    ]


def test_builtin_arith_local_is_this_machine_s_build(monkeypatch, tiny):
    model, tokenizer = tiny(tied=False)
    monkeypatch.setattr(arith_llama, "load_or_build", lambda log: (model, tokenizer))
    base = models.load_base("builtin:arith-local", log=lambda msg: None)
    assert base.fingerprint == models.fingerprint(model) != arith_llama.SHIPPED_FINGERPRINT


@pytest.mark.parametrize("name", list(FAMILY))
def test_every_base_of_the_size_axis_ships_with_its_recipe_and_scores_at_least_99_percent_addition(name, no_build):
    assert list(FAMILY) == [n for n in arith_llama.FAMILY if n in FAMILY] and set(FAMILY) == set(arith_llama.FAMILY)
    base = models.load_base(f"builtin:{name}", log=lambda msg: None)
    assert base.fingerprint == arith_llama.FAMILY_FINGERPRINTS[name]
    recipe = json.loads((arith_llama.ASSETS / name / "recipe.json").read_text())
    assert recipe == asdict(arith_llama.FAMILY[name])
    params, accuracy = FAMILY[name]
    assert sum(p.numel() for p in base.model.parameters()) == params
    assert base.model.config.hidden_size == recipe["hidden"]
    assert base.tokenizer.get_vocab() == arith_llama.char_tokenizer().get_vocab()  # one tokenizer for the axis
    assert arith_llama.accuracies(base.model, base.tokenizer) == accuracy and accuracy["add_acc"] >= 0.99
    assert not no_build.exists()
