"""The one training loop: AdamW, linear warm-up then cosine decay, masked next-token loss.

Used for every method and for building the local arithmetic base model, so a method differs
from another only in which parameters it hands over and how the model computes.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from clbench.data import Encoded, Padded
from clbench.devices import input_device
from clbench.distributed import DataParallel, launched
from clbench.errors import ClbenchError, DivergedError
from clbench.faults import fault_point


@dataclass(frozen=True)
class TrainResult:
    steps: int
    final_loss: float
    tokens_seen: int
    seconds: float
    # per step (loss, lr, grad_norm): the task loss, the lr it stepped with, the gradient norm before clipping
    curve: tuple[tuple[float, float, float], ...] = ()


def autocast(device: torch.device):
    """bf16 compute on CUDA (fp32 parameters stay fp32 masters); plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def epoch_batches(n: int, batch_size: int, steps: int, generator: torch.Generator):
    """Index batches cut from a stream of successive shuffled epochs (each index once per epoch)."""
    order: list[int] = []
    for _ in range(steps):
        if len(order) < batch_size:
            order += torch.randperm(n, generator=generator).tolist() * max(1, math.ceil(batch_size / n))
        batch, order = order[:batch_size], order[batch_size:]
        yield batch


# torch's fused AdamW kernel (one pass over all tensors of a device; 0.11 s instead of the default per-parameter
# loop's 0.85 s a step for SmolLM2-135M on 2 CPU threads, issue 12) exists for floating-point tensors on cpu and cuda
# in every torch clbench supports (>= 2.4), with the default's results up to float rounding (tests/
# test_train_optimizer.py). Parameters spread over several devices (device_map) take it too: it groups them
# by device. So do FSDP2's DTensor shards: DTensor shards the fused op like any pointwise op (the FSDP test
# in tests/test_distributed.py). Meta parameters never reach here (train() refuses them). Any other device
# (mps, xpu, ...) keeps torch's default choice, which clbench has not compared with the fused kernel there.
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def adamw(param_groups: list[dict], lr: float) -> torch.optim.AdamW:
    params = [p for group in param_groups for p in group["params"]]
    fused = all(p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in params)
    # weight decay only where a group asks: decay moves rows whose gradient is zero.
    # fused=None, not False, off the fused devices: False would also turn off foreach, torch's default on cuda
    return torch.optim.AdamW(param_groups, lr=lr, weight_decay=0.0, fused=True if fused else None)


def check_trainable(params: list[torch.Tensor]) -> None:
    """A method's bug, caught before it silently trains nothing: a low-precision or offloaded trainable weight."""
    low = sorted({str(p.dtype).removeprefix("torch.") for p in params if p.dtype != torch.float32})
    if low:
        raise ClbenchError(
            f"trainable parameters must be float32 masters, got {', '.join(low)}: an AdamW step below "
            "2^-8 of a bf16 weight rounds away; keep float32 copies and let autocast compute in bf16"
        )
    if any(p.is_meta for p in params):
        raise ClbenchError(
            "a trainable parameter is offloaded to cpu/disk by device_map; only weights on a device can train"
        )


def train(
    model,
    param_groups: list[dict],
    examples: list[Encoded],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    pad_id: int,
    vocab_limit: int | None = None,
    warmup_frac: float = 0.1,
    max_grad_norm: float = 1.0,
    on_step: Callable[[int, float, float, float], None] | None = None,
    penalty: Callable[[], torch.Tensor] | None = None,
) -> TrainResult:
    """vocab_limit: softmax over the first vocab_limit logits only (p(u|·)=0 for new tokens u).
    penalty: a method's regulariser (Adapter.penalty), added to the loss that is backpropagated and
    clipped at every step; the logged and returned loss stay the task loss alone.
    on_step(step, loss, lr, grad_norm) after each update, with the values TrainResult.curve keeps."""
    params = [p for group in param_groups for p in group["params"]]
    check_trainable(params)
    device = input_device(model)
    # launched as several processes (accelerate launch): DDP or FSDP, each process a shard of every batch;
    # before the optimizer, since FSDP replaces the parameters with sharded ones
    parallel = DataParallel(model, param_groups, penalty=penalty is not None) if launched() else None
    if parallel:
        model = parallel.wrapped
    optimizer = adamw(param_groups, lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(max(1, int(warmup_frac * steps)), steps))
    generator = torch.Generator().manual_seed(seed)
    batches = epoch_batches(len(examples), batch_size, steps, generator)
    model.train()
    tokens = 0
    loss_value = float("nan")
    start = time.perf_counter()
    padded = Padded(examples, pad_id)
    curve = []
    for step, batch in enumerate(parallel.shards(batches) if parallel else batches):
        ids, attention, target_mask = (t.to(device) for t in padded.batch(batch))
        with autocast(device):
            logits = model(input_ids=ids).logits[:, :-1]  # right padding: no mask needed (data.Padded)
            if vocab_limit is not None:
                logits = logits[..., :vocab_limit]
                # a new token as target has probability 0 under this softmax: not scored (as in evaluate)
                target_mask = target_mask & (ids[:, 1:] < vocab_limit)
            loss = F.cross_entropy(logits[target_mask].float(), ids[:, 1:][target_mask])
        loss_value = parallel.batch_loss(loss, target_mask) if parallel else loss.item()
        extra = penalty() if penalty is not None else None  # None: no tensor or sync per step for other methods
        if not math.isfinite(loss_value if extra is None else loss_value + extra.item()):
            raise DivergedError(f"non-finite training loss at step {step}")
        optimizer.zero_grad(set_to_none=True)
        if parallel:
            parallel.backward(loss, extra)
            grad_norm = parallel.clip_grad_norm_(max_grad_norm)
        else:
            if loss.requires_grad:  # not where no trainable parameter reads it (distill, tied: its penalty trains)
                loss.backward()
            if extra is not None and extra.requires_grad:
                # its own pass, after the task's: backpropagated with the loss, every weight's penalty gradient
                # (made first: the penalty sits next to the loss in the graph) waited in autograd's buffers for the
                # task gradient of the same weight, one more copy of the weights (ewc on SmolLM2-135M)
                extra.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        if not torch.isfinite(grad_norm):
            raise DivergedError(f"non-finite gradient norm at step {step}")
        optimizer.step()
        curve.append((loss_value, schedule.get_last_lr()[0], grad_norm.item()))  # the lr this update used
        schedule.step()
        fault_point("train-step")  # crash tests: SIGKILL here, mid-training
        tokens += int(attention.sum())
        if on_step:
            on_step(step, *curve[-1])
    model.eval()
    if parallel:
        tokens = parallel.finish(tokens)
    return TrainResult(steps, loss_value, tokens, time.perf_counter() - start, tuple(curve))
