"""Every registered method under the protocol on a tiny model, and the pieces the methods share.

python -m pytest -q tests/test_methods.py
"""

import copy
import dataclasses

import pytest
import torch

from clbench.data import encode_examples, encode_texts
from clbench.errors import ClbenchError
from clbench.expand import expand
from clbench.explain import load_new_rows
from clbench.method import methods, register_method
from clbench.protocol import adapt_and_evaluate, base_reading
from clbench.session import Session
from clbench.taskspec import Budget
from clbench.testing import HIDDEN, expanded, tiny_base, tiny_data, tiny_plan
from clbench.train import train

D, MLP, LAYERS = HIDDEN, 2 * HIDDEN, 1  # clbench.testing.tiny_llama's shape
FROZEN_BACKBONE = {name for name in methods() if methods().get(name).frozen_backbone}  # old weights bit-identical


def expected_trainable(name: str, tied: bool, old_vocab: int, n_new: int) -> int | None:
    """Each shipped method's trainable-parameter count, worked out from its definition (not from the model); None for
    a method added after them, whose own test file pins its count (docs/adding-a-method.md), so that adding one edits
    no shared test."""
    vocab = old_vocab + n_new
    layer = 4 * D * D + 3 * D * MLP + 2 * D  # q k v o, gate up down, two RMSNorms
    every_weight = vocab * D * (1 if tied else 2) + LAYERS * layer + D  # + final norm
    rank = methods().get("lora").config_cls().rank
    lora = LAYERS * rank * (4 * (D + D) + 3 * (D + MLP)) + n_new * D * (1 if tied else 2)
    prompt = methods().get("pt").config_cls().virtual_tokens * D
    counts = {
        "et": n_new * D,
        "et-dict": n_new * old_vocab,
        "et-out": 2 * n_new * D,
        "et-full": n_new * D * (1 if tied else 2),  # tied: one row serves input and output
        "distill": n_new * D * (1 if tied else 2),  # the same rows as et-full's, by other losses
        "ewc": every_weight,
        "fft": every_weight,
        "nonew": every_weight,  # fft's, over the base vocabulary: it adds no row
        "replay": every_weight,
        "lora": lora,
        "pt": prompt + n_new * D,
    }
    return counts.get(name)


