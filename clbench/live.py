"""Live training curves (`clbench run --log trackio|wandb`): each run a tracker run, named by its run_id
and configured with its config, every step's loss, lr and gradient norm logged as it comes, the run's
metrics at its end. The package is imported only when asked and is no dependency of clbench; both
share the calls used here (init(project=, name=, config=), log(dict, step=), finish()).
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass

from clbench.errors import ClbenchError

TRACKERS = ("trackio", "wandb")
PROJECT = "clbench"


def live_log(name: str) -> LiveLog:
    """The tracker, imported now: a missing package fails before any run trains."""
    if name not in TRACKERS:
        raise ClbenchError(f"unknown --log {name!r}; known: {', '.join(TRACKERS)}")
    try:
        return LiveLog(importlib.import_module(name))
    except ImportError:
        raise ClbenchError(f"--log {name}: the package {name} is not installed (pip install {name})") from None


@dataclass(frozen=True)
class LiveLog:
    module: object

    @contextmanager
    def run(self, run_id: str, config: dict):
        self.module.init(project=PROJECT, name=run_id, config=config)
        try:
            yield LiveRun(self.module)
        finally:
            self.module.finish()


@dataclass(frozen=True)
class LiveRun:
    module: object

    def step(self, step: int, loss: float, lr: float, grad_norm: float) -> None:
        self.module.log({"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm}, step=step)

    def result(self, values: dict[str, float]) -> None:
        self.module.log({f"result/{k}": v for k, v in sorted(values.items())})
