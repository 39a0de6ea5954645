"""The method protocol and registry.

A method is one file in baselines/ that defines a config dataclass (with `help` metadata on
every field and at least `lr`) and a setup class, and registers them with one call:

    register_method("et", ETConfig, ET, train_vocab="old", description="...", frozen_backbone=True, ...)

The setup, called as ET(model, expansion, config) with the expanded model, is the Adapter: the parameter
groups to optimise and a `finalize()` that returns the model to evaluate (a function returning an Adapter
works too; its hooks are then checked at set-up, a class's at registration). The training loop,
budgets and evaluation are the protocol's (clbench/protocol.py), identical for every method.
What the protocol needs to know of a method beyond that, it reads from the registration's
capability flags (MethodSpec), never from the adapter's attributes; each flag is checked
against the adapter wherever the code can tell.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import clbench.baselines  # the package alone (its __init__ is empty): where methods() finds the method files
from clbench.errors import ClbenchError
from clbench.expand import Expansion
from clbench.registry import Registry


class Adapter(Protocol):
    param_groups: list[dict]  # AdamW groups; each may set its own weight_decay (default 0)

    def finalize(self): ...  # → the model to evaluate, new rows written into it

    # Optional: training_examples(train, replay) -> list[Encoded], declared by reads_old_text=True.
    # The protocol calls it once, after setup and before the first step (the weights as they were
    # before training), and trains on what it returns instead of `train` (replay: the task's
    # replay_text, encoded like plain text). The one hook through which a method sees old text: `replay`
    # rehearses it; `ewc` returns `train` unchanged and estimates its Fisher on `replay`. A hook of
    # its own would hand over the same data at the same moment, so there is one.

    # Optional: penalty() -> Tensor, declared by penalty=True. A scalar train() adds to the loss at
    # every step: backpropagated, clipped with the rest and checked for finiteness with it; the logged
    # and returned training loss stay the task loss alone. `ewc`'s pull toward the old weights; `distill`'s
    # whole objective (no trainable parameter of its tied form reads the task loss).

    # Optional: teacher(readings, pad_id), declared by reads_teacher_text=True. The protocol calls it once per
    # stage, after setup and before the first step, with one clbench.teacher.Reading per training example:
    # the example as train() feeds it, as the base reads it with each new token replaced by what it stands
    # for, and which positions of the two have read the same text. `distill`'s teacher.


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config_cls: type
    setup: Callable[[Any, Expansion, Any], Adapter]
    train_vocab: Literal["old", "full"]  # "old": training softmax over V only (p(u|·) = 0)
    description: str
    # capabilities, declared at registration (register_method checks them against the adapter class,
    # check_adapter against each adapter the protocol sets up):
    reads_old_text: bool = False  # the adapter has the training_examples hook (replay, ewc)
    penalty: bool = False  # the adapter has the penalty hook (ewc)
    trains_rows_outside_model: bool = False  # some trained parameters are not the model's (ET's new rows, pt's prompt)
    # the adapted model's hidden states on text without new tokens are exactly the base's (et, et-dict, et-out;
    # not pt, whose soft prompt precedes every text): its old-text numbers are the base's by construction
    frozen_backbone: bool = False
    reads_teacher_text: bool = False  # the adapter has the teacher hook (distill)
    # False: the control that adds no token (nonew): the run reads the task as the base tokenizer does, its training
    # text with the new tokens written as what they stand for where the task knows it (protocol.base_reading)
    adds_tokens: bool = True

    @property
    def lr_grid(self) -> tuple[float, ...]:
        """The learning rates `clbench tune` tries by default: the `grid` metadata of the lr field."""
        lr = next(f for f in dataclasses.fields(self.config_cls) if f.name == "lr")
        return tuple(lr.metadata.get("grid", ()))

    def config(self, overrides: dict[str, Any] | None = None):
        fields = {f.name: f for f in dataclasses.fields(self.config_cls)}
        overrides = overrides or {}
        for key in overrides:
            if key not in fields:
                raise ClbenchError(f"method {self.name!r} has no option {key!r}; options: {', '.join(fields)}")
        try:
            config = self.config_cls(**{k: _coerce(fields[k], v, self.name) for k, v in overrides.items()})
        except (TypeError, ValueError) as error:
            raise ClbenchError(f"method {self.name!r}: {error}") from None
        if not (isinstance(config.lr, (int, float)) and math.isfinite(config.lr) and config.lr > 0):
            raise ClbenchError(f"method {self.name!r}: lr must be a positive finite number, got {config.lr!r}")
        return config

    def check_hooks(self, adapter) -> None:
        """adapter: an Adapter or its class; the optional hooks it defines must be the ones declared."""
        for flag, hook in HOOKS.items():
            declared, defined = getattr(self, flag), hasattr(adapter, hook)
            if declared and not defined:
                raise ClbenchError(f"method {self.name!r} declares {flag}=True, and its adapter has no {hook}()")
            if defined and not declared:
                raise ClbenchError(f"method {self.name!r}: its adapter defines {hook}(); declare {flag}=True")

    def check_adapter(self, adapter, model) -> None:
        """What can be told of a set-up adapter only: its hooks, and whether it trains parameters outside the model."""
        self.check_hooks(adapter)
        own = {id(p) for p in model.parameters()}
        outside = any(id(p) not in own for group in adapter.param_groups for p in group["params"])
        if outside != self.trains_rows_outside_model:
            raise ClbenchError(
                f"method {self.name!r} declares trains_rows_outside_model={self.trains_rows_outside_model}, "
                f"and its adapter trains {'some' if outside else 'no'} parameters outside the model"
            )


# capability flag → the adapter's hook
HOOKS = {"reads_old_text": "training_examples", "penalty": "penalty", "reads_teacher_text": "teacher"}


def _coerce(field: dataclasses.Field, value: Any, method: str) -> Any:
    kind = type(field.default) if field.default is not dataclasses.MISSING else str
    if isinstance(value, str) and kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            raise ClbenchError(
                f"method {method!r} option {field.name!r} needs a {kind.__name__}, got {value!r}"
            ) from None
    return value


# lr grids for `clbench tune`, half-decade steps, declared on each method's `lr` field
# (metadata "grid"). Wide enough to hold the optimum from a 530k-parameter model to an 8B one:
# full fine-tuning from 1e-6 (large models) to 1e-3 (the small arithmetic base); new rows alone
# sit in an embedding space of norm ~1 and take much larger steps.
NEW_ROWS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
# distilled new rows (distill): the same space one half-decade lower, down to 3e-4, near the reference
# implementation's default 1e-4 (with 100 steps of one snippet per new token)
DISTILLED_ROWS = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
ALL_WEIGHTS = (1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)

METHODS: Registry[MethodSpec] = Registry("method")


def register_method(
    name,
    config_cls,
    setup,
    *,
    train_vocab,
    description,
    reads_old_text=False,
    penalty=False,
    trains_rows_outside_model=False,
    frozen_backbone=False,
    reads_teacher_text=False,
    adds_tokens=True,
) -> MethodSpec:
    if "lr" not in {f.name for f in dataclasses.fields(config_cls)}:
        raise ClbenchError(f"method {name!r}: its config needs an 'lr' field")
    spec = MethodSpec(
        name,
        config_cls,
        setup,
        train_vocab,
        description,
        reads_old_text=reads_old_text,
        penalty=penalty,
        trains_rows_outside_model=trains_rows_outside_model,
        frozen_backbone=frozen_backbone,
        reads_teacher_text=reads_teacher_text,
        adds_tokens=adds_tokens,
    )
    if isinstance(setup, type):  # an adapter class: its hooks are known now; a setup function's at set-up
        spec.check_hooks(setup)
    return METHODS.register(name, spec)


_loaded = False


def methods() -> Registry[MethodSpec]:
    """The registry, after importing every module of baselines/ (each registers itself)."""
    global _loaded
    if not _loaded:
        _loaded = True
        # imported here, not above: each of them imports this module to register itself
        for module in sorted(m.name for m in pkgutil.iter_modules(clbench.baselines.__path__)):
            importlib.import_module(f"clbench.baselines.{module}")
    return METHODS
