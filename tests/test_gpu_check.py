"""bench/gpu_check.py, the prepared GPU check: its tiny shape runs here on the CPU, so the script a lent GPU
runs is known to work; the real shape runs only where CUDA is."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
LINE = re.compile(
    r"^\s*(et|fft|eval): +[\d.]+ ms/(step|pass) +(\d+) tokens/s +MFU +[\d.]+% +peak +(nan|[\d.]+) GiB$", re.M
)


def check(args: list[str], timeout: int) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    rows = {m.group(1): int(m.group(3)) for m in LINE.finditer(done.stdout)}
    assert set(rows) == {"et", "fft", "eval"} and all(rate > 0 for rate in rows.values()), done.stdout
    assert re.search(r"^ET/FFT time per step: \d+\.\d\d$", done.stdout, re.M), done.stdout
    return done.stdout


def test_the_gpu_check_runs_clbench_et_fft_and_eval_on_a_tiny_shape_on_the_cpu():
    out = check(["--shape", "tiny", "--device", "cpu", "--steps", "1", "--batch", "4"], timeout=120)
    assert out.startswith("cpu, torch ") and "tiny shape, batch 4 × seq 64, 1 steps" in out


def test_the_gpu_check_says_so_when_no_gpu_is_there():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert (
        done.returncode == 1
        and done.stderr.strip() == "gpu_check: torch sees no CUDA GPU (use --shape tiny --device cpu for a smoke test)"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_gpu_check_on_llama_3_2_1b_shape():
    print(check([], timeout=600))
