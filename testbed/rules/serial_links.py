"""The pipeline simulator's WAN links that serve one message at a time, in the order sent
(testbed.rules.pipeline's module docstring has the rules): FIFO trains (concurrent sharing on a
link whose every route is a one-round `burst`) and temporal slots (Atlas). Both keep a clock
per link (when it is next free, every message sent so far served in the order sent) and serve
the trains of folded replicas (testbed.rules.trains) among the other messages; they differ in how
long a message holds the link, when it arrives, what its burst loses at the link's queue and
how the lost bytes come back.
"""

from __future__ import annotations

from abc import abstractmethod
import math
from heapq import heappop, heappush
from typing import Any, Callable, Mapping

from testbed.rules.tcpchannel import WIRE_PER_PAYLOAD, Channel, halvings
from testbed.rules.trains import Middle, Trains
from testbed.rules.wanlinks import EPS, EventQueue, LinkDiscipline, MessageKey, Route
from testbed.spec.links import LinkDir


class SerialLinks(LinkDiscipline):
    """Links serving one message at a time in the order sent. A message standing for w alike
    ones without a head holds the link w times in turn and arrives with the last. A train's
    head registers the train's middle members on its first link (`middles`), served in the
    order sent among the other messages; the train's tail serves what is left of them first.
    Subclasses say how long a message holds the link (`message_ms`), how long a train's
    members do (`middle`), and when a message arrives and what its queue loses (`settle`)."""

    def __init__(self, events: EventQueue, deliver: Callable[..., Any],
                 rate_mbit: Mapping[LinkDir, float], queue_bytes: Mapping[LinkDir, float],
                 trains: Trains) -> None:
        super().__init__(events, deliver, rate_mbit)
        self.queue_bytes = queue_bytes
        self.trains = trains
        self.clock: dict[LinkDir, float] = {}                   # when each link is next free
        self.middles: dict[LinkDir, dict[tuple, Middle]] = {}   # head's message key -> train

    @abstractmethod
    def message_ms(self, route: Route, link: LinkDir) -> float:
        """How long one message holds the link."""

    @abstractmethod
    def middle(self, now: float, key: MessageKey, route: Route, n: int, gap: float,
               one_ms: float, warm_ms: float, before: Channel | None, start: float) -> Middle:
        """The middle members of head message `key`'s train of n, spaced gap apart; the head
        holds the link one_ms from `start`; before: the head's channel as it was before its
        message (None: the route has no channel the discipline times)."""

    @abstractmethod
    def settle(self, now: float, key: MessageKey, route: Route, link: LinkDir, start: float,
               hold: int, w: int, channel: Channel | None = None) -> None:
        """The message, served from `start` for `hold` messages' time (the link's clock at its
        end), arrives: what its burst loses at the queue, and when it and its resent bytes
        arrive."""

    def send(self, now: float, key: MessageKey, route: Route, w: int, sender: int,
             warm_ms: float, channel: Channel | None = None) -> None:
        link = route.links[0]
        self.serve_middles(link, now)
        r = key[2]
        hold = w
        head = self.trains.heads[r]
        if head is not None:            # the train's last: its middle is through first
            mid = self.middles.get(link, {}).pop((*key[:2], head, *key[3:]), None)
            if mid is not None:
                self.clock[link] = mid.rest_until(max(self.clock[link], now))
            hold = 1
        start = max(now, self.clock.get(link, 0.0))
        behind = self.trains.behind(r)
        before = None
        if channel is not None and self.times_channels:     # they send when it is served
            before = channel.copy() if behind is not None else None
            solo = channel.send(start, route.payload_bytes)
            if solo != route.solo_ms:
                route = route.timed(solo)
        one_ms = self.message_ms(route, link)
        self.clock[link] = start + hold * one_ms
        if behind is not None:          # a train's head: its middle follows it
            tail, n = behind
            gap = self.trains.gap(key, sender, r, tail, n)
            self.middles.setdefault(link, {})[key] = self.middle(
                now, key, route, n, gap, one_ms, warm_ms, before, start)
        self.settle(now, key, route, link, start, hold, w, channel)

    def serve_middles(self, link: LinkDir, t: float) -> None:
        """Serve, in the order sent, every train member sent by t (before a message sent at t).
        One train's members a_i ... a_j, spaced alike and served alike, from a link free at W,
        leave it free at max(W + m d, a_i + m d, a_j + d); members of several trains interleave,
        and members in slow start after idle take longer, so those are served one by one in the
        order sent."""
        trains = self.middles.get(link)
        if not trains:
            return
        due: list[tuple[Middle, int, int]] = []      # (train, first member, last member)
        for k in list(trains):
            b = trains[k]
            i, n, t0, gap = b.next, b.n, b.first_sent, b.spacing
            if t0 + i * gap > t + EPS:
                continue
            j = n - 1 if gap <= 0 else min(n - 1, int((t - t0) / gap + EPS))
            due.append((b, i, j))
            b.next = j + 1
            if b.next >= n:
                del trains[k]
        W = self.clock.get(link, 0.0)
        queued = any(b.burst_bytes for b, _, _ in due)    # members' bursts meet a queue
        if (len(due) == 1 and not queued and due[0][0].hold_of is None
                and due[0][0].member_ms(due[0][1], W) == due[0][0].member_ms(due[0][2], W)):
            b, i, j = due[0]
            count, d = j - i + 1, b.member_ms(i, W)
            W = max(W + count * d, b.first_sent + i * b.spacing + count * d,
                    b.first_sent + j * b.spacing + d)
        elif len(due) == 1 and not queued:      # one train's members in turn
            b, i, j = due[0]
            t0, gap = b.first_sent, b.spacing
            holds = b.hold_of
            alike = (holds.alike(max(W, t0 + i * gap))
                     if isinstance(holds, MemberHolds) else None)
            if alike is not None:       # all hold alike: in closed form (as above)
                W = holds.serve(i, j, W, t0, gap, *alike)
            else:
                for x in range(i, j + 1):
                    start = max(W, t0 + x * gap)
                    W = start + b.member_ms(x, start)
        elif due:
            for a, _, b, x in sorted((b.first_sent + x * b.spacing, n, b, x)
                                     for n, (b, i, j) in enumerate(due)
                                     for x in range(i, j + 1)):
                start = max(W, a)
                if b.burst_bytes:
                    self.clock[link] = W
                    W = start + self.member_queued(link, b, x, a, start, t)
                else:
                    W = start + b.member_ms(x, start)
        self.clock[link] = W

    def member_queued(self, link: LinkDir, b: Middle, x: int, sent: float, start: float,
                      now: float) -> float:
        """How long train member x, sent at `sent` and served from `start` (no earlier than
        `now`'s send serves it), holds the link where its burst meets the link's queue."""
        return b.member_ms(x, start)

    def overflow(self, link: LinkDir, wait_ms: float, burst: float,
                 most: float | None = None, not_arrived: float = 0.0) -> float:
        """Wire bytes a burst loses at the link's queue, with wait_ms of the link's time ahead
        of it, less not_arrived bytes of that not in the queue yet (tail drop: what does not
        fit). Less than a byte is none: the backlog's sums round, and a drop cuts windows."""
        q = self.queue_bytes.get(link)
        if q is None:
            return 0.0
        ahead = max(0.0, max(0.0, wait_ms) * self.rate_mbit[link] * 125.0 - not_arrived)
        lost = min(burst if most is None else most, max(0.0, ahead + burst - q))
        return lost if lost >= 1.0 else 0.0     # less than a byte: the sums' rounding

    def add_drops(self, link: LinkDir, it: int, lost: float) -> None:
        per_it = self.drops.setdefault(link, {})
        per_it[it] = per_it.get(it, 0.0) + lost


