"""Folded alike replicas in the pipeline simulator (testbed.rules.pipeline): a replica with a
weight stands for the members behind the one before it (its head), a chain of such parts for a
group. On a link serving one message at a time (testbed.rules.serial_links) the head's message
registers the part's middle members as a train, sent after it at even spacing; the part's last
member (its tail) is simulated and sends its own message after them.

`Trains` is who heads whom and how far apart the members send: the gap between head and tail
at the latest op both started (a first pass), or what the last pass found, and what this pass
finds. `Middle` is one train's members still to be served on one link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


class Trains:
    """The heads and tails of folded replicas, and the spacing of their trains. `gaps`: the
    spacing the last pass found per head's message key (None: the first pass)."""

    def __init__(self, heads: Sequence[int | None], weight: Sequence[int],
                 gaps: dict[tuple, float] | None) -> None:
        self.heads = list(heads)
        # a head replica -> (its part's tail, the members the tail stands for)
        self.tail_of = {h: (r, weight[r]) for r, h in enumerate(self.heads) if h is not None}
        self.on = bool(self.tail_of)     # whether there are any (else nothing is recorded)
        self.gaps = gaps
        # filled in by the simulator while `on`:
        self.started: dict[tuple, float] = {}   # (s, r, it, pos) -> when that op started
        self.latest: dict[tuple[int, int], tuple[int, int]] = {}   # (s, r) -> (it, pos) last
        self.sent_at: dict[tuple, float] = {}   # when each message was sent
        self.used_gaps: dict[tuple, float] = {}  # the spacing each train was served at

    def behind(self, r: int) -> tuple[int, int] | None:
        """(tail, members) when replica r heads a train of more than one member, else None."""
        t = self.tail_of.get(r)
        return t if t is not None and t[1] > 1 else None

    def gap(self, key: tuple, sender: int, head: int, tail: int, n: int) -> float:
        """The spacing head message `key`'s train is served at: the last pass's, else as now."""
        gap = self.gaps.get(key) if self.gaps is not None else None
        if gap is None:
            gap = self.spacing(sender, head, tail, n)
        self.used_gaps[key] = gap
        return gap

    def spacing(self, s: int, head: int, tail: int, n: int) -> float:
        """How far apart a train's members are now: the gap between its head and its last
        member at the latest op both started, over the members behind the head."""
        if (s, tail) not in self.latest:
            return 0.0
        it, k = self.latest[(s, tail)]
        h = self.started.get((s, head, it, k))
        return 0.0 if h is None else max(0.0, (self.started[(s, tail, it, k)] - h) / n)

    def found(self) -> tuple[dict[tuple, float], float]:
        """The spacing this pass found per head's message (the tail's send time less the
        head's, over the members behind the head), and how far the last member of a train
        moved between the spacing used and the one found (ms, the most over trains)."""
        train_gaps, shift = {}, 0.0
        behind = {r: t for r, t in self.tail_of.items() if t[1] > 1}     # heads of trains
        sent_at, used_gaps = self.sent_at, self.used_gaps
        for key, t in sent_at.items():
            if key[2] not in behind:
                continue
            tail, n = behind[key[2]]
            t_tail = sent_at.get((*key[:2], tail, *key[3:]))
            if t_tail is not None:
                train_gaps[key] = max(0.0, (t_tail - t) / n)
                if key in used_gaps:
                    shift = max(shift, abs(train_gaps[key] - used_gaps[key]) * n)
        return train_gaps, shift


@dataclass(slots=True)
class Middle:
    """One train's members still to be served on a link: members next ... n - 1 (member 0 is
    the head), member x sent at first_sent + x * spacing, holding the link d_ms, or d_idle_ms
    where its connections sat idle past the RTO since its previous message (idle0_ms, the
    head's idle time, plus x times slope_ms, the change of spacing)."""
    next: int
    n: int
    first_sent: float
    spacing: float
    d_ms: float
    d_idle_ms: float
    idle0_ms: float
    slope_ms: float
    rto_ms: float
    # given: how long member x, served from a time, holds the link (its own connections' state)
    hold_of: Callable[[int, float], float] | None = None
    # where the link has a set queue (FIFO trains): the wire bytes the head's first round put
    # in it at once and the tail's last did (a member's is between them by its place; 0: no
    # queue), the members' iteration and round trip (their lost bytes come back one later)
    burst_bytes: float = 0.0
    burst_last: float = 0.0
    iteration: int = 0
    rtt_ms: float = 0.0

    def member_ms(self, x: int, start: float) -> float:
        """How long member x, served from `start`, holds the link."""
        if self.hold_of is not None:
            return self.hold_of(x, start)
        return self.d_idle_ms if self.idle0_ms + x * self.slope_ms > self.rto_ms else self.d_ms

    def rest_until(self, free: float) -> float:
        """When the link is free again after the members not yet served, one after another
        from `free`."""
        for x in range(self.next, self.n):
            free += self.member_ms(x, free)
        self.next = self.n
        return free
