"""et-full: only the new rows train, under the full softmax, one row per token where embeddings are tied.

Checked against PEFT's TrainableTokens, trained by the same loop on the same data from the same
rows: the two are independent implementations of the same method and must agree to float rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import TrainableTokensConfig, get_peft_model

from clbench.data import Example, encode_examples, encode_texts
from clbench.evaluate import score
from clbench.expand import expand
from clbench.method import methods
from clbench.train import train

PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 9), (12, 3)]
OLD_TEXT = ["12+3=15", "4*5=20", "99+1=100", "7*8=56", "0+0=0"]
STEPS, LR = 8, 3e-2


def _examples(tokenizer):
    return encode_examples(tokenizer, [Example(f"{a}<spec>{b}=", f"{a * b}<spec>") for a, b in PAIRS], 32)


def _train(model, tokenizer, param_groups):
    return train(
        model, param_groups, _examples(tokenizer), steps=STEPS, batch_size=2, lr=LR, seed=0, pad_id=0
    ).final_loss


def _expanded(tiny, tied):
    model, tokenizer = tiny(tied=tied)
    expansion = expand(model, tokenizer, ["<spec>"], init="random", seed=0)
    return model, tokenizer, expansion


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_et_full_agrees_with_peft_trainable_tokens(tiny, tied):
    model, tokenizer, expansion = _expanded(tiny, tied)
    twin = copy.deepcopy(model)
    spec = methods().get("et-full")
    assert spec.train_vocab == "full"
    adapter = spec.setup(model, expansion, spec.config({"lr": LR}))
    loss = _train(model, tokenizer, adapter.param_groups)
    adapted = adapter.finalize()

    # PEFT's own construction: on a tied model it ties lm_head's trainable tokens to the embedding's
    targets = ["embed_tokens"] if tied else ["embed_tokens", "lm_head"]
    peft_model = get_peft_model(twin, TrainableTokensConfig(target_modules=targets, token_indices=expansion.new_ids))
    peft_params = [p for p in peft_model.parameters() if p.requires_grad]
    assert type(peft_model.base_model.model.lm_head).__name__ == "TrainableTokensLayer"  # tied or its own
    assert len(peft_params) == (1 if tied else 2) == len(adapter.param_groups[0]["params"])
    peft_loss = _train(peft_model, tokenizer, [{"params": peft_params}])
    merged = peft_model.merge_and_unload()

    assert loss == pytest.approx(peft_loss, rel=1e-5)
    for get in ("get_input_embeddings", "get_output_embeddings"):
        ours, theirs = getattr(adapted, get)().weight, getattr(merged, get)().weight
        torch.testing.assert_close(ours[17], theirs[17], rtol=1e-5, atol=1e-6)
        assert torch.equal(ours[:17], theirs[:17])  # old rows: both untouched
    trained = adapted.get_input_embeddings().weight[17]
    assert torch.equal(adapted.get_output_embeddings().weight[17], trained) is tied  # tied: one row in and out


def test_et_full_leaves_old_vocabulary_scores_bit_identical_on_a_tied_model(tiny):
    model, tokenizer, expansion = _expanded(tiny, tied=True)
    base = copy.deepcopy(model)
    initial = model.get_input_embeddings().weight[17].clone()
    spec = methods().get("et-full")
    adapter = spec.setup(model, expansion, spec.config())
    _train(model, tokenizer, adapter.param_groups)
    adapted = adapter.finalize()

    assert (
        adapted.config.tie_word_embeddings
        and adapted.get_output_embeddings().weight is adapted.get_input_embeddings().weight
    )
    assert not torch.equal(adapted.get_input_embeddings().weight[17], initial)  # the new row learned
    for (name, before), after in zip(base.state_dict().items(), adapted.state_dict().values()):
        assert torch.equal(
            after[:17] if after.shape[0] == 18 else after, before[:17] if before.shape[0] == 18 else before
        ), name
    old = encode_texts(tokenizer, OLD_TEXT, 32)
    a, b = (
        score(base, old, old_vocab=17, pad_id=0, batch_size=2),
        score(adapted, old, old_vocab=17, pad_id=0, batch_size=2),
    )
    assert (a.nll_old, a.n_old) == (b.nll_old, b.n_old)  # forgetting_oldvocab exactly 0
    assert b.nll_full > a.nll_full  # the new row takes probability under the full softmax: forgetting_full > 0
