"""Evaluation without repeated work: a frozen backbone's scores on old text and on the oracle text reuse
the base's hidden states, and the at-init target scores are made once per (base, data, init, seed):
the same numbers, fewer forward passes."""

from __future__ import annotations

import dataclasses

import pytest
from test_methods import FROZEN_BACKBONE

from clbench.data import Example
from clbench.method import methods
from clbench.protocol import adapt_and_evaluate
from clbench.session import Session
from clbench.taskspec import Budget
from clbench.testing import NOT_REPRODUCIBLE, tiny_base, tiny_data, tiny_plan


def with_oracle():
    """tiny_data with each `<spec>` read as what it stands for, `*` (in the training examples too: distill's teacher)."""
    data = tiny_data()
    oracle = lambda examples: [Example(e.prompt.replace("<spec>", "*"), e.completion, e.group) for e in examples]
    return dataclasses.replace(data, target_oracle=oracle(data.target_test), train_oracle=oracle(data.train))


def evaluate(name: str, tied: bool, *, reuse: bool, data=None, session=None) -> tuple[dict, int]:
    """→ (metrics, decoder forward passes made on the adapted model)."""
    spec = dataclasses.replace(methods().get(name), frozen_backbone=reuse)
    calls = []

    def setup(model, expansion, config):  # count the adapted model's decoder passes
        model.get_decoder().register_forward_pre_hook(lambda module, args: calls.append(1))
        return methods().get(name).setup(model, expansion, config)

    budget = Budget(n_train=6, steps=3, batch_size=4, eval_batch_size=2)
    values = adapt_and_evaluate(
        tiny_plan(tiny_base(tied), data or tiny_data(), dataclasses.replace(spec, setup=setup), budget),
        session=session or Session(),
    ).values
    return values, len(calls)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", sorted(FROZEN_BACKBONE))
def test_reusing_the_bases_old_text_positions_changes_no_metric(name, tied):
    fresh, fresh_calls = evaluate(name, tied, reuse=False)
    reused, reused_calls = evaluate(name, tied, reuse=True)
    assert {k: v for k, v in reused.items() if k not in NOT_REPRODUCIBLE} == {
        k: v for k, v in fresh.items() if k not in NOT_REPRODUCIBLE
    }
    # 3 old texts at eval batch 2: two decoder passes the reuse skips (training and targets run as before)
    assert fresh_calls - reused_calls == 2


@pytest.mark.parametrize("name", sorted(FROZEN_BACKBONE))
def test_reusing_the_bases_oracle_positions_changes_no_metric(name):
    fresh, fresh_calls = evaluate(name, True, reuse=False, data=with_oracle())
    reused, reused_calls = evaluate(name, True, reuse=True, data=with_oracle())
    assert "target_loss_oracle_adapted" in fresh
    assert {k: v for k, v in reused.items() if k not in NOT_REPRODUCIBLE} == {
        k: v for k, v in fresh.items() if k not in NOT_REPRODUCIBLE
    }
    # two passes each over 3 old texts and 3 oracle prompts at eval batch 2
    assert fresh_calls - reused_calls == 4


def test_the_at_init_scores_are_made_once_per_seed_and_shared_by_methods():
    session = Session()
    shared = {name: evaluate(name, True, reuse=True, session=session)[0] for name in ("et", "fft", "lora")}
    alone = {name: evaluate(name, True, reuse=True)[0] for name in ("et", "fft", "lora")}
    assert len(session.init_scores) == 1
    for name in shared:
        assert {k: v for k, v in shared[name].items() if k not in NOT_REPRODUCIBLE} == {
            k: v for k, v in alone[name].items() if k not in NOT_REPRODUCIBLE
        }


def test_the_oracle_text_is_encoded_once_per_base_and_data():
    session = Session()
    for name in ("et", "fft"):
        evaluate(name, True, reuse=True, data=with_oracle(), session=session)
    assert len(session.oracle_encodings) == 1
    ((_, first),) = session.oracle_encodings.items()
    assert session.oracle_encoded(tiny_base(True), with_oracle()) is first  # the same base and data, reloaded
    assert len(first) == len(with_oracle().target_oracle)