def head_and_embedding(model):
    return model.get_input_embeddings().weight, model.get_output_embeddings().weight


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("name", methods().names())
def test_every_method_keeps_its_contract(name, tied, tmp_path):
    base, spec = tiny_base(tied), methods().get(name)
    data = tiny_data() if spec.adds_tokens else base_reading(None, spec, tiny_data())  # as plan() reads the task
    seen = {}

    def setup(model, expansion, config):  # the protocol's own setup call, observed
        seen["model"], seen["expansion"] = model, expansion
        seen["adapter"] = spec.setup(model, expansion, config)
        seen["before"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return seen["adapter"]

    budget = Budget(n_train=6, steps=3, batch_size=4, eval_batch_size=8)
    values = adapt_and_evaluate(
        tiny_plan(base, data, dataclasses.replace(spec, setup=setup), budget),
        session=Session(),
        rows_path=tmp_path / "rows.safetensors",
    ).values
    model, expansion = seen["model"], seen["expansion"]
    old, new = expansion.old_vocab, slice(expansion.old_vocab, expansion.new_vocab)

    expected = expected_trainable(name, tied, old, len(data.new_tokens))
    assert expected is None or values["trainable_params"] == expected
    assert values["trainable_params"] > 0
    embedding, head = head_and_embedding(model)
    tokens, stored = load_new_rows(tmp_path / "rows.safetensors")
    assert (
        tokens == data.new_tokens
        and torch.equal(stored["input"], embedding[new])
        and torch.equal(stored["output"], head[new])
    )
    if name not in FROZEN_BACKBONE:
        return
    # frozen backbone: every base weight bit-identical, old rows included; only new rows moved
    base_embedding, base_head = head_and_embedding(base.model)
    assert torch.equal(embedding[:old], base_embedding) and torch.equal(head[:old], base_head)
    assert not torch.equal(embedding[new], seen["before"]["model.embed_tokens.weight"][new])
    skip = {"model.embed_tokens.weight", "lm_head.weight"}
    base_state = base.model.state_dict()
    assert all(torch.equal(tensor, base_state[key]) for key, tensor in model.state_dict().items() if key not in skip)
    assert values["forgetting_oldvocab"] == 0.0 and values["old_skill_acc_delta"] == 0.0
    old_text = torch.tensor([encode_texts(base.tokenizer, data.old_text[:1], 32)[0].ids])
    with torch.no_grad():  # what frozen_backbone declares: the hidden states on old text are the base's
        hidden = lambda m: m(input_ids=old_text, output_hidden_states=True).hidden_states
        assert all(torch.equal(mine, theirs) for mine, theirs in zip(hidden(model), hidden(base.model)))
    if name == "et-out":  # its own output row, trained, distinct from the input row even when tied
        adapter = seen["adapter"]
        assert torch.equal(head[new], adapter.out_rows.detach()) and torch.equal(
            embedding[new], adapter.rows.weight.detach()
        )
        assert not torch.equal(head[new], embedding[new]) and head.data_ptr() != embedding.data_ptr()
    elif name in ("et-full", "distill"):  # tied: the one trained row is the output row too; untied: its own output row
        adapter = seen["adapter"]
        assert torch.equal(embedding[new], adapter.rows.weight.detach())
        assert torch.equal(
            head[new], (adapter.rows.weight if tied and name == "distill" else adapter.out_rows).detach()
        )
        assert (head.data_ptr() == embedding.data_ptr()) is tied
        assert not torch.equal(head[new], seen["before"]["lm_head.weight"][new])
    elif not tied:  # ET's untied new output row is never trained: still its initialisation
        assert torch.equal(head[new], seen["before"]["lm_head.weight"][new])


class Hooked:
    """An adapter class with both optional hooks."""

    def __init__(self, model, expansion, config):
        self.param_groups, self.model = [{"params": [torch.nn.Parameter(torch.zeros(1))]}], model

    def training_examples(self, train, replay):
        return train

    def penalty(self):
        return torch.zeros(())

    def finalize(self):
        return self.model


@dataclasses.dataclass(frozen=True)
class LrOnly:
    lr: float = 1e-3


@pytest.mark.parametrize(
    "declared, message",
    [
        ({"penalty": True}, r"its adapter defines training_examples\(\); declare reads_old_text=True"),
        ({"reads_old_text": True}, r"its adapter defines penalty\(\); declare penalty=True"),
    ],
)
def test_registration_refuses_a_hook_it_does_not_declare(declared, message):
    with pytest.raises(ClbenchError, match=f"^method 'hooked': {message}$"):
        register_method("hooked", LrOnly, Hooked, train_vocab="full", description="", **declared)
    assert "hooked" not in methods()


def test_registration_refuses_a_declared_hook_the_adapter_lacks():
    fft = methods().get("fft")
    with pytest.raises(
        ClbenchError, match=r"^method 'plain' declares penalty=True, and its adapter has no penalty\(\)$"
    ):
        register_method("plain", LrOnly, fft.setup, train_vocab="full", description="", penalty=True)
    assert "plain" not in methods()


def test_an_adapter_is_held_to_its_declarations_when_set_up():
    # a setup function's adapter is known only once set up: the protocol checks it there (protocol.setup)
    model = tiny_base(tied=False).model
    adapter = Hooked(model, None, None)  # its one parameter is outside the model
    spec = dataclasses.replace(methods().get("fft"), reads_old_text=True)
    with pytest.raises(ClbenchError, match="^method 'fft': its adapter defines penalty\\(\\); declare penalty=True$"):
        spec.check_adapter(adapter, model)
    spec = dataclasses.replace(spec, penalty=True)
    with pytest.raises(
        ClbenchError,
        match="^method 'fft' declares trains_rows_outside_model=False, and its adapter trains some parameters "
        "outside the model$",
    ):
        spec.check_adapter(adapter, model)
    assert dataclasses.replace(spec, trains_rows_outside_model=True).check_adapter(adapter, model) is None


def test_lora_merge_keeps_the_trained_rows():
    base, data = tiny_base(tied=False), tiny_data()
    model, tokenizer, expansion = expanded(base, data.new_tokens)
    initial = model.get_input_embeddings().weight[expansion.old_vocab].detach().clone()
    spec = methods().get("lora")
    adapter = spec.setup(model, expansion, spec.config({"lr": "0.05"}))
    examples = encode_examples(tokenizer, data.train, 32)
    train(model, adapter.param_groups, examples, steps=3, batch_size=4, lr=0.05, seed=0, pad_id=tokenizer.pad_token_id)
    ids = torch.tensor([examples[0].ids])
    with torch.no_grad():
        unmerged = model(input_ids=ids).logits
        merged_model = adapter.finalize()
        merged = merged_model(input_ids=ids).logits
    assert torch.allclose(unmerged, merged, atol=1e-5)
    assert type(merged_model.get_input_embeddings()) is torch.nn.Embedding
    assert not torch.equal(merged_model.get_input_embeddings().weight[expansion.old_vocab], initial)
    assert torch.equal(
        merged_model.get_input_embeddings().weight[: expansion.old_vocab], base.model.get_input_embeddings().weight
    )


@pytest.mark.parametrize("name", methods().names())
def test_every_method_trains_float32_masters_of_a_bf16_model(name):
    # on CUDA, hub models load in bf16: each method must hand the optimizer float32 parameters
    base = tiny_base(tied=False)
    model, tokenizer = copy.deepcopy(base.model).to(torch.bfloat16), copy.deepcopy(base.tokenizer)
    expansion = expand(model, tokenizer, ["<spec>"], init="random", seed=0)
    spec = methods().get(name)
    adapter = spec.setup(model, expansion, spec.config())
    params = [p for group in adapter.param_groups for p in group["params"]]
    assert params and {p.dtype for p in params} == {torch.float32}
    examples = encode_examples(tokenizer, tiny_data().train, 32)
    # the masters before training and after each step: a step the loop counts but does not apply (skipped, or
    # with no gradient reaching them: AdamW here has no weight decay) leaves two successive states equal
    states = [[p.detach().clone() for p in params]]
    train(
        model,
        adapter.param_groups,
        examples,
        steps=2,
        batch_size=4,
        lr=1e-3,
        seed=0,
        pad_id=tokenizer.pad_token_id,
        vocab_limit=expansion.old_vocab if spec.train_vocab == "old" else None,
        on_step=lambda *_: states.append([p.detach().clone() for p in params]),
    )
    moved = [any(not torch.equal(a, b) for a, b in zip(s, t)) for s, t in zip(states, states[1:])]
    assert moved == [True, True]  # two updates applied, each to the float32 masters


def test_training_refuses_bf16_trainable_parameters():
    base = tiny_base(tied=False)
    weight = torch.nn.Parameter(torch.zeros(2, D, dtype=torch.bfloat16))
    examples = encode_examples(base.tokenizer, tiny_data().train, 32)
    with pytest.raises(ClbenchError, match="float32 masters, got bfloat16"):
        train(base.model, [{"params": [weight]}], examples, steps=1, batch_size=2, lr=1e-3, seed=0, pad_id=0)
