"""A run's own peak memory, not the process's.

On CUDA torch keeps the peak itself: reset at the run's start, read at its end (`peak_mem_mb`). On CPU
the only peak the kernel keeps is the process's lifetime high-water mark (ru_maxrss): in `--method all`
every run after ewc would report ewc's. So a thread samples the process's resident set every
SAMPLE_SECONDS and the run reports its peak minus the resident set at its start
(`peak_rss_increase_mb`): what the run itself added, whatever ran before it in the process.
"""

from __future__ import annotations

import threading
import weakref

import psutil
import torch

SAMPLE_SECONDS = 0.05
MB = 2**20


def resident_bytes() -> int:
    return psutil.Process().memory_info().rss


class PeakMemory:
    """Started at construction; metrics() stops it and gives the run's memory metric.

    The sampling thread holds the peak in a shared list, not this object: a run that raises before
    metrics() drops the object, and its finalizer stops the thread (no sampler outlives its run)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
            self.device = device
            return
        self.start = resident_bytes()
        self.peak = [self.start]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=_sample, args=(self.peak, self.stop), daemon=True)
        weakref.finalize(self, self.stop.set)
        self.thread.start()

    def metrics(self) -> dict[str, float]:
        if self.cuda:
            return {"peak_mem_mb": torch.cuda.max_memory_allocated(self.device) / MB}
        self.stop.set()
        self.thread.join()
        return {"peak_rss_increase_mb": (max(self.peak[0], resident_bytes()) - self.start) / MB}


def _sample(peak: list[int], stop: threading.Event) -> None:
    process = psutil.Process()
    while not stop.wait(SAMPLE_SECONDS):
        peak[0] = max(peak[0], process.memory_info().rss)
