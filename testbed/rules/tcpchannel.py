"""One transfer direction's K persistent TCP connections, message after message: how long each
message takes alone, given what the messages before it left in the connections. Pure.

One job: a message's solo time (first byte sent to last byte arrived) on a channel whose state
lives across messages. The trainer opens a stage boundary's K connections once and sends every
micro-batch's activation (or gradient) over them, so a message meets:
- the windows its predecessors still hold: each connection has at most its window in flight,
  the window being the smallest of the receive window the hosts advertise, the congestion window,
  and (with random loss) the average window of the congestion control's loss response
  (testbed.rules.tcploss). A chunk sent at time s is acknowledged at s + RTT (the round-trip
  model of testbed.predict.transfer); a connection sends again as soon as acknowledgements free
  its window, so a message sent while an earlier one is in flight waits for the earlier one's
  acknowledgements instead of getting windows of its own;
- the congestion window as the host left it: it grows by the bytes acknowledged (slow start)
  while it is below twice the most the connection had in flight (Linux's
  tcp_is_cwnd_limited; at most twice the receive window), and after an idle gap longer than the RTO (Linux's
  tcp_slow_start_after_idle, where the scenario keeps it) it is halved once per RTO of the gap
  beyond the first and never below the initial window (tcp_cwnd_restart), where the old rule
  restarted from the initial window whatever the gap;
- the time to resend what is lost (testbed.rules.tcploss.recovery_ms), added to its arrival;
- with `loss_events` (the simulator's channels), random loss as events instead of the loss
  response's average window: each connection loses the packet at which its expected losses
  (loss x packets sent) reach one, its first staggered over one loss interval. A loss past the
  window of the last one's recovery sets ssthresh and the window to the window times beta (0.5
  Reno, 0.7 CUBIC), detected a round trip after the packet left; above ssthresh the window
  grows in congestion avoidance while it is full (Reno one segment per window acknowledged;
  CUBIC towards the larger of its cubic and Reno-friendly windows, RFC 9438, its epoch moved
  on by idle time as Linux's bictcp_cwnd_event does), and an idle restart keeps ssthresh at
  3/4 of the window at least (tcp_current_ssthresh). So a loss's smaller window lasts across
  the messages after it, which the average response does not see: measured, 0.1% loss on
  25-50 ms cost multitcp and atlas 36-58% (docs/model_grid.md). Where it is used, the window
  is not also capped at the average response.
The message is striped over min(K, bytes / 4 KiB) connections (testbed.rules.stripes); per round
trip each connection sends what its window allows, and the chunks of the message queue one after
another at the bottleneck rate (its own FIFO: other messages' contention is the simulator's).
Past GROUPS stripes (the paper-scale scenarios' hundreds of connections), the stripes are
simulated as GROUPS groups of equal connections with one state each: a group's chunk is its
connections' chunks back to back, all acknowledged a round trip after the first started (the
last of a group's g connections up to g - 1 chunks' time early).

A fresh channel with warm connections gives testbed.predict.transfer.transfer_ms's time, and one
restarting slow start its slow-start time (tests/test_model_tcp.py checks both).

Speed (the simulator sends millions of messages at paper scale): a message sent with nothing in
flight, in a state the channel has seen, goes as it went then (`memo`, exact: the state is the
key); `settled_send` says what a copy's send would give where the memo answers it, without the
copy (testbed.rules.serial_links.MemberHolds asks it per idle class); the acknowledgement loops are
written out in `send` and `_next_chunk`, the innermost loops of the model.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from operator import itemgetter

from testbed.rules.stripes import stripe_count
from testbed.rules.tcploss import CUBIC_BETA, CUBIC_C, MODELLED, recovery_ms, window_under_loss
from testbed.spec.scenario import ETH_FRAME_BYTES, TCP_MSS_BYTES

INITIAL_WINDOW_SEGMENTS = 10      # Linux's initial congestion window (RFC 6928)
WIRE_PER_PAYLOAD = ETH_FRAME_BYTES / TCP_MSS_BYTES
# Above this many connections a message's stripes are simulated as this many groups of equal
# connections (module docstring); at or below it, one by one
GROUPS = 16
MEMO_STATES = 256       # states a channel remembers the outcome of (Channel.memo)
EPS = 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class ChannelSpec:
    """A routed path as the channel's connections see it (configured, real-time values)."""
    rate_mbit: float            # the bottleneck rate (wire)
    one_way_ms: float
    rtt_ms: float
    window_bytes: float         # receive window per connection
    connections: int = 1        # K
    loss: float = 0.0           # packet loss probability on the path (0..1)
    congestion_control: str = "cubic"
    slow_start_after_idle: bool = True
    rto_ms: float = math.inf    # idle longer than this restarts the congestion window

    @property
    def loss_window_bytes(self) -> float:
        """The average window of the loss response (inf without loss, and for BBR, whose rate
        is taken as insensitive to random loss: testbed.predict.unmodelled says so)."""
        if self.loss <= 0 or self.congestion_control not in MODELLED:
            return math.inf
        return window_under_loss(self.congestion_control, self.rtt_ms, self.loss)


