"""The core claim: ET leaves every old weight, and so every old-vocabulary score, bit-identical.

Also FFT's contrast (everything trains, old weights move) and the vocabulary expansion itself.
"""

from __future__ import annotations

import copy

import pytest
import torch

from clbench.arith import char_tokenizer
from clbench.data import Example, encode_examples, encode_texts
from clbench.errors import ClbenchError
from clbench.evaluate import score
from clbench.expand import expand
from clbench.method import methods
from clbench.testing import HIDDEN
from clbench.train import train

PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 9), (12, 3)]
OLD_TEXT = ["12+3=15", "4*5=20", "99+1=100", "7*8=56", "0+0=0"]


def _tensors(model) -> dict[str, torch.Tensor]:
    """Every parameter (tied ones under each name) and buffer, detached copies."""
    named = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    return {name: t.detach().clone() for name, t in named.items()}


def _adapt(model, tokenizer, method: str, *, steps: int = 5):
    expansion = expand(model, tokenizer, ["<spec>"], init="random", seed=0)
    spec = methods().get(method)
    config = spec.config()
    after_expand = _tensors(model)
    adapter = spec.setup(model, expansion, config)
    examples = encode_examples(tokenizer, [Example(f"{a}<spec>{b}=", str(a * b)) for a, b in PAIRS], 32)
    assert all(expansion.new_ids[0] in e.ids for e in examples)
    result = train(
        model,
        adapter.param_groups,
        examples,
        steps=steps,
        batch_size=2,
        lr=config.lr,
        seed=0,
        pad_id=tokenizer.pad_token_id,
        vocab_limit=expansion.old_vocab if spec.train_vocab == "old" else None,
    )
    assert result.steps == steps
    return expansion, adapter, after_expand, adapter.finalize()


EMBEDDINGS = ("model.embed_tokens.weight", "lm_head.weight")


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_et_touches_only_the_new_rows(tiny, tied):
    model, tokenizer = tiny(tied=tied)
    original = copy.deepcopy(model)
    before = _tensors(model)
    assert ("lm_head.weight" in before) is True  # listed under both names when tied
    expansion, adapter, after_expand, adapted = _adapt(model, tokenizer, "et")

    assert expansion.old_vocab == 17 and expansion.new_ids == [17] and expansion.tied is tied
    assert adapted is model
    after = _tensors(adapted)
    assert set(after) == set(before)
    for name, old in before.items():
        new = after[name]
        if name in EMBEDDINGS:
            assert new.shape == (18, HIDDEN), name
            assert torch.equal(new[:17], old), name
        else:
            assert torch.equal(new, old), name

    # the new input row trained; with untied embeddings the new output row is never touched
    embed = adapted.get_input_embeddings().weight
    assert not torch.equal(embed[17], after_expand["model.embed_tokens.weight"][17])
    if tied:
        assert adapted.get_output_embeddings().weight.data_ptr() == embed.data_ptr()
    else:
        assert torch.equal(adapted.lm_head.weight[17], after_expand["lm_head.weight"][17])

    # only n_new × hidden numbers were handed to the optimizer, and nothing of the model trains
    trainable = sum(p.numel() for group in adapter.param_groups for p in group["params"])
    assert trainable == len(expansion.new_ids) * HIDDEN == 16
    assert not any(p.requires_grad for p in adapted.parameters())

    # the hook is gone: the model's own embedding now carries the learned row
    ids = torch.tensor([[1, 17]])
    assert torch.equal(adapted.get_input_embeddings()(ids)[0, 1], embed[17])
    assert len(adapted.get_input_embeddings()._forward_hooks) == 0

    # old-vocabulary scores on old text: bit-identical to the original, unexpanded model
    old = encode_texts(char_tokenizer(), OLD_TEXT, 32)
    base_scores = score(original, old, old_vocab=17, pad_id=0, batch_size=2)
    adapted_scores = score(adapted, old, old_vocab=17, pad_id=0, batch_size=2)
    assert adapted_scores.nll_old == base_scores.nll_old
    assert adapted_scores.n_old == base_scores.n_old == sum(len(t) + 1 for t in OLD_TEXT)
    assert torch.equal(adapted_scores.hits_old, base_scores.hits_old)
    # the base has no new tokens: its full softmax is its old one
    assert base_scores.nll_full == base_scores.nll_old
    # the adapted full softmax gives the new token some mass: strictly worse on old text
    assert adapted_scores.nll_full > adapted_scores.nll_old


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_fft_trains_everything(tiny, tied):
    model, tokenizer = tiny(tied=tied)
    before = _tensors(model)
    expansion, adapter, after_expand, adapted = _adapt(model, tokenizer, "fft")
    trainable = sum(p.numel() for group in adapter.param_groups for p in group["params"])
    assert trainable == sum(p.numel() for p in adapted.parameters())
    # 17→18 rows of embeddings (one matrix when tied, two when not), plus the untouched rest
    rest = sum(t.numel() for n, t in before.items() if n not in EMBEDDINGS and n in dict(adapted.named_parameters()))
    assert trainable == rest + (1 if tied else 2) * 18 * HIDDEN
    after = _tensors(adapted)
    for name, old in before.items():
        if name in dict(adapted.named_buffers()):
            continue
        new = after[name][:17] if name in EMBEDDINGS else after[name]
        assert not torch.equal(new, old), f"{name} did not change under FFT"


