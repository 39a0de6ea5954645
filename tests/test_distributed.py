"""GPU-scale paths, exercised on CPU: device_map placement (models.load_base) and data-parallel
training under `accelerate launch` (clbench/distributed.py).

On a CPU-only machine device_map="auto" puts every module on the CPU; an explicit map with "disk"
makes accelerate offload a layer and swap it in per forward, which is the code path of a model too
large for its GPUs. Several processes use gloo on the CPU: `accelerate launch --cpu --num_processes 2`
starts one process in accelerate 1.15 (multi-CPU wants an MPI hostfile), so the test launches
`--multi_gpu` with ACCELERATE_USE_CPU=1, which is torchrun with gloo.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from tiny_setup import cli_env, run_clbench

import clbench
from clbench.arith import char_tokenizer
from clbench.errors import ClbenchError
from clbench.method import methods
from clbench.models import load_base
from clbench.protocol import run_one
from clbench.session import Session
from clbench.store import Store
from clbench.taskspec import load_tasks
from clbench.testing import NOT_REPRODUCIBLE, TASK, save_tiny_model, tiny_llama

# layer 0 on disk: accelerate swaps it in for each forward; embeddings and head stay where clbench writes them
DISK_MAP = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "disk",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "cpu",
}


def run(tiny_cli, tmp_path, method: str, session: Session, seed: int = 0):
    task = load_tasks([tiny_cli.tasks]).get(TASK)
    return run_one(task, methods().get(method), seed=seed, store=Store(tmp_path / "results.duckdb"), session=session)


def reproducible(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in NOT_REPRODUCIBLE}


@pytest.fixture(scope="module")
def plain_et(tiny_cli, tmp_path_factory):
    return run(tiny_cli, tmp_path_factory.mktemp("plain"), "et", Session()).metrics


@pytest.mark.parametrize("device_map", ["auto", DISK_MAP], ids=["auto", "layer-on-disk"])
def test_et_on_a_placed_model_equals_the_plain_run(device_map, plain_et, tiny_cli, tmp_path):
    session = Session(device_map=device_map)
    outcome = run(tiny_cli, tmp_path, "et", session)
    assert outcome.status == "finished"
    assert outcome.metrics["forgetting_oldvocab"] == 0.0
    assert reproducible(outcome.metrics) == reproducible(plain_et)
    base = session.bases[str(tiny_cli.model)]
    # the offloaded layer's weights are read where accelerate keeps them: the same fingerprint as a plain load
    assert base.fingerprint == load_base(str(tiny_cli.model)).fingerprint
    if device_map == DISK_MAP:
        assert base.model.model.layers[0].mlp.up_proj.weight.is_meta


def test_a_placed_model_is_handed_to_the_run_and_reloaded_for_the_next(tiny_cli, tmp_path):
    session = Session(device_map="auto")
    base = session.base(str(tiny_cli.model))
    first = base.model
    loads = []
    reload = base.reload
    base.reload = lambda: loads.append(1) or reload()
    run(tiny_cli, tmp_path, "et", session, seed=0)
    assert loads == []  # the first run took the loaded model itself: no copy, no second load
    run(tiny_cli, tmp_path, "et", session, seed=1)
    assert loads == [1]  # the second run's model: loaded again from the same folder
    assert base.model is not first and len(loads) == 2  # the base itself comes back on the next access


def test_a_reload_that_finds_other_weights_is_an_error(tmp_path):
    folder = save_tiny_model(tmp_path / "model")
    base = load_base(str(folder), device_map="auto")
    base.own_model()
    tiny_llama(char_tokenizer(), tied=False, seed=1).save_pretrained(folder)
    with pytest.raises(ClbenchError, match="changed on disk since this process first loaded it"):
        _ = base.model


def test_fft_on_a_model_with_offloaded_layers_is_refused_in_one_line(tiny_cli, tmp_path):
    with pytest.raises(ClbenchError, match="method 'fft' trains weights that device_map offloaded to cpu/disk"):
        run(tiny_cli, tmp_path, "fft", Session(device_map=DISK_MAP))


def accelerate_launch(
    args: list[str], env: dict[str, str], processes: int = 2, engine: str = "ddp"
) -> subprocess.CompletedProcess:
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "clbench.cli",
        *args,
    ]
    # `--use_fsdp` sets ACCELERATE_USE_FSDP; set directly, accelerate's own FSDP plugin (CUDA-minded) stays out
    engine_env = {"ACCELERATE_USE_FSDP": "true"} if engine == "fsdp" else {}
    return subprocess.run(
        command, env={**env, "ACCELERATE_USE_CPU": "1", **engine_env}, text=True, capture_output=True, timeout=300
    )


def table(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as connection:
        return connection.execute(sql).fetchall()


@pytest.mark.slow
@pytest.mark.parametrize("method, engine", [("fft", "ddp"), ("et", "ddp"), ("ewc", "ddp"), ("fft", "fsdp")])
def test_two_processes_train_one_run_like_one_process(method, engine, tiny_cli, tmp_path):
    """DDP or FSDP2 over gloo: one finished row, one attempt, the one-process metrics up to float sum order."""
    env = cli_env(tmp_path / "cache")
    one = run_clbench(tiny_cli.run_args(tmp_path / "one.duckdb", "--method", method), env)
    assert one.returncode == 0, one.stderr
    two = accelerate_launch(tiny_cli.run_args(tmp_path / "two.duckdb", "--method", method), env, engine=engine)
    assert two.returncode == 0, two.stderr
    assert (
        two.stderr.count("1 runs: 1 finished") == 1 and two.stdout.count(TASK) == 1
    )  # the main process alone reports
    db = tmp_path / "two.duckdb"
    assert table(db, "SELECT status FROM runs") == [("finished",)]
    assert table(db, "SELECT attempt, outcome FROM attempts") == [(1, "finished")]
    single, parallel = (
        dict(table(tmp_path / f"{n}.duckdb", "SELECT metric, value FROM metrics")) for n in ("one", "two")
    )
    assert single.keys() == parallel.keys()
    # ewc's penalty gradient (λ = 1e6) dwarfs the task's, whose last-bit differences then weigh more:
    # measured 2.1e-7 relative on forgetting_full, 1.7e-7 on final_train_loss
    rel = 1e-6 if method == "ewc" else 1e-7
    for metric in single.keys() - NOT_REPRODUCIBLE:
        # the gradient is a sum over two shards instead of one batch: the weights differ in the last
        # float32 bits, and fused AdamW carries them a little further (measured: 1.4e-8 on forgetting_oldvocab
        # after FFT, 1.7e-8 on word_gap after ewc, both differences of ~2.8-nat losses; 4.5e-10 before fused)
        assert parallel[metric] == pytest.approx(single[metric], rel=rel, abs=5e-8), metric
    for exact in ("tokens_seen", "trainable_params", "target_loss_init", "old_loss_base", "target_acc"):
        assert parallel[exact] == single[exact], exact
    if method == "et":
        assert parallel["forgetting_oldvocab"] == 0.0

    again = accelerate_launch(tiny_cli.run_args(db, "--method", method), env, engine=engine)
    assert again.returncode == 0 and "0 finished, 1 already in" in again.stderr, again.stderr
    assert table(db, "SELECT count(*) FROM attempts") == [(1,)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, message",
    [
        ("et", "trains new rows outside the model and needs no sharding"),
        ("et-out", "trains new rows outside the model and needs no sharding"),  # train_vocab "full", rows outside
        ("ewc", "computes its penalty on references to the unsharded weights"),
    ],
)
def test_fsdp_refuses_methods_it_cannot_shard_before_writing(method, message, tiny_cli, tmp_path):
    done = accelerate_launch(
        tiny_cli.run_args(tmp_path / "r.duckdb", "--method", method), cli_env(tmp_path / "cache"), engine="fsdp"
    )
    # each process exits 2 with the one line (clbench.cli); accelerate's launcher then exits 1
    assert done.returncode == 1 and f"clbench: error: method {method!r} {message}" in done.stderr
    # no clbench frame in any traceback (the launcher prints its own ChildFailedError one)
    assert f'File "{Path(clbench.__file__).parent}' not in done.stderr
    assert not (tmp_path / "r.duckdb").exists() or table(tmp_path / "r.duckdb", "SELECT count(*) FROM attempts") == [
        (0,)
    ]