class FifoTrains(SerialLinks):
    """Concurrent sharing on a link whose every route is a `burst` (the whole message leaves in
    its first round trip): the bursts queue at the bottleneck in the order sent. Each holds the
    link for its wire bytes at the link's rate and arrives one way later, or no earlier than its
    solo time after it was sent. A burst (what its connections send at once) arriving behind
    the link's backlog (what of it has reached the queue: `not_arrived`) loses what does not
    fit in its queue; the connections it falls on cut their windows (Channel.congest); the lost
    bytes leave the link's time and enter it again a round trip after they were sent
    (`resend`), behind what came meanwhile."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # per link: (when a message's hold ends, its wire bytes that wait for acknowledgements)
        self.later: dict[LinkDir, NotArrived] = {}
        # where a link has a queue: each channel's (kind, s, r) last burst (wire bytes)
        self.last_burst: dict[tuple, float] = {}

    def message_ms(self, route: Route, link: LinkDir) -> float:
        return route.wire_bytes * 8 / (self.rate_mbit[link] * 1e3)

    def middle(self, now: float, key: MessageKey, route: Route, n: int, gap: float,
               one_ms: float, warm_ms: float, before: Channel | None, start: float) -> Middle:
        return Middle(1, n, now, gap, one_ms, one_ms, 0.0, 0.0, route.rto_ms)

    def not_arrived(self, link: LinkDir, t: float) -> float:
        """Wire bytes of the link's backlog at t that have not reached its queue: what a
        message past its first round sends as acknowledgements free its windows (they come
        as the link serves it, the last of its bytes on the clock). Kept only for a link with
        a queue (nothing else asks)."""
        later = self.later.get(link)
        return 0.0 if later is None else later.at(t)

    def comes_later(self, link: LinkDir, end: float, wire: float) -> None:
        """wire bytes that reach the link's queue as it serves them, the last at `end`."""
        later = self.later.get(link)
        if later is None:
            later = self.later[link] = NotArrived(self.rate_mbit[link] * 125.0)
        later.add(end, wire)

    def settle(self, now: float, key: MessageKey, route: Route, link: LinkDir, start: float,
               hold: int, w: int, channel: Channel | None = None) -> None:
        arrive = max(self.clock[link] + route.one_way_ms, now + route.solo_ms)
        burst = route.burst_bytes if route.burst_bytes is not None else route.wire_bytes
        if channel is not None:         # its first round as its connections' windows allowed
            burst = min(burst, channel.first_round_bytes * WIRE_PER_PAYLOAD)
        if link in self.queue_bytes:
            self.last_burst[key[:3]] = burst
            mid = self.middles.get(link, {}).get(key)
            if mid is not None:     # a train's head: its members' bursts, from its to its tail's
                tail = self.trains.behind(key[2])[0]
                mid.burst_bytes = burst
                mid.burst_last = self.last_burst.get((*key[:2], tail), burst)
                mid.iteration, mid.rtt_ms = key[3], route.rtt_ms
        # what waits ahead of it (and has reached the queue), then its (alike) bursts
        lost = self.overflow(link, start - now, burst * hold,
                             None if channel is not None else hold * route.wire_bytes,
                             self.not_arrived(link, now))
        if channel is not None and route.wire_bytes > burst and link in self.queue_bytes:
            self.comes_later(link, self.clock[link], hold * (route.wire_bytes - burst))
        if lost <= 0:
            self.events.push(arrive, self.deliver, (key,))
            return
        if channel is not None:         # the senders' response to the drop
            channel.congest(now, lost / hold / WIRE_PER_PAYLOAD)
        self.add_drops(link, key[3], lost)
        self.clock[link] -= lost / (self.rate_mbit[link] * 125.0)
        self.events.push(now + route.rtt_ms, self.resend, (key, route, lost, arrive))

    def member_queued(self, link: LinkDir, b: Middle, x: int, sent: float, start: float,
                      now: float) -> float:
        """A train's member meets the queue as a simulated message does (`settle`): its burst
        (between its head's and its tail's last, by its place) behind the backlog that has
        reached the queue loses what does not fit; the lost bytes leave its hold and enter the
        link again a round trip after it sent (`resend_lost`); the rest of its message comes
        as acknowledgements free its windows (`not_arrived`)."""
        d = b.member_ms(x, start)
        wire = d * self.rate_mbit[link] * 125.0
        burst = min(wire, b.burst_bytes + (b.burst_last - b.burst_bytes) * x / b.n)
        lost = self.overflow(link, start - sent, burst, None, self.not_arrived(link, sent))
        if wire > burst:
            self.comes_later(link, start + d, wire - burst)
        if lost <= 0:
            return d
        self.add_drops(link, b.iteration, lost)
        self.events.push(max(now, sent + b.rtt_ms), self.resend_lost,
                         (link, b.iteration, lost, b.rtt_ms))
        return d - lost / (self.rate_mbit[link] * 125.0)

    def resend_lost(self, now: float, link: LinkDir, it: int, lost: float,
                    rtt_ms: float) -> None:
        """A train member's bytes lost a round trip ago enter the link again (as `resend`; the
        member's arrival is its tail's to time)."""
        self.serve_middles(link, now)
        start = max(now, self.clock.get(link, 0.0))
        again = self.overflow(link, start - now, lost, None, self.not_arrived(link, now))
        self.clock[link] = start + (lost - again) / (self.rate_mbit[link] * 125.0)
        if again > 0:
            self.add_drops(link, it, again)
            self.events.push(now + rtt_ms, self.resend_lost, (link, it, again, rtt_ms))

    def resend(self, now: float, key: MessageKey, route: Route, lost: float,
               arrive: float) -> None:
        """Bytes lost a round trip ago enter the link again, in the order sent."""
        link = route.links[0]
        self.serve_middles(link, now)
        start = max(now, self.clock.get(link, 0.0))
        again = self.overflow(link, start - now, lost, None, self.not_arrived(link, now))
        self.clock[link] = start + (lost - again) / (self.rate_mbit[link] * 125.0)
        arrive = max(arrive, self.clock[link] + route.one_way_ms)
        if again > 0:
            self.add_drops(link, key[3], again)
            self.events.push(now + route.rtt_ms, self.resend, (key, route, again, arrive))
        else:
            self.events.push(arrive, self.deliver, (key,))


