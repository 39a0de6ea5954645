"""Inspecting a run (issue 13): its training curves, its per-example records, its own peak memory.

python -m pytest -q tests/test_run_inspection.py
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import re
import sys
import time
import types

import pytest
import torch
import torch.nn.functional as F

from clbench.arith import char_tokenizer
from clbench.cli import main
from clbench.data import Padded, encode_examples
from clbench.memory import PeakMemory
from clbench.method import methods
from clbench.protocol import adapt_and_evaluate, run_one
from clbench.report import leaderboard
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import Budget, load_task_file
from clbench.testing import tiny_base, tiny_data, tiny_plan
from clbench.train import epoch_batches, train, warmup_cosine

BUDGET = Budget(n_train=6, steps=3, batch_size=4, eval_batch_size=8)


# ---------------------------------------------------------------- training curves


def test_train_returns_every_steps_loss_lr_and_unclipped_grad_norm():
    base, data = tiny_base(tied=False), tiny_data()
    model = copy.deepcopy(base.model)
    examples = encode_examples(base.tokenizer, data.train, 32)
    pad = base.tokenizer.pad_token_id
    # the first step's loss and gradient norm, worked out apart from train() on the same batch
    reference = copy.deepcopy(base.model).train()
    [batch] = epoch_batches(len(examples), 4, 1, torch.Generator().manual_seed(0))
    ids, _, mask = Padded(examples, pad).batch(batch)
    loss = F.cross_entropy(reference(input_ids=ids).logits[:, :-1][mask], ids[:, 1:][mask])
    loss.backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()]))

    seen = []
    result = train(
        model,
        [{"params": list(model.parameters())}],
        examples,
        steps=10,
        batch_size=4,
        lr=1e-2,
        seed=0,
        pad_id=pad,
        max_grad_norm=1e-3,  # clips every step: the curve keeps the norm before clipping
        on_step=lambda *record: seen.append(record),
    )
    factor = warmup_cosine(1, 10)
    assert [lr for _, lr, _ in result.curve] == [1e-2 * factor(s) for s in range(10)]
    assert result.curve[0][0] == loss.item() and result.curve[0][2] == pytest.approx(norm.item(), rel=1e-6)
    assert all(g > 1e-3 for _, _, g in result.curve)
    assert seen == [(step, *point) for step, point in enumerate(result.curve)]
    assert result.final_loss == result.curve[-1][0]


def _run(task_file, store: Store, **kwargs):
    return run_one(
        load_task_file(task_file),
        methods().get("et"),
        seed=0,
        store=store,
        session=Session(),
        model="builtin:tiny",
        **kwargs,
    )


def test_a_run_stores_every_step_in_its_own_transaction(tmp_path, tiny_builtin, small_task_file):
    store = Store(tmp_path / "r.duckdb")
    outcome = _run(small_task_file, store)  # the small task: 3 steps, lr 0.03 (et's default)
    rows = store.query("SELECT run_id, stage, step, loss, lr, grad_norm FROM curves ORDER BY step")
    assert rows.run_id.tolist() == [outcome.run_id] * 3 and rows.stage.tolist() == [1, 1, 1]
    assert rows.step.tolist() == [0, 1, 2] and rows.lr.tolist() == [0.03, 0.03, 0.015]
    assert rows.loss.iloc[-1] == outcome.metrics["final_train_loss"]
    assert (rows.grad_norm > 0).all()
    # a rerecorded run replaces its rows: none of the old ones stay
    run = store.query("SELECT * FROM runs").iloc[0].to_dict()
    run.update(config={}, versions={})
    store.record(run, {"target_loss": 1.0}, curves=[(1, 0, 2.0, 0.1, 3.0)])
    assert store.query("SELECT stage, step, loss, lr, grad_norm FROM curves").values.tolist() == [
        [1, 0, 2.0, 0.1, 3.0]
    ]


class FakeTracker(types.ModuleType):
    """trackio's and wandb's calls, recorded."""

    def __init__(self, name: str):
        super().__init__(name)
        self.calls = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))

    def log(self, values, step=None):
        self.calls.append(("log", values, step))

    def finish(self):
        self.calls.append(("finish",))


def _cli_run(task_file, db, *extra) -> list[str]:
    return ["run", "--task", "small", "--method", "et", "--model", "builtin:tiny"] + [
        "--task-dir",
        str(task_file.parent),
        "--db",
        str(db),
        *extra,
    ]


@pytest.mark.parametrize("tracker", ["trackio", "wandb"])
def test_live_logging_sends_each_step_and_the_results_to_the_tracker(
    tmp_path, tiny_builtin, small_task_file, monkeypatch, capsys, tracker
):
    fake = FakeTracker(tracker)
    monkeypatch.setitem(sys.modules, tracker, fake)
    db = tmp_path / "r.duckdb"
    assert main(_cli_run(small_task_file, db, "--log", tracker)) == 0
    store = Store(db)
    [(run_id, config)] = store.query("SELECT run_id, config FROM runs").values.tolist()
    curve = store.query("SELECT step, loss, lr, grad_norm FROM curves ORDER BY step").values.tolist()
    metrics = dict(store.query("SELECT metric, value FROM metrics").values.tolist())
    init, *steps, result, finish = fake.calls
    assert init == ("init", {"project": "clbench", "name": run_id, "config": json.loads(config)})
    assert steps == [
        ("log", {"train/loss": loss, "train/lr": lr, "train/grad_norm": norm}, int(step))
        for step, loss, lr, norm in curve
    ]
    assert result == ("log", {f"result/{k}": v for k, v in sorted(metrics.items())}, None)
    assert finish == ("finish",)


@pytest.mark.parametrize("tracker", ["trackio", "wandb"])
def test_a_tracker_that_is_not_installed_is_one_line_before_any_run(
    tmp_path, tiny_builtin, small_task_file, monkeypatch, capsys, tracker
):
    monkeypatch.setitem(sys.modules, tracker, None)  # import fails as for a package that is not installed
    assert main(_cli_run(small_task_file, tmp_path / "r.duckdb", "--log", tracker)) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (
        f"clbench: error: --log {tracker}: the package {tracker} is not installed (pip install {tracker})\n"
    )
    assert not (tmp_path / "r.duckdb").exists()


# ---------------------------------------------------------------- per-example records


def test_log_samples_stores_each_example_and_leaves_the_run_id_alone(tmp_path, tiny_builtin, small_task_file, capsys):
    plain, sampled = tmp_path / "plain.duckdb", tmp_path / "sampled.duckdb"
    assert main(_cli_run(small_task_file, plain)) == 0
    assert main(_cli_run(small_task_file, sampled, "--log-samples")) == 0
    assert Store(plain).query("SELECT run_id FROM runs").equals(Store(sampled).query("SELECT run_id FROM runs"))
    assert Store(plain).query("SELECT count(*) AS n FROM samples").n.tolist() == [0]

    store = Store(sampled)
    metrics = dict(store.query("SELECT metric, value FROM metrics").values.tolist())
    rows = store.query("SELECT * FROM samples ORDER BY eval_set, example")
    target, old = rows[rows.eval_set == "target"], rows[rows.eval_set == "old_text"]
    task = load_task_file(small_task_file)
    data = task.build(task.resolved()[2], char_tokenizer())
    assert len(target) == len(data.target_test) == 20 and len(old) == len(data.old_text) == 10
    assert target.example.tolist() == list(range(20))
    assert (target.prompt + "|" + target.completion).tolist() == [
        f"{e.prompt}|{e.completion}" for e in data.target_test
    ]
    assert old.completion.tolist() == data.old_text and (old.prompt == "").all()
    # the character tokenizer: the first completion position expects the completion's first character
    assert target.expected.tolist() == [e.completion[0] for e in data.target_test]
    # the run's metrics are these rows' aggregates
    assert (target.prediction_old == target.expected).mean() == metrics["target_top1"]
    assert target.nll_old.sum() / target.n_old.sum() == pytest.approx(metrics["target_loss"], rel=1e-6)
    assert target.nll_full.sum() / target.n_full.sum() == pytest.approx(metrics["target_loss_full"], rel=1e-6)
    assert old.base_nll_old.sum() / old.n_old.sum() == pytest.approx(metrics["old_loss_base"], rel=1e-6)
    assert target.base_nll_old.isna().all()
    # et leaves every old weight as it was: each old text scores as under the base, to the bit
    assert metrics["forgetting_oldvocab"] == 0.0 and (old.nll_old == old.base_nll_old).all()
    assert (old.nll_full > old.nll_old).all()  # the new row takes probability mass under the full softmax


# ---------------------------------------------------------------- a run's own peak memory

BIG = 256 * 2**20  # bytes: far above a tiny run's own allocations (under 1 MiB measured) and sampling noise


def test_a_run_does_not_report_the_peak_of_the_run_before_it():
    spec = methods().get("et")

    def hungry(model, expansion, config):  # 256 MiB, touched, for 6 sampling intervals, freed before the run ends
        ballast = torch.ones(BIG // 4)
        time.sleep(0.3)
        del ballast  # only the sampling thread can have seen it
        return spec.setup(model, expansion, config)

    runs = [dataclasses.replace(spec, setup=hungry), spec]
    plan = lambda m: tiny_plan(tiny_base(False), tiny_data(), m, BUDGET)
    values = [adapt_and_evaluate(plan(m), session=Session()).values for m in runs]
    first, second = (v["peak_rss_increase_mb"] for v in values)
    assert "peak_mem_mb" not in values[1]  # a CPU run: no CUDA peak
    # the first run's peak holds its ballast; the second's is its own (under 1 MiB measured; 16: room for the
    # allocator keeping pages); with ru_maxrss the second would report at least the first's 256
    assert BIG / 2**20 <= first < BIG / 2**20 + 16
    assert 0 <= second < 16


def test_the_sampler_stops_when_a_run_drops_it_without_reading_it():
    memory = PeakMemory(torch.device("cpu"))
    thread = memory.thread
    assert thread.is_alive()
    del memory  # a run that raised before its metrics
    gc.collect()
    thread.join(timeout=1)
    assert not thread.is_alive()


# ---------------------------------------------------------------- the leaderboard


def test_the_leaderboard_plots_curves_and_shows_the_worst_examples(tmp_path):
    from leaderboard_db import EVIL, record

    store = Store(tmp_path / "r.duckdb")
    for run_id, method, seed in [("a0", "et", 0), ("a1", "et", 1), ("b0", "fft", 0)]:
        record(store, run_id, "arith", method, "tiny", seed, {"target_loss": 1.0})
    run = store.query("SELECT * FROM runs WHERE run_id = 'b0'").iloc[0].to_dict()
    run.update(config={"method": "fft", "budget": {"n_train": 200}, "method_config": {"lr": 0.01}}, versions={})
    samples = [
        # eval_set, example, prompt, completion, nll_old, n_old, nll_full, n_full, base_nll_old, expected, preds
        ("old_text", 0, "", "calm", 4.0, 4, 4.0, 4, 4.0, "c", "c", "c"),
        ("old_text", 1, "", EVIL, 9.0, 3, 12.0, 3, 3.0, "<", "x", "<new>"),  # Δ full 3.0 per token: the worst
        ("old_text", 2, "", "mild", 5.0, 2, 6.0, 2, 4.0, "m", "m", "m"),  # Δ full 1.0
        ("old_text", 3, "", "flat", 2.0, 2, 2.2, 2, 2.0, "f", "f", "f"),  # Δ full 0.1
        ("target", 0, "2*3=", "6", 0.5, 1, 0.6, 1, None, "6", "6", "6"),
    ]
    store.record(run, {"target_loss": 2.0}, curves=[(1, s, 3.0 - s, 0.01, 1.5) for s in range(10)], samples=samples)
    page = (leaderboard.build(tmp_path / "r.duckdb", tmp_path / "out") / "index.html").read_text()
    assert page.count("gradient norm (before clipping)") == 1  # one task with curves: one figure
    assert EVIL not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    examples = page[page.index("Examples (1 runs with --log-samples)") :]
    worst = examples[examples.index("most forgotten old text") : examples.index("worst target examples")]
    assert worst.index("&lt;script&gt;") < worst.index("mild") < worst.index("flat")
    assert "calm" not in worst  # 3 shown: calm (Δ 0) is the fourth
    # example 1: Δ NLL per token (12 − 3) / 3 under the full softmax, (9 − 3) / 3 under the old; tokens quoted
    row = "<td>1</td><td>&lt;script&gt;alert(1)&lt;/script&gt;</td><td>3</td><td>2</td>"
    assert row + "<td>&quot;&lt;&quot;</td><td>&quot;x&quot;</td><td>&quot;&lt;new&gt;&quot;</td>" in re.sub(
        r">\s+<", "><", worst
    )
    assert "fft · seed 0 · run b0" in examples
