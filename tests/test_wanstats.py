"""Every WAN packet accounted for, on a real network (root): Network.wan_stats() counts what
crossed each link direction, drops by cause and release lateness; a call starts a new interval;
the delay lines run at real-time priority (or not, with realtime=False).

Networks: DCs wa/wb (10 ms, 20 Mbit/s) and wla/wlb (the same with 5% loss per direction), names
no other test uses. Known traffic: ping (one echo request a->b and one reply b->a per ping) and
one iperf3 test.
"""

from __future__ import annotations

import json
import os

import pytest

from testbed.emulation import wanstats
from testbed.emulation.machine import CpuTimes
from testbed.run.calibrate import measure_goodput
from testbed.emulation.network import Network
from testbed.spec.scenario import load_scenario
from tests.realtime_here import expected, refusal
from tests.tolerance import retried
from tests.scenarios import two_dc, write_scenario
from testbed.emulation.tools import ping

pytestmark = pytest.mark.network

PING_BYTES = 84           # IP bytes of a default ping (20 IP + 8 ICMP + 56 data)
# The median release must be on time; the tail is a figure, printed here and in the benchmarks,
# not asserted: it is the host's, not ours (CI's VM, 26% steal time: p99 4.6-6.1 ms in all 5 and
# 8 attempts while the median stayed 0.06-0.10 ms). A delay line that keeps bad time (a wrong
# clock, no polling, a starved thread) misses the median as well.
LATE_TOL_MS = 1.0
LATENESS_ATTEMPTS = 3
ATTEMPT_GAP_S = 2.0
LOSS_PCT = 5.0
IPERF_PORT = 5741


def build(folder, data, **kwargs) -> Network:
    return Network(load_scenario(write_scenario(folder, data)), folder / "run", **kwargs)


def pings(net: Network, src: str, dst: str, count: int, interval_s: float) -> ping.PingResult:
    """count pings; with loss ping exits 1, so its summary is read whatever the exit code."""
    proc = net.spawn(src, ping.ping_argv(net.host_ip(dst), count, interval_s),
                     net.run_dir / "logs" / f"{src}-ping.log")
    proc.wait(count * interval_s + 15)
    return ping.parse_ping(proc.output(10_000_000))


def describe(stats: dict) -> str:
    return json.dumps(stats, indent=1)


def on_time(stats: dict) -> bool:
    """The median release of every direction within LATE_TOL_MS of its due time."""
    return all(s["lateness_ms"]["p50"] < LATE_TOL_MS for k, s in stats.items() if k != "cpu")


def tails(stats: dict) -> str:
    return ", ".join(f"{k} {s['lateness_ms']['p99']} ms" for k, s in stats.items() if k != "cpu")


@pytest.fixture(scope="module")
def w(tmp_path_factory, leftovers):
    before = leftovers.snapshot()
    with build(tmp_path_factory.mktemp("w"), two_dc("w", delay_ms=10, rate_mbit=20)) as net:
        if net.backend != "delayline":
            pytest.skip(f"backend is {net.backend}: no delay line to count packets")
        yield net
    leftovers.assert_nothing_new(before, "by the w network")


def test_delay_lines_run_at_realtime_priority(w):
    """At SCHED_FIFO 50 where the kernel grants it; where it refuses (a container's cgroup
    without RT runtime), at normal priority, with the refusal recorded."""
    assert w.realtime_status == {"wa-gw": expected(50), "wb-gw": expected(50)}, w.realtime_status
    policy, prio = (os.SCHED_FIFO, 50) if refusal() is None else (os.SCHED_OTHER, 0)
    assert w.cpu_idle == "poll", w.cpu_idle   # idle CPUs poll while the delay lines keep time
    for dl in w.delaylines:
        cmdline = open(f"/proc/{dl.proc.pid}/cmdline", "rb").read()
        assert b"testbed.emulation.delayline" in cmdline  # the pid we signal is the delay line itself
        for tid in os.listdir(f"/proc/{dl.proc.pid}/task"):
            assert os.sched_getscheduler(int(tid)) & ~os.SCHED_RESET_ON_FORK == policy
            assert os.sched_getparam(int(tid)).sched_priority == prio


