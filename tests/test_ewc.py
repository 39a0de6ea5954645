"""ewc on tiny in-process models: its Fisher, its penalty, train()'s penalty hook, and what a huge λ does.

python -m pytest -q tests/test_ewc.py
"""

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from clbench.baselines.ewc import diagonal_fisher
from clbench.data import Padded, encode_examples, encode_texts
from clbench.errors import ClbenchError, DivergedError
from clbench.method import methods
from clbench.protocol import adapt_and_evaluate
from clbench.session import Session
from clbench.taskspec import Budget
from clbench.testing import expanded, tiny_base, tiny_data, tiny_plan
from clbench.train import train

REPLAY = ["2+2=4", "9*3=27", "33+9=42", "7*7=49", "1+1=2"]  # unequal lengths: padded batches


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_fisher_is_the_mean_of_squared_per_text_gradients(tied):
    model, tokenizer, expansion = expanded(tiny_base(tied))
    replay = encode_texts(tokenizer, REPLAY, 32)
    fisher = diagonal_fisher(model, replay, vocab_limit=expansion.old_vocab)

    # the definition, one text at a time: mean NLL of its tokens after bos, old-vocabulary softmax
    params = dict(model.named_parameters())
    squares = {name: torch.zeros_like(p) for name, p in params.items()}
    for text in replay:
        ids = torch.tensor(text.ids)
        logits = model(input_ids=ids[None]).logits[0, :-1, : expansion.old_vocab]
        gradients = torch.autograd.grad(F.cross_entropy(logits, ids[1:]), list(params.values()))
        for name, g in zip(params, gradients):
            squares[name] += g.square() / len(replay)

    assert fisher.keys() == squares.keys()
    for name in params:
        torch.testing.assert_close(fisher[name], squares[name], rtol=1e-5, atol=1e-12)
        assert squares[name].sum() > 0, name  # every weight touches old text: no comparison of zeros
    # the new token's rows do not enter the old-vocabulary likelihood of old text
    new = expansion.old_vocab
    assert fisher["model.embed_tokens.weight"][new:].abs().sum() == 0
    if not tied:
        assert fisher["lm_head.weight"][new:].abs().sum() == 0


def vmap_fisher(model, examples, *, vocab_limit: int, batch_size: int) -> dict[str, torch.Tensor]:
    """diagonal_fisher as it was until issue 12: per-text gradients of every weight for batch_size
    padded texts at once (vmap), squared and summed; kept here only as the reference it must equal."""
    params = {name: p.detach() for name, p in model.named_parameters()}

    def example_nll(params, ids, scored):
        logits = functional_call(model, params, args=(), kwargs={"input_ids": ids[None]}).logits[0, :-1, :vocab_limit]
        nll = F.cross_entropy(logits.float(), ids[1:].clamp(max=vocab_limit - 1), reduction="none")
        return (nll * scored).sum() / scored.sum().clamp(min=1)

    per_example = vmap(grad(example_nll), in_dims=(None, 0, 0))
    fisher = {name: torch.zeros_like(p) for name, p in params.items()}
    padded = Padded(examples, pad_id=0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")  # SDPA has no batching rule
        for start in range(0, len(examples), batch_size):
            ids, _, target_mask = padded.batch(range(start, min(start + batch_size, len(examples))))
            scored = (target_mask & (ids[:, 1:] < vocab_limit)).float()
            for name, g in per_example(params, ids, scored).items():
                fisher[name] += g.float().square().sum(0)
    return {name: f / len(examples) for name, f in fisher.items()}


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_fisher_equals_the_batched_vmap_fisher_it_replaced(tied):
    model, tokenizer, expansion = expanded(tiny_base(tied))
    # prompt/completion examples too: their prompt tokens are context, not scored
    replay = encode_texts(tokenizer, REPLAY, 32) + encode_examples(tokenizer, tiny_data().train[:3], 32)
    for p in model.parameters():
        p.grad = torch.ones_like(p)  # as a train() leaves its last step's: no part of F
    fisher = diagonal_fisher(model, replay, vocab_limit=expansion.old_vocab)
    reference = vmap_fisher(model, replay, vocab_limit=expansion.old_vocab, batch_size=3)  # 3 + 3 + 2, padded
    assert fisher.keys() == reference.keys()
    worst = 0.0
    for name, f in fisher.items():
        assert f.dtype == torch.float32 and reference[name].abs().sum() > 0, name
        torch.testing.assert_close(f, reference[name], rtol=1e-5, atol=1e-12)
        worst = max(worst, ((f - reference[name]).abs() / reference[name].abs().clamp(min=1e-30)).max().item())
    # measured: about half the entries differ in their last bits, by at most 4.1e-7 relative (untied and tied):
    # the same sums in another order (one text at a time instead of padded batches of 3)
    assert worst < 1e-6
    assert all(p.grad is None for p in model.parameters())  # each gradient freed once squared into F


def ewc_adapter(tied: bool, lam: float):
    model, tokenizer, expansion = expanded(tiny_base(tied))
    spec = methods().get("ewc")
    adapter = spec.setup(model, expansion, spec.config({"lam": lam}))
    train_set = encode_examples(tokenizer, tiny_data().train, 32)
    replay = encode_texts(tokenizer, REPLAY, 32)
    assert adapter.training_examples(train_set, replay) is train_set  # ewc trains on the new examples alone
    return adapter, model, expansion, diagonal_fisher(model, replay, vocab_limit=expansion.old_vocab)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_penalty_is_zero_at_the_old_weights_and_quadratic_around_them(tied):
    lam = 250.0
    adapter, model, expansion, fisher = ewc_adapter(tied, lam)
    assert adapter.penalty().item() == 0.0

    embedding = model.get_input_embeddings().weight
    q = model.model.layers[0].self_attn.q_proj.weight
    new = expansion.old_vocab
    with torch.no_grad():
        embedding[new:] += 3.0  # the new token's row: no penalty however far it moves
    assert adapter.penalty().item() == 0.0

    with torch.no_grad():
        q += 0.01
        embedding[5] -= 0.02
    expected = (
        lam
        / 2
        * (
            fisher["model.layers.0.self_attn.q_proj.weight"].sum() * 0.01**2
            + fisher["model.embed_tokens.weight"][5].sum() * 0.02**2
        )
    )
    penalty = adapter.penalty()
    assert expected > 0
    assert penalty.item() == pytest.approx(expected.item(), rel=1e-5)
    penalty.backward()  # its gradient is λ F Δ
    torch.testing.assert_close(
        q.grad, lam * fisher["model.layers.0.self_attn.q_proj.weight"] * 0.01, rtol=1e-4, atol=1e-12
    )


def test_train_adds_the_penalty_to_the_update_but_reports_the_task_loss():
    def run(penalty):
        model, tokenizer, expansion = expanded(tiny_base(tied=False))
        params = list(model.parameters())
        examples = encode_examples(tokenizer, tiny_data().train, 32)
        result = train(
            model,
            [{"params": params}],
            examples,
            steps=3,
            batch_size=4,
            lr=1e-2,
            seed=0,
            pad_id=tokenizer.pad_token_id,
            penalty=penalty and (lambda: penalty(params)),
        )
        return result, model.model.norm.weight.detach().clone()

    plain, plain_norm = run(None)
    constant, constant_norm = run(lambda params: torch.tensor(7.0))  # no gradient: same training, same loss
    assert constant.final_loss == plain.final_loss and torch.equal(constant_norm, plain_norm)
    pulled, pulled_norm = run(lambda params: 100.0 * params[-1].sum())  # params[-1]: the final norm's weight
    assert not torch.equal(pulled_norm, plain_norm)
    with pytest.raises(DivergedError, match="non-finite training loss at step 0"):
        run(lambda params: torch.tensor(float("inf")))


def test_the_penalty_is_backpropagated_after_the_task_gradient_is_complete():
    # so no penalty gradient waits in autograd's buffers for the task's gradient of its weight (a copy of the weights)
    model, tokenizer, _ = expanded(tiny_base(tied=False))
    params = list(model.parameters())
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, weight):
            return weight.sum()

        @staticmethod
        def backward(ctx, grad):
            seen.append(all(p.grad is not None for p in params))  # the task's backward has reached every weight
            return grad * torch.ones_like(params[-1])

    train(
        model,
        [{"params": params}],
        encode_examples(tokenizer, tiny_data().train, 32),
        steps=2,
        batch_size=4,
        lr=1e-2,
        seed=0,
        pad_id=tokenizer.pad_token_id,
        penalty=lambda: Probe.apply(params[-1]),
    )
    assert seen == [True, True]


