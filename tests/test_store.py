"""The DuckDB store, and the protocol end to end on a tiny builtin base."""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import run_row

from clbench.arith import char_tokenizer
from clbench.errors import ClbenchError
from clbench.method import methods
from clbench.protocol import run_one
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import load_task_file
from clbench.testing import HIDDEN, NOT_REPRODUCIBLE, tiny_llama
from clbench.train import epoch_batches


def results(store: Store) -> list[tuple]:
    frame = store.query(
        "SELECT run_id, task, method, model, seed, metric, value, status FROM results ORDER BY run_id, metric"
    )
    return [
        tuple(None if isinstance(v, float) and math.isnan(v) else v for v in row)
        for row in frame.itertuples(index=False)
    ]


def test_round_trip(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    assert store.status("r1") is None
    assert not (tmp_path / "r.duckdb").exists()  # asking does not create the file
    store.record(run_row("r1"), {"target_acc": 0.5, "trainable_params": 16})
    store.record(run_row("r2", seed=1, method="fft"), {"target_acc": 1.0})
    assert store.status("r1") == "finished"
    assert store.status("r3") is None
    assert results(store) == [
        ("r1", "arithmetic", "et", "builtin:tiny", 0, "target_acc", 0.5, "finished"),
        ("r1", "arithmetic", "et", "builtin:tiny", 0, "trainable_params", 16.0, "finished"),
        ("r2", "arithmetic", "fft", "builtin:tiny", 1, "target_acc", 1.0, "finished"),
    ]
    config, versions = store.query("SELECT config, versions FROM runs WHERE run_id = 'r2'").iloc[0]
    assert config == '{"method": "fft", "seed": 1}' and versions == '{"torch": "x"}'


def test_rerecording_replaces(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    store.record(run_row("r1", status="failed", reason="non-finite training loss at step 1"), {})
    assert store.status("r1") == "failed"
    store.record(run_row("r1"), {"target_acc": 0.25, "target_loss": 2.0})
    store.record(run_row("r1"), {"target_acc": 0.75})  # a metric that disappears goes too
    assert store.status("r1") == "finished"
    assert results(store) == [("r1", "arithmetic", "et", "builtin:tiny", 0, "target_acc", 0.75, "finished")]
    assert store.query("SELECT count(*) AS n FROM runs").n.tolist() == [1]


def test_failed_run_shows_with_null_metric(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    store.record(run_row("ok"), {"target_acc": 1.0})
    store.record(run_row("bad", status="failed", reason="diverged"), {})
    assert store.status("bad") == "failed"
    assert results(store) == [
        ("bad", "arithmetic", "et", "builtin:tiny", 0, None, None, "failed"),
        ("ok", "arithmetic", "et", "builtin:tiny", 0, "target_acc", 1.0, "finished"),
    ]
    assert store.query("SELECT reason FROM runs WHERE run_id = 'bad'").reason.tolist() == ["diverged"]


def test_query_of_a_missing_file(tmp_path):
    with pytest.raises(ClbenchError, match=r"does not exist \(run `clbench run` first\)"):
        Store(tmp_path / "none.duckdb").query("SELECT 1")
    assert not (tmp_path / "none.duckdb").exists()


def test_corrupt_file_is_an_error_and_left_alone(tmp_path):
    path = tmp_path / "corrupt.duckdb"
    junk = os.urandom(8192)
    path.write_bytes(junk)
    store = Store(path)
    for attempt in (
        lambda: store.status("r1"),
        lambda: store.query("SELECT 1"),
        lambda: store.record(run_row("r1"), {"a": 1.0}),
    ):
        with pytest.raises(ClbenchError, match=r"^cannot open results database .*corrupt\.duckdb: "):
            attempt()
    assert path.read_bytes() == junk
    assert sorted(os.listdir(tmp_path)) == ["corrupt.duckdb"]  # no WAL or sidecar left behind


def test_directory_or_missing_folder_is_an_error(tmp_path):
    (tmp_path / "d.duckdb").mkdir()
    with pytest.raises(ClbenchError, match=r"^results database .*d\.duckdb is a directory$"):
        Store(tmp_path / "d.duckdb")
    with pytest.raises(ClbenchError, match=r"^results database folder .*nowhere does not exist$"):
        Store(tmp_path / "nowhere" / "r.duckdb")


# ---------------------------------------------------------------- the protocol end to end


def _run(task_file, method: str, store: Store, session: Session | None = None, model: str = "builtin:tiny", **kwargs):
    return run_one(
        load_task_file(task_file),
        methods().get(method),
        seed=0,
        store=store,
        session=session or Session(),
        model=model,
        n_train=8,
        **kwargs,
    )


@pytest.mark.parametrize("model", ["builtin:tiny", "builtin:tiny-tied"])
def test_et_run_end_to_end(tmp_path, tiny_builtin, small_task_file, model):
    store = Store(tmp_path / "r.duckdb")
    session = Session()
    outcome = _run(small_task_file, "et", store, session, model=model)
    assert outcome.status == "finished" and outcome.reason is None
    values = outcome.metrics
    assert values["forgetting_oldvocab"] == 0.0
    assert values["old_skill_acc_delta"] == 0.0
    assert values["old_skill_acc"] == values["old_skill_acc_base"]
    assert values["trainable_params"] == HIDDEN
    assert values["forgetting_full"] > 0.0  # the new token takes probability mass under the full softmax
    # tokens_seen: the non-padding tokens of the 3 × 4 sequences the seed-0 batch order picks
    task = load_task_file(small_task_file)
    train = task.build(task.resolved()[2], char_tokenizer()).train[:8]
    lengths = [
        1 + len(e.prompt) - len("<spec>") + 1 + len(e.completion) + 1 for e in train
    ]  # bos … eos, <spec> one token
    order = [i for batch in epoch_batches(8, 4, 3, torch.Generator().manual_seed(0)) for i in batch]
    assert values["tokens_seen"] == sum(lengths[i] for i in order)
    assert {"target_acc_seen", "target_acc_unseen"} <= set(values)
    assert math.isfinite(values["target_loss"]) and math.isfinite(values["final_train_loss"])
    assert store.status(outcome.run_id) == "finished"
    stored = dict(store.query("SELECT metric, value FROM results WHERE run_id = ?", [outcome.run_id]).values.tolist())
    assert stored == {k: float(v) for k, v in values.items()}

    again = _run(small_task_file, "et", store, session, model=model)
    assert (again.run_id, again.status, again.metrics) == (outcome.run_id, "skipped", {})
    assert store.query("SELECT count(*) AS n FROM runs").n.tolist() == [1]


def test_fft_run_end_to_end(tmp_path, tiny_builtin, small_task_file):
    store = Store(tmp_path / "r.duckdb")
    outcome = _run(small_task_file, "fft", store)
    assert outcome.status == "finished"
    base = tiny_llama(char_tokenizer(), tied=False)
    # every weight of the expanded model: the base's plus one input and one output row
    assert outcome.metrics["trainable_params"] == sum(p.numel() for p in base.parameters()) + 2 * HIDDEN
    assert outcome.metrics["forgetting_oldvocab"] != 0.0


def test_runs_are_deterministic(tmp_path, tiny_builtin, small_task_file):
    first = _run(small_task_file, "et", Store(tmp_path / "a.duckdb"), Session())
    second = _run(small_task_file, "et", Store(tmp_path / "b.duckdb"), Session())
    assert first.status == second.status == "finished"
    assert first.run_id == second.run_id
    strip = lambda values: {k: v for k, v in values.items() if k not in NOT_REPRODUCIBLE}
    assert strip(first.metrics) == strip(second.metrics)
    assert set(first.metrics) == set(second.metrics)


def test_a_run_records_the_commit_it_started_with(tmp_path, tiny_builtin, small_task_file, monkeypatch):
    import clbench.protocol

    trained = []
    train = clbench.protocol.train
    monkeypatch.setattr(clbench.protocol, "train", lambda *a, **k: trained.append(1) or train(*a, **k))
    monkeypatch.setattr(clbench.protocol, "git_commit", lambda: "moved" if trained else "started")
    store = Store(tmp_path / "r.duckdb")
    assert _run(small_task_file, "et", store).status == "finished" and trained
    assert store.query("SELECT git_commit FROM runs").git_commit.tolist() == ["started"]


def test_a_diverged_run_is_recorded_as_failed(tmp_path, tiny_builtin, small_task_file):
    store = Store(tmp_path / "r.duckdb")
    outcome = _run(small_task_file, "fft", store, options={"lr": "1e30"})  # lr inf is refused as bad input
    assert outcome.status == "failed"
    assert outcome.metrics == {}
    assert outcome.reason.startswith("non-finite")
    assert store.status(outcome.run_id) == "failed"
    assert results(store) == [(outcome.run_id, "small", "fft", "builtin:tiny", 0, None, None, "failed")]
    # a failed run is not "done": asking again runs it again (and fails again), still one row
    assert _run(small_task_file, "fft", store, options={"lr": "1e30"}).status == "failed"
    assert store.query("SELECT count(*) AS n FROM runs").n.tolist() == [1]


def test_n_train_beyond_the_pool_is_an_error(tmp_path, tiny_builtin, small_task_file):
    with pytest.raises(ClbenchError, match=r"n_train 10000 exceeds the \d+ training examples"):
        run_one(
            load_task_file(small_task_file),
            methods().get("et"),
            seed=0,
            store=Store(tmp_path / "r.duckdb"),
            session=Session(),
            model="builtin:tiny",
            n_train=10000,
        )
    assert not (tmp_path / "r.duckdb").exists()
