"""What SCHED_FIFO gets on this machine, for the tests that check what a run recorded: a
fifo:<priority> status where the kernel grants it, refused:<errno> where it refuses (a container
whose cgroup gives real-time tasks no runtime, as Docker's on cgroup v1: cpu.rt_runtime_us = 0,
EPERM), refused:unthrottled where RT throttling is off (testbed.host.realtime refuses then).

Asked once, of a child Python (the test process keeps its own policy), with the bare system
call, not through testbed.host.realtime, whose answer the tests compare with it."""

from __future__ import annotations

import functools
import subprocess
import sys

PROBE = """
import errno, os
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print("granted")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, str(exc.errno)))
"""
RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"


@functools.cache
def refusal() -> str | None:
    """None where a root process here may take SCHED_FIFO, else why not, as set_fifo says it."""
    try:
        with open(RT_RUNTIME) as f:
            if int(f.read()) < 0:
                return "unthrottled"
    except (OSError, ValueError):
        pass
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=30, check=True).stdout.strip()
    return None if out == "granted" else out


def expected(priority: int) -> str:
    """The status testbed.host.realtime.set_fifo(priority) must return here."""
    why = refusal()
    return f"fifo:{priority}" if why is None else f"refused:{why}"


REFUSAL_WARNING = "warning: real-time priority refused for the delay lines ("


def without_refusal_warning(stderr: str) -> str:
    """A run's stderr less the one warning a run prints where SCHED_FIFO is refused here (a
    container without RT runtime); where it is refused the warning must be there, once, and
    where it is granted it must not be."""
    lines = stderr.splitlines(keepends=True)
    warned = [line for line in lines if line.startswith(REFUSAL_WARNING)]
    assert len(warned) == (0 if refusal() is None else 1), \
        f"SCHED_FIFO here: {refusal() or 'granted'}; the run's stderr:\n{stderr}"
    return "".join(line for line in lines if not line.startswith(REFUSAL_WARNING))
