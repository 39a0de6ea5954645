"""The text tasks' `gpu` profile on one GPU, offline: every method × the seeds given of each task, into one
database, then its leaderboard page and `report --paper` (issue 24).

    python bench/gpu_profile.py --out gpu-results                       # pseudowords and xling-es, seed 0
    python bench/gpu_profile.py --tasks pseudowords --seeds 0,1,2 --out gpu-results
    python bench/gpu_profile.py --tasks arithmetic --profile none --methods et --budget steps=2 --device cpu --out /tmp/g

Nothing here reaches the network: the hub is set offline before clbench loads, and the gpu profiles use the
packaged SmolLM2-135M and corpora (../shared/ASSETS.md). Each task's wall time is printed beside the
profile's target of 10 minutes for every method × 1 seed on one H200. The profiles' lrs are their cpu
profile's, not searched at this budget: a publishable table searches them first (`clbench tune --profile gpu`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers or datasets is imported
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

TARGET_SECONDS = 600  # every method × 1 seed of one task (tasks/pseudowords.yaml, tasks/_xling.yaml: gpu)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-results"), help="results.duckdb, pages, walls.json")
    parser.add_argument("--tasks", default="pseudowords,xling-es", help="comma-separated (default: %(default)s)")
    parser.add_argument("--profile", default="gpu", help="the tasks' profile; none: their default (%(default)s)")
    parser.add_argument("--methods", default="all", help="as `clbench run --method` (default: %(default)s)")
    parser.add_argument("--seeds", default="0", help="comma-separated (default: %(default)s)")
    parser.add_argument("--budget", action="append", default=[], metavar="KEY=VALUE", help="as `clbench run`")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="as `clbench run`")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu (a smoke test)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "gpu_profile: torch sees no CUDA GPU (--device cpu with a small --budget for a smoke test)",
            file=sys.stderr,
        )
        return 1
    from clbench.cli import main as clbench

    args.out.mkdir(parents=True, exist_ok=True)
    db, walls, failed = str(args.out / "results.duckdb"), {}, False
    profile = [] if args.profile == "none" else ["--profile", args.profile]
    overrides = [flag for key in ("budget", "param") for pair in getattr(args, key) for flag in (f"--{key}", pair)]
    for task in args.tasks.split(","):
        start = time.perf_counter()
        how = ["--method", args.methods, "--seeds", args.seeds, "--device", args.device, "--db", db]
        code = clbench(["run", "--task", task, *profile, *how, *overrides])
        walls[task] = {"seconds": round(time.perf_counter() - start, 1), "exit": code}
        failed |= code != 0
        print(f"== {task}: {walls[task]['seconds']:.0f} s wall, exit {code} (target: ≤ {TARGET_SECONDS} s per seed)")
    failed |= clbench(["leaderboard", "--db", db, "--out", str(args.out)]) != 0
    failed |= clbench(["report", "--paper", "--db", db, "--out", str(args.out / "report.md")]) != 0
    device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    facts = {"device": device, "torch": torch.__version__, "profile": args.profile, "seeds": args.seeds}
    (args.out / "walls.json").write_text(json.dumps(facts | {"tasks": walls}, indent=1) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