def test_pings_are_counted_per_direction(w):
    """Every ping is counted in both directions, nothing dropped, the median release on time.
    Retried like the RTT checks of test_network: this VM's vCPUs stall now and then (steal time;
    a bare SCHED_FIFO timer loop sees single 5-15 ms stalls here); a real delay-line problem
    misses every attempt. The p99 is printed."""
    n = 100
    pings(w, "wa-h1", "wb-h1", 2, 0.05)  # warm-up: ARP on every hop
    def hundred_pings(_):
        w.wan_stats()                     # start the interval here
        r = pings(w, "wa-h1", "wb-h1", n, 0.01)
        stats = w.wan_stats()
        assert r.received == n, r
        assert set(stats) == {"wa->wb", "wb->wa"}, describe(stats)
        for direction in ("wa->wb", "wb->wa"):
            s = stats[direction]
            assert s["packets"] >= n and s["bytes"] >= n * PING_BYTES, describe(stats)
            assert s["released"] == s["packets"], describe(stats)
            for key in ("dropped_loss", "dropped_queue_full", "dropped_user", "id_gaps",
                        "enobufs", "verdict_errors"):
                assert s[key] == 0, f"{direction} {key}:\n{describe(stats)}"
            assert s["rt"] == expected(50)
        return stats

    attempts = retried(hundred_pings, ok=on_time, tries=LATENESS_ATTEMPTS, gap_s=ATTEMPT_GAP_S)
    print(f"\npings, {len(attempts)} attempt(s), lateness p99 {tails(attempts[-1])}: "
          f"{describe(attempts)}")
    assert on_time(attempts[-1]), \
        f"lateness p50 >= {LATE_TOL_MS} ms in {len(attempts)} attempts:\n{describe(attempts)}"
    # A second call starts from zero (nothing crossed the WAN since the first).
    again = w.wan_stats()
    assert all(s["packets"] == s["released"] == s["bytes"] == 0 for s in again.values()), \
        describe(again)


def test_iperf3_bytes_are_counted_without_drops(w):
    """Every attempt counts right and drops nothing; lateness is retried as in the ping test."""
    def two_seconds_of_iperf3(_):
        w.wan_stats()
        cpu = CpuTimes.now()
        result = measure_goodput(w, "wa-h1", "wb-h1", IPERF_PORT, 2)
        stats = w.wan_stats()
        fwd, back = stats["wa->wb"], stats["wb->wa"]
        # At least what the receiver counted in its steady window went through the delay line.
        assert fwd["bytes"] >= result.received_mbit * 1e6 / 8 * result.seconds, \
            f"{result}\n{describe(stats)}"
        assert back["packets"] > 0  # the ACKs
        for direction, s in stats.items():
            assert s["dropped_loss"] == s["dropped_queue_full"] == s["dropped_user"] == 0, \
                f"{direction}:\n{describe(stats)}"
            assert s["id_gaps"] == s["enobufs"] == s["verdict_errors"] == 0, describe(stats)
        return result, stats, cpu.usage(CpuTimes.now())

    tries = retried(two_seconds_of_iperf3, ok=lambda t: on_time(t[1]), tries=LATENESS_ATTEMPTS,
                    gap_s=ATTEMPT_GAP_S)
    attempts = [dict(stats, cpu=cpu) for _, stats, cpu in tries]
    result, stats, _ = tries[-1]
    assert on_time(stats), \
        f"lateness p50 >= {LATE_TOL_MS} ms in {len(attempts)} attempts:\n{describe(attempts)}"
    drop_warnings = [x for x in wanstats.warnings(stats, w.plan.scenario.wan) if "dropped" in x]
    assert not drop_warnings, drop_warnings
    print(f"\niperf3 {result.received_mbit:.2f} Mbit/s, lateness p99 {tails(stats)}: "
          f"{describe(stats)}")


def test_configured_loss_is_counted_and_binomial(tmp_path, leftovers):
    """5% loss per direction, realtime=False: every echo request reaches the a->b delay line
    (packets + dropped_loss = pings sent), every reply comes from a delivered request, and the
    losses fall in the binomial band."""
    before = leftovers.snapshot()
    data = two_dc("wl", delay_ms=10, rate_mbit=20)
    data["wan"][0]["loss_pct"] = LOSS_PCT
    n = 400
    with build(tmp_path, data, realtime=False) as net:
        if net.backend != "delayline":
            pytest.skip(f"backend is {net.backend}: no delay line to count packets")
        assert net.realtime_status == {"wla-gw": "off", "wlb-gw": "off"} and net.cpu_idle == "off"
        assert all(os.sched_getscheduler(dl.proc.pid) == os.SCHED_OTHER for dl in net.delaylines)
        net.wan_stats()
        r = pings(net, "wla-h1", "wlb-h1", n, 0.01)
        stats = net.wan_stats()
        stats_paths = [dl.stats_path for dl in net.delaylines]
    fwd, back = stats["wla->wlb"], stats["wlb->wla"]
    p = LOSS_PCT / 100
    assert fwd["packets"] + fwd["dropped_loss"] == n, describe(stats)
    assert back["packets"] + back["dropped_loss"] == fwd["packets"], describe(stats)
    assert back["packets"] == r.received, f"{r}\n{describe(stats)}"
    for s in (fwd, back):
        low, high = wanstats.binomial_band(s["packets"] + s["dropped_loss"], p)
        assert low <= s["dropped_loss"] <= high, describe(stats)
        assert s["dropped_queue_full"] == s["dropped_user"] == s["id_gaps"] == 0, describe(stats)
    assert not [x for x in wanstats.warnings(stats, net.plan.scenario.wan) if "dropped" in x]
    # Each delay line wrote a final report as it stopped.
    for path in stats_paths:
        assert json.loads(path.read_text())["final"] is True
    print(f"\nloss {LOSS_PCT}%: {describe(stats)}")
    leftovers.assert_nothing_new(before, "by the wl network")


