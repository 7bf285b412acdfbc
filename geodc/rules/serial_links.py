"""The pipeline simulator's WAN links that serve one message at a time, in the order sent
(geodc.rules.pipeline's module docstring has the rules): FIFO trains (concurrent sharing on a
link whose every route is a one-round `burst`) and temporal slots (Atlas). Both keep a clock
per link (when it is next free, every message sent so far served in the order sent) and serve
the trains of folded replicas (geodc.rules.trains) among the other messages; they differ in how
long a message holds the link, when it arrives, what its burst loses at the link's queue and
how the lost bytes come back.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable, Mapping

from geodc.rules.trains import Middle, Trains
from geodc.rules.wanlinks import EPS, EventQueue, LinkDiscipline, MessageKey, Route
from geodc.spec.links import LinkDir


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
               one_ms: float, warm_ms: float) -> Middle:
        """The middle members of head message `key`'s train of n, spaced gap apart."""

    @abstractmethod
    def settle(self, now: float, key: MessageKey, route: Route, link: LinkDir, start: float,
               hold: int, w: int) -> None:
        """The message, served from `start` for `hold` messages' time (the link's clock at its
        end), arrives: what its burst loses at the queue, and when it and its resent bytes
        arrive."""

    def send(self, now: float, key: MessageKey, route: Route, w: int, sender: int,
             warm_ms: float) -> None:
        link = route.links[0]
        one_ms = self.message_ms(route, link)
        self.serve_middles(link, now)
        r = key[2]
        hold = w
        head = self.trains.heads[r]
        if head is not None:            # the train's last: its middle is through first
            mid = self.middles.get(link, {}).pop((*key[:2], head, *key[3:]), None)
            if mid is not None:
                self.clock[link] = max(self.clock[link], now) + mid.rest_ms()
            hold = 1
        start = max(now, self.clock.get(link, 0.0))
        self.clock[link] = start + hold * one_ms
        behind = self.trains.behind(r)
        if behind is not None:          # a train's head: its middle follows it
            tail, n = behind
            gap = self.trains.gap(key, sender, r, tail, n)
            self.middles.setdefault(link, {})[key] = self.middle(now, key, route, n, gap,
                                                                 one_ms, warm_ms)
        self.settle(now, key, route, link, start, hold, w)

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
        if len(due) == 1 and due[0][0].member_ms(due[0][1]) == due[0][0].member_ms(due[0][2]):
            b, i, j = due[0]
            count, d = j - i + 1, b.member_ms(i)
            W = max(W + count * d, b.first_sent + i * b.spacing + count * d,
                    b.first_sent + j * b.spacing + d)
        elif due:
            for a, d in sorted((b.first_sent + x * b.spacing, b.member_ms(x)) for b, i, j in due
                               for x in range(i, j + 1)):
                W = max(W, a) + d
        self.clock[link] = W

    def overflow(self, link: LinkDir, wait_ms: float, burst: float,
                 most: float | None = None) -> float:
        """Wire bytes a burst loses at the link's queue, with wait_ms of the link's time queued
        ahead of it (tail drop: what does not fit)."""
        q = self.queue_bytes.get(link)
        if q is None:
            return 0.0
        ahead = max(0.0, wait_ms) * self.rate_mbit[link] * 125.0     # Mbit/s x ms -> bytes
        return min(burst if most is None else most, max(0.0, ahead + burst - q))

    def add_drops(self, link: LinkDir, it: int, lost: float) -> None:
        per_it = self.drops.setdefault(link, {})
        per_it[it] = per_it.get(it, 0.0) + lost


