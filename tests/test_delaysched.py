"""The delay line's scheduling (testbed.emulation.delaysched), without sockets or root: due times, order
under jitter, loss, batch selection, the wake-up lead, lateness and id gaps; and the parsing of
the kernel's counters (testbed.emulation.delayline). Randomised checks use fixed seeds (hypothesis is not a
dependency of the project)."""

from __future__ import annotations

import math
import random

import pytest

from testbed.emulation import delaysched as ds
from testbed.emulation.delayline import parse_netlink_drops, parse_nfqueue_proc

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0  # a CLOCK_REALTIME-like start: due times are absolute


def arrivals(n: int, mean_gap_s: float, seed: int = 3) -> list[float]:
    rng = random.Random(seed)
    t, out = T0, []
    for _ in range(n):
        t += rng.expovariate(1 / mean_gap_s)
        out.append(t)
    return out


# ---- due times and order --------------------------------------------------------------------
def test_due_times_are_exact_without_jitter():
    q = ds.QueueSchedule(delay_ms=10)
    times = arrivals(1000, 1e-4)
    for i, t in enumerate(times, start=1):
        assert q.on_packet(i, t, 1500)
    assert [due for due, _ in q.pending] == [t + 0.010 for t in times]
    assert q.counters.packets == 1000 and q.counters.bytes == 1500 * 1000


def test_jitter_never_reorders_and_stays_in_its_band():
    delay_s, jitter_s = 0.010, 0.005
    q = ds.QueueSchedule(delay_ms=10, jitter_ms=5, rng=random.Random(7))
    times = arrivals(5000, 1e-3)  # packets closer together than the jitter
    for i, t in enumerate(times, start=1):
        q.on_packet(i, t)
    dues = [due for due, _ in q.pending]
    assert [pid for _, pid in q.pending] == list(range(1, 5001))
    assert all(a <= b for a, b in zip(dues, dues[1:])), "a due time went backwards"
    lows = [due - t for due, t in zip(dues, times)]
    assert min(lows) >= delay_s - jitter_s - 1e-12
    # Above delay + jitter only by waiting for the packet before (order kept).
    prev = 0.0
    for due, t in zip(dues, times):
        assert due <= max(prev, t + delay_s + jitter_s) + 1e-12
        prev = due
    # With gaps much longer than the jitter, the delays spread over the whole band.
    q2 = ds.QueueSchedule(delay_ms=10, jitter_ms=5, rng=random.Random(7))
    for i, t in enumerate(arrivals(2000, 0.05), start=1):
        q2.on_packet(i, t)
    spread = [due - t for (due, _), t in zip(q2.pending, arrivals(2000, 0.05))]
    assert min(spread) < delay_s - 0.9 * jitter_s and max(spread) > delay_s + 0.9 * jitter_s


def test_due_time_function():
    rng = random.Random(1)
    assert ds.due_time(5.0, 0.01, 0.0, 0.0, rng) == 5.01
    assert ds.due_time(5.0, 0.01, 0.0, 6.0, rng) == 6.0  # never before the previous packet


# ---- loss -----------------------------------------------------------------------------------
@pytest.mark.parametrize("loss_pct", [0.1, 1.0, 20.0])
def test_loss_rate_is_binomial(loss_pct):
    n = 50_000
    q = ds.QueueSchedule(delay_ms=10, loss_pct=loss_pct, rng=random.Random(11))
    kept = sum(q.on_packet(i, T0 + i * 1e-5) for i in range(1, n + 1))
    p = loss_pct / 100
    sd = math.sqrt(n * p * (1 - p))
    lost = q.counters.dropped_loss
    assert abs(lost - n * p) <= 4 * sd, f"{lost} of {n} lost at loss_pct {loss_pct}"
    assert kept == n - lost == q.counters.packets == len(q.pending)


def test_no_loss_means_no_draws():
    rng = random.Random(5)
    state = rng.getstate()
    q = ds.QueueSchedule(delay_ms=1, rng=rng)
    for i in range(1, 100):
        assert q.on_packet(i, T0)
    assert rng.getstate() == state