@dataclass(slots=True)
class _Connection:
    cwnd: float                 # bytes
    chunks: deque               # (start ms, bytes) in flight: acknowledged at start + RTT
    last_sent_ms: float = -math.inf     # when its last chunk finished leaving
    flight_max: float = 0.0     # the most bytes it had in flight (Linux's max_packets_out)
    # with loss events (Channel's loss_events):
    ssthresh: float = math.inf  # bytes: slow start below it, congestion avoidance above
    debt: float = 0.5           # expected losses since the last one (a loss at 1)
    w_max: float = 0.0          # bytes: the window at the last loss (CUBIC's W_max)
    epoch_ms: float = -math.inf     # when the last loss was detected, moved on by idle time
    recovered_ms: float = -math.inf     # before this, a loss is in the same window as the last

    def copy(self) -> "_Connection":
        """An independent connection in this one's state (its own chunks). Field by field
        without __init__ (the simulator copies millions): a new field goes here too
        (tests/test_model_tcp.py checks that every field is copied)."""
        twin = _new(_Connection)
        twin.cwnd, twin.chunks = self.cwnd, deque(self.chunks)
        twin.last_sent_ms, twin.flight_max = self.last_sent_ms, self.flight_max
        twin.ssthresh, twin.debt, twin.w_max = self.ssthresh, self.debt, self.w_max
        twin.epoch_ms, twin.recovered_ms = self.epoch_ms, self.recovered_ms
        return twin


_new = object.__new__
_SIZE = itemgetter(1)


