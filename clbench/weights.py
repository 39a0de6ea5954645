"""A model's weights named by their content: the fingerprint runs record, and builtin bases are checked against."""

from __future__ import annotations

import hashlib

import torch


def fingerprint(model: torch.nn.Module) -> str:
    """sha256 over every tensor of the state dict: names the weights, wherever they came from."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if tensor.is_meta:  # offloaded to cpu/disk by device_map: read it where accelerate keeps it
            tensor = _offloaded(model, name)
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _offloaded(model: torch.nn.Module, name: str) -> torch.Tensor:
    from accelerate.utils import align_module_device

    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner)
    with align_module_device(module, torch.device("cpu")):
        return module.state_dict()[leaf].clone()