# ---- batch selection ------------------------------------------------------------------------
def test_batch_is_every_due_packet_up_to_the_last_due_id():
    q = ds.QueueSchedule(delay_ms=10)
    for i in range(1, 11):
        q.on_packet(100 + i, T0 + i * 0.001)   # due at T0 + 11 ms .. T0 + 20 ms
    assert q.due_batch(T0 + 0.0105) == (0, 0)
    count, last_id = q.due_batch(T0 + 0.0145)
    assert (count, last_id) == (4, 104)
    assert len(q.pending) == 10, "due_batch must not remove anything"
    q.released(count, T0 + 0.015)
    assert [pid for _, pid in q.pending] == list(range(105, 111))
    assert q.next_due() == pytest.approx(T0 + 0.015)
    assert q.due_batch(T0 + 1) == (6, 110)
    q.released(6, T0 + 1)
    assert q.next_due() is None and q.due_batch(T0 + 2) == (0, 0)


def test_next_deadline_over_queues():
    a, b = ds.QueueSchedule(delay_ms=10), ds.QueueSchedule(delay_ms=3)
    assert ds.next_deadline([a, b]) is None
    a.on_packet(1, T0)
    b.on_packet(1, T0 + 0.001)
    assert ds.next_deadline([a, b]) == pytest.approx(T0 + 0.004)


def test_a_gap_never_lets_a_packet_out_early():
    """Model of the kernel (nfqnl_recv_verdict_batch accepts every queued entry with id <= N)
    with ids that never reached us: those the kernel dropped (never queued) and, worse, ones it
    queued but whose message we lost. Nothing leaves before arrival + delay - jitter - grace,
    and every packet we scheduled leaves no earlier than its due time - grace."""
    rng = random.Random(17)
    delay_s, jitter_s = 0.010, 0.002
    q = ds.QueueSchedule(delay_ms=10, jitter_ms=2, rng=random.Random(3))
    kernel: list[tuple[int, float]] = []          # (id, arrival) queued in the kernel, in id order
    arrival: dict[int, float] = {}
    left: dict[int, float] = {}                   # id -> when the kernel let it go
    due: dict[int, float] = {}                    # id -> due time, for the ids we saw
    now = T0
    for packet_id in range(1, 3001):
        now += rng.expovariate(1 / 0.0005)
        fate = rng.random()
        if fate < 0.05:
            continue                               # user_dropped: never queued, never seen
        kernel.append((packet_id, now))
        arrival[packet_id] = now
        if fate >= 0.08:                           # else: queued, but its message lost by us
            q.on_packet(packet_id, now)
            due[packet_id] = q.pending[-1][0]
        wake = now + rng.random() * 0.003          # the loop wakes and releases what is due
        count, last_id = q.due_batch(wake + ds.RELEASE_GRACE_S)
        if count:
            while kernel and kernel[0][0] <= last_id:  # the kernel's batch verdict
                left[kernel.pop(0)[0]] = wake
            q.released(count, wake)
    assert len(left) > 2000
    for pid, t in left.items():
        assert t >= arrival[pid] + delay_s - jitter_s - ds.RELEASE_GRACE_S - 1e-12
        if pid in due:
            assert t >= due[pid] - ds.RELEASE_GRACE_S - 1e-12
    assert q.counters.id_gaps == 3000 - len(due)


def test_lost_message_leaves_no_earlier_than_its_delay_minus_jitter():
    q = ds.QueueSchedule(delay_ms=10, jitter_ms=2, rng=random.Random(1))
    # id 1 arrives at T0 but its message is lost; id 2 arrives 1 ms later.
    q.on_packet(2, T0 + 0.001)
    count, last_id = q.due_batch(T0 + 1)
    due2 = q.pending[0][0]
    assert last_id == 2 and q.counters.id_gaps == 1
    assert due2 - T0 >= 0.010 - 0.002  # id 1 would leave with id 2: after delay - jitter


# ---- gaps -----------------------------------------------------------------------------------
def test_gaps_in_ids_are_counted():
    q = ds.QueueSchedule(delay_ms=1)
    for pid in (1, 2, 5, 6, 10, 11):
        q.on_packet(pid, T0)
    assert q.counters.id_gaps == 2 + 3
    first = ds.QueueSchedule(delay_ms=1)
    first.on_packet(4, T0)  # ids start at 1 on a freshly bound queue
    assert first.counters.id_gaps == 3


