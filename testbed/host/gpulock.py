"""One host is one GPU: the per-host lock that every process computing on the host's GPU holds
while it computes (the training worker for F, B and OPT; the prefill server for a prefill).

One job: mutual exclusion of GPU compute between processes of one emulated host. In profile mode
a compute span is a timed hold, so nothing else would stop a prefill and a training op from
"running" at once; on a real GPU they would time-slice it and both slow down about 2x
(../shared/data/gpu-profiles/h200-colocation.json). With this lock they take turns instead: a
prefill that overruns its bubble delays the next training op by exactly the overrun, which the
worker records (GPU_WAIT) as the slowdown it is.

The lock is flock(2) on a file in the run folder (Mininet hosts are network namespaces of one
kernel and share the filesystem), so it is released by the kernel when its holder dies: a crashed
prefill server cannot wedge training.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class GpuLock:
    """flock-based exclusive lock on `path` (created if missing). Not reentrant."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.held = False

    def acquire(self) -> int:
        """Block until this process holds the GPU; returns the nanoseconds waited (0 if free)."""
        if self.try_acquire():
            return 0
        t0 = time.time_ns()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.held = True
        return time.time_ns() - t0

    def try_acquire(self) -> bool:
        """Take the GPU if nobody holds it; never blocks."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self.held = False

    def close(self) -> None:
        self.release()
        os.close(self._fd)

    def __enter__(self) -> "GpuLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
