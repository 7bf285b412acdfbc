"""How the pipeline simulator's WAN links serve messages (testbed.rules.pipeline): a route's
description, the event queue the simulator and the links share, the interface every link
discipline has, and the fair share (TCP's max-min share of links that can interleave messages).
The disciplines that serve one message at a time (FIFO trains, temporal slots) are in
testbed.rules.serial_links.

A discipline is handed each WAN message as it leaves (`send`) and delivers it by pushing the
simulator's arrival handler at its arrival time; what it needs in between (a reshare, a flow's
end, a resend) it schedules as its own events on the same queue.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping

from testbed.rules.fairshare import max_min_rates
from testbed.rules.tcpchannel import Channel, ChannelSpec
from testbed.spec.links import LinkDir

EPS = 1e-9

MessageKey = tuple     # (kind, stage, replica, iteration, micro-batch) of the op that needs it


@dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """How one stage boundary's messages travel in one pipeline and one direction."""
    links: tuple[LinkDir, ...]  # link directions of the WAN path; () inside a DC
    solo_ms: float              # one message's time alone, first byte sent to last arrived
    one_way_ms: float = 0.0     # the path's delay (inside solo_ms)
    wire_bytes: float = 0.0     # per message
    solo_idle_ms: float | None = None   # alone, after its connections sat idle > rto_ms
    rto_ms: float = float("inf")
    burst: bool = False         # the whole message leaves in one round trip (steady windows)
    burst_bytes: float | None = None    # wire bytes entering the bottleneck at once (one round
                                        # of every connection); None: the whole message
    rtt_ms: float = 0.0         # the path's round trip (a lost byte is resent one later)
    # the connections that carry its messages, persistent across them (testbed.rules.tcpchannel):
    # given, each message's solo time is its channel's, and solo_ms / solo_idle_ms are what a
    # fresh channel gives (warm / restarting slow start)
    channel: ChannelSpec | None = None
    payload_bytes: float = 0.0  # per message, with a channel

    def solo(self, idle_ms: float) -> float:
        """Alone, after idle_ms since this route's last message left."""
        if self.solo_idle_ms is not None and idle_ms > self.rto_ms:
            return self.solo_idle_ms
        return self.solo_ms

    def timed(self, solo_ms: float) -> "Route":
        """This route with one message's solo time: dataclasses.replace(self, solo_ms=...)
        at half its cost (the simulator does it for most WAN messages)."""
        twin = _new(Route)
        for name in _ROUTE_FIELDS:
            _set(twin, name, getattr(self, name))
        _set(twin, "solo_ms", solo_ms)
        return twin


_ROUTE_FIELDS = tuple(f.name for f in fields(Route))
_new, _set = object.__new__, object.__setattr__


class EventQueue:
    """Pending events, earliest first, ties in the order pushed. An event is a handler and its
    arguments; the simulator pops one and calls handler(now, *data)."""

    __slots__ = ("heap", "ticket")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        # ticket(): the next number of the queue's sequence (an event's, or taken without
        # one: a fair-shared flow's order of arrival)
        self.ticket = itertools.count().__next__

    def push(self, t: float, handler: Callable[..., Any], data: tuple = ()) -> None:
        heapq.heappush(self.heap, (t, self.ticket(), handler, data))


class LinkDiscipline(ABC):
    """How a set of WAN link directions serves the messages whose route starts on one of them.
    `deliver(now, key)` is the simulator's arrival handler, pushed on `events` at each
    message's arrival; `drops` (link direction -> iteration -> wire bytes lost and sent again)
    is what the links' queues dropped."""

    def __init__(self, events: EventQueue, deliver: Callable[..., Any],
                 rate_mbit: Mapping[LinkDir, float]) -> None:
        self.events = events
        self.deliver = deliver
        self.rate_mbit = rate_mbit
        self.drops: dict[LinkDir, dict[int, float]] = {}

    # whether it times a route's channel itself, from when the message is served (temporal
    # slots: a message's connections start sending when its slot begins, not when it is sent)
    times_channels = False
    # whether a folded train's members waited for their own acknowledgements unlike their
    # head (temporal slots say so: testbed.rules.serial_links.MemberHolds), so the fold does not
    # hold as simulated
    trains_unalike = False

    @abstractmethod
    def send(self, now: float, key: MessageKey, route: Route, w: int, sender: int,
             warm_ms: float, channel: Channel | None = None) -> None:
        """Message `key` leaves now over `route` (its solo_ms already the one for how long its
        connections sat idle), standing for w alike messages; sender: the sending stage;
        warm_ms: its solo time with its connections warm; channel: its connections, given only
        to a discipline that `times_channels` (route.solo_ms is then a fresh channel's)."""


@dataclass
class _Flow:
    key: tuple
    links: tuple[LinkDir, ...]
    left_bits: float
    cap_mbit: float
    one_way_ms: float
    weight: int = 1           # alike messages it stands for, each at rate_mbit
    rate_mbit: float = 0.0
    n: int = 0                # order of arrival
    ver: int = 0              # its end event's, bumped at every new rate