class NotArrived:
    """A link's bytes (each message's: its wire bytes past its first round, the last of them
    at `end`) not in its queue yet at t: min(bytes, (end - t) x rate) each, summed. Each is
    whole until end - bytes / rate, and only those past that (few: a link serves one message
    at a time) are summed one by one."""

    __slots__ = ("per_ms", "whole", "whole_bytes", "partial")

    def __init__(self, per_ms: float) -> None:
        self.per_ms = per_ms                    # wire bytes per ms (the link's rate)
        self.whole: list[tuple[float, float, float]] = []   # heap: (whole until, end, bytes)
        self.whole_bytes = 0.0
        self.partial: list[tuple[float, float]] = []        # (end, bytes)

    def add(self, end: float, wire: float) -> None:
        heappush(self.whole, (end - wire / self.per_ms, end, wire))
        self.whole_bytes += wire

    def at(self, t: float) -> float:
        whole, partial = self.whole, self.partial
        while whole and whole[0][0] < t:
            _, end, wire = heappop(whole)
            self.whole_bytes -= wire
            partial.append((end, wire))
        if not whole:
            self.whole_bytes = 0.0
        if partial:
            partial[:] = [(end, b) for end, b in partial if end > t]
        per_ms = self.per_ms
        return self.whole_bytes + sum(min(b, (end - t) * per_ms) for end, b in partial)


