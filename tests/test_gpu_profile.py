"""bench/gpu_profile.py, the script a lent GPU runs for the text tasks' gpu profile: its whole path (runs, page,
report, walls.json) runs here on the arithmetic task's small default, on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import torch

from clbench.taskspec import load_tasks

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_profile.py"


def test_the_gpu_profile_script_runs_its_whole_path_on_the_cpu(tmp_path):
    args = ["--tasks", "arithmetic", "--profile", "none", "--methods", "et", "--budget", "steps=2", "--device", "cpu"]
    args += [
        f"--param={key}=20" for key in ("n_test", "n_old_skill", "n_old_text", "n_validation", "n_validation_old")
    ]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "== arithmetic: " in done.stdout and "exit 0 (target: ≤ 600 s per seed)" in done.stdout
    with duckdb.connect(str(tmp_path / "results.duckdb"), read_only=True) as db:
        runs = db.execute("SELECT task, method, status, json_extract(config, '$.budget.steps') FROM runs").fetchall()
    assert runs == [("arithmetic", "et", "finished", "2")]
    facts = json.loads((tmp_path / "walls.json").read_text())
    assert facts["device"] == "cpu" and facts["tasks"]["arithmetic"]["exit"] == 0
    assert "## arithmetic" in (tmp_path / "leaderboard.md").read_text()
    assert (tmp_path / "report.md").read_text().startswith("# ")


def test_the_gpu_profile_script_says_so_when_no_gpu_is_there():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.strip() == (
        "gpu_profile: torch sees no CUDA GPU (--device cpu with a small --budget for a smoke test)"
    )


@pytest.mark.parametrize("name", ["pseudowords", "xling-es", "xling-de", "xling-ar"])
def test_the_gpu_profile_is_ten_times_the_cpu_profiles_steps_on_more_data(name):
    task = load_tasks().get(name)
    (_, cpu, cpu_params), (model, gpu, gpu_params) = task.resolved("cpu"), task.resolved("gpu")
    assert model == "builtin:smollm2-135m" and gpu.steps == 10 * cpu.steps and gpu.n_train >= 4 * cpu.n_train
    assert gpu_params == cpu_params  # the same task, only the budget grows
    assert task.lrs("gpu") == task.lrs("cpu")
