"""The pieces `cleanup --cluster` and the cluster's signals rest on, run here without ssh: the
script a server runs to signal recorded processes (through a pidfd, only where the recorded
start time still matches), and the owner line of a run folder (alive, dead, another machine's).
Loopback ring: real processes, no root."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from testbed.emulation.serverregistry import SIGNAL_RECORDED, owner_alive, owner_line

pytestmark = pytest.mark.loopback


def start_field(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]


def run_script(sig: int, *files) -> str:
    return subprocess.run([sys.executable, "-c", SIGNAL_RECORDED, str(sig), *map(str, files)],
                          capture_output=True, text=True, check=True, timeout=30).stdout.strip()


def test_recorded_processes_are_signalled_only_while_their_start_time_matches(tmp_path):
    ours = subprocess.Popen(["sleep", "300"])
    stranger = subprocess.Popen(["sleep", "300"])
    try:
        good, stale, gone, junk = (tmp_path / f"{n}.pid" for n in ("good", "stale", "gone", "junk"))
        good.write_text(f"{ours.pid} {start_field(ours.pid)}\n")
        # the stranger's pid with another start time: a reused number, never signalled
        stale.write_text(f"{stranger.pid} {int(start_field(stranger.pid)) - 1}\n")
        gone.write_text("999999999 1\n")
        junk.write_text("not a record\n")
        out = run_script(signal.SIGTERM, good, stale, gone, junk, tmp_path / "missing.pid")
        assert out == "signalled 1", out
        assert ours.wait(timeout=10) == -signal.SIGTERM
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        for p in (ours, stranger):
            p.kill()
            p.wait()


def test_a_run_folders_owner_is_alive_dead_or_another_machines():
    line = owner_line()
    boot, pid, start = line.split()
    assert owner_alive(line) is True
    assert owner_alive(f"{boot} {pid} {int(start) + 1}") is False      # pid reused since
    assert owner_alive(f"{boot} 999999999 1") is False                  # gone
    assert owner_alive(f"00000000-0000-0000-0000-000000000000 {pid} {start}") is None
    assert owner_alive("") is None and owner_alive("garbage") is None
