"""train()'s AdamW: torch's fused kernel where it exists, with the default implementation's results.

python -m pytest -q tests/test_train_optimizer.py
"""

import copy

import pytest
import torch

import clbench.train
from clbench.data import encode_examples
from clbench.testing import tiny_base, tiny_data
from clbench.train import adamw, train


def trained(model, tokenizer, monkeypatch, *, fused: bool):
    if not fused:  # no device takes the fused kernel: torch's default, the per-parameter loop on cpu
        monkeypatch.setattr(clbench.train, "FUSED_ADAMW_DEVICES", ())
    losses = []
    result = train(
        model,
        [{"params": list(model.parameters())}],
        encode_examples(tokenizer, tiny_data().train, 32),
        steps=12,
        batch_size=4,
        lr=1e-2,
        seed=0,
        pad_id=tokenizer.pad_token_id,
        on_step=lambda step, loss, lr, grad_norm: losses.append(loss),
    )
    monkeypatch.undo()
    return result, losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def test_fused_adamw_trains_as_the_default_implementation_up_to_float_rounding(monkeypatch):
    base = tiny_base(tied=False)
    default, default_losses, default_weights = trained(
        copy.deepcopy(base.model), base.tokenizer, monkeypatch, fused=False
    )
    fused, fused_losses, fused_weights = trained(copy.deepcopy(base.model), base.tokenizer, monkeypatch, fused=True)

    assert fused.steps == default.steps == 12 and fused.tokens_seen == default.tokens_seen
    # measured: after 12 steps at lr 1e-2, 2414 of the 3152 weights differ in their last bits, by at most
    # 1.2e-7 (the largest moved 0.07); 2 of the 12 losses by 2.4e-7 (1 float32 ulp at ~2.6) — the same
    # training up to the order of float operations, not a different optimizer
    assert fused_losses[0] == default_losses[0]  # before any update
    assert fused_losses == pytest.approx(default_losses, rel=0, abs=1e-6)
    assert fused_weights.keys() == default_weights.keys()
    moved = 0.0
    for name, weight in fused_weights.items():
        torch.testing.assert_close(weight, default_weights[name], rtol=0, atol=1e-6)
        moved = max(moved, (weight - base.model.state_dict()[name]).abs().max().item())
    assert moved > 0.05  # the weights did move: the comparison is not one of untouched copies
    assert not all(torch.equal(w, default_weights[n]) for n, w in fused_weights.items())  # two kernels did run


def test_fused_where_torch_has_the_kernel_and_torchs_default_elsewhere():
    on_cpu = torch.nn.Parameter(torch.zeros(3))
    on_meta = torch.nn.Parameter(torch.zeros(3, device="meta"))
    assert adamw([{"params": [on_cpu]}], 1e-3).defaults["fused"] is True
    # one parameter off the fused devices and none takes it: torch's own choice (None), not fused=False,
    # which would also turn off the foreach kernel torch picks on cuda
    mixed = adamw([{"params": [on_cpu]}, {"params": [on_meta], "weight_decay": 0.1}], 1e-3)
    assert mixed.defaults["fused"] is None and mixed.defaults["foreach"] is None
    assert [group["weight_decay"] for group in mixed.param_groups] == [0.0, 0.1]  # a group's own decay stays