def test_et_old_scores_identical_right_after_expansion(tiny):
    model, tokenizer = tiny(tied=True)
    original = copy.deepcopy(model)
    expand(model, tokenizer, ["<spec>"], init="random", seed=0)
    old = encode_texts(char_tokenizer(), OLD_TEXT, 32)
    a = score(original, old, old_vocab=17, pad_id=0, batch_size=4)
    b = score(model, old, old_vocab=17, pad_id=0, batch_size=4)
    assert (a.nll_old, a.n_old) == (b.nll_old, b.n_old)
    assert torch.equal(a.hits_old, b.hits_old)


# ---------------------------------------------------------------- expand()


@pytest.mark.parametrize(
    "new_tokens, init, message",
    [
        (["<x>", "<y>", "<x>"], "random", "duplicate new tokens: ['<x>']"),
        (["<x>", "+"], "random", "new token(s) already in the base vocabulary: ['+']"),
        (["<x>"], "zeros", "unknown init strategy 'zeros'; known: random, mean, subword-mean, omp"),
    ],
)
def test_expand_errors_leave_model_and_tokenizer_alone(tiny, new_tokens, init, message):
    model, tokenizer = tiny(tied=False)
    before = _tensors(model)
    with pytest.raises(ClbenchError) as info:
        expand(model, tokenizer, new_tokens, init=init, seed=0)
    assert str(info.value) == message
    assert len(tokenizer) == 17
    after = _tensors(model)
    assert all(torch.equal(after[n], before[n]) for n in before)


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_mean_init_is_exactly_the_mean_of_old_rows(tiny, tied):
    model, tokenizer = tiny(tied=tied)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    expansion = expand(model, tokenizer, ["<x>", "<y>"], init="mean", seed=0)
    assert expansion.new_ids == [17, 18] and expansion.new_vocab == 19
    assert tokenizer.convert_tokens_to_ids(["<x>", "<y>"]) == [17, 18]
    embed = model.get_input_embeddings().weight
    assert embed.shape == (19, HIDDEN)
    assert torch.equal(embed[17], old_in.mean(0))
    assert torch.equal(embed[18], old_in.mean(0))
    assert torch.equal(model.get_output_embeddings().weight[17:], old_out.mean(0).expand(2, -1))


def test_subword_mean_init(tiny):
    model, tokenizer = tiny(tied=False)
    old = model.get_input_embeddings().weight.detach().clone()
    expand(model, tokenizer, ["12"], init="subword-mean", seed=0)  # the old tokenizer: '1' (5), '2' (6)
    assert torch.equal(model.get_input_embeddings().weight[17], old[[5, 6]].mean(0))


def test_random_init_depends_only_on_the_seed(tiny):
    rows = []
    for seed in (0, 0, 1):
        model, tokenizer = tiny(tied=False)
        expand(model, tokenizer, ["<x>"], init="random", seed=seed)
        rows.append(model.get_input_embeddings().weight[17].detach().clone())
    assert torch.equal(rows[0], rows[1])
    assert not torch.equal(rows[0], rows[2])
