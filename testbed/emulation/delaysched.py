"""The delay line's scheduling, apart from its netlink I/O (`testbed.emulation.delayline`).

One job: for each packet a queue hands us, decide whether it is lost and when it is due; at each
wake-up, pick which packets to release (one batch verdict: the highest due id) and when to wake
next; learn how early to wake; and count what happened. Pure: no sockets, no root; every time is
passed in (seconds, on the clock of the kernel's arrival stamps, CLOCK_REALTIME), and the random
numbers come from a `random.Random` the caller seeds.

Due times: due = max(arrival + delay + uniform(-jitter, +jitter), previous due of the queue), so
a queue's due times never go backwards and packets leave in the order they came (see the
delayline docstring for what that costs under jitter).

Batch verdicts and ids. The kernel gives every packet it queues the next id of that queue
(`++id_sequence`, under the queue's lock), and `nfqnl_recv_verdict_batch` accepts every entry
*in its queue list* with id <= the given id (wrapping u32 compare). So the release of a batch up
to id N is exact when the ids we hold are every id <= N still queued, in due order, which the
FIFO guarantees. A gap in the ids we see (id k never reached us) means, by the kernel's code
(`__nfqnl_enqueue_packet`), that the netlink unicast of k failed (our socket was full): the kernel
then counts it in `queue_user_dropped` and frees the packet without putting it on the queue list,
so no later batch verdict can touch it, and nothing leaves early. Were a message ever lost on
our side instead (a bug), packet k would leave with the first batch that covers it: at a due
time of a packet that arrived after it, so no earlier than arrival + delay - jitter, never
before its delay. Gaps are counted either way (`id_gaps`, expected to equal the kernel's
`dropped_user`).

Lateness: verdict time minus due time, per released packet, in a fixed log-bucket histogram
(`LatencyHistogram`): cheap to fill, cheap percentiles, reset in place per report interval.
Releases up to RELEASE_GRACE_S before the due time (so one wake-up serves packets due within
50 us of each other) count as 0.
"""

from __future__ import annotations

import collections
import math
import random
from dataclasses import dataclass, field
from typing import Iterable

RELEASE_GRACE_S = 50e-6   # release what is due this close, rather than sleep again
LATE_S = 1e-3             # a release later than this counts in late_packets
LEAD_GAIN = 0.2           # integral gain of the wake-up lead control
LEAD_MAX_S = 0.002
ID_MASK = 0xFFFFFFFF      # packet ids are u32 and wrap

_SUB_BITS = 3                   # 8 sub-buckets per power of two: bucket width <= 1/8 of value
_SUB = 1 << _SUB_BITS
_LINEAR_US = 2 * _SUB           # values below 16 us get one bucket per microsecond
_MAX_BITS = 34                  # up to 2^34 us (~4.8 h); larger values go in the last bucket
N_BUCKETS = _LINEAR_US + (_MAX_BITS - _SUB_BITS - 1) * _SUB


def bucket_of(us: int) -> int:
    """Bucket index of a whole number of microseconds (HdrHistogram-like log-linear buckets)."""
    if us < _LINEAR_US:
        return us if us > 0 else 0
    bits = us.bit_length()
    if bits > _MAX_BITS:
        return N_BUCKETS - 1
    return _LINEAR_US + (bits - _SUB_BITS - 2) * _SUB + ((us >> (bits - _SUB_BITS - 1)) & (_SUB - 1))


def bucket_upper_us(index: int) -> int:
    """Exclusive upper bound of a bucket, in microseconds."""
    if index < _LINEAR_US:
        return index + 1
    octave, sub = divmod(index - _LINEAR_US, _SUB)
    shift = octave + 1
    return (_SUB + sub + 1) << shift


class LatencyHistogram:
    """Counts of durations (seconds) in fixed log buckets, plus the exact max and the number
    over LATE_S. Percentiles are a bucket's upper bound (never above the exact max)."""

    __slots__ = ("counts", "total", "max_s", "over")

    def __init__(self) -> None:
        self.counts = [0] * N_BUCKETS
        self.total = 0
        self.max_s = 0.0
        self.over = 0

    def record(self, value_s: float) -> None:
        if value_s > 0.0:
            self.counts[bucket_of(int(value_s * 1e6))] += 1
            if value_s > self.max_s:
                self.max_s = value_s
            if value_s > LATE_S:
                self.over += 1
        else:
            self.counts[0] += 1
        self.total += 1

    def percentile_s(self, q: float) -> float:
        """The q-quantile (0 < q <= 1), 0.0 when empty."""
        if not self.total:
            return 0.0
        rank = max(1, math.ceil(q * self.total - 1e-9))  # 0.99 * 100 is 99.00000000000001
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(bucket_upper_us(index) * 1e-6, self.max_s)
        return self.max_s

    def reset(self) -> None:
        counts = self.counts
        for i in range(N_BUCKETS):
            counts[i] = 0
        self.total = 0
        self.max_s = 0.0
        self.over = 0


def due_time(arrival_s: float, delay_s: float, jitter_s: float, last_due_s: float,
             rng: random.Random) -> float:
    """When a packet that arrived at arrival_s is due: delay plus uniform jitter, but never
    before the queue's previous packet (order is kept)."""
    if jitter_s:
        delay_s += rng.uniform(-jitter_s, jitter_s)
    due = arrival_s + delay_s
    return due if due > last_due_s else last_due_s


