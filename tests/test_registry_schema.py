"""The registry, the task-file schema, every builtin task file, and the arithmetic data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from clbench.arith import MUL_PAIRS, char_tokenizer, mul_pairs_seen
from clbench.errors import ClbenchError
from clbench.registry import Registry
from clbench.taskspec import builtin_task_dir, load_task_file, load_tasks, merge, task_files
from clbench.testing import arithmetic_raw, write_task_file

# ---------------------------------------------------------------- Registry


@pytest.fixture
def registry() -> Registry[int]:
    r: Registry[int] = Registry("task")
    r.register("arithmetic", 1)
    r.register("b", 2)
    r.register("a", 3)
    return r


def test_register_returns_the_item_and_get_finds_it(registry):
    assert registry.register("c", 4) == 4
    assert registry.get("c") == 4
    assert registry.names() == ["a", "arithmetic", "b", "c"]
    assert list(registry) == ["a", "arithmetic", "b", "c"]
    assert "c" in registry and "d" not in registry


def test_duplicate_name_is_an_error(registry):
    with pytest.raises(ClbenchError, match=r"^duplicate task name 'a'$"):
        registry.register("a", 99)
    assert registry.get("a") == 3  # the first registration stands


def test_unknown_name_suggests(registry):
    with pytest.raises(ClbenchError) as info:
        registry.get("arithmetc")
    assert str(info.value) == "unknown task 'arithmetc' (did you mean 'arithmetic'?); known: a, arithmetic, b"


def test_unknown_name_without_close_match(registry):
    with pytest.raises(ClbenchError) as info:
        registry.get("zzzzzz")
    assert "did you mean" not in str(info.value)
    assert str(info.value) == "unknown task 'zzzzzz'; known: a, arithmetic, b"


def test_builtin_task_registry_suggests_arithmetic():
    with pytest.raises(ClbenchError, match=re.escape("did you mean 'arithmetic'")):
        load_tasks().get("arithmatic")


def test_resolve(registry):
    assert registry.resolve("all") == ["a", "arithmetic", "b"]
    assert registry.resolve("b,a") == ["b", "a"]  # the order given
    assert registry.resolve(" b , a ,") == ["b", "a"]
    assert registry.resolve("arithmetic") == ["arithmetic"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("a,a", "task list 'a,a' names one task twice"),
        ("", "empty task list ''"),
        (" , ", "empty task list ' , '"),
        ("a,nope", "unknown task 'nope'"),
    ],
)
def test_resolve_errors(registry, spec, message):
    with pytest.raises(ClbenchError, match=re.escape(message)):
        registry.resolve(spec)


# ---------------------------------------------------------------- task files


def _load(tmp_path: Path, raw: dict, name: str = "arithmetic"):
    return load_task_file(write_task_file(tmp_path, name, raw=raw))


def test_copy_of_arithmetic_loads(tmp_path):
    raw = arithmetic_raw()
    task = _load(tmp_path, raw)
    assert task.name == "arithmetic"
    model, budget, params = task.resolved()
    assert model == raw["model"] == "builtin:arith-llama"
    assert budget.model_dump() == {"eval_batch_size": 64, **raw["budget"]}
    assert params.model_dump() == params.model_dump() | raw["params"]
    assert params.operator == "<spec>"


def test_unknown_top_level_key(tmp_path):
    raw = arithmetic_raw() | {"colour": "red"}
    with pytest.raises(ClbenchError, match=r"^task file arithmetic\.yaml: colour: Extra inputs are not permitted$"):
        _load(tmp_path, raw)


def test_unknown_budget_key(tmp_path):
    raw = arithmetic_raw()
    raw["budget"]["stepz"] = 3
    with pytest.raises(ClbenchError, match=r"budget\.stepz: Extra inputs are not permitted"):
        _load(tmp_path, raw)


def test_wrong_type(tmp_path):
    raw = arithmetic_raw()
    raw["budget"]["steps"] = "x"
    with pytest.raises(ClbenchError, match=r"^task file arithmetic\.yaml: budget\.steps: .*integer"):
        _load(tmp_path, raw)


def test_zero_steps(tmp_path):
    raw = arithmetic_raw()
    raw["budget"]["steps"] = 0
    with pytest.raises(
        ClbenchError, match=r"^task file arithmetic\.yaml: budget\.steps: Input should be greater than 0$"
    ):
        _load(tmp_path, raw)


def test_a_typo_of_a_required_key_suggests_it_rather_than_the_key_missing(tmp_path):
    raw = arithmetic_raw()
    raw["budget"]["stpes"] = raw["budget"].pop("steps")
    raw["profiles"]["paper"]["modle"] = raw["profiles"]["paper"].pop("model")
    with pytest.raises(ClbenchError) as info:
        _load(tmp_path, raw)
    assert str(info.value) == (
        "task file arithmetic.yaml: budget.stpes: Extra inputs are not permitted (did you mean 'steps'?)"
    )
    raw["budget"]["steps"] = raw["budget"].pop("stpes")
    with pytest.raises(ClbenchError) as info:
        _load(tmp_path, raw)
    assert str(info.value) == (
        "task file arithmetic.yaml: profiles.paper.modle: Extra inputs are not permitted (did you mean 'model'?)"
    )


def test_missing_required_field(tmp_path):
    raw = arithmetic_raw()
    del raw["version"]
    with pytest.raises(ClbenchError, match=r"^task file arithmetic\.yaml: version: Field required$"):
        _load(tmp_path, raw)


def test_malformed_yaml(tmp_path):
    path = write_task_file(tmp_path, "arithmetic", text="name: arithmetic\nbudget: [unclosed\n")
    with pytest.raises(ClbenchError, match=r"is not valid YAML \(line 3\)$"):
        load_task_file(path)


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = write_task_file(tmp_path, "arithmetic", text="- a\n- b\n")
    with pytest.raises(ClbenchError, match=r"must hold a mapping of fields$"):
        load_task_file(path)


def test_file_name_must_be_task_name(tmp_path):
    with pytest.raises(
        ClbenchError, match=re.escape("task file other.yaml: the file name must be the task name (arithmetic.yaml)")
    ):
        _load(tmp_path, arithmetic_raw(), name="other")


def test_unknown_init(tmp_path):
    raw = arithmetic_raw() | {"init": "zeros"}
    with pytest.raises(ClbenchError, match=re.escape("init 'zeros' is not one of random, mean, subword-mean")):
        _load(tmp_path, raw)


def test_unknown_param_raised_at_resolve(tmp_path):
    raw = arithmetic_raw()
    raw["params"]["n_tets"] = 5
    task = _load(tmp_path, raw)  # params are the generator's business: checked when resolved
    with pytest.raises(ClbenchError, match=r"^task 'arithmetic' params: n_tets: Extra inputs are not permitted$"):
        task.resolved()


def test_wrong_param_type_raised_at_resolve(tmp_path):
    raw = arithmetic_raw()
    raw["params"]["n_test"] = 0
    with pytest.raises(ClbenchError, match=r"params: n_test: Input should be greater than 0"):
        _load(tmp_path, raw).resolved()


def test_unknown_profile(tmp_path):
    task = _load(tmp_path, arithmetic_raw())
    with pytest.raises(
        ClbenchError, match=r"^task 'arithmetic' has no profile 'nope' \(profiles: (.*, )?paper(, .*)?\)$"
    ):
        task.resolved("nope")


def test_profile_overrides_and_its_errors(tmp_path):
    raw = arithmetic_raw()
    raw["profiles"]["quick"] = {"budget": {"steps": 7}, "params": {"n_test": 11}}
    raw["profiles"]["typo"] = {"budget": {"stepz": 7}}
    raw["profiles"]["badparam"] = {"params": {"opperator": "<x>"}}
    task = _load(tmp_path, raw)
    model, budget, params = task.resolved("quick")
    assert model == "builtin:arith-llama"  # not overridden
    assert (budget.steps, budget.n_train, params.n_test) == (7, 200, 11)
    assert task.resolved("paper")[0] == "meta-llama/Llama-3.2-3B"
    with pytest.raises(ClbenchError, match=r"profile 'typo' budget: stepz: Extra inputs are not permitted"):
        task.resolved("typo")
    with pytest.raises(ClbenchError, match=r"params: opperator: Extra inputs are not permitted"):
        task.resolved("badparam")


def test_missing_generator_file(tmp_path):
    raw = arithmetic_raw() | {"generator": "missing.py:build"}
    task = _load(tmp_path, raw)
    with pytest.raises(ClbenchError, match=r"generator file .*missing\.py does not exist"):
        task.resolved()


def test_extra_task_dir_duplicating_a_builtin_is_an_error(tmp_path):
    write_task_file(tmp_path, "arithmetic", raw=arithmetic_raw())
    with pytest.raises(ClbenchError, match=r"^duplicate task name 'arithmetic'$"):
        load_tasks([tmp_path])


# ---------------------------------------------------------------- include:


def test_merge_is_key_by_key_for_mappings_and_replaces_anything_else():
    inherited = {"a": 1, "m": {"x": 1, "y": {"p": 1, "q": 2}}, "l": [1, 2], "n": {"k": 1}, "s": "old"}
    own = {"m": {"y": {"q": 3}, "z": 4}, "l": [3], "n": None, "t": "new"}
    assert merge(inherited, own) == {
        "a": 1,
        "m": {"x": 1, "y": {"p": 1, "q": 3}, "z": 4},
        "l": [3],  # a list replaces, it is not concatenated
        "n": None,  # null replaces a mapping
        "s": "old",
        "t": "new",
    }
    assert inherited["m"]["y"] == {"p": 1, "q": 2}  # the inputs are left as they were


def _write(directory: Path, name: str, fields: dict) -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(fields, sort_keys=False), encoding="utf-8")
    return path


def _fragment_and_child(tmp_path: Path) -> Path:
    """_base.yaml: arithmetic without name and a profile; small.yaml includes it and overrides parts."""
    base = arithmetic_raw()
    del base["name"]
    base["profiles"] = {"big": {"model": "builtin:other", "budget": {"steps": 50, "n_train": 100}}}
    write_task_file(tmp_path, "_base", raw=base)
    child = {
        "include": "_base.yaml",
        "name": "small",
        "budget": {"steps": 7},
        "profiles": {"big": {"budget": {"steps": 9}}},
    }
    return _write(tmp_path, "small.yaml", child)


def test_include_inherits_and_merges_profiles_key_by_key(tmp_path):
    task = load_task_file(_fragment_and_child(tmp_path))
    raw = arithmetic_raw()
    model, budget, params = task.resolved()
    assert (task.name, model, budget.model_dump()) == (
        "small",
        raw["model"],
        {"eval_batch_size": 64, **raw["budget"], "steps": 7},
    )
    assert params.model_dump() == params.model_dump() | raw["params"]
    model, budget, _ = task.resolved("big")
    assert (model, budget.steps, budget.n_train) == ("builtin:other", 9, 100)


def test_an_underscore_file_is_a_fragment_not_a_task(tmp_path):
    _fragment_and_child(tmp_path)
    assert [p.name for p in task_files(tmp_path)] == ["small.yaml"]
    assert "small" in load_tasks([tmp_path]) and "_base" not in load_tasks([tmp_path])


def test_a_typo_in_an_including_file_still_fails(tmp_path):
    _fragment_and_child(tmp_path)
    _write(tmp_path, "small.yaml", {"include": "_base.yaml", "name": "small", "budget": {"stepz": 7}})
    with pytest.raises(ClbenchError, match=r"^task file small\.yaml: budget\.stepz: Extra inputs are not permitted$"):
        load_task_file(tmp_path / "small.yaml")


def test_include_of_a_missing_file(tmp_path):
    path = _write(tmp_path, "small.yaml", {"include": "_nope.yaml", "name": "small"})
    with pytest.raises(ClbenchError, match=r"^task file small\.yaml: included file .*_nope\.yaml does not exist$"):
        load_task_file(path)


def test_include_cycle(tmp_path):
    _write(tmp_path, "_a.yaml", {"include": "_b.yaml"})
    _write(tmp_path, "_b.yaml", {"include": "_a.yaml"})
    path = _write(tmp_path, "small.yaml", {"include": "_a.yaml", "name": "small"})
    with pytest.raises(ClbenchError) as info:
        load_task_file(path)
    assert str(info.value) == "task file small.yaml: include cycle small.yaml → _a.yaml → _b.yaml → _a.yaml"


def test_include_must_name_one_file(tmp_path):
    path = _write(tmp_path, "small.yaml", {"include": ["_a.yaml", "_b.yaml"], "name": "small"})
    with pytest.raises(ClbenchError, match=r"^task file small\.yaml: include must name one file, got \["):
        load_task_file(path)


# what tasks/xling-{es,de,ar}.yaml resolved to before they included tasks/_xling.yaml (dumped then)
XLING_BEFORE = json.loads((Path(__file__).parent / "data" / "xling_resolved.json").read_text(encoding="utf-8"))


# what was added to them since, on purpose: the cpu and gpu profiles, tuned lrs and the tune metric, validation sizes,
# the opt-in to unknown text (default off)
ADDED_SPEC = {"tune_metric", "lr", "allow_unknown_tokens"}
ADDED_PROFILE, ADDED_PARAMS = {"lr"}, {"n_validation", "n_validation_old"}
ADDED_PROFILES = {"cpu", "gpu"}


@pytest.mark.parametrize("name", sorted(XLING_BEFORE))
def test_xling_tasks_resolve_exactly_as_before_include(name):
    task = load_tasks().get(name)
    spec = {k: v for k, v in task.spec.model_dump(mode="json").items() if k not in ADDED_SPEC}
    assert spec.pop("profiles").pop("cpu")["budget"]["steps"] == 100
    expected = dict(XLING_BEFORE[name]["spec"])
    profiles = {
        p: {k: v for k, v in prof.items() if k not in ADDED_PROFILE}
        for p, prof in task.spec.model_dump(mode="json")["profiles"].items()
        if p not in ADDED_PROFILES
    }
    # version 2: scored by the content rule, 3: old text read as running text (issue 37); the files otherwise as they
    # were
    assert spec.pop("version") == expected.pop("version") + 2 == 3
    assert profiles == expected.pop("profiles") and spec == expected
    for profile in (None, "paper"):
        model, budget, params = task.resolved(profile)
        params = {k: v for k, v in params.model_dump(mode="json").items() if k not in ADDED_PARAMS}
        resolved = {"model": model, "budget": budget.model_dump(), "params": params}
        assert resolved == XLING_BEFORE[name][profile or "default"], profile


# ---------------------------------------------------------------- every builtin task file

BUILTIN_TASK_FILES = task_files(builtin_task_dir())


def test_there_are_builtin_tasks():
    assert "arithmetic.yaml" in [p.name for p in BUILTIN_TASK_FILES]


def uses_hub(params) -> bool:
    """A profile reading `hf:` corpora (the paper's WikiText / Wikipedia) cannot be built offline."""
    return any(isinstance(v, str) and v.startswith("hf:") for v in params.model_dump().values())


def mentions(text: str, token: str, whole_word: bool) -> bool:
    return re.search(rf"(?<!\w){re.escape(token)}(?!\w)", text) is not None if whole_word else token in text


@pytest.mark.parametrize("path", BUILTIN_TASK_FILES, ids=[p.stem for p in BUILTIN_TASK_FILES])
def test_builtin_task_file(path):
    task = load_task_file(path)
    assert task.name == path.stem
    base_vocab = char_tokenizer().get_vocab()
    for profile in [None, *task.spec.profiles]:
        model, budget, params = task.resolved(profile)
        assert model
        if uses_hub(params):
            continue
        data = task.build(params, char_tokenizer())
        assert data.new_tokens, profile
        assert len(set(data.new_tokens)) == len(data.new_tokens)
        assert not set(data.new_tokens) & set(base_vocab), profile
        assert data.train and data.target_test and data.old_text, profile
        assert budget.n_train <= (min(len(s.train) for s in data.stages) if data.stages else len(data.train)), profile
        # every target example shows a new token; plain target text (prompt "") as a set does
        for e in data.target_test:
            assert e.prompt == "" or any(mentions(e.prompt, t, data.whole_word_tokens) for t in data.new_tokens), (
                profile,
                e,
            )
        assert any(
            mentions(e.completion, t, data.whole_word_tokens) for e in data.target_test for t in data.new_tokens
        ) or all(e.prompt for e in data.target_test)
        for text in data.old_text:
            assert not any(mentions(text, t, data.whole_word_tokens) for t in data.new_tokens), (profile, text)


# ---------------------------------------------------------------- arithmetic data


def _pair(prompt: str, operator: str) -> tuple[int, int]:
    a, b = prompt.removesuffix("=").split(operator)
    return int(a), int(b)


def test_arithmetic_data_facts():
    task = load_tasks().get("arithmetic")
    _, budget, params = task.resolved()
    data = task.build(params, char_tokenizer())
    assert data.new_tokens == ["<spec>"]
    assert len(data.target_test) == 300
    assert len(data.train) == 600 and len(data.validation) == 100  # validation: the pool's last 100 pairs
    test_pairs = [_pair(e.prompt, "<spec>") for e in data.target_test]
    train_pairs = [_pair(e.prompt, "<spec>") for e in data.train]
    validation_pairs = [_pair(e.prompt, "<spec>") for e in data.validation]
    assert len(set(test_pairs)) == 300 and len(set(train_pairs)) == 600 and len(set(validation_pairs)) == 100
    assert not set(test_pairs) & set(train_pairs) and not set(validation_pairs) & (set(test_pairs) | set(train_pairs))
    assert set(test_pairs) | set(train_pairs) | set(validation_pairs) == set(MUL_PAIRS)
    for (a, b), e in zip(test_pairs + train_pairs, data.target_test + data.train):
        assert e.completion == str(a * b)
    seen = mul_pairs_seen()
    assert len(seen) == 700
    assert {e.group for e in data.target_test} == {"seen", "unseen"}
    assert [e.group for e in data.target_test] == ["seen" if p in seen else "unseen" for p in test_pairs]
    assert all(e.group is None for e in data.train)
    assert len(data.old_text) == 500 and len(data.old_skill) == 500
    # the split is fixed: same params, same data
    assert task.build(params, char_tokenizer()).fingerprint() == data.fingerprint()
