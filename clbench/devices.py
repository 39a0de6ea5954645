"""Which device: a --device name resolved, and where a model's inputs go."""

from __future__ import annotations

import torch

from clbench.errors import ClbenchError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ClbenchError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ClbenchError(f"device {name!r} asked for, but torch sees no CUDA GPU")
    return torch.device(name)


def input_device(model) -> torch.device:
    """Where a model's inputs go: its input embedding's device. A model placed with device_map spans
    several devices, and its first parameter need not be the embedding."""
    return model.get_input_embeddings().weight.device
