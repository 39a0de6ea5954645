"""Which process holds a run, and whether that process still lives.

A claim records host, pid and the process's start token (boot id + the kernel's start time of the pid),
so a later process can tell a holder that is gone — killed, crashed, rebooted — from a live one, and a
reused pid from the process that claimed the run.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start: str | None  # None where there is no /proc (then liveness falls back to signal 0)

    @classmethod
    def me(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), start_token(os.getpid()))

    def alive(self) -> bool:
        """Whether this process, on this host, still runs (another host's processes cannot be seen)."""
        if Path("/proc/self/stat").exists():
            return self.start is not None and start_token(self.pid) == self.start
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # exists, owned by another user
        return True

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"


def start_token(pid: int) -> str | None:
    """boot id + start time of pid (field 22 of /proc/PID/stat); None if the process is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name before ')' may hold spaces
    if fields[0] in ("Z", "X"):  # killed but not yet reaped: it will never write again
        return None
    return f"{boot}:{fields[19]}"
