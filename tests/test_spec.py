"""The run specification: one spelling of a run's inputs, and run ids that never change."""

import dataclasses
import json
from pathlib import Path

import duckdb
import pytest

from clbench.errors import ClbenchError
from clbench.method import methods
from clbench.spec import RunSpec, resolve, run_id
from clbench.taskspec import load_tasks

PUBLISHED = sorted((Path(__file__).parent.parent / "leaderboard").rglob("results.duckdb"))


def stored_runs(path: Path) -> list[tuple[str, dict]]:
    with duckdb.connect(str(path), read_only=True) as db:
        return [(rid, json.loads(config)) for rid, config in db.execute("SELECT run_id, config FROM runs").fetchall()]


def test_published_databases_are_found():
    # the rehash test below must not pass by finding nothing
    assert len(PUBLISHED) >= 2 and all(len(stored_runs(p)) > 0 for p in PUBLISHED)


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: str(p.parent.relative_to(p.parents[2])))
def test_every_published_run_rehashes_to_its_own_id_through_the_spec(path):
    """A stored config → RunSpec.from_config → resolve() (the very function plan() calls) gives back the
    stored config, and so the run's id: no published run of the task's current version changes id."""
    tasks, registry = load_tasks(), methods()
    runs = stored_runs(path)
    for stored_id, config in runs:
        spec = RunSpec.from_config(config)
        rebuilt, _ = resolve(
            spec,
            tasks.get(spec.task),
            registry.get(spec.method),
            base_ref=config["model"],
            model_fingerprint=config["model_fingerprint"],
            data_fingerprint=config["data_fingerprint"],
            teacher=config.get("teacher"),
        )
        assert run_id(config) == stored_id
        # a run of an earlier version of its task (the content rule's version 2 came after the published version 1
        # databases) rebuilds exactly but for that version: nothing else of its config moved
        current = tasks.get(spec.task).spec.version
        assert rebuilt == {**config, "task_version": current}, stored_id
        if config["task_version"] == current:
            assert run_id(rebuilt) == stored_id


def test_run_id_is_the_hash_of_the_key_sorted_config():
    # pinned values (sha256 of the key-sorted JSON, first 16 hex digits): key order does not matter
    assert run_id({"b": 1, "a": [1.5, None]}) == run_id({"a": [1.5, None], "b": 1}) == "ad3879169fd83895"
    assert run_id({"a": 1}) == "f9d86028c6e0d64e"


def test_spec_is_frozen_and_round_trips():
    spec = RunSpec.make(
        "arithmetic", "et", seed=2, options={"lr": 0.01}, budget_overrides={"steps": 5}, param_overrides={"n_test": 9}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.seed = 3
    assert hash(spec) == hash(RunSpec.from_dict(json.loads(json.dumps(spec.to_dict()))))
    assert RunSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["budget_overrides"] == {"steps": 5}
    assert spec.with_(seed=3, budget_overrides={"steps": 6}).budget_overrides == (("steps", 6),)


@pytest.mark.parametrize(
    "how, message",
    [
        ({"split": "train"}, "unknown split 'train'; known: test, validation"),
        ({"n_train": 0}, "n_train must be a positive integer, got 0"),
        ({"tuned": True, "options": {"lr": 0.1}}, r"the lr is given twice: by an option \(lr=...\) and by --tuned"),
    ],
)
def test_bad_specs_are_refused_in_one_line(how, message):
    with pytest.raises(ClbenchError, match=f"^{message}$"):
        RunSpec.make("arithmetic", "et", **how)
