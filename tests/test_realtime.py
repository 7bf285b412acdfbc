"""testbed.host.realtime: the one way to SCHED_FIFO. A thread it sets forks children (and starts
threads) at normal priority, RLIMIT_RTTIME is set, it refuses while RT throttling is off, and
nothing else in the code base calls sched_setscheduler. The priority changes run in a child
Python process (RLIMIT_RTTIME belongs to the process: the test process keeps its own)."""

from __future__ import annotations

import ast
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.host.realtime import PRIORITY, RT_HARD_S, RT_SOFT_S, set_fifo
from tests.realtime_here import expected, refusal

REPO = Path(__file__).resolve().parent.parent
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_FIFO needs root (CAP_SYS_NICE)")

# One RT thread, as the transport's I/O threads and the controller's notice thread make it:
# what it got, its policy, its fork child's, a thread it starts, and the main thread's.
THREAD_MODE = """
import json, os, resource, threading
from testbed.host.realtime import set_fifo
out = {}
def child_policy():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(os.sched_getscheduler(0)).encode())
        os._exit(0)
    os.close(w)
    policy = int(os.read(r, 32))
    os.waitpid(pid, 0)
    return policy
def started():
    out["started_thread"] = os.sched_getscheduler(0)
def rt():
    out["status"] = set_fifo(%d)
    out["policy"] = os.sched_getscheduler(0)
    out["priority"] = os.sched_getparam(0).sched_priority
    out["fork_child"] = child_policy()
    t = threading.Thread(target=started)
    t.start()
    t.join()
t = threading.Thread(target=rt)
t.start()
t.join()
out["main"] = os.sched_getscheduler(0)
out["rttime"] = resource.getrlimit(resource.RLIMIT_RTTIME)
print(json.dumps(out))
"""

# Every thread of a process, as the delay line and the arbiter do, and back (SIGXCPU's demotion).
PROCESS_MODE = """
import json, os, threading
from testbed.host.realtime import process_threads, set_fifo, set_normal
hold = threading.Event()
t = threading.Thread(target=hold.wait)
t.start()
status = set_fifo(%d, process_threads())
rt = sorted({os.sched_getscheduler(tid) for tid in process_threads()})
set_normal(process_threads())
normal = sorted({os.sched_getscheduler(tid) for tid in process_threads()})
hold.set()
print(json.dumps({"status": status, "rt": rt, "normal": normal}))
"""


# A loop that never blocks, as a delay line's would (its loop is the main thread, where Python
# runs signal handlers): RLIMIT_RTTIME's soft limit (lowered to 50 ms here; a lower limit already
# set stays) sends SIGXCPU, and the delay line's handler demotes every thread.
RUNAWAY = """
import json, os, resource, signal, time
from testbed.host.realtime import process_threads, set_fifo, set_normal
resource.setrlimit(resource.RLIMIT_RTTIME, (50_000, 2_000_000))
demoted = []
def on_rttime(signum, frame):
    set_normal(process_threads())
    demoted.append(time.monotonic())
signal.signal(signal.SIGXCPU, on_rttime)
status = set_fifo(%d, process_threads())
t0 = time.monotonic()
while not demoted and time.monotonic() - t0 < 1.5:
    pass
print(json.dumps({"status": status, "demoted_after_s": demoted and demoted[0] - t0,
                  "policy": os.sched_getscheduler(0),
                  "rttime": resource.getrlimit(resource.RLIMIT_RTTIME)}))
"""


RUNAWAY_THREAD = """
import hashlib, json, os, resource, threading, time
from testbed.host.realtime import demote_on_rttime, set_fifo
resource.setrlimit(resource.RLIMIT_RTTIME, (50_000, 2_000_000))
demote_on_rttime("test")
got = {}
data = bytes(16 << 20)
def spin():
    # CPU without the GIL (hashlib lets it go): a loop that waited for the GIL would block,
    # and blocking restarts the kernel's RTTIME count
    got["status"] = set_fifo(%d)
    t0 = time.monotonic()
    while os.sched_getscheduler(0) != os.SCHED_OTHER and time.monotonic() - t0 < 1.5:
        hashlib.sha256(data).digest()
    got["demoted_after_s"] = time.monotonic() - t0
    got["policy"] = os.sched_getscheduler(0)
t = threading.Thread(target=spin)
t.start()
while t.is_alive():
    time.sleep(0.01)    # the main thread, where Python runs the SIGXCPU handler
print(json.dumps(got))
"""