class Channel:
    """K persistent connections in one direction (module docstring). loss_events: random
    loss as events, one every 1/p packets per connection (module docstring), instead of the
    loss response's average window and the expected resend time."""

    def __init__(self, spec: ChannelSpec, warm: bool = True, loss_events: bool = False):
        self.spec = spec
        self.cap = 2 * spec.window_bytes
        self.initial_bytes = min(spec.window_bytes, INITIAL_WINDOW_SEGMENTS * TCP_MSS_BYTES)
        first = self.cap if warm else self.initial_bytes
        self.events = (loss_events and spec.loss > 0
                       and spec.congestion_control in MODELLED)
        self.reduced = False            # a queue's drop reduced a window (`congest`)
        self.first_round_bytes = 0.0    # payload the last message sent before any wait
        n = max(1, min(GROUPS, spec.connections))
        # the connections' first losses staggered over one loss interval
        self.conns = [_Connection(cwnd=first, chunks=deque(), debt=(i + 0.5) / n)
                      for i in range(n)]
        self.ms_per_byte = WIRE_PER_PAYLOAD * 8 / (spec.rate_mbit * 1e3)
        # never above the receive window, nor (averaged) the loss response's
        self.most = (spec.window_bytes if self.events
                     else min(spec.window_bytes, spec.loss_window_bytes))
        # (payload, each connection's window and most in flight) with nothing in flight ->
        # (solo time, the connections after it, times from the send; its first round's bytes):
        # a message sent in a state seen before goes as it went then (shared with the
        # channel's copies)
        self.memo: dict[tuple, tuple[float, list, float]] = {}

    def _grow(self, c: _Connection, size: float, at: float) -> None:
        """Below ssthresh, slow start: the window grows by the bytes acknowledged while it is
        below twice the most it had in flight (Linux grows only a window that limits:
        tcp_is_cwnd_limited), at most to the cap. Above it (after a loss), congestion
        avoidance while the window is full: Reno one segment per window acknowledged, CUBIC
        towards the larger of its cubic and its Reno-friendly window (RFC 9438) at `at`. A
        window at the cap stays (the callers skip the call then)."""
        if c.cwnd < c.ssthresh:
            limit = min(self.cap, 2 * c.flight_max)
            if c.cwnd < limit:
                c.cwnd = min(limit, c.cwnd + size)
            return
        if c.flight_max < c.cwnd - EPS or c.cwnd >= self.cap:
            return
        if self.spec.congestion_control == "reno":
            inc = TCP_MSS_BYTES * size / c.cwnd
        else:
            t_s = max(0.0, at - c.epoch_ms) / 1e3
            w_max = c.w_max / TCP_MSS_BYTES
            k = (w_max * (1 - CUBIC_BETA) / CUBIC_C) ** (1 / 3)
            cubic = CUBIC_C * (t_s - k) ** 3 + w_max
            friendly = (w_max * CUBIC_BETA + 3 * (1 - CUBIC_BETA) / (1 + CUBIC_BETA)
                        * t_s * 1e3 / max(self.spec.rtt_ms, EPS))
            target = max(cubic, friendly) * TCP_MSS_BYTES
            inc = max(0.0, target - c.cwnd) * size / c.cwnd
        c.cwnd = min(self.cap, c.cwnd + inc)

    def _lose(self, c: _Connection, start: float, size: float, each_ms: float) -> None:
        """The loss events in a chunk of `size` bytes per connection (of c's group: each of
        its alike connections loses on its own packet count, at once), sent from `start` at
        each_ms a byte: where one falls past the window of the last (one
        reduction per window of data, as NewReno/SACK recovery), ssthresh and the window become
        the window times beta (0.5 Reno, 0.7 CUBIC; never below 2 segments), detected a round
        trip after the lost packet left, and congestion avoidance follows (`_grow`)."""
        spec = self.spec
        packets = size / TCP_MSS_BYTES
        before = c.debt
        c.debt += spec.loss * packets
        if c.debt < 1.0:
            return
        c.debt -= math.floor(c.debt)
        left_at = start + (1.0 - before) / (spec.loss * packets) * size * each_ms
        self._reduce(c, left_at)

    def _reduce(self, c: _Connection, left_at: float) -> None:
        """The congestion control's response to a packet c sent at left_at and lost: where it
        falls past the window of the last reduction, ssthresh and the window become the window
        times beta, detected a round trip later."""
        if left_at < c.recovered_ms:
            return
        spec = self.spec
        w = min(c.cwnd, self.most)
        beta = 0.5 if spec.congestion_control == "reno" else CUBIC_BETA
        c.w_max = w if w >= c.w_max else w * (1 + beta) / 2        # CUBIC's fast convergence
        c.cwnd = c.ssthresh = max(2 * TCP_MSS_BYTES, w * beta)
        c.epoch_ms = c.recovered_ms = left_at + spec.rtt_ms

    def congest(self, sent_ms: float, lost_bytes: float) -> None:
        """A queue on the path dropped lost_bytes (payload) of the message whose first round
        left at sent_ms: the last packets of a burst whose connections' packets interleave, so
        the drops fall on min(K, packets lost) of its connections (the last ones), each of which
        reduces its window (`_reduce`) if the drop is past its last reduction's window. The
        channel is no longer one whose outcome a state of windows alone decides (no memo)."""
        if lost_bytes <= 0 or self.spec.congestion_control not in MODELLED:
            return
        self.reduced = True
        hit = min(1.0, lost_bytes / TCP_MSS_BYTES / max(1, self.spec.connections))
        n = len(self.conns)
        for c in self.conns[n - max(1, round(hit * n)):]:
            self._reduce(c, sent_ms)


    def copy(self) -> "Channel":
        """An independent channel in this one's state (a folded train's members start from
        their head's)."""
        twin = Channel.__new__(Channel)
        (twin.spec, twin.cap, twin.initial_bytes, twin.ms_per_byte, twin.most, twin.memo,
         twin.events, twin.reduced, twin.first_round_bytes) = (
            self.spec, self.cap, self.initial_bytes, self.ms_per_byte, self.most, self.memo,
            self.events, self.reduced, self.first_round_bytes)
        twin.conns = [c.copy() for c in self.conns]
        return twin

    def idle_ms(self, now: float) -> float:
        """How long the channel's most recently used connection has sat idle at `now`."""
        return now - max(c.last_sent_ms for c in self.conns)

    def send(self, now: float, payload_bytes: float) -> float:
        """Send a message at `now`: its solo time (first byte sent to last byte arrived), with
        the state its predecessors left; the channel keeps this message's chunks."""
        if payload_bytes <= 0:
            return 0.0
        spec = self.spec
        k = stripe_count(int(payload_bytes), spec.connections)
        groups = min(k, GROUPS)
        conns = self.conns[:groups]
        each_ms = self.ms_per_byte * k / groups     # a group's chunk: its connections' in turn
        rtt, most, cap = spec.rtt_ms, self.most, self.cap
        restarts, rto = spec.slow_start_after_idle, spec.rto_ms
        settled = not (self.events or self.reduced)
        for c in conns:                 # what was acknowledged by now, then idle restarts
            chunks = c.chunks
            while chunks and chunks[0][0] + rtt <= now + EPS:     # acknowledged
                start, size = chunks.popleft()
                if c.cwnd < cap:        # (`_grow` leaves a window at the cap as it is)
                    self._grow(c, size, start + rtt)
            if chunks:
                settled = False
            elif restarts and now - c.last_sent_ms > rto or math.isfinite(c.epoch_ms):
                self._restart_if_idle(c, now)       # (else it leaves c as it is)
        if settled:                     # nothing in flight: as the last time in this state
            key = (payload_bytes, tuple((c.cwnd, c.flight_max) for c in conns))
            seen = self.memo.get(key)
            if seen is not None:
                solo, after, self.first_round_bytes = seen
                for c, (cwnd, flight_max, chunks, last) in zip(conns, after):
                    c.cwnd, c.flight_max, c.last_sent_ms = cwnd, flight_max, now + last
                    for t, size in chunks:
                        c.chunks.append((now + t, size))
                return solo
        left = [payload_bytes / k] * groups
        free = now                      # this message's own queue at the bottleneck
        rooms = []              # what each sends now without waiting (as `_next_chunk` at now)
        for c in conns:
            window = min(most, c.cwnd)
            room = window - sum(map(_SIZE, c.chunks))
            rooms.append(min(left[0], max(room, EPS))
                         if room >= min(left[0], window) - EPS or not c.chunks else 0.0)
        first_round = sum(rooms) * k / groups
        events = self.events
        while max(left) > EPS:          # a round: each connection with bytes left sends a chunk
            for i, c in enumerate(conns):
                if left[i] <= EPS:
                    continue
                start, size = self._next_chunk(c, free, left[i])
                start = max(start, free)
                chunks = c.chunks
                chunks.append((start, size))
                c.flight_max = max(c.flight_max, sum(map(_SIZE, chunks)))
                if events:
                    self._lose(c, start, size, each_ms)
                free = start + size * each_ms
                c.last_sent_ms = free
                left[i] -= size
        packets = math.ceil(payload_bytes / k / TCP_MSS_BYTES - EPS)
        solo = free + spec.one_way_ms + recovery_ms(spec.loss, spec.rtt_ms, k, packets) - now
        self.first_round_bytes = first_round
        if settled and len(self.memo) < MEMO_STATES:
            self.memo[key] = (solo, [(c.cwnd, c.flight_max,
                                      [(t - now, size) for t, size in c.chunks],
                                      c.last_sent_ms - now) for c in conns], first_round)
        return solo

    def settled_send(self, now: float, payload_bytes: float) -> tuple[float, float] | None:
        """What `send(now, payload_bytes)` on a copy of this channel would give, without the
        copy, where the memo answers it: (the solo time, when the copy's connections last
        sent, the latest); None where it would not (a chunk still in flight at `now`, a window
        an acknowledgement grows, loss events, a reduced window, or a state not seen before:
        then copy and send). Changes nothing."""
        if payload_bytes <= 0 or self.events or self.reduced:
            return None
        spec = self.spec
        k = stripe_count(int(payload_bytes), spec.connections)
        groups = min(k, GROUPS)
        conns = self.conns[:groups]
        rtt, cap, restarts, rto = spec.rtt_ms, self.cap, spec.slow_start_after_idle, spec.rto_ms
        state = []                      # each connection's (window, most in flight) after
        for c in conns:                 # its acknowledgements and idle restart, as `send`
            if c.chunks and (c.cwnd < cap or any(start + rtt > now + EPS
                                                 for start, _ in c.chunks)):
                return None
            if math.isfinite(c.epoch_ms):
                return None
            cwnd, gap = c.cwnd, now - c.last_sent_ms
            if restarts and gap > rto:  # as `_restart_if_idle`
                cwnd = max(min(self.initial_bytes, cwnd), cwnd / 2 ** halvings(gap, rto))
            state.append((cwnd, c.flight_max))
        seen = self.memo.get((payload_bytes, tuple(state)))
        if seen is None:
            return None
        solo, after, _ = seen
        sent = [now + last for _, _, _, last in after]
        sent += [c.last_sent_ms for c in self.conns[groups:]]
        return solo, max(sent)

    def _next_chunk(self, c: _Connection, t: float, left: float) -> tuple[float, float]:
        """When connection c may next send and how much of `left`: at t, after dropping the
        chunks acknowledged by then (growing its window), where its window has room for a full
        chunk (a window's worth, or what is left) or nothing is in flight; else when the
        acknowledgements of its oldest chunks make room."""
        rtt, most, cap, chunks = self.spec.rtt_ms, self.most, self.cap, c.chunks
        while True:
            while chunks and chunks[0][0] + rtt <= t + EPS:     # acknowledged
                start, size = chunks.popleft()
                if c.cwnd < cap:        # (`_grow` leaves a window at the cap as it is)
                    self._grow(c, size, start + rtt)
            window = min(most, c.cwnd)
            room = window - sum(map(_SIZE, chunks))
            if room >= min(left, window) - EPS or not chunks:
                return t, min(left, max(room, EPS))
            t = chunks[0][0] + rtt

    def _restart_if_idle(self, c: _Connection, now: float) -> None:
        """Linux's tcp_cwnd_restart for c, with nothing in flight at `now`: idle longer than
        the RTO, the window halves once per RTO of the gap past the first, never below the
        initial window."""
        spec = self.spec
        gap = now - c.last_sent_ms
        if math.isfinite(c.epoch_ms) and gap > 0:
            c.epoch_ms += gap           # CUBIC's epoch skips idle time (bictcp_cwnd_event)
        if not spec.slow_start_after_idle or gap <= spec.rto_ms:
            return
        c.ssthresh = max(c.ssthresh, 0.75 * c.cwnd)     # tcp_current_ssthresh
        floor = min(self.initial_bytes, c.cwnd)
        c.cwnd = max(floor, c.cwnd / 2 ** halvings(gap, spec.rto_ms))


def halvings(gap_ms: float, rto_ms: float) -> int:
    """How often tcp_cwnd_restart halves the window after an idle gap: once per RTO of the gap
    past the first (64: as good as never sent)."""
    if gap_ms <= rto_ms:
        return 0
    return min(64, math.ceil(gap_ms / rto_ms - EPS) - 1) if math.isfinite(gap_ms) else 64

