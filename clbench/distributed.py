"""Several processes, one run: data-parallel training, DDP through accelerate or torch FSDP2.

    accelerate launch --multi_gpu --num_processes 8 -m clbench.cli run --task arithmetic --method fft
    accelerate launch --multi_gpu --use_fsdp --num_processes 8 -m clbench.cli run --task arithmetic --method fft
    (no GPU: ACCELERATE_USE_CPU=1 in front, gloo on the CPU; tests/test_distributed.py)

Launched so, every process runs the same command in lockstep: it plans every run, expands the
vocabulary and trains (train() hands model and parameters to DataParallel below; each process takes
its share of every batch), and scores the trained model. Only the main process touches the results
store, writes files and prints; its claim decides for all. A plain `clbench run` is one process:
none of this runs and no Accelerator is created.
"""

from __future__ import annotations

import os
import sys

import torch

from clbench.errors import ClbenchError

WIDTH = 120  # characters: a terminal's width, the longest line clbench prints by default (progress, summaries)


def log(message: str) -> None:
    """A line of progress on stderr; launched as several processes, they all run the same runs: one speaks."""
    if is_main():
        print(message, file=sys.stderr, flush=True)


def log_items(items: list[str], indent: str = "  ") -> None:
    """Items ("target_loss 4.07") on as few lines of at most WIDTH characters as they fill, two spaces apart; an item
    is never split."""
    line = ""
    for item in items:
        if line and len(line) + 2 + len(item) > WIDTH:
            log(line)
            line = ""
        line = f"{line}  {item}" if line else indent + item
    if line:
        log(line)


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
        raise ClbenchError(
            "launched as several processes (WORLD_SIZE > 1) but accelerate joined them in no process group; "
            "on a machine without GPUs set ACCELERATE_USE_CPU=1"
        )
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


def close() -> None:
    """The launched processes leave together: one that exits first tears the process group's
    connections down under the others (seen: SIGABRT in rank 1 after a rerun that trained nothing)."""
    if launched() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def fsdp_requested() -> bool:
    """`accelerate launch --use_fsdp` (or an accelerate config that selects FSDP) sets ACCELERATE_USE_FSDP."""
    from accelerate.utils import parse_flag_from_env

    return parse_flag_from_env("ACCELERATE_USE_FSDP")


class DataParallel:
    """One train() call across the launched processes: the global batch is cut into one shard per
    process, and each process's loss is weighted by its share of the batch's scored tokens, so the
    averaged gradient, the update and the reported loss are those of one process on the whole batch
    (up to the order of floating-point sums).

    Two engines, neither home-made: DDP through accelerate's Accelerator (every process holds the whole
    model and optimizer state), or, with --use_fsdp, torch's FSDP2 (`fully_shard` on each transformer
    block named in the model's `_no_split_modules`, then the root), which shards weights, gradients and
    AdamW state over the processes — FFT of a model whose optimizer state does not fit one GPU. FSDP2
    replaces the model's parameters with sharded ones, so the optimizer is built after this and the
    param groups are rewritten in place (the unsharded originals are then freed); finish() gathers the
    full weights back into every process for scoring."""

    def __init__(self, model, param_groups: list[dict], *, penalty: bool = False):
        self.state = _state()
        self.rank, self.world = self.state.process_index, self.state.num_processes
        self.fsdp = fsdp_requested()
        model_params = {id(p) for p in model.parameters()}
        outside = [p for group in param_groups for p in group["params"] if id(p) not in model_params]
        if self.fsdp:
            if outside or penalty:  # plan() says so per method before anything is written; this is the backstop
                raise ClbenchError(
                    "FSDP replaces the model's weights with shards; this method trains parameters outside "
                    "the model or holds references to the weights for a penalty: launch it without --use_fsdp (DDP)"
                )
            self.wrapped = _fully_shard(model, param_groups, self.state.device)
        else:
            from accelerate import Accelerator
            from accelerate.utils import DistributedType

            accelerator = Accelerator()
            if accelerator.distributed_type not in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU):
                raise ClbenchError(
                    f"accelerate config selects {accelerator.distributed_type.value}; clbench trains "
                    "with DDP or, with --use_fsdp, torch FSDP2: use a plain multi-GPU config"
                )
            # a method's own parameters (ET's new rows, a soft prompt) ride along in one module, so DDP
            # averages their gradients too
            self.wrapped = accelerator.prepare(_WithParameters(model, outside))
        self.params = [p for group in param_groups for p in group["params"]]

    def shards(self, batches):
        for batch in batches:  # plan() checked batch_size >= processes: no shard is empty
            yield batch[self.rank :: self.world]

    def _sum(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.to(self.state.device)
        torch.distributed.all_reduce(tensor)
        return tensor

    def batch_loss(self, loss: torch.Tensor, scored: torch.Tensor) -> float:
        """loss: the mean over this shard's `scored` positions → the mean over the whole batch's, the
        same number in every process (so a non-finite loss stops all of them at once). Remembers this
        shard's weight for backward()."""
        count = scored.sum().float()
        shard_sum = torch.where(count > 0, loss.detach().float() * count, 0.0)  # an empty shard's mean is NaN
        totals = self._sum(torch.stack([shard_sum, count]))
        # DDP and FSDP average gradients over processes: weight each shard's mean by its share of the tokens
        self.weight = count * self.world / totals[1]
        return (totals[0] / totals[1]).item()

    def backward(self, loss: torch.Tensor, penalty: torch.Tensor | None) -> None:
        # reached only when the batch loss is finite: a NaN here is an empty shard's, weighted 0;
        # the penalty (train()'s) is the same in every process, and DDP's average keeps it whole
        weighted = loss.nan_to_num() * self.weight
        (weighted if penalty is None else weighted + penalty).backward()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)  # DTensor-aware: the norm of the whole gradient
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def finish(self, tokens: int) -> int:
        """→ tokens over all processes; under FSDP every process gets the full weights back (for scoring)."""
        if self.fsdp:
            from torch.distributed.fsdp import FSDPModule

            for module in self.wrapped.modules():
                if isinstance(module, FSDPModule):
                    module.set_reshard_after_forward(False)
                    module.unshard()
        return int(self._sum(torch.tensor(tokens)).item())


def _fully_shard(model, param_groups: list[dict], device: torch.device):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    name_of = {id(p): name for name, p in model.named_parameters()}
    if isinstance(model, FSDPModule):  # a later stage of a sequential task: sharded before, unsharded since
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
                module.set_reshard_after_forward(True)
    else:
        mesh = init_device_mesh(device.type, (torch.distributed.get_world_size(),))
        # on GPUs, gather weights in bf16 (the forward autocasts to bf16 anyway), reduce gradients in fp32
        policy = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if device.type == "cuda"
            else MixedPrecisionPolicy()
        )
        blocks = set(getattr(model, "_no_split_modules", None) or ())
        for module in model.modules():
            if type(module).__name__ in blocks:
                fully_shard(module, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    sharded = dict(model.named_parameters())
    for group in param_groups:
        group["params"] = [sharded[name_of[id(p)]] for p in group["params"]]
    return model


class _WithParameters(torch.nn.Module):
    """The model, plus parameters a method trains outside it, as one module for DDP."""

    def __init__(self, model, extra: list[torch.nn.Parameter]):
        super().__init__()
        self.model = model
        self.extra = torch.nn.ParameterList(extra)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)
