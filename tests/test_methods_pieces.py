"""Exact values for what the methods share: OMP, top-s, the omp init, the prompt offset,
sweep resumability and the explain read-out.

    python -m pytest -q tests/test_methods_pieces.py
"""

import copy
import math

import pytest
import torch

from clbench.cli import main
from clbench.data import Example, collate, encode_examples
from clbench.errors import ClbenchError
from clbench.evaluate import score
from clbench.expand import expand
from clbench.explain import describe_rows, explain
from clbench.method import methods
from clbench.metrics import token_nll
from clbench.session import Session
from clbench.sparse import omp
from clbench.store import Store
from clbench.sweep import curve, sweep
from clbench.taskspec import load_task_file
from clbench.testing import tiny_base, write_tiny_task


def test_omp_finds_the_sparse_combination_and_its_residual():
    dictionary = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [1.0, 1.0, 0, 0]])
    target = torch.tensor([2.0, 0, 3.0, 0.5])
    one = omp(dictionary, target, 1)
    assert one.indices == [2] and one.weights == pytest.approx([3.0], abs=1e-12)
    assert one.residual == pytest.approx(math.sqrt(4 + 0.25) / math.sqrt(13.25), abs=1e-12)
    two = omp(dictionary, target, 2)
    assert two.indices == [2, 0] and two.weights == pytest.approx([3.0, 2.0], abs=1e-12)
    assert two.residual == pytest.approx(0.5 / math.sqrt(13.25), abs=1e-12)
    # stops once the residual is zero, even with atoms to spare
    exact = omp(dictionary, torch.tensor([0.0, 0, -1.5, 0]), 3)
    assert exact.indices == [2] and exact.weights == pytest.approx([-1.5]) and exact.residual == 0.0


def test_top_s_keeps_the_largest_entries_and_passes_every_gradient():
    from clbench.baselines.et_dict import top_s

    alpha = torch.tensor([[0.1, -3.0, 2.0, 0.5], [1.0, 0.0, -0.25, 0.5]], requires_grad=True)
    kept = top_s(alpha, 2)
    assert kept.tolist() == [[0.0, -3.0, 2.0, 0.0], [1.0, 0.0, 0.0, 0.5]]
    upstream = torch.arange(8.0).reshape(2, 4)
    (kept * upstream).sum().backward()
    assert torch.equal(alpha.grad, upstream)  # straight-through: dropped entries still learn


def test_omp_init_is_the_sparse_fit_of_the_subword_mean():
    base = tiny_base(tied=False)
    model, tokenizer = copy.deepcopy(base.model), copy.deepcopy(base.tokenizer)
    expand(model, tokenizer, ["12", "9*"], init="omp", seed=0)  # the old tokenizer splits each into 2 pieces
    old = base.model.get_input_embeddings().weight
    ids = base.tokenizer.convert_tokens_to_ids
    for row, pieces in zip(model.get_input_embeddings().weight[-2:], [["1", "2"], ["9", "*"]]):
        assert torch.allclose(row, old[ids(pieces)].mean(0), atol=1e-6)  # two pieces: within 8 atoms, exact


def test_pt_scores_exactly_the_real_positions():
    base = tiny_base(tied=True)
    model, tokenizer = copy.deepcopy(base.model), copy.deepcopy(base.tokenizer)
    expansion = expand(model, tokenizer, ["<spec>"], init="random", seed=0)
    spec = methods().get("pt")
    k = 3
    adapter = spec.setup(model, expansion, spec.config({"virtual_tokens": str(k)}))
    prompted = adapter.finalize()
    examples = encode_examples(tokenizer, [Example("12<spec>3=", "36"), Example("4+5=", "9")], 32)
    ids, attention, target_mask = collate(examples, tokenizer.pad_token_id)  # two lengths: right padding

    hidden = prompted.get_decoder()(input_ids=ids, attention_mask=attention).last_hidden_state
    assert hidden.shape == (2, ids.shape[1], 16)
    # by hand: prompt vectors in front, the decoder run on embeddings, the first k positions dropped
    prompt = adapter.prompt.embedding.weight.detach().expand(2, -1, -1)
    embeds = torch.cat([prompt, prompted.get_input_embeddings()(ids)], dim=1)
    mask = torch.cat([torch.ones(2, k, dtype=attention.dtype), attention], dim=1)
    with torch.no_grad():
        by_hand = unhooked_decoder(prompted)(inputs_embeds=embeds, attention_mask=mask).last_hidden_state[:, k:]
    assert torch.equal(hidden.detach(), by_hand)
    assert prompted(input_ids=ids, attention_mask=attention).logits.shape[1] == ids.shape[1]

    scores = score(prompted, examples, old_vocab=expansion.old_vocab, pad_id=tokenizer.pad_token_id, batch_size=8)
    logits = by_hand[:, :-1][target_mask] @ prompted.get_output_embeddings().weight.T
    targets = ids[:, 1:][target_mask]
    # score() batches by length (the short example first), and BLAS with 2 threads rounds a permuted
    # batch differently (seen: 9e-9 of 14.6); a misaligned offset would move the sum by O(1)
    assert scores.n_full == 5 and scores.nll_full == pytest.approx(token_nll(logits, targets).sum().item(), rel=1e-7)


