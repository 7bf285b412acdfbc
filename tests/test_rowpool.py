"""The what-if's rows in worker processes (geodc.predict.rowpool): the same table as one by
one, a worker's error raised in the caller, and no worker left after the block, nor after a
SIGTERM or SIGHUP to the caller."""

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

from geodc.predict.rowpool import rows_pool
from geodc.predict.whatif import whatif
from geodc.spec.scenario import parse_scenario
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
    assert [r.key for r in two.rows][-1] == "request_rate"
    assert len(told) == len(two.rows) and told[-1].startswith(f"{len(two.rows)} of ")
    assert multiprocessing.active_children() == []


def _fails(x: int) -> int:
    raise ValueError(f"row {x} failed")


def test_a_workers_error_is_raised_in_the_caller_and_no_worker_is_left():
    with pytest.raises(ValueError, match="row 3 failed"):
        with rows_pool(2) as pool:
            pool.submit(_fails, 3).get()
    assert multiprocessing.active_children() == []


CHILD = """
import os, sys, time
sys.path.insert(0, os.getcwd())
from geodc.predict.rowpool import rows_pool
from tests.test_rowpool import _sleeps
try:
    with rows_pool(2) as pool:
        jobs = [pool.submit(_sleeps, sys.argv[1] + f"/{i}") for i in range(2)]
        [job.get() for job in jobs]
except KeyboardInterrupt:
    sys.exit(130)
"""


def _sleeps(path: str) -> None:
    Path(path).write_text(str(os.getpid()))
    time.sleep(60)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_workers_with_the_caller(tmp_path, sig):
    """SIGTERM or SIGHUP to the caller mid-row: it exits 130 and both workers are gone at
    once (watched through pidfds taken while they ran), not a row's time later."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int((tmp_path / str(i)).read_text()) for i in range(2)]
        fds = [os.pidfd_open(pid) for pid in pids]
        proc.send_signal(sig)
        assert proc.wait(timeout=15) == 130
        ready, _, _ = select.select(fds, [], [], 5)     # a pidfd is readable once it exited
        assert sorted(ready) == sorted(fds), pids
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
