"""A run's inputs, spelled once: the `RunSpec`, and the one function that resolves it to the config its id hashes.

    spec = RunSpec.make("arithmetic", "et", seed=0, budget_overrides={"steps": 5})   # what a user asks for
    config, method_config = resolve(spec, task, method, base_ref=..., ...)   # what the run depends on
    run_id(config)                                                     # the id the record is stored under

The CLI, `tune`, `sweep` and the executors make a RunSpec and nothing else; `plan()` resolves it. A
finished run rebuilds from its stored config with `RunSpec.from_config`, which resolves back to that very
config (every param, budget key and method option pinned), so `lm-eval --run`, `explain` and reruns retrain
exactly what was recorded, whatever defaults or profiles say today.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from clbench.errors import ClbenchError

SPLITS = ("test", "validation")


def _frozen(mapping: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((mapping or {}).items()))


@dataclass(frozen=True)
class RunSpec:
    """Everything a run depends on that is not read from a file: the task file, the base weights and the
    data it builds are pinned by version and fingerprints in the resolved config.

    options, params, budget: method options (--set), task-param overrides (--param) and budget overrides
    (--budget), stored as sorted pairs so a spec is immutable and hashable; read them as dicts. tuned: take
    the lr `clbench tune` chose for this spec (--tuned)."""

    task: str
    method: str
    seed: int = 0
    model: str | None = None
    profile: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    init: str | None = None
    n_train: int | None = None
    param_overrides: tuple[tuple[str, Any], ...] = ()
    budget_overrides: tuple[tuple[str, Any], ...] = ()
    split: str = "test"
    tuned: bool = False

    @classmethod
    def make(
        cls,
        task: str,
        method: str,
        *,
        options: Mapping | None = None,
        param_overrides: Mapping | None = None,
        budget_overrides: Mapping | None = None,
        **rest,
    ) -> RunSpec:
        """The one constructor the CLI, tune, sweep and the executors use: mappings in, a frozen spec out."""
        mappings = (options, param_overrides, budget_overrides)
        spec = cls(task, method, **{name: _frozen(m) for name, m in zip(MAPPING_FIELDS, mappings)}, **rest)
        if spec.split not in SPLITS:
            raise ClbenchError(f"unknown split {spec.split!r}; known: {', '.join(SPLITS)}")
        if spec.n_train is not None and spec.n_train < 1:
            raise ClbenchError(f"n_train must be a positive integer, got {spec.n_train}")
        if spec.tuned and "lr" in spec.option_dict:
            raise ClbenchError("the lr is given twice: by an option (lr=...) and by --tuned")
        return spec

    @classmethod
    def from_config(cls, config: Mapping) -> RunSpec:
        """The spec that resolves to exactly this stored config: its params, budget and method options in full."""
        return cls.make(
            config["task"],
            config["method"],
            seed=config["seed"],
            model=config["model"],
            profile=config["profile"],
            options=config["method_config"],
            init=config["init"],
            param_overrides=config["params"],
            budget_overrides=config["budget"],
            split=config.get("split", "test"),
        )

    @property
    def option_dict(self) -> dict:
        return dict(self.options)

    def with_(self, **changes) -> RunSpec:
        """A copy with some inputs changed; mappings for options and overrides."""
        for name in MAPPING_FIELDS:
            if name in changes:
                changes[name] = _frozen(changes[name])
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-ready, as stored beside a record's config; RunSpec.from_dict reads it back."""
        return {**asdict(self), **{name: dict(getattr(self, name)) for name in MAPPING_FIELDS}}

    @classmethod
    def from_dict(cls, stored: Mapping) -> RunSpec:
        return cls.make(**dict(stored))


MAPPING_FIELDS = ("options", "param_overrides", "budget_overrides")


def run_id(config: Mapping) -> str:
    """The id a run is stored under: its resolved config, hashed. The only place a run id is made."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def resolve(
    spec: RunSpec,
    task,
    method,
    *,
    base_ref: str,
    model_fingerprint: str,
    data_fingerprint: str,
    tuned_choice: Callable[[str], dict | None] | None = None,
    teacher: str | None = None,
    settings: tuple | None = None,
) -> tuple[dict, Any]:
    """spec + the loaded base's ref and fingerprint + the task data's fingerprint → (config, method_config).

    Pure but for tuned_choice (ResultStore.tuned, read with spec.tuned). teacher: what a distilling method's teacher reads
    (clbench/teacher.py source), part of its config. settings: task_settings(spec, task), where the caller has it. The config holds everything that
    determines the result, and run_id hashes it: its keys and their order of appearance are those of every
    run ever recorded, so no run id changes."""
    default_model, budget, params = settings or task_settings(spec, task)
    config = {
        "task": task.name,
        "task_version": task.spec.version,
        "profile": spec.profile,
        "params": params.model_dump(),
        "budget": budget.model_dump(),
        "method": method.name,
        "method_config": None,  # below: its lr may depend on everything else
        "train_vocab": method.train_vocab,
        "model": base_ref,
        "init": spec.init or task.spec.init,
        "seed": spec.seed,
        "model_fingerprint": model_fingerprint,
        "data_fingerprint": data_fingerprint,  # the whole task data; `split` says which part is scored
        "split": spec.split,
    }
    if task.spec.allow_unknown_tokens:  # only where set: every other run keeps the run_id it always had
        config["allow_unknown_tokens"] = True
    if teacher is not None:  # only for a method that reads teacher text: every other run keeps its id
        config["teacher"] = teacher
    options = spec.option_dict
    if "lr" not in options:
        lr = chosen_lr(spec, task, method, base_ref == default_model, tune_key(config, options), tuned_choice)
        if lr is not None:
            options["lr"] = lr
    method_config = method.config(options)
    config["method_config"] = asdict(method_config)
    return config, method_config


def task_settings(spec: RunSpec, task) -> tuple:
    """(the task's default model, its budget, its params) for the spec's profile, with its overrides and
    n_train applied, each checked by the task's schemas."""
    default_model, budget, params = task.resolved(
        spec.profile,
        params_override=dict(spec.param_overrides) or None,
        budget_override=dict(spec.budget_overrides) or None,
    )
    if spec.n_train is not None:
        budget = budget.model_copy(update={"n_train": spec.n_train})
    return default_model, budget, params


def tune_key(config: Mapping, options: Mapping) -> str:
    """What a tuned lr is chosen for: the run's whole config but its lr, seed and split (a
    choice holds across seeds and is applied to the test split), and the other method options."""
    key = {k: v for k, v in config.items() if k not in ("seed", "split", "method_config")}
    key["options"] = {k: v for k, v in sorted(options.items()) if k != "lr"}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def chosen_lr(spec: RunSpec, task, method, default_model: bool, key: str, tuned_choice) -> float | None:
    """The lr a run takes when no option sets it: `clbench tune`'s choice in the store (spec.tuned),
    else the task file's for this profile (tuned for its own model only), else None (the method's default)."""
    if spec.tuned:
        choice = tuned_choice(key) if tuned_choice is not None else None
        if choice is None:
            raise ClbenchError(
                f"no tuned lr for {task.name} × {method.name} with this model, profile and budget in the "
                f"results database: run `clbench tune --task {task.name} --method {method.name}` first"
            )
        return choice["lr"]
    shipped = task.lrs(spec.profile)
    if method.name in shipped and default_model:
        return shipped[method.name]
    return None