def test_gap_across_the_u32_wrap():
    assert ds.id_gap(0xFFFFFFFE, 1) == 3
    assert ds.id_gap(7, 7) == 0
    assert ds.id_gap(7, 6) == 0  # from the past: not a gap
    q = ds.QueueSchedule(delay_ms=1)
    q.expected_id = 0xFFFFFFFF
    q.on_packet(0xFFFFFFFF, T0)
    q.on_packet(0, T0)
    q.on_packet(1, T0)
    assert q.counters.id_gaps == 0 and q.expected_id == 2


# ---- lateness -------------------------------------------------------------------------------
def test_lateness_is_recorded_per_released_packet():
    q = ds.QueueSchedule(delay_ms=10)
    for i in range(1, 101):
        q.on_packet(i, T0)                  # all due at T0 + 10 ms
    q.released(98, T0 + 0.010 + 200e-6)     # 0.2 ms late
    q.released(1, T0 + 0.010 + 3e-3)        # 3 ms late
    q.released(1, T0 + 0.010 - 30e-6)       # within the grace: counts as 0
    r = q.counters.report()
    assert r["released"] == 100 and r["late_packets"] == 1
    assert r["lateness_ms"]["max"] == pytest.approx(3.0, abs=1e-6)
    assert 0.2 <= r["lateness_ms"]["p50"] <= 0.2 * 1.125 + 1e-3
    assert 0.2 <= r["lateness_ms"]["p99"] <= 0.2 * 1.125 + 1e-3
    q.counters.reset()
    r = q.counters.report()
    assert r["released"] == r["late_packets"] == r["packets"] == 0
    assert r["lateness_ms"] == {"p50": 0.0, "p99": 0.0, "max": 0.0}


def test_histogram_percentiles_are_within_a_bucket():
    rng = random.Random(23)
    h = ds.LatencyHistogram()
    values = [rng.lognormvariate(math.log(200e-6), 1.0) for _ in range(20_000)]
    for v in values:
        h.record(v)
    values.sort()
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = values[math.ceil(q * len(values)) - 1]
        got = h.percentile_s(q)
        assert exact <= got <= max(exact * 1.125, exact + 2e-6), (q, exact, got)
    assert h.max_s == values[-1] and h.percentile_s(1.0) == values[-1]
    assert h.over == sum(v > 1e-3 for v in values)


def test_histogram_buckets_tile_the_line():
    for index in range(1, ds.N_BUCKETS):
        low = ds.bucket_upper_us(index - 1)
        assert ds.bucket_of(low) == index
        assert ds.bucket_of(ds.bucket_upper_us(index) - 1) == index
    assert ds.bucket_of(-5) == 0 and ds.bucket_of(10**15) == ds.N_BUCKETS - 1


# ---- wake-up lead ---------------------------------------------------------------------------
@pytest.mark.parametrize("latency_s", [0.0, 80e-6, 400e-6])
def test_lead_converges_to_the_loop_latency(latency_s):
    """The loop sets off `lead` before a deadline and its verdict lands `latency` later, so
    it is late by latency - lead: the lead must converge to the latency."""
    lead = ds.LeadControl()
    rng = random.Random(2)
    for _ in range(200):
        late = latency_s + rng.uniform(-10e-6, 10e-6) - lead.lead_s
        lead.update(late)
    assert lead.lead_s == pytest.approx(latency_s, abs=15e-6)


def test_lead_is_clamped():
    lead = ds.LeadControl()
    for _ in range(100):
        lead.update(0.05)
    assert lead.lead_s == ds.LEAD_MAX_S
    for _ in range(100):
        lead.update(-0.05)
    assert lead.lead_s == 0.0


# ---- the kernel's counters (text as this kernel, 6.18, prints it) -----------------------------
def test_parse_nfqueue_proc():
    text = ("    9   8114     0 2     1     0    24       40  1\n"
            "   10 2664688557     0 2     1    10     0       30  1\n")
    assert parse_nfqueue_proc(text) == {9: (0, 24, 40), 10: (10, 0, 30)}
    assert parse_nfqueue_proc("") == {}


def test_parse_netlink_drops():
    text = ("sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n"
            "00000000ae9d7356 12  8114       00000000 0        0        0     2        24       26798   \n"
            "000000008c9cb518 0   0          00000000 0        0        0     2        0        4       \n")
    assert parse_netlink_drops(text) == {26798: 24, 4: 0}