def unhooked_decoder(model):
    """A copy of the decoder without the prompt hooks: the plain computation to compare with."""
    decoder = copy.deepcopy(model.get_decoder())
    decoder._forward_pre_hooks.clear()
    decoder._forward_hooks.clear()
    decoder._forward_hooks_with_kwargs.clear()
    decoder._forward_pre_hooks_with_kwargs.clear()
    return decoder


def tiny_task(tmp_path):
    tiny = {"n_train": 20, "steps": 3, "batch_size": 4, "eval_batch_size": 64}
    params = {"n_test": 12, "n_old_skill": 8, "n_old_text": 8, "n_replay": 8}
    return load_task_file(write_tiny_task(tmp_path, "tiny", budget=tiny, params=params))


def test_sweep_resumes_and_explain_reads_a_stored_run(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    task, store, session = tiny_task(tmp_path), Store(tmp_path / "r.duckdb"), Session()
    session.bases["tiny"] = tiny_base(tied=False)
    chosen = [methods().get("et"), methods().get("fft")]
    first = sweep(task, chosen, [5, 10], [0, 1], store=store, session=session)
    assert [o.status for o in first] == ["finished"] * 8
    second = sweep(task, chosen, [5, 10], [0, 1], store=store, session=session)
    assert [o.status for o in second] == ["skipped"] * 8 and [o.run_id for o in second] == [o.run_id for o in first]
    table = curve(store, [o.run_id for o in first])
    assert list(table.index) == [("et", 5), ("et", 10), ("fft", 5), ("fft", 10)] and set(table.seeds) == {2}

    text = explain(store, first[0].run_id[:6], s=2, session=session)
    assert text.splitlines()[0] == f"run {first[0].run_id}: tiny-arith × et (seed 0, tiny), s = 2"
    assert text.splitlines()[2].startswith("<spec>  nearest (cosine): ")
    with pytest.raises(ClbenchError, match="no finished run with id 'zz'"):
        explain(store, "zz", s=2, session=session)


def test_describe_rows_on_a_known_dictionary():
    dictionary = torch.tensor([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 1.0]])
    row = torch.tensor([[0.6, 0.0, -0.25]])  # = 0.6·'a' − 0.25·'c'
    lines = describe_rows(row, ["<new>"], dictionary, ["a", "b", "c"], s=2, k=2)
    assert lines == [
        "<new>  nearest (cosine): 'a' 0.923, 'b' 0.000",
        "       ≈ 0.6·'a' − 0.25·'c'   (residual 0.000)",
    ]
    one = describe_rows(row, ["<new>"], dictionary, ["a", "b", "c"], s=1, k=1)
    assert one[1] == "       ≈ 0.6·'a'   (residual 0.385)"  # 0.25 / ‖(0.6, 0, −0.25)‖ = 0.25 / 0.65


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["sweep", "--task", "arithmetic", "--method", "et", "--n", "10,0"],
            "--n must be comma-separated positive integers",
        ),
        (["sweep", "--task", "arithmetic", "--method", "et", "--n", "10,10"], "--n names a count twice"),
        (["explain", "nope"], "r.duckdb does not exist"),
    ],
)
def test_cli_bad_input_is_one_line(argv, message, tmp_path, capsys):
    assert main([*argv, "--db", str(tmp_path / "r.duckdb")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