def run_child(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=30)          # geodc: from the cwd
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.network
@root_only
def test_an_rt_thread_forks_and_starts_threads_at_normal_priority():
    """Where the kernel refuses SCHED_FIFO (a container's cgroup without RT runtime), set_fifo
    says why and leaves the thread at normal priority; RLIMIT_RTTIME is set either way."""
    prio = PRIORITY["worker_io"]
    doc = run_child(THREAD_MODE % prio)
    assert doc["status"] == expected(prio), doc
    if refusal() is None:
        assert doc["policy"] == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK and doc["priority"] == prio, doc
    else:
        assert doc["policy"] == os.SCHED_OTHER and doc["priority"] == 0, doc
    assert doc["fork_child"] == os.SCHED_OTHER, doc      # pyroute2's fork children, say
    assert doc["started_thread"] == os.SCHED_OTHER, doc  # a library's thread
    assert doc["main"] == os.SCHED_OTHER, doc            # the calling thread alone
    assert doc["rttime"] == [int(RT_SOFT_S * 1e6), int(RT_HARD_S * 1e6)], doc


@pytest.mark.network
@root_only
def test_every_thread_of_a_process_and_back():
    doc = run_child(PROCESS_MODE % PRIORITY["delayline"])
    assert doc["status"] == expected(PRIORITY["delayline"]), doc
    granted = refusal() is None
    assert doc["rt"] == [os.SCHED_FIFO | os.SCHED_RESET_ON_FORK if granted else os.SCHED_OTHER], doc
    assert doc["normal"] == [os.SCHED_OTHER], doc


@pytest.mark.network
@root_only
def test_a_loop_that_never_blocks_is_demoted():
    if refusal() is not None:
        pytest.skip(f"SCHED_FIFO refused here ({refusal()}): nothing to demote")
    doc = run_child(RUNAWAY % PRIORITY["delayline"])
    assert doc["status"] == f"fifo:{PRIORITY['delayline']}", doc
    assert doc["demoted_after_s"] and doc["demoted_after_s"] < 1.0, doc
    assert doc["policy"] == os.SCHED_OTHER and doc["rttime"][1] == 2_000_000, doc


@pytest.mark.network
@root_only
def test_a_runaway_rt_thread_is_demoted_and_its_process_lives():
    """demote_on_rttime (workers, controller, runner): SIGXCPU from an RT thread that is not
    the main one demotes it; the process does not end with SIGXCPU's default action."""
    if refusal() is not None:
        pytest.skip(f"SCHED_FIFO refused here ({refusal()}): nothing to demote")
    doc = run_child(RUNAWAY_THREAD % PRIORITY["worker_io"])
    assert doc["status"] == f"fifo:{PRIORITY['worker_io']}", doc
    assert doc["policy"] == os.SCHED_OTHER and doc["demoted_after_s"] < 1.5, doc


@pytest.mark.unit
def test_refused_while_rt_throttling_is_off(tmp_path):
    runtime = tmp_path / "sched_rt_runtime_us"
    runtime.write_text("-1\n")
    rttime = resource.getrlimit(resource.RLIMIT_RTTIME)
    got = {}

    def rt() -> None:
        got["status"] = set_fifo(PRIORITY["notice"], rt_runtime=str(runtime))
        got["policy"] = os.sched_getscheduler(0)

    t = threading.Thread(target=rt)
    t.start()
    t.join()
    assert got == {"status": "refused:unthrottled", "policy": os.SCHED_OTHER}, got
    assert resource.getrlimit(resource.RLIMIT_RTTIME) == rttime


def code_files() -> list[Path]:
    """The repository's Python files (not the virtualenv, results or docs folders)."""
    found = []
    for folder, subdirs, files in os.walk(REPO):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")
                      and not (folder == str(REPO) and d in ("results", "docs"))]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


@pytest.mark.unit
def test_no_sched_setscheduler_outside_host_realtime():
    """Every real-time thread goes through testbed.host.realtime's guards: no other module calls
    sched_setscheduler (by attribute or by name)."""
    helper = REPO / "testbed" / "host" / "realtime.py"
    found = []
    for path in code_files():
        source = path.read_bytes()
        if path == helper or b"sched_setscheduler" not in source:
            continue
        rel = path.relative_to(REPO)
        for node in ast.walk(ast.parse(source, str(rel))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name == "sched_setscheduler":
                    found.append(f"{rel}:{node.lineno}")
    assert not found, f"sched_setscheduler outside testbed/host/realtime.py: {found}"


@pytest.mark.loopback
def test_the_rt_notice_thread_survives_a_deeply_nested_datagram(tmp_path):
    """The controller's notice thread parses datagrams at RT priority: MAX_NOTICE_BYTES bounds
    their size, but 2,000 '[' (under the cap) raised RecursionError in json.loads, past the
    thread's error handling: the thread died and the controller heard no notice again."""
    from tests.test_bubbletea_parts import close_controller, make_controller
    ctl = make_controller(tmp_path)
    thread = threading.Thread(target=ctl.notices, daemon=True)
    thread.start()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"[" * 2000, ctl._sock.getsockname())
        time.sleep(0.5)
        assert thread.is_alive()
    finally:
        ctl.stop.set()
        thread.join(timeout=5)
        close_controller(ctl)
