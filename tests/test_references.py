"""Reference points stored with every run: learned nothing, the oracle, gap_closed, word_gap, top-1."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from clbench import metrics as M
from clbench.data import encode_examples
from clbench.evaluate import score
from clbench.expand import expand
from clbench.method import methods
from clbench.protocol import run_one
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import load_tasks
from clbench.testing import TASK


def test_gap_closed_is_the_share_of_the_gap_between_learning_nothing_and_the_oracle():
    assert M.gap_closed(3.0, no_learning=4.0, oracle=2.0) == 0.5
    assert M.gap_closed(4.0, no_learning=4.0, oracle=2.0) == 0.0
    assert M.gap_closed(1.0, no_learning=4.0, oracle=2.0) == 1.5  # beats the oracle
    assert math.isnan(M.gap_closed(3.0, no_learning=2.0, oracle=2.0))  # no gap to close


def test_first_match_reads_each_examples_first_position():
    correct = torch.tensor([True, False, False, True, True])
    example_of = torch.tensor([0, 0, 1, 1, 2])
    assert M.first_match(correct, example_of, 4).tolist() == [True, False, True, False]  # 3: no position


def test_every_run_stores_its_references(tiny_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))
    task = load_tasks([tiny_cli.tasks]).get(TASK)
    session, store = Session(device="cpu"), Store(tmp_path / "r.duckdb")
    outcome = run_one(task, methods().get("et"), seed=0, store=store, session=session)
    values = outcome.metrics
    base = session.base(str(tiny_cli.model))
    _, budget, params = task.resolved()
    data = session.data(task, params, base)
    bs, vocab, pad = budget.eval_batch_size, len(base.tokenizer), base.tokenizer.pad_token_id
    on = lambda examples: score(
        base.model,
        encode_examples(base.tokenizer, examples, base.max_length, data.scoring),
        old_vocab=vocab,
        pad_id=pad,
        batch_size=bs,
    )
    nolearn, oracle = on(data.target_test), on(data.target_oracle)
    assert values["target_loss_nolearn"] == nolearn.loss_old
    assert values["target_loss_oracle"] == oracle.loss_old
    assert values["target_top1_oracle"] == M.accuracy(oracle.top1_old)
    assert values["target_acc_oracle"] == M.accuracy(oracle.hits_old)  # an exact-match task
    assert values["target_acc_nolearn"] == M.accuracy(nolearn.hits_old)
    # the random tiny model reads `*` no better than <unk>: no gap, so no gap_closed (see the pure test above)
    assert oracle.loss_old >= nolearn.loss_old and "gap_closed" not in values
    assert values["word_gap"] == values["target_loss"] - values["target_loss_oracle_adapted"]
    n_bytes = sum(len(e.completion.encode()) for e in data.target_test)  # every completion byte: prompts precede them
    assert values["target_tokens_per_byte"] == values["target_tokens_per_byte_base"] == nolearn.n_full / n_bytes
    # the expanded model before training, made here as the protocol makes it: what the new tokens cost at init
    model, tokenizer = base.own_model(), copy.deepcopy(base.tokenizer)
    torch.manual_seed(0)
    expand(model, tokenizer, data.new_tokens, init=task.spec.init, seed=0, whole_words=data.whole_word_tokens)
    at_init = score(
        model,
        encode_examples(tokenizer, data.target_test, base.max_length, data.scoring),
        old_vocab=vocab,
        pad_id=pad,
        batch_size=bs,
    )
    assert values["target_bpb_init"] == M.bits_per_byte(at_init.nll_full, n_bytes) != values["target_bpb"]
    stored = store.query("SELECT metric, value FROM results").set_index("metric").value
    assert stored["word_gap"] == values["word_gap"] and stored["target_top1"] == values["target_top1"]


def scores(n_old, n_full, loss=2.0):
    """Two examples alike: every bootstrap resample has the same loss, so every *_se is 0; 40 bytes scored."""
    hits = torch.tensor([True, False])
    half = torch.tensor([n_old / 2, n_old / 2], dtype=torch.float64)
    fields = {
        "n_old": n_old,
        "n_full": n_full,
        "loss_old": loss,
        "top1_old": hits,
        "hits_old": hits[:1],
        "n_bytes": 40,
    }
    return type("S", (), fields | {"example_nll_old": loss * half, "example_n_old": half})()


# the metrics that compare a run with learning nothing and with reading the meaning
REFERENCES = [
    "target_top1_nolearn",
    "target_tokens_per_byte",
    "target_tokens_per_byte_base",
    "target_acc_nolearn",
    "target_loss_nolearn",
    "target_loss_oracle",
    "target_top1_oracle",
    "target_acc_oracle",
    "gap_closed",
    "gap_closed_se",
    "target_loss_oracle_adapted",
    "word_gap",
    "word_gap_se",
]


def reference_metrics(*, target, no_learning, oracle, adapted_oracle, exact_match=False):
    """The references' values, each by its declaration's score, from these scores alone."""
    scores = M.RunScores(
        target=target, no_learning=no_learning, oracle=oracle, adapted_oracle=adapted_oracle, exact_match=exact_match
    )
    return M.scored(scores, names=REFERENCES)


def test_references_where_the_task_knows_the_meaning():
    values = reference_metrics(
        target=scores(10, 10, loss=3.0),
        no_learning=scores(10, 10, loss=4.0),
        oracle=scores(10, 10, loss=2.0),
        adapted_oracle=scores(10, 10, loss=2.5),
    )
    assert values == {
        "target_top1_nolearn": 0.5,
        "target_tokens_per_byte": 0.25,
        "target_tokens_per_byte_base": 0.25,
        "target_loss_nolearn": 4.0,
        "target_loss_oracle": 2.0,
        "target_top1_oracle": 0.5,
        "gap_closed": 0.5,
        "gap_closed_se": 0.0,
        "target_loss_oracle_adapted": 2.5,
        "word_gap": 0.5,
        "word_gap_se": 0.0,
    }


def test_an_exact_match_task_adds_the_references_accuracy():
    values = reference_metrics(
        target=scores(10, 10),
        no_learning=scores(10, 10),
        oracle=scores(10, 10),
        adapted_oracle=None,
        exact_match=True,
    )
    # hits_old: one example, right (the helper's): accuracy 1 for both references
    assert (values["target_acc_nolearn"], values["target_acc_oracle"]) == (1.0, 1.0)
    assert "target_acc_oracle" not in reference_metrics(
        target=scores(10, 10), no_learning=scores(10, 10), oracle=None, adapted_oracle=None
    )


def test_references_skip_per_token_losses_where_completions_tokenize_differently():

    values = reference_metrics(target=scores(8, 10), no_learning=scores(14, 14), oracle=None, adapted_oracle=None)
    assert values == {"target_top1_nolearn": 0.5, "target_tokens_per_byte": 0.25, "target_tokens_per_byte_base": 0.35}


def test_bootstrap_se_is_the_standard_error_of_a_mean_and_zero_for_a_paired_copy():
    x = torch.linspace(0, 2, 400, dtype=torch.float64)
    ones = torch.ones(400, dtype=torch.long)
    analytic = float(x.std() / 400**0.5)
    assert M.bootstrap_se(x, ones) == pytest.approx(analytic, rel=0.06)
    assert M.bootstrap_se(x, ones) == M.bootstrap_se(x, ones)  # a fixed seed
    assert M.bootstrap_se(x, ones, x, ones) == 0.0  # forgetting of an unchanged model has no noise
    assert M.bootstrap_se(torch.full((50,), 3.0), torch.full((50,), 2)) == 0.0
    assert math.isnan(M.bootstrap_se(x[:1], ones[:1]))


def test_gap_closed_se_resamples_the_three_losses_together():
    x = torch.linspace(1, 3, 400, dtype=torch.float64)  # per-example difficulty, shared by all three
    ones = torch.ones(400, dtype=torch.float64)
    # a method halfway between learning nothing (x + 1) and the oracle (x) on every example closes half
    # the gap on every resample: no noise left, though its own loss varies as much as x does
    assert M.bootstrap_gap_closed_se((x + 0.5, ones), (x + 1, ones), (x, ones)) < 1e-15  # float64 rounding
    assert M.bootstrap_se(x + 0.5, ones) > 0.02
    # a share that varies by example, 0.25 or 0.75 alternately: the SE of its mean over 400 (0.25 / 20)
    share = torch.tensor([0.25, 0.75] * 200, dtype=torch.float64)
    se = M.bootstrap_gap_closed_se((x + 1 - share, ones), (x + 1, ones), (x, ones))
    assert se == pytest.approx(float(share.std()) / 20, rel=0.06)
    # a resample with no gap to close has no finite ratio
    assert math.isnan(M.bootstrap_gap_closed_se((x, ones), (x, ones), (x, ones)))