# ---- the pure parts: warnings and the READY line (no network; CI runs this file as root) ------
def counters(**over) -> dict:
    s = {"packets": 10_000, "bytes": 0, "dropped_loss": 0, "dropped_queue_full": 0,
         "dropped_user": 0, "id_gaps": 0, "enobufs": 0, "verdict_errors": 0, "late_packets": 0,
         "lateness_ms": {"p50": 0.02, "p99": 0.2, "max": 0.5}, "released": 10_000,
         "interval_s": 1.0, "rt": "fifo:50"}
    s.update(over)
    return s


class _Link:
    def __init__(self, a: str, b: str, loss_pct: float) -> None:
        self.a, self.b, self.loss_pct = a, b, loss_pct


def test_warnings():
    links = [_Link("x", "y", 1.0), _Link("x", "z", 0.0)]
    quiet = {"x->y": counters(dropped_loss=100), "y->x": counters(dropped_loss=90),
             "x->z": counters()}
    assert wanstats.warnings(quiet, links) == []
    loud = {"x->y": counters(dropped_loss=200),                     # 2% on a 1% link
            "z->x": counters(dropped_queue_full=1),                 # any kernel drop, lossless
            "x->z": counters(dropped_user=3, id_gaps=3, late_packets=4,
                             lateness_ms={"p50": 0.1, "p99": 0.3, "max": 7.0}),
            "y->x": counters(verdict_errors=2, rt="demoted:rttime")}
    got = wanstats.warnings(loud, links)
    assert len(got) == 6, got
    assert any("x->y: 200 of 10200 packets dropped" in g for g in got), got
    assert any("z->x" in g and "queue full 1" in g for g in got), got
    assert any("x->z" in g and "delay line too slow 3" in g for g in got), got
    assert any("x->z: 4 of 10000 packets" in g and "max 7.000" in g for g in got), got
    assert any("refused 2 verdicts" in g for g in got) and any("demoted" in g for g in got)
    # a link the scenario's faults cut or made lossy: its loss drops are a note, not a
    # warning; a kernel drop there is still a warning
    faulted = {"x->y": counters(dropped_loss=2000), "x->z": counters(dropped_loss=50,
                                                                     dropped_queue_full=400)}
    got = wanstats.warnings(faulted, links, faulted={"x->y", "x->z"})
    assert got[0].startswith("note: wan x->y: 2000 of 12000 packets dropped by the scenario's "
                             "faults"), got
    assert got[1].startswith("warning: wan x->z: 450 of 10450 packets dropped"), got


def test_binomial_band():
    low, high = wanstats.binomial_band(10_000, 0.01)
    assert low == pytest.approx(100 - 4 * 9.95, abs=0.01) and high == pytest.approx(139.8, abs=0.01)
    assert wanstats.binomial_band(500, 0.0) == (0.0, 0.0)


class _FakeProc:
    def __init__(self, text: str) -> None:
        self.text = text

    def output(self, tail_chars: int = 4000) -> str:
        return self.text[-tail_chars:]

    def poll(self):
        return None

    def describe(self) -> str:
        return "fake delay line"


def test_ready_line_gives_the_realtime_status():
    from testbed.spec.errors import TestbedError
    from testbed.emulation.network import _wait_ready
    assert _wait_ready(_FakeProc("READY rt=fifo:50 1:10:0:0:1024\n"), 1) == "fifo:50"
    assert _wait_ready(_FakeProc("x\nREADY rt=refused:EPERM 1:10:0:0:1024\n"), 1) == "refused:EPERM"
    with pytest.raises(TestbedError):  # half a line: not ready yet
        _wait_ready(_FakeProc("READY rt=fifo:50 1:10:0"), 0.05)
