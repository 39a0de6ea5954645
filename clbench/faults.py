"""Test-only fault injection: crash and concurrency tests make a real process die or stall at a named point.

    CLBENCH_TEST_FAULT=record:kill@2        SIGKILL this process the 2nd time it reaches `record`
    CLBENCH_TEST_FAULT=train-step:sleep=0.2  pause 0.2 s every time it reaches `train-step`

Points: `train-step` (after each optimizer step), `record` (inside the transaction that writes a
run's row and metrics, before COMMIT) and `merge` (inside a merge's transaction, before COMMIT).
Unset — as always outside tests — it does nothing.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

_reached: Counter[str] = Counter()


def fault_point(name: str) -> None:
    spec = os.environ.get("CLBENCH_TEST_FAULT")
    if not spec:
        return
    point, _, action = spec.partition(":")
    if point != name:
        return
    action, _, nth = action.partition("@")
    _reached[name] += 1
    if nth and _reached[name] != int(nth):
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("sleep="):
        time.sleep(float(action.removeprefix("sleep=")))
