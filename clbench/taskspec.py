"""Task files: one YAML per task in tasks/, checked by a strict schema.

A task file names a generator hook (`generator: arithmetic.py:build`, a path relative to the
file) whose module also defines `Params`, a pydantic model with extra="forbid": the file's
`params:` are validated by it, so a typo anywhere in a task file is an error, never a default.
A published task changes by a new file with a higher `version`, not by an edit.

A task file may start from another with `include: other.yaml` (a path relative to the file;
the included file may include further). The including file's fields are laid over the included
ones: where both hold a mapping (budget, params, profiles, a profile, its budget or params) the
two merge key by key, recursively; any other value (a string, a number, a list, null) replaces
the inherited one whole. A file cannot remove an inherited key. `include` itself is not a field
of the result, and the merged mapping is checked by the same strict schema as a plain file
(`generator` is still relative to the task file that is loaded). A file whose name starts with
`_` (tasks/_xling.yaml) is only for including: it is not a task, and need not be a complete one.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError

from clbench.data import TaskData
from clbench.errors import ClbenchError
from clbench.expand import INIT_STRATEGIES
from clbench.metrics import METRICS, Metric, declared_by
from clbench.registry import Registry, did_you_mean


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(Strict):
    n_train: PositiveInt = Field(
        description="training examples used: the first `n_train` of the generator's `train` pool (`--n-train` "
        "overrides)"
    )
    steps: PositiveInt = Field(description="optimizer steps, the same for every method")
    batch_size: PositiveInt = Field(description="training batch size")
    eval_batch_size: PositiveInt = Field(64, description="scoring batch size")


class Profile(Strict):
    model: str | None = Field(None, description="replaces the task's `model`")
    budget: dict[str, int] = Field(
        default_factory=dict, description="budget keys merged over the task's `budget`, then checked again"
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="merged over the task's `params`, top-level key by top-level key, then validated by `Params`",
    )
    lr: dict[str, PositiveFloat] = Field(
        default_factory=dict, description="method → learning rate for this profile, chosen by `clbench tune`"
    )


class TaskSpec(Strict):
    name: str = Field(
        pattern=r"^[a-z][a-z0-9-]*$",
        description="the task's name; must equal the file name (`my-task.yaml`) and be unique across all task folders",
    )
    version: PositiveInt = Field(description="a published task changes by a new version, not an edit")
    description: str = Field(description="one line, shown by `clbench ls tasks`")
    generator: str = Field(
        pattern=r"^[\w./-]+\.py:\w+$", description="the generator hook, `file.py:function`, relative to the task file"
    )
    model: str = Field(
        description="default base model: `builtin:NAME` (`builtin:arith-llama`, `builtin:smollm2-135m`), a local "
        "path or a Hugging Face id (`--model` overrides)"
    )
    init: str = Field(
        "random",
        description=f"how the new rows are initialised, one of {', '.join(f'`{i}`' for i in INIT_STRATEGIES)} "
        "([protocol.md](protocol.md), step 3; `--init` overrides)",
    )
    budget: Budget = Field(description="the training budget, the same for every method (`Budget`, below)")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the generator's parameters, validated by its `Params` model"
    )
    profiles: dict[str, Profile] = Field(
        default_factory=dict,
        description="named alternatives chosen with `--profile NAME`, e.g. `paper` (`Profile`, below)",
    )
    lr: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="method → learning rate on the default model and budget, chosen by `clbench tune` on validation data",
    )
    tune_metric: str = Field(
        "target_loss", description="what `clbench tune` minimises on the validation split (a lower-is-better metric)"
    )
    allow_unknown_tokens: bool = Field(
        False,
        description="accept text the base tokenizer reads as its unknown token (otherwise an error before any run); "
        "recorded in each run's config",
    )


@dataclass(frozen=True)
class Task:
    spec: TaskSpec
    path: Path

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def _hook(self) -> tuple[type[BaseModel], Callable[..., TaskData], list[Metric]]:
        file, function = self.spec.generator.split(":")
        module_path = (self.path.parent / file).resolve()
        if not module_path.is_file():
            raise ClbenchError(f"task {self.name!r}: generator file {module_path} does not exist")
        loader = importlib.util.spec_from_file_location(f"clbench_task_{self.name.replace('-', '_')}", module_path)
        module = importlib.util.module_from_spec(loader)
        with declared_by(module_path) as own:
            loader.loader.exec_module(module)
        if not hasattr(module, function) or not hasattr(module, "Params"):
            raise ClbenchError(f"task {self.name!r}: {file} must define Params and {function}()")
        return module.Params, getattr(module, function), own

    @property
    def metrics(self) -> list[Metric]:
        """The metrics the task's generator module declares itself (clbench.metrics.register_metric)."""
        return self._hook[2]

    def resolved(
        self, profile: str | None = None, *, params_override: dict | None = None, budget_override: dict | None = None
    ) -> tuple[str, Budget, BaseModel]:
        """→ (model, budget, params) for the default or a named profile, with a command line's
        overrides (--param, --budget) applied last and checked by the same schemas."""
        model, budget, params = self.spec.model, self.spec.budget, dict(self.spec.params)
        if profile is not None:
            if profile not in self.spec.profiles:
                known = ", ".join(self.spec.profiles) or "none"
                raise ClbenchError(f"task {self.name!r} has no profile {profile!r} (profiles: {known})")
            chosen = self.spec.profiles[profile]
            model = chosen.model or model
            budget = _validate(
                Budget, {**budget.model_dump(), **chosen.budget}, f"task {self.name!r} profile {profile!r} budget"
            )
            params.update(chosen.params)
        params_cls, _, _ = self._hook
        if budget_override:
            _known_keys(Budget, budget_override, f"task {self.name!r} has no budget key")
            budget = _validate(Budget, {**budget.model_dump(), **budget_override}, f"task {self.name!r} --budget")
        if params_override:
            _known_keys(params_cls, params_override, f"task {self.name!r} has no param")
            params.update(params_override)
        return model, budget, _validate(params_cls, params, f"task {self.name!r} params")

    def lrs(self, profile: str | None = None) -> dict[str, float]:
        """method → the learning rate this task's file ships for the profile (tuned on validation data)."""
        return dict(self.spec.profiles[profile].lr if profile is not None else self.spec.lr)

    def build(self, params: BaseModel, tokenizer) -> TaskData:
        _, generate, _ = self._hook
        try:
            data = generate(params, tokenizer)
        except (OSError, UnicodeDecodeError) as error:  # a generator's data file missing, unreadable or not UTF-8
            raise ClbenchError(f"task {self.name!r}: cannot read its data: {error}") from None
        if not data.train or not data.target_test or not data.old_text:
            raise ClbenchError(f"task {self.name!r}: the generator produced an empty train, target or old-text set")
        data.check(self.name)
        return data