def id_gap(expected: int, packet_id: int) -> int:
    """How many ids were skipped before packet_id (u32 wrap-around; an id from the past,
    which the kernel never sends, counts as no gap)."""
    gap = (packet_id - expected) & ID_MASK
    return gap if gap < 0x80000000 else 0


@dataclass(slots=True)
class QueueCounters:
    """What one queue (one link direction) did since the last reset."""

    packets: int = 0          # kept and delayed (GSO super-packets count once)
    bytes: int = 0            # IP bytes of those (the kernel's NFQA_CAP_LEN; 0 when absent)
    dropped_loss: int = 0     # dropped by the configured loss_pct
    id_gaps: int = 0          # ids that never reached us
    verdict_errors: int = 0   # verdicts the kernel refused (the packet was gone, e.g. flushed)
    lateness: LatencyHistogram = field(default_factory=LatencyHistogram)
    # From the kernel's arrival stamp to our read: time the packet spent in the kernel before
    # the delay line saw it (a busy CPU deferring network softirqs, or our own wake-up). It is
    # part of the delay, not added to it, unless it exceeds the delay (then lateness shows it).
    arrival_lag: LatencyHistogram = field(default_factory=LatencyHistogram)

    def reset(self) -> None:
        self.packets = self.bytes = self.dropped_loss = self.id_gaps = self.verdict_errors = 0
        self.lateness.reset()
        self.arrival_lag.reset()

    def report(self) -> dict:
        h = self.lateness
        return {"packets": self.packets, "bytes": self.bytes, "dropped_loss": self.dropped_loss,
                "id_gaps": self.id_gaps, "verdict_errors": self.verdict_errors,
                "released": h.total, "late_packets": h.over,
                "lateness_ms": _summary_ms(h), "arrival_lag_ms": _summary_ms(self.arrival_lag)}


def _summary_ms(h: LatencyHistogram) -> dict[str, float]:
    return {"p50": round(h.percentile_s(0.5) * 1e3, 4), "p99": round(h.percentile_s(0.99) * 1e3, 4),
            "max": round(h.max_s * 1e3, 4)}


class QueueSchedule:
    """One queue's FIFO of (due time, packet id), its loss and jitter draws, and its counters."""

    __slots__ = ("delay_s", "jitter_s", "loss_pct", "rng", "pending", "last_due_s",
                 "expected_id", "counters")

    def __init__(self, delay_ms: float, jitter_ms: float = 0.0, loss_pct: float = 0.0,
                 rng: random.Random | None = None) -> None:
        self.delay_s = delay_ms / 1e3
        self.jitter_s = jitter_ms / 1e3
        self.loss_pct = loss_pct
        self.rng = rng or random.Random(1)
        self.pending: collections.deque[tuple[float, int]] = collections.deque()
        self.last_due_s = 0.0
        self.expected_id = 1    # a freshly bound queue numbers its packets from 1
        self.counters = QueueCounters()

    def on_packet(self, packet_id: int, arrival_s: float, nbytes: int = 0,
                  read_s: float | None = None) -> bool:
        """Account for a packet (read by us at read_s) and schedule it; False if it is lost
        (the caller drops it)."""
        c = self.counters
        if read_s is not None:
            c.arrival_lag.record(read_s - arrival_s)
        if packet_id != self.expected_id:
            c.id_gaps += id_gap(self.expected_id, packet_id)
        self.expected_id = (packet_id + 1) & ID_MASK
        if self.loss_pct and self.rng.random() * 100.0 < self.loss_pct:
            c.dropped_loss += 1
            return False
        due = due_time(arrival_s, self.delay_s, self.jitter_s, self.last_due_s, self.rng)
        self.last_due_s = due
        self.pending.append((due, packet_id))
        c.packets += 1
        c.bytes += nbytes
        return True

    def due_batch(self, horizon_s: float) -> tuple[int, int]:
        """(how many packets are due by horizon_s, the id of the last of them); (0, 0) if none.
        Nothing is removed: call released() once the batch verdict is sent."""
        count = 0
        last_id = 0
        for due, packet_id in self.pending:
            if due > horizon_s:
                break
            count += 1
            last_id = packet_id
        return count, last_id

    def released(self, count: int, now_s: float) -> None:
        """The first `count` pending packets left at now_s: record how late each was."""
        pending = self.pending
        record = self.counters.lateness.record
        for _ in range(count):
            record(now_s - pending.popleft()[0])

    def next_due(self) -> float | None:
        return self.pending[0][0] if self.pending else None


def next_deadline(schedules: Iterable[QueueSchedule]) -> float | None:
    """The earliest due time over all queues (None when nothing is pending)."""
    best = None
    for s in schedules:
        if s.pending:
            due = s.pending[0][0]
            if best is None or due < best:
                best = due
    return best


class LeadControl:
    """How early the loop sets off for a deadline. Integral control on how late the release
    aimed at came out (measured once its verdict is sent): it converges to the loop's own
    latency (wake-up, reading, the verdict), clamped to 0..max_s."""

    __slots__ = ("lead_s", "gain", "max_s")

    def __init__(self, gain: float = LEAD_GAIN, max_s: float = LEAD_MAX_S) -> None:
        self.lead_s = 0.0
        self.gain = gain
        self.max_s = max_s

    def update(self, late_s: float) -> float:
        lead = self.lead_s + self.gain * late_s
        self.lead_s = self.max_s if lead > self.max_s else (lead if lead > 0.0 else 0.0)
        return self.lead_s