class FifoTrains(SerialLinks):
    """Concurrent sharing on a link whose every route is a `burst` (the whole message leaves in
    its first round trip): the bursts queue at the bottleneck in the order sent. Each holds the
    link for its wire bytes at the link's rate and arrives one way later, or no earlier than its
    solo time after it was sent. A burst arriving behind the link's backlog loses what does not
    fit in its queue; the lost bytes leave the link's time and enter it again a round trip after
    they were sent (`resend`), behind what came meanwhile."""

    def message_ms(self, route: Route, link: LinkDir) -> float:
        return route.wire_bytes * 8 / (self.rate_mbit[link] * 1e3)

    def middle(self, now: float, key: MessageKey, route: Route, n: int, gap: float,
               one_ms: float, warm_ms: float) -> Middle:
        return Middle(1, n, now, gap, one_ms, one_ms, 0.0, 0.0, route.rto_ms)

    def settle(self, now: float, key: MessageKey, route: Route, link: LinkDir, start: float,
               hold: int, w: int) -> None:
        arrive = max(self.clock[link] + route.one_way_ms, now + route.solo_ms)
        burst = route.burst_bytes if route.burst_bytes is not None else route.wire_bytes
        # what waits ahead of it, then its (alike) bursts
        lost = self.overflow(link, start - now, burst * hold, hold * route.wire_bytes)
        if lost <= 0:
            self.events.push(arrive, self.deliver, (key,))
            return
        self.add_drops(link, key[3], lost)
        self.clock[link] -= lost / (self.rate_mbit[link] * 125.0)
        self.events.push(now + route.rtt_ms, self.resend, (key, route, lost, arrive))

    def resend(self, now: float, key: MessageKey, route: Route, lost: float,
               arrive: float) -> None:
        """Bytes lost a round trip ago enter the link again, in the order sent."""
        link = route.links[0]
        self.serve_middles(link, now)
        start = max(now, self.clock.get(link, 0.0))
        again = self.overflow(link, start - now, lost)
        self.clock[link] = start + (lost - again) / (self.rate_mbit[link] * 125.0)
        arrive = max(arrive, self.clock[link] + route.one_way_ms)
        if again > 0:
            self.add_drops(link, key[3], again)
            self.events.push(now + route.rtt_ms, self.resend, (key, route, again, arrive))
        else:
            self.events.push(arrive, self.deliver, (key,))


class TemporalSlots(SerialLinks):
    """Temporal sharing (Atlas): the message's first link is held by one message at a time, in
    the order they became ready, each for its solo data time (slow start after idle included:
    a train's members each as their own idle time says). Only the slot's own burst is queued;
    what it loses is resent within the slot, which lasts a round trip longer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a head's channel (kind, s, r) -> its last train's (first sent, spacing): when each
        # member sent its previous message, so how long its connections sat idle
        self.last_train: dict[tuple, tuple[float, float]] = {}

    def message_ms(self, route: Route, link: LinkDir) -> float:
        return route.solo_ms - route.one_way_ms

    def middle(self, now: float, key: MessageKey, route: Route, n: int, gap: float,
               one_ms: float, warm_ms: float) -> Middle:
        d, d_idle, idle0, slope = one_ms, one_ms, 0.0, 0.0
        if route.solo_idle_ms is not None:
            d, d_idle = warm_ms - route.one_way_ms, route.solo_idle_ms - route.one_way_ms
            prev = self.last_train.get(key[:3])
            idle0, slope = ((float("inf"), 0.0) if prev is None
                            else (now - prev[0], gap - prev[1]))
        self.last_train[key[:3]] = (now, gap)
        return Middle(1, n, now, gap, d, d_idle, idle0, slope, route.rto_ms)

    def settle(self, now: float, key: MessageKey, route: Route, link: LinkDir, start: float,
               hold: int, w: int) -> None:
        arrive = self.clock[link] + route.one_way_ms            # the last of them
        burst = route.burst_bytes if route.burst_bytes is not None else route.wire_bytes
        lost = self.overflow(link, 0.0, burst)     # one message's burst in the queue at a time
        if lost <= 0:
            self.events.push(arrive, self.deliver, (key,))
            return
        self.add_drops(link, key[3], lost * w)
        extra = route.rtt_ms + lost / (self.rate_mbit[link] * 125.0)
        self.clock[link] += extra * hold             # the slot lasts through the resend
        self.events.push(arrive + extra * hold, self.deliver, (key,))
