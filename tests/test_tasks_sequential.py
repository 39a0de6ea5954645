"""The sequential task through the one protocol, on a tiny in-process model: the stage × task
matrix is stored with the run, and ET's structure shows in it exactly (frozen backbone, each stage
training only its own rows: no transfer in either direction, no forgetting)."""

import pytest
import yaml

from clbench import cl_metrics
from clbench.method import methods
from clbench.protocol import run_one
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import builtin_task_dir, load_task_file
from clbench.testing import tiny_base

STAGES = ["spec", "plus", "times"]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CLBENCH_CACHE", str(tmp_path / "cache"))


def tiny_session() -> Session:
    session = Session()
    session.bases["builtin:arith-llama"] = tiny_base(tied=False, name="builtin:arith-llama")
    return session


@pytest.fixture
def tiny_task(tmp_path):
    spec = yaml.safe_load((builtin_task_dir() / "sequential.yaml").read_text())
    spec.update(
        name="sequential-tiny",
        generator=f"{builtin_task_dir() / 'sequential.py'}:build",
        budget={"n_train": 16, "steps": 4, "batch_size": 8, "eval_batch_size": 64},
    )
    spec["params"].update(n_test=12, n_pool=16, n_old_skill=10, n_old_text=10, n_replay=0)
    path = tmp_path / "sequential-tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_task_file(path)


def stored(db, method):
    store = Store(db)
    run = store.query("SELECT run_id FROM runs WHERE method = ?", [method]).run_id.item()
    cells = store.query("SELECT after_stage, eval_stage, metric, value FROM stage_matrix WHERE run_id = ?", [run])
    values = dict(store.query("SELECT metric, value FROM metrics WHERE run_id = ?", [run]).itertuples(index=False))
    matrix = {(r.after_stage, r.eval_stage, r.metric): r.value for r in cells.itertuples()}
    return matrix, values


def R(matrix, metric):
    return [[matrix[a, e, metric] for e in range(1, 4)] for a in range(4)]


def test_et_stage_matrix_shows_no_transfer_and_no_forgetting(tmp_path, tiny_task):
    db = tmp_path / "r.duckdb"
    outcome = run_one(tiny_task, methods().get("et"), seed=0, store=Store(db), session=tiny_session())
    assert outcome.status == "finished"
    matrix, values = stored(db, "et")
    # 4 rows (before training, after each stage) × (old text: 2 losses, 2 drifts + 3 stages × 3 metrics)
    assert len(matrix) == 4 * (4 + 3 * 3)
    loss, acc = R(matrix, "target_loss"), R(matrix, "target_acc")
    for j in range(3):
        assert len({loss[i][j] for i in range(j + 1)}) == 1  # untouched until its own stage
        assert len({loss[i][j] for i in range(j + 1, 4)}) == 1  # and untouched after it
        assert loss[j + 1][j] != loss[j][j]  # its own stage moved it
    assert len({matrix[a, 0, "loss_oldvocab"] for a in range(4)}) == 1
    assert [matrix[a, 0, "drift_kl_oldvocab"] for a in range(4)] == [0.0] * 4  # every old transition kept
    # et trains input rows under the old softmax: the new output rows, and so the mass they take from old text
    # under the full softmax, are those every stage's tokens were added with
    full = [matrix[a, 0, "drift_kl_full"] for a in range(4)]
    assert full[0] > 0 and full == [full[0]] * 4
    assert values["bwt_target_loss"] == 0.0 and values["fwt_target_loss"] == 0.0
    assert values["forgetting_oldvocab"] == 0.0 and values["trainable_params"] == 16  # one 16-wide row per stage
    # the stored run-level numbers are the pure functions of the stored matrix
    assert values["avg_target_acc"] == cl_metrics.average(acc)
    assert values["forgetting_target_loss_spec"] == cl_metrics.forgetting(loss, False)[0]
    assert values["fwt_target_acc"] == cl_metrics.forward_transfer(acc, True)
    # every step of every stage in the curves table, each stage under its own warm-up and decay
    curves = Store(db).query("SELECT stage, step, lr FROM curves ORDER BY stage, step")
    assert list(zip(curves.stage, curves.step)) == [(stage, step) for stage in (1, 2, 3) for step in range(4)]
    assert curves.lr.tolist() == curves.lr[:4].tolist() * 3 and curves.lr[0] > curves.lr[3]


def test_fft_moves_every_stage(tmp_path, tiny_task):
    db = tmp_path / "r.duckdb"
    run_one(tiny_task, methods().get("fft"), seed=0, store=Store(db), session=tiny_session())
    matrix, values = stored(db, "fft")
    loss = R(matrix, "target_loss")
    assert loss[1][2] != loss[0][2]  # training stage 1 changed how stage 3 scores: forward transfer
    assert values["fwt_target_loss"] == cl_metrics.forward_transfer(loss, False) != 0.0
    assert values["forgetting_oldvocab"] != 0.0
    drift = [matrix[a, 0, "drift_kl_oldvocab"] for a in range(4)]
    assert drift[0] == 0.0 and min(drift[1:]) > 0  # the base against itself, then every stage moved old transitions
    assert values["drift_kl_oldvocab"] == drift[3]  # the run's number is the one after its last stage