def test_a_huge_lambda_keeps_old_text_where_fft_loses_it():
    base, data = tiny_base(tied=False), tiny_data()
    budget = Budget(n_train=6, steps=30, batch_size=4, eval_batch_size=8)

    def forgetting(name, **options):
        spec = methods().get(name)
        plan = tiny_plan(base, data, spec, budget, spec.config({"lr": 1e-2, **options}))
        values = adapt_and_evaluate(plan, session=Session()).values
        return values["forgetting_oldvocab"], values["target_loss"]

    fft = forgetting("fft")
    assert forgetting("ewc", lam=0.0) == fft  # no penalty: fft, step for step
    ewc = forgetting("ewc", lam=1e9)
    # measured: fft 0.291, ewc −0.030 (its old text a little better than the base's) at λ = 1e9
    assert fft[0] > 0.25 and abs(ewc[0]) < fft[0] / 5, (fft, ewc)


def test_ewc_refuses_a_task_without_replay_text():
    base, data = tiny_base(tied=False), dataclasses.replace(tiny_data(), replay_text=[])
    spec = methods().get("ewc")
    budget = Budget(n_train=6, steps=1, batch_size=4, eval_batch_size=8)
    with pytest.raises(
        ClbenchError, match="^method 'ewc' needs old text to estimate its Fisher on: the task has no replay_text$"
    ):
        adapt_and_evaluate(tiny_plan(base, data, spec, budget), session=Session())


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_the_penalty_keeps_no_copy_of_the_weights_for_its_backward(tied):
    lam = 250.0
    adapter, model, _, _ = ewc_adapter(tied, lam)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    live = {t.untyped_storage().data_ptr() for _, anchor, f in adapter.anchors for t in (anchor, f)}
    live |= {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.untyped_storage().data_ptr()) or t, lambda t: t
    ):
        penalty = adapter.penalty()
    assert saved and set(saved) <= live  # the graph holds θ, θ* and F themselves, no (θ − θ*)
    penalty.backward()
    # the same value and gradient as autograd through the plain expression, to float rounding
    plain = lam / 2 * sum((f * (p - anchor).square()).sum() for p, anchor, f in adapter.anchors)
    assert penalty.item() == pytest.approx(plain.item(), rel=1e-6)
    params = [p for p, _, _ in adapter.anchors]
    for p, expected in zip(params, torch.autograd.grad(plain, params), strict=True):
        torch.testing.assert_close(p.grad, expected, rtol=1e-6, atol=1e-12)
