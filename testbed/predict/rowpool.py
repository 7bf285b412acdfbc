"""Independent model computations in worker processes, each result taken when the caller
needs it. Pure but for the processes: no root, no network.

One job: `whatif`'s rows at once on a machine's cores. The workers are spawned (not forked: the
caller may hold threads), ignore SIGINT (the caller's Ctrl-C stops the table, not each worker
with a traceback of its own) and are ended when the pool's block ends, by return, error or
interrupt (multiprocessing.Pool's terminate: its own children, not yet reaped). A caller that
must end them on SIGTERM or SIGHUP too makes those raise KeyboardInterrupt (the `whatif`
command: testbed.emulation.interrupts.installed). With one worker nothing is spawned: each
computation runs in the caller when it is submitted.
"""

from __future__ import annotations

import multiprocessing
import signal
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol


class Result(Protocol):
    def get(self) -> Any: ...


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class _Inline:
    def submit(self, fn: Callable[[Any], Any], task: Any) -> Result:
        return _Done(fn(task))


class _Spawned:
    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, fn: Callable[[Any], Any], task: Any) -> Result:
        """fn(task) in a worker; fn module-level, task picklable."""
        return self.pool.apply_async(fn, (task,))


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def rows_pool(workers: int) -> Iterator[_Inline | _Spawned]:
    """A pool of `workers` processes (one: the caller itself) with submit(fn, task) -> a
    result whose get() waits for it (and raises what fn raised)."""
    if workers <= 1:
        yield _Inline()
        return
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_ignore_sigint) as pool:
        yield _Spawned(pool)