class TemporalSlots(SerialLinks):
    """Temporal sharing (Atlas): the message's first link is held by one message at a time, in
    the order they became ready, each for its solo data time (slow start after idle included:
    a train's members each as their own idle time says). Only the slot's own burst is queued;
    what it loses is resent within the slot, which lasts a round trip longer. A route's
    channel is timed from the slot's start: its connections send when the slot begins."""

    times_channels = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a head's channel (kind, s, r) -> its last train's (first sent, spacing): when each
        # member sent its previous message, so how long its connections sat idle
        self.last_train: dict[tuple, tuple[float, float]] = {}
        # a head's channel -> its last train's members' holds (when each member's connections
        # last sent), where the channel is timed from the slot
        self.last_holds: dict[tuple, MemberHolds] = {}
        self.trains_unalike = False     # (LinkDiscipline's) told by MemberHolds

    def message_ms(self, route: Route, link: LinkDir) -> float:
        return route.solo_ms - route.one_way_ms

    def middle(self, now: float, key: MessageKey, route: Route, n: int, gap: float,
               one_ms: float, warm_ms: float, before: Channel | None, start: float) -> Middle:
        prev = self.last_train.get(key[:3])
        self.last_train[key[:3]] = (now, gap)
        # each member's slot queues its own burst alone, as the head's does (`settle`): it
        # loses as much (counted with its tail's, which stands for the members) and its slot
        # lasts through the resend as long
        link = route.links[0]
        lost = self.overflow(link, 0.0, self.burst_of(route))
        extra = route.rtt_ms + lost / (self.rate_mbit[link] * 125.0) if lost > 0 else 0.0
        if before is not None:
            holds = MemberHolds(before, start, route.payload_bytes, route.one_way_ms, one_ms,
                                self.last_holds.get(key[:3]), self, extra)
            self.last_holds[key[:3]] = holds
            return Middle(1, n, now, gap, one_ms + extra, one_ms + extra, 0.0, 0.0,
                          route.rto_ms, holds)
        d, d_idle, idle0, slope = one_ms, one_ms, 0.0, 0.0
        if route.solo_idle_ms is not None:
            d, d_idle = warm_ms - route.one_way_ms, route.solo_idle_ms - route.one_way_ms
            idle0, slope = ((float("inf"), 0.0) if prev is None
                            else (now - prev[0], gap - prev[1]))
        return Middle(1, n, now, gap, d + extra, d_idle + extra, idle0, slope, route.rto_ms)

    @staticmethod
    def burst_of(route: Route) -> float:
        return route.burst_bytes if route.burst_bytes is not None else route.wire_bytes

    def settle(self, now: float, key: MessageKey, route: Route, link: LinkDir, start: float,
               hold: int, w: int, channel: Channel | None = None) -> None:
        arrive = self.clock[link] + route.one_way_ms            # the last of them
        # one message's burst in the queue at a time
        lost = self.overflow(link, 0.0, self.burst_of(route))
        if lost <= 0:
            self.events.push(arrive, self.deliver, (key,))
            return
        self.add_drops(link, key[3], lost * w)
        extra = route.rtt_ms + lost / (self.rate_mbit[link] * 125.0)
        self.clock[link] += extra * hold             # the slot lasts through the resend
        self.events.push(arrive + extra * hold, self.deliver, (key,))