def _known_keys(model_cls: type[BaseModel], overrides: dict, what: str) -> None:
    known = list(model_cls.model_fields)
    for key in overrides:
        if key not in known:
            raise ClbenchError(f"{what} {key!r}{did_you_mean(key, known)}; known: {', '.join(known)}")


def _validate(model_cls: type[BaseModel], value: Any, where: str):
    try:
        return model_cls.model_validate(value)
    except ValidationError as error:
        # a mistyped key is two errors, the real key missing and the typo extra: the typo, with its hint, explains both
        errors = [(e, "") for e in error.errors()]
        hinted = [
            (e, hint)
            for e, _ in errors
            if e["type"] == "extra_forbidden" and (hint := _near_miss(model_cls, value, e["loc"]))
        ]
        first, hint = (hinted or errors)[0]
        location = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ClbenchError(f"{where}: {location}: {first['msg']}{hint}") from None


def _near_miss(model_cls: type[BaseModel], value: Any, loc: tuple) -> str:
    """did_you_mean for the extra key at loc among the schema's keys there that the mapping lacks (through
    nested models and mappings of them): a key given as well as the typo is not what the typo misspells."""
    kind = model_cls
    for part in loc[:-1]:
        value = value.get(part) if isinstance(value, dict) else None
        if isinstance(kind, type) and issubclass(kind, BaseModel) and part in kind.model_fields:
            kind = kind.model_fields[part].annotation
        elif typing.get_origin(kind) is dict:
            kind = typing.get_args(kind)[1]
        else:
            return ""
    if not (isinstance(kind, type) and issubclass(kind, BaseModel) and isinstance(value, dict)):
        return ""
    return did_you_mean(str(loc[-1]), [key for key in kind.model_fields if key not in value])


def _read_mapping(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ClbenchError(f"cannot read task file {path}: {error}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ClbenchError(f"task file {path} is not valid YAML{where}") from None
    if not isinstance(raw, dict):
        raise ClbenchError(f"task file {path} must hold a mapping of fields")
    return raw


def merge(inherited: dict, own: dict) -> dict:
    """own laid over inherited: mappings on both sides merge key by key, anything else in own replaces."""
    merged = dict(inherited)
    for key, value in own.items():
        both = isinstance(value, dict) and isinstance(inherited.get(key), dict)
        merged[key] = merge(inherited[key], value) if both else value
    return merged


def read_with_includes(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The file's fields with its `include:` chain resolved (see the module docstring)."""
    if path.resolve() in [p.resolve() for p in chain]:
        raise ClbenchError(f"task file {chain[0].name}: include cycle {' → '.join(p.name for p in (*chain, path))}")
    raw = _read_mapping(path)
    included = raw.pop("include", None)
    if included is None:
        return raw
    if not isinstance(included, str):
        raise ClbenchError(f"task file {path.name}: include must name one file, got {included!r}")
    target = path.parent / included
    if not target.is_file():
        raise ClbenchError(f"task file {path.name}: included file {target} does not exist")
    return merge(read_with_includes(target, (*chain, path)), raw)


def load_task_file(path: Path) -> Task:
    spec = _validate(TaskSpec, read_with_includes(path), f"task file {path.name}")
    if spec.init not in INIT_STRATEGIES:
        raise ClbenchError(f"task file {path.name}: init {spec.init!r} is not one of {', '.join(INIT_STRATEGIES)}")
    if path.stem != spec.name:
        raise ClbenchError(f"task file {path.name}: the file name must be the task name ({spec.name}.yaml)")
    if spec.tune_metric not in METRICS or METRICS.get(spec.tune_metric).higher_is_better:
        raise ClbenchError(
            f"task file {path.name}: tune_metric {spec.tune_metric!r} is not a declared lower-is-better metric"
        )
    return Task(spec, path)


def builtin_task_dir() -> Path:
    return Path(str(importlib.resources.files("clbench.tasks")))


def task_files(directory: Path) -> list[Path]:
    """The folder's task files: every *.yaml but the `_` ones, which are only for including."""
    return sorted(p for p in directory.glob("*.yaml") if not p.name.startswith("_"))


def load_tasks(extra_dirs: list[Path] = ()) -> Registry[Task]:
    registry: Registry[Task] = Registry("task")
    for directory in [builtin_task_dir(), *extra_dirs]:
        if not directory.is_dir():
            raise ClbenchError(f"task folder {directory} does not exist or is not a folder")
        for path in task_files(directory):
            task = load_task_file(path)
            registry.register(task.name, task)
    return registry