class FairShare(LinkDiscipline):
    """Concurrent sharing on links that can interleave messages (TCP's fair share): all
    messages on a link share it max-min fairly (progressive filling over the path's links,
    testbed.rules.fairshare), each at most at its own cap, the rate at which it would take its
    solo data time alone. A message standing for w alike ones is w flows at the rate each gets.

    A link whose flows' caps sum to no more than its rate never fills (each flow gets at most
    its cap): it constrains nobody, so the share skips it and flows joined only through such
    links are reshared apart. Rates are reshared once after every event at one time, and only
    for the flows the changes can move."""

    def __init__(self, events: EventQueue, deliver: Callable[..., Any],
                 rate_mbit: Mapping[LinkDir, float]) -> None:
        super().__init__(events, deliver, rate_mbit)
        self.flows: dict[tuple, _Flow] = {}
        self.link_flows: dict[LinkDir, dict[tuple, _Flow]] = {}
        self.last_update = 0.0
        self.pending: set[LinkDir] = set()     # links whose flows changed since the last reshare
        self.cap_sum: dict[LinkDir, float] = {}
        self.tight: set[LinkDir] = set()       # the links that can fill
        self.loosened: set[LinkDir] = set()    # no longer tight since the last reshare
        self.fresh: list[_Flow] = []           # started since the last reshare

    def send(self, now: float, key: MessageKey, route: Route, w: int, sender: int,
             warm_ms: float, channel: Channel | None = None) -> None:
        self.progress(now)
        data_ms = max(EPS, route.solo_ms - route.one_way_ms)
        f = self.flows[key] = _Flow(key=key, links=route.links, left_bits=route.wire_bytes * 8,
                                    cap_mbit=route.wire_bytes * 8 / data_ms / 1e3,
                                    one_way_ms=route.one_way_ms, weight=w,
                                    n=self.events.ticket())
        self.join(f)
        self.fresh.append(f)
        self.reshare_soon(now, route.links)

    def progress(self, now: float) -> None:
        """Every flow's bits left, at its rate since the last update."""
        dt = now - self.last_update
        if dt > 0:
            for f in self.flows.values():
                f.left_bits -= f.rate_mbit * 1e3 * dt      # Mbit/s x ms = 1e3 bits
        self.last_update = now

    def recap(self, link: LinkDir, total: float) -> None:
        self.cap_sum[link] = total
        if total > self.rate_mbit.get(link, float("inf")) * (1 - 1e-9):
            self.tight.add(link)
        elif link in self.tight:
            self.tight.discard(link)
            self.loosened.add(link)

    def join(self, f: _Flow) -> None:
        for link in dict.fromkeys(f.links):
            self.link_flows.setdefault(link, {})[f.key] = f
            self.recap(link, self.cap_sum.get(link, 0.0) + f.weight * f.cap_mbit)

    def leave(self, f: _Flow) -> None:
        for link in dict.fromkeys(f.links):
            on = self.link_flows[link]
            on.pop(f.key, None)
            self.recap(link, self.cap_sum[link] - f.weight * f.cap_mbit if on else 0.0)

    def reshare_soon(self, now: float, links) -> None:
        """Reshare once after every event at this time (no time passes between them)."""
        if not self.pending:
            self.events.push(now, self.on_reshare, ())
        self.pending.update(links)

    def on_reshare(self, now: float) -> None:
        seeds = list(self.pending)
        self.pending.clear()
        self.reshare(now, seeds)

    def affected(self, seeds) -> dict[tuple, _Flow]:
        """The flows whose rates the changes since the last reshare can move: the flows just
        started, and every flow joined to them or to a seed link that is (or just stopped
        being) tight through tight links. A flow that meets the change only on a link that
        stays slack keeps its rate."""
        tight = self.tight
        comp = {f.key: f for f in self.fresh if f.key in self.flows}
        stack = [l for l in seeds if l in tight or l in self.loosened]
        for f in comp.values():
            stack.extend(l for l in f.links if l in tight)
        self.fresh.clear()
        self.loosened.clear()
        seen: set[LinkDir] = set()
        while stack:
            link = stack.pop()
            if link in seen:
                continue
            seen.add(link)
            for k, f in self.link_flows.get(link, {}).items():
                if k not in comp:
                    comp[k] = f
                    stack.extend(l for l in f.links if l in tight)
        return comp

    def reshare(self, now: float, seeds) -> None:
        """Max-min fair rates with caps of the flows the changes can move (`affected`), then
        schedule their next ends."""
        active = sorted((f for f in self.affected(seeds).values() if f.left_bits > EPS),
                        key=lambda f: f.n)
        if not active:
            return
        before = [f.rate_mbit for f in active]
        max_min_rates(active, self.rate_mbit, self.tight)
        for f, rate in zip(active, before):
            if f.rate_mbit != rate or not f.ver:       # else its end is as scheduled
                f.ver += 1
                self.events.push(now + f.left_bits / (f.rate_mbit * 1e3), self.on_flow_end,
                                 (f.key, f.ver))

    def on_flow_end(self, now: float, key: tuple, ver: int) -> None:
        """A flow's data is through, unless a later reshare moved its end: every message whose
        data is through (several may end at once) leaves its links and arrives one way later."""
        f = self.flows.get(key)
        if f is None or f.ver != ver:
            return                # superseded by a later reshare
        self.progress(now)
        freed: set[LinkDir] = set()
        for k in [k for k, g in self.flows.items() if g.left_bits <= 1.0]:   # bits: float noise
            g = self.flows.pop(k)
            self.leave(g)
            freed.update(g.links)
            self.events.push(now + g.one_way_ms, self.deliver, (k,))
        self.reshare_soon(now, freed)