class MemberHolds:
    """How long each middle member of a folded train holds its slot when the route's channel is
    timed from the slot (temporal sharing). Member x's connections are its head's as they were
    before the head's message (alike replicas send alike), idle since member x's own previous
    message on the channel finished sending (`previous`: that train's holds; without it, as
    long as the head's were). Where every chunk has been acknowledged (idle a round trip or
    more) the hold depends on the idle time only through how often tcp_cwnd_restart halves the
    windows, so one hold is computed per count (from the channel's memo where it answers:
    Channel.settled_send, else on a copy); a shorter idle time is computed as it is. Where
    a member waits for its own acknowledgements and its head does not, or the other way round,
    the slots are told (`TemporalSlots.trains_unalike`: which members wait then depends on
    their order, which the fold does not know, so the fold does not hold there); a train whose
    every member waits as its head does (one connection, each message behind its own
    predecessor) folds."""

    def __init__(self, before: Channel, head_start: float, payload_bytes: float,
                 one_way_ms: float, head_ms: float, previous: "MemberHolds | None",
                 slots: "TemporalSlots", extra_ms: float = 0.0) -> None:
        self.slots = slots          # told when a member waits for its own acknowledgements
        self.extra_ms = extra_ms    # each slot's resend of what its burst lost at the queue
        self.before, self.payload, self.one_way_ms = before, payload_bytes, one_way_ms
        self.head_ms = head_ms
        self.last_sent = max(c.last_sent_ms for c in before.conns)
        self.head_idle = head_start - self.last_sent
        self.previous = previous
        if previous is not None:
            previous.previous = None        # only the train before is needed
        self.ends: dict[int, float] = {}    # member -> when its connections last sent
        # members served in closed form: (first, last, base, t0, gap, hold, sending)
        self.runs: list[tuple[int, int, float, float, float, float, float]] = []
        self.last_end = -math.inf           # the latest of its members' ends
        self.held: dict[tuple, tuple[float, float]] = {}    # idle class -> (hold, sending)
        self.rtt_ms = before.spec.rtt_ms
        # without slow start after idle, every member idle a round trip or more holds alike
        self.restarts = before.spec.slow_start_after_idle
        # whether the head waited in its slot for its own acknowledgements
        self.head_waited = (self.head_idle < self.rtt_ms and math.isfinite(self.last_sent)
                            and not math.isclose(head_ms, self.after(self.rtt_ms)[0],
                                                 rel_tol=1e-9))

    def __call__(self, x: int, start: float) -> float:
        if not math.isfinite(self.last_sent):       # the channel's first message: as the head
            self.ends[x] = start + self.head_ms
            return self.head_ms + self.extra_ms
        end = self.previous.end_of(x) if self.previous is not None else None
        idle = self.head_idle if end is None else max(0.0, start - end)
        hold, sending = self.after(idle)
        if idle < self.rtt_ms:
            if (not math.isclose(hold, self.head_ms, rel_tol=1e-9)
                    and not math.isclose(hold, self.after(self.rtt_ms)[0], rel_tol=1e-9)):
                self.slots.trains_unalike = True     # it waited for its own windows, unlike
                                                     # its head
        if self.head_waited and not math.isclose(hold, self.head_ms, rel_tol=1e-9):
            self.slots.trains_unalike = True         # its head waited, it did not
        self.ends[x] = start + sending
        self.last_end = max(self.last_end, start + sending)
        return hold + self.extra_ms

    def alike(self, earliest: float) -> tuple[float, float] | None:
        """(hold, sending) when every member still to be served, none before `earliest`, holds
        alike: each idle a round trip or more without slow start after idle (or the channel's
        first message); None where that is not known without serving them one by one."""
        if not math.isfinite(self.last_sent):
            return self.head_ms + self.extra_ms, self.head_ms
        if self.restarts:
            return None
        if self.previous is None:
            if self.head_idle < self.rtt_ms:       # each member idle as long as its head
                return None
        elif self.previous.last_end > earliest - self.rtt_ms:
            return None
        settled = self.after(self.rtt_ms)
        if self.head_waited and not math.isclose(settled[0], self.head_ms, rel_tol=1e-9):
            self.slots.trains_unalike = True         # its head waited, they do not
        return settled[0] + self.extra_ms, settled[1]

    def serve(self, i: int, j: int, free: float, t0: float, gap: float, hold: float,
              sending: float) -> float:
        """Members i .. j, sent at t0 + x gap, served in turn from a link free at `free`, each
        holding it `hold`: member x starts at max(max(free, a_i) + (x - i) hold, a_x); when
        the link is free again."""
        base = max(free, t0 + i * gap)
        self.runs.append((i, j, base, t0, gap, hold, sending))
        last_start = max(base + (j - i) * hold, t0 + j * gap)
        self.last_end = max(self.last_end, last_start + sending)
        return last_start + hold

    def end_of(self, x: int) -> float | None:
        """When member x's connections last sent on this train's message (None: not served)."""
        end = self.ends.get(x)
        if end is not None:
            return end
        for i, j, base, t0, gap, hold, sending in self.runs:
            if i <= x <= j:
                return max(base + (x - i) * hold, t0 + x * gap) + sending
        return None

    def after(self, idle: float) -> tuple[float, float]:
        """(hold, how long its connections send) of a member idle this long."""
        spec = self.before.spec
        if idle >= spec.rtt_ms:
            cls = ("acked", halvings(idle, spec.rto_ms) if spec.slow_start_after_idle else 0)
        else:
            cls = ("in flight", round(idle, 6))
        if cls not in self.held:
            t = self.last_sent + idle
            seen = self.before.settled_send(t, self.payload)     # (without a copy)
            if seen is not None:
                solo, last = seen
            else:
                twin = self.before.copy()
                solo = twin.send(t, self.payload)
                last = max(c.last_sent_ms for c in twin.conns)
            self.held[cls] = (solo - self.one_way_ms, last - t)
        return self.held[cls]
