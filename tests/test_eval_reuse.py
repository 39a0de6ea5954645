"""A frozen backbone's evaluation on old text reuses the base's hidden states: same numbers, no forward pass."""

from __future__ import annotations

import dataclasses

import pytest
from test_methods import FROZEN_BACKBONE, tiny_base, tiny_data, tiny_plan

from clbench.method import methods
from clbench.protocol import Session, adapt_and_evaluate
from clbench.taskspec import Budget

TIMING = {
    "train_seconds",
    "tokens_per_second",
    "peak_mem_mb",
    "peak_rss_increase_mb",
}  # measured, not computed: they vary run to run


def evaluate(name: str, tied: bool, *, reuse: bool) -> tuple[dict, int]:
    """→ (metrics, decoder forward passes made on the adapted model)."""
    spec = dataclasses.replace(methods().get(name), frozen_backbone=reuse)
    calls = []

    def setup(model, expansion, config):  # count the adapted model's decoder passes
        model.get_decoder().register_forward_pre_hook(lambda module, args: calls.append(1))
        return methods().get(name).setup(model, expansion, config)

    budget = Budget(n_train=6, steps=3, batch_size=4, eval_batch_size=2)
    values = adapt_and_evaluate(
        tiny_plan(tiny_base(tied), tiny_data(), spec.config(), budget),
        method=dataclasses.replace(spec, setup=setup),
        session=Session(),
    ).values
    return values, len(calls)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", sorted(FROZEN_BACKBONE))
def test_reusing_the_bases_old_text_positions_changes_no_metric(name, tied):
    fresh, fresh_calls = evaluate(name, tied, reuse=False)
    reused, reused_calls = evaluate(name, tied, reuse=True)
    assert {k: v for k, v in reused.items() if k not in TIMING} == {k: v for k, v in fresh.items() if k not in TIMING}
    # 3 old texts at eval batch 2: two decoder passes the reuse skips (training and targets run as before)
    assert fresh_calls - reused_calls == 2
