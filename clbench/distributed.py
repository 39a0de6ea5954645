"""Several processes, one run: data-parallel training through accelerate.

    accelerate launch --multi_gpu --num_processes 2 -m clbench.cli run --task arithmetic --method fft
    (no GPU: ACCELERATE_USE_CPU=1 in front, gloo on the CPU; tests/test_distributed.py)

Launched so, every process runs the same command in lockstep: it plans every run, expands the
vocabulary and trains (train() wraps model and optimizer in accelerate's Accelerator, DDP; each
process takes its share of every batch), and scores the trained model. Only the main process
touches the results store, writes files and prints; its claim decides for all. A plain
`clbench run` is one process: none of this runs and no Accelerator is created.
"""

from __future__ import annotations

import os

import torch

from clbench.errors import ClbenchError


def launched() -> bool:
    """Started as one of several processes (accelerate launch / torchrun set WORLD_SIZE)."""
    return processes() > 1


def processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _state():
    from accelerate import PartialState
    from accelerate.utils import parse_flag_from_env

    # joins the process group; accelerate's Accelerator reads ACCELERATE_USE_CPU itself, PartialState does not
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    if state.num_processes < 2:
        raise ClbenchError("launched as several processes (WORLD_SIZE > 1) but accelerate joined them in no process group; "
                           "on a machine without GPUs set ACCELERATE_USE_CPU=1")
    return state


def device() -> torch.device:
    """This process's device: its own GPU (LOCAL_RANK), or the CPU with ACCELERATE_USE_CPU=1."""
    return _state().device


def main_decides(decide):
    """decide() on the main process; every process gets its (picklable) answer."""
    if not launched():
        return decide()
    from accelerate.utils import broadcast_object_list

    _state()
    answer = [decide() if is_main() else None]
    return broadcast_object_list(answer)[0]


class DataParallel:
    """accelerate's Accelerator around one train() call: the global batch is cut into one shard per
    process, and each process's loss is weighted by its share of the batch's scored tokens, so the
    averaged gradient, the update and the reported loss are those of one process on the whole batch
    (up to the order of floating-point sums)."""

    def __init__(self, model, optimizer, params: list[torch.nn.Parameter]):
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        self.accelerator = Accelerator()
        if self.accelerator.distributed_type not in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU):
            raise ClbenchError(f"accelerate config selects {self.accelerator.distributed_type.value}; clbench trains "
                               "with DDP only (it scores the trained model unsharded): use a plain multi-GPU config")
        model_params = {id(p) for p in model.parameters()}
        # a method's own parameters (ET's new rows, a soft prompt) ride along in one module, so DDP
        # averages their gradients too
        self.wrapped, self.optimizer = self.accelerator.prepare(
            _WithParameters(model, [p for p in params if id(p) not in model_params]), optimizer)
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes

    def shards(self, batches):
        for batch in batches:  # plan() checked batch_size >= processes: no shard is empty
            yield batch[self.rank :: self.world]

    def batch_loss(self, loss: torch.Tensor, scored: torch.Tensor) -> float:
        """loss: the mean over this shard's `scored` positions → the mean over the whole batch's, the
        same number in every process (so a non-finite loss stops all of them at once). Remembers this
        shard's weight for backward()."""
        count = scored.sum().float()
        shard_sum = torch.where(count > 0, loss.detach().float() * count, 0.0)  # an empty shard's mean is NaN
        totals = self.accelerator.reduce(torch.stack([shard_sum, count]), reduction="sum")
        # DDP averages gradients over processes: weight each shard's mean by its share of the tokens
        self.weight = count * self.world / totals[1]
        return (totals[0] / totals[1]).item()

    def backward(self, loss: torch.Tensor, penalty: torch.Tensor) -> None:
        # reached only when the batch loss is finite: a NaN here is an empty shard's, weighted 0;
        # the penalty (train()'s) is the same in every process, and DDP's average keeps it whole
        self.accelerator.backward(loss.nan_to_num() * self.weight + penalty)

    def clip_grad_norm_(self, params, max_norm: float) -> torch.Tensor:
        return self.accelerator.clip_grad_norm_(params, max_norm)

    def total(self, value: int) -> int:
        return int(self.accelerator.reduce(torch.tensor(value, device=self.accelerator.device), reduction="sum"))


class _WithParameters(torch.nn.Module):
    """The model, plus parameters a method trains outside it, as one module for DDP."""

    def __init__(self, model, extra: list[torch.nn.Parameter]):
        super().__init__()
        self.model = model
        self.extra = torch.nn.ParameterList(extra)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)
