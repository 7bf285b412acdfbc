"""Real-time priority for every thread the testbed runs at SCHED_FIFO: one table, one helper.

PRIORITY names each real-time user. set_fifo is the only way any of them gets there, with the
guards that keep a runaway loop from taking the machine: it refuses while the kernel's RT
throttling is off (sched_rt_runtime_us = -1; by default RT tasks get at most 95% of each
second), it sets RLIMIT_RTTIME, and it sets SCHED_RESET_ON_FORK, so that no process or thread
created by a real-time thread (pyroute2's fork children, a thread a library starts) inherits
the priority.

RLIMIT_RTTIME belongs to the process: every RT thread of it may run RT_SOFT_S of CPU without
blocking before the kernel sends the process SIGXCPU, and RT_HARD_S before it kills it. Python
runs the handler in the main thread, which is not the RT one, so it gets to run: the delay line
and the arbiter demote their threads in their own handlers; every other process with RT
threads (the workers, the controller, the runner's fault thread) calls demote_on_rttime from
its main thread.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys
from collections.abc import Sequence

PRIORITY = {
    "delayline": 50,   # the emulated WAN's clock: above every other RT thread
    "arbiter": 50,     # grants WAN slots on that clock
    "fault": 20,       # faultrun's thread: rate changes were up to 70 ms late without it
    # The workers' stage-to-stage channel I/O threads and gloo's threads (one io_priority): a
    # granted sender took up to 70 ms (p90 12-15 ms) to put its first byte on the wire at D = 4
    # behind its CPU-bound neighbours on 2 cores.
    "worker_io": 10,
    # The BubbleTea controller's notice thread: at nice 10 on 2 busy cores it heard a message
    # 15 ms late once, past the arrival bound's margin. It parses datagrams of at most
    # MAX_NOTICE_BYTES (prefill.controller).
    "notice": 10,
}
RT_SOFT_S = 5.0    # RLIMIT_RTTIME: CPU seconds at RT priority without blocking -> SIGXCPU
RT_HARD_S = 10.0   # ... -> SIGKILL
RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"


def process_threads() -> list[int]:
    """Every thread of this process (for set_fifo and set_normal)."""
    return [int(t) for t in os.listdir("/proc/self/task")]


def _errno_name(exc: OSError | ValueError) -> str:
    code = getattr(exc, "errno", None) or errno.EINVAL
    return errno.errorcode.get(code, str(code))


def set_fifo(priority: int, tids: Sequence[int] = (0,), *, rt_runtime: str = RT_RUNTIME) -> str:
    """tids (default: the calling thread alone; Linux applies sched_setscheduler(0) to the
    caller, not the process) to SCHED_FIFO | SCHED_RESET_ON_FORK at priority. Returns
    'fifo:<priority>', or 'refused:<why>' with every thread left at normal priority:
    'unthrottled' (rt_runtime reads -1), 'rlimit-<errno>' or the errno of sched_setscheduler.
    A thread of tids that has ended meanwhile is passed over.

    SCHED_RESET_ON_FORK applies to every clone, threads too: a thread started by an RT thread
    runs at normal priority. To make a library's threads RT, pass their ids after they exist."""
    try:
        with open(rt_runtime) as f:
            if int(f.read()) < 0:
                return "refused:unthrottled"
    except (OSError, ValueError):
        pass   # no such file (not Linux's RT scheduler): RLIMIT_RTTIME still bounds us
    have_soft, have_hard = (x if x != resource.RLIM_INFINITY else float("inf")
                            for x in resource.getrlimit(resource.RLIMIT_RTTIME))
    hard = int(min(RT_HARD_S * 1e6, have_hard))        # lower limits already set stay
    soft = int(min(RT_SOFT_S * 1e6, have_soft, hard))
    try:
        resource.setrlimit(resource.RLIMIT_RTTIME, (soft, hard))
    except (OSError, ValueError) as exc:
        return f"refused:rlimit-{_errno_name(exc)}"
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK,
                                  os.sched_param(priority))
        except ProcessLookupError:
            continue   # a thread that ended meanwhile
        except OSError as exc:
            set_normal(tids)
            return f"refused:{_errno_name(exc)}"
    return f"fifo:{priority}"


def set_normal(tids: Sequence[int] = (0,)) -> None:
    """tids (default: the calling thread) back to SCHED_OTHER; threads gone meanwhile skipped."""
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass


def demote_on_rttime(name: str) -> None:
    """From the main thread: on SIGXCPU (an RT thread of this process ran RT_SOFT_S without
    blocking) every thread goes back to normal priority, said in one line, and the process
    goes on."""
    def on_rttime(signum, frame) -> None:  # noqa: ARG001
        set_normal(process_threads())
        print(f"{name}: a thread ran {RT_SOFT_S:g} s at real-time priority without blocking; "
              "every thread back to normal priority", file=sys.stderr, flush=True)

    signal.signal(signal.SIGXCPU, on_rttime)
