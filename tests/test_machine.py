"""testbed.emulation.machine: CPU time shares from /proc/stat (steal included), the no-halt request and
the kernel modules a build loaded."""

from __future__ import annotations

import struct

import pytest

from testbed.emulation.machine import (CpuTimes, hold_cpu_wakeup_latency, loaded_modules,
                             modules_loaded_since, release_cpu_wakeup_latency)

pytestmark = pytest.mark.unit

STAT_A = "cpu  100 0 50 800 10 0 20 20 0 0\ncpu0 50 0 25 400 5 0 10 10 0 0\n"
STAT_B = "cpu  200 0 100 1500 10 0 40 150 0 0\ncpu0 100 0 50 750 5 0 20 75 0 0\n"


def test_usage_splits_cpu_time_with_steal():
    a, b = CpuTimes.parse(STAT_A), CpuTimes.parse(STAT_B)
    # deltas: user 100, system 50, idle 700, softirq 20, steal 130: 1000 ticks in all
    assert a.usage(b) == {"busy_pct": 17.0, "idle_pct": 70.0, "softirq_pct": 2.0,
                          "steal_pct": 13.0}
    assert a.usage(a)["busy_pct"] == 0.0


def test_this_machine_reads():
    now = CpuTimes.now()
    assert now.user > 0 and now.idle >= 0


def test_wakeup_latency_request_is_written_and_released(tmp_path):
    target = tmp_path / "cpu_dma_latency"
    target.write_bytes(b"")
    fd, status = hold_cpu_wakeup_latency(target)
    assert status == "poll" and fd is not None
    release_cpu_wakeup_latency(fd)
    assert struct.unpack("i", target.read_bytes()) == (0,)


def test_wakeup_latency_request_refused_is_a_status_not_an_error(tmp_path):
    fd, status = hold_cpu_wakeup_latency(tmp_path / "missing")
    assert fd is None and status.startswith("refused:")


def test_modules_loaded_since_lists_the_new_ones(tmp_path):
    modules = tmp_path / "modules"
    modules.write_text("veth 40960 0 - Live 0x0\nbridge 311296 0 - Live 0x0\n")
    before = loaded_modules(modules)
    modules.write_text("sch_netem 24576 0 - Live 0x0\nveth 40960 0 - Live 0x0\n"
                       "bridge 311296 0 - Live 0x0\ntcp_bbr 20480 1 - Live 0x0\n")
    assert modules_loaded_since(before, modules) == ["sch_netem", "tcp_bbr"]


def test_modules_unavailable_without_proc_modules(tmp_path):
    missing = tmp_path / "modules"
    assert loaded_modules(missing) is None
    assert modules_loaded_since(None, missing).startswith("unavailable")
