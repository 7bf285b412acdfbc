"""The what-if's rows in worker processes (testbed.predict.rowpool): the same table as one by
one, a worker's error raised in the caller, and no worker left after the block, nor after a
SIGTERM or SIGHUP to the `whatif` command."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.predict.rowpool import rows_pool
from testbed.predict.whatif import whatif
from testbed.spec.scenario import parse_scenario
from tests.test_whatif import small_bubbletea_doc

pytestmark = pytest.mark.loopback

REPO = Path(__file__).resolve().parent.parent


def _strip(doc):
    """A table's document without its timings (the only figures that may differ)."""
    if isinstance(doc, dict):
        return {k: _strip(v) for k, v in doc.items() if k != "seconds"}
    if isinstance(doc, list):
        return [_strip(x) for x in doc]
    return doc


def test_rows_in_two_processes_are_the_rows_one_by_one():
    sc = parse_scenario(small_bubbletea_doc(), path="small.yaml")
    told: list[str] = []
    one = whatif(sc)
    two = whatif(sc, progress=told.append, workers=2)
    assert _strip(two.to_dict()) == _strip(one.to_dict())
    assert [r.key for r in two.rows][-2:] == ["request_rate", "deadline_rate"]
    assert len(told) == len(two.rows) and told[-1].startswith(f"{len(two.rows)} of ")
    assert multiprocessing.active_children() == []


def _fails(x: int) -> int:
    raise ValueError(f"row {x} failed")


def test_a_workers_error_is_raised_in_the_caller_and_no_worker_is_left():
    with pytest.raises(ValueError, match="row 3 failed"):
        with rows_pool(2) as pool:
            pool.submit(_fails, 3).get()
    assert multiprocessing.active_children() == []


def _workers(pid: int) -> list[int]:
    """pid's children that are multiprocessing's spawned workers (not its resource tracker,
    which ends on its own when its pipe closes)."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(k) for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_whatif_ends_its_workers(sig):
    """SIGTERM or SIGHUP to `run_testbed.py whatif` mid-row: it exits 130 and both row workers
    are gone at once (watched through pidfds taken while they ran), not a row's time later."""
    proc = subprocess.Popen([sys.executable, "run_testbed.py", "whatif",
                             "topologies/paper/gpt160b_5dc.yaml"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while len(_workers(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)       # both workers (this machine has 2 cores or more)
        pids = _workers(proc.pid)
        assert len(pids) >= 2, "whatif started no workers"
        fds = [os.pidfd_open(pid) for pid in pids]
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 130, proc.stderr.read()
        ready, _, _ = select.select(fds, [], [], 5)     # a pidfd is readable once it exited
        assert sorted(ready) == sorted(fds), pids
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_interrupts_installed_for_a_block_gives_the_handlers_back():
    """`whatif` runs in its caller's process too (tests, notebooks): the stop handlers it
    sets for its block are the caller's again after it, also when the block raises."""
    from testbed.emulation import interrupts
    before = {sig: signal.getsignal(sig) for sig in interrupts.STOP_SIGNALS}
    with pytest.raises(ValueError):
        with interrupts.installed():
            assert all(signal.getsignal(sig) is interrupts._on_stop
                       for sig in interrupts.STOP_SIGNALS)
            raise ValueError("the block failed")
    assert {sig: signal.getsignal(sig) for sig in interrupts.STOP_SIGNALS} == before
