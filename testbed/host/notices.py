"""BubbleTea's notices, the one definition of the worker -> controller protocol, and a bubble on
one training host as the controller sees it. Pure: no sockets, no clock (the sender is
trainer/worker.py, the receiver prefill/controller.py, which gives
`now`; docs/bubbletea/design.md says why it is so).

The protocol. A training worker whose host's GPU is shared with a prefill server (its spec's
GpuShareExtras with a notice address, testbed/host/extras.py) sends its DC's controller one UDP
datagram per notice: a JSON object {"kind": ..., the kind's fields, "seq": n} (`encode_notice`),
at most MAX_NOTICE_BYTES. seq numbers a worker's datagrams 0, 1, ...; the controller counts the
numbers it never sees (notices lost, here or on the way: the arrival bound holds only if none
that would lower it is lost). A send error is ignored: a dead controller never stops training.
Every time is a time_ns() of the sender's machine, every duration ns. The kinds (one frozen
dataclass each, sent and parsed as that type):

- "bubble" (BubbleNotice), after a compute op, when the learned gap before the next op
  (testbed/rules/bubbles.py) is >= MIN_NOTICE_MS and the message that op awaits (if any) is not
  already in (then it starts at once): the GPU is idle from t_idle_ns (the op's end) until about
  t_pred_end_ns (the prediction); iteration and op (index in the row, then OPT) of the next op;
  gaps_ns, the learned gaps before it, ascending. The gap before OPT that holds the all-reduce
  (D > 1) only with the address's `allreduce`. The worker logs an IDLE span for each. When the
  next op waits for a neighbour's message, the arrival bound's fields: awaits ([kind,
  iteration, micro-batch] of that message). Not begun to arrive: pending (true), wire_ns (its
  least wire time, bytes x 8 / the lowest rate on its way: GpuShareExtras' Inbound) and, when
  the neighbour making it is in this DC, made_ns (that op's profile hold), maker ([its host,
  iteration, op index in its row]) and spread_ns (the longest first-to-last-byte time of the
  last messages of that kind: once made, it is expected in within this). Begun: end_min_ns
  (first byte + wire time) and end_max_ns (first byte + the longest first-to-last-byte time of
  the last SPREAD_HISTORY messages of its kind: an estimate from the channel's own history, not
  a bound).
- "busy" (BusyNotice), at each acquisition of the GPU lock: busy_ns, the bubble is over.
- "arrival" (ArrivalNotice), from the channel's reader thread at the first byte of the message
  a pending bubble awaits (trainer.transport's on_arrival): the bubble of
  t_idle_ns lasts until no sooner than end_min_ns (first byte + wire time), expected by
  end_max_ns.
- "output" (OutputNotice), when a worker starts an op whose output goes to a neighbour in its
  own DC (the same controller): host, that neighbour; awaits, the message; end_min_ns, the op's
  start + its profile hold (the message is not in before). Not sent across DCs: the other DC's
  controller would hear it one WAN delay late.
The bounds come from the configured links and the profile, not from predictions.

`parse_notice` reads one datagram's object as its kind's type: every field the kind has is
type- and range-checked (times and durations ints in 0..MAX_NS, indices 0..MAX_INDEX, host
names 1..MAX_HOST_CHARS characters, gaps_ns at most MAX_GAPS), fields the kind does not have are
ignored, and a missing or unknown kind is refused; whether its times are near now is the
reader's check (`out_of_window`).

The bubble: `Bubble.end_ns(now, margin)` is the end admission uses: the learned prediction, cut
to a begun message's expected end where sooner, or the arrival bound where later. The bound is
a lower bound on when training takes the GPU: the message's bytes need their wire time at the
lowest rate on their way, after the op that makes them (its profile hold); margin covers the
notices' latency. It holds only if no notice that would lower it is lost, and only where bytes
cannot come faster than the configured rates (no jitter, no delay or rate faults:
testbed.plans.systems.arrival_bounds_hold). `Bubble.extend`: extend_bubbles' next longer learned
gap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from functools import cache
from typing import Callable, ClassVar, Literal

MAX_NOTICE_BYTES = 2048    # a datagram the controller reads
MAX_NS = 2**63 - 1         # every time and duration of a notice: an int64 of ns, >= 0
MAX_INDEX = 2**31 - 1      # iterations, op indices, awaits' parts
MAX_HOST_CHARS = 64
MAX_GAPS = 64              # gaps_ns entries


@cache
def _names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(kind))


class _Wire:
    """What every kind shares: its JSON object, and the window check of its times."""

    __slots__ = ()
    TIMES: ClassVar[tuple[str, ...]] = ()        # times: within the window of now
    DURATIONS: ClassVar[tuple[str, ...]] = ()    # durations: shorter than the window

    def to_wire(self) -> dict:
        """The notice's JSON object (no seq: encode_notice adds it): its kind first, then every
        field that is set (None and a false pending are left out). Field by field, not
        dataclasses.asdict: a worker sends these on its critical path (asdict's deep copy took
        ten times as long)."""
        return {k: v for k in _names(type(self))
                if (v := getattr(self, k)) is not None and v is not False}

    def out_of_window(self, now_ns: int, window_ns: int) -> str | None:
        """The first field that is not within window_ns of now (a time) or longer than
        window_ns (a duration), or None: a notice from a running worker never is."""
        for key in self.TIMES:
            value = getattr(self, key)
            if value is not None and abs(value - now_ns) > window_ns:
                return key
        for key in self.DURATIONS:
            value = getattr(self, key)
            if value is not None and value > window_ns:
                return key
        if any(g > window_ns for g in getattr(self, "gaps_ns", ())):
            return "gaps_ns"
        return None


@dataclass(frozen=True, kw_only=True, slots=True)
class BubbleNotice(_Wire):
    """The GPU is idle from t_idle_ns until about t_pred_end_ns (module docstring)."""

    TIMES: ClassVar[tuple[str, ...]] = ("t_idle_ns", "t_pred_end_ns", "end_min_ns", "end_max_ns")
    DURATIONS: ClassVar[tuple[str, ...]] = ("wire_ns", "made_ns", "spread_ns")
    kind: Literal["bubble"] = field(default="bubble", init=False)
    host: str
    t_idle_ns: int
    t_pred_end_ns: int
    iteration: int | None = None
    op: int | None = None
    gaps_ns: list[int] = field(default_factory=list)
    awaits: tuple[int, int, int] | None = None
    pending: bool = False
    wire_ns: int | None = None
    made_ns: int | None = None
    maker: tuple[str, int, int] | None = None
    spread_ns: int | None = None
    end_min_ns: int | None = None
    end_max_ns: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class BusyNotice(_Wire):
    """Training took the GPU again at busy_ns: the bubble is over."""

    TIMES: ClassVar[tuple[str, ...]] = ("busy_ns",)
    kind: Literal["busy"] = field(default="busy", init=False)
    host: str
    busy_ns: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ArrivalNotice(_Wire):
    """The message the bubble from t_idle_ns awaits began to arrive: it is in no sooner than
    end_min_ns, expected by end_max_ns."""

    TIMES: ClassVar[tuple[str, ...]] = ("t_idle_ns", "end_min_ns", "end_max_ns")
    kind: Literal["arrival"] = field(default="arrival", init=False)
    host: str
    t_idle_ns: int
    end_min_ns: int
    end_max_ns: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputNotice(_Wire):
    """A neighbour in this DC began the op that makes the message host awaits: it is not in
    before end_min_ns."""

    TIMES: ClassVar[tuple[str, ...]] = ("end_min_ns",)
    kind: Literal["output"] = field(default="output", init=False)
    host: str
    awaits: tuple[int, int, int]
    end_min_ns: int


Notice = BubbleNotice | BusyNotice | ArrivalNotice | OutputNotice


def encode_notice(notice: Notice, seq: int) -> bytes:
    """One datagram: the notice's JSON object, numbered."""
    return json.dumps(dict(notice.to_wire(), seq=seq)).encode()


def _int(value: object, what: str, hi: int = MAX_NS) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an integer")
    if not 0 <= value <= hi:
        raise ValueError(f"{what} must be in 0..{hi}")
    return value


def _opt_int(n: dict, key: str, hi: int = MAX_NS) -> int | None:
    return None if n.get(key) is None else _int(n[key], key, hi)


def _host(value: object, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_HOST_CHARS:
        raise TypeError(f"{what} must be a string of 1..{MAX_HOST_CHARS} characters")
    return value


def _triple(value: object, what: str) -> tuple:
    if not isinstance(value, list) or len(value) != 3:
        raise ValueError(f"{what} must be a list of 3")
    return tuple(value)


def _gaps(value: object) -> list[int]:
    if not isinstance(value, list) or len(value) > MAX_GAPS:
        raise ValueError(f"gaps_ns must be a list of at most {MAX_GAPS}")
    return sorted(_int(g, "gaps_ns[]") for g in value)


def _awaits(value: object) -> tuple[int, int, int]:
    return tuple(_int(x, "awaits[]", MAX_INDEX) for x in _triple(value, "awaits"))


def _maker(value: object) -> tuple[str, int, int]:
    host, it, op = _triple(value, "maker")
    return (_host(host, "maker host"), _int(it, "maker iteration", MAX_INDEX),
            _int(op, "maker op", MAX_INDEX))


def _bubble(n: dict, host: str) -> BubbleNotice:
    return BubbleNotice(host=host, t_idle_ns=_int(n["t_idle_ns"], "t_idle_ns"),
                        t_pred_end_ns=_int(n["t_pred_end_ns"], "t_pred_end_ns"),
                        iteration=_opt_int(n, "iteration", MAX_INDEX),
                        op=_opt_int(n, "op", MAX_INDEX), gaps_ns=_gaps(n.get("gaps_ns", [])),
                        awaits=None if n.get("awaits") is None else _awaits(n["awaits"]),
                        pending=n.get("pending", False) is True,
                        wire_ns=_opt_int(n, "wire_ns"), made_ns=_opt_int(n, "made_ns"),
                        maker=None if n.get("maker") is None else _maker(n["maker"]),
                        spread_ns=_opt_int(n, "spread_ns"),
                        end_min_ns=_opt_int(n, "end_min_ns"),
                        end_max_ns=_opt_int(n, "end_max_ns"))


def _busy(n: dict, host: str) -> BusyNotice:
    return BusyNotice(host=host, busy_ns=_int(n["busy_ns"], "busy_ns"))


def _arrival(n: dict, host: str) -> ArrivalNotice:
    return ArrivalNotice(host=host, t_idle_ns=_int(n["t_idle_ns"], "t_idle_ns"),
                         end_min_ns=_int(n["end_min_ns"], "end_min_ns"),
                         end_max_ns=_opt_int(n, "end_max_ns"))


def _output(n: dict, host: str) -> OutputNotice:
    return OutputNotice(host=host, awaits=_awaits(n["awaits"]),
                        end_min_ns=_int(n["end_min_ns"], "end_min_ns"))


PARSERS: dict[str, Callable[[dict, str], Notice]] = {
    "bubble": _bubble, "busy": _busy, "arrival": _arrival, "output": _output}


def parse_notice(n: dict) -> Notice:
    """A notice from its JSON object, as its kind's type (module docstring: what is checked);
    KeyError, TypeError or ValueError (one line) if malformed or of an unknown kind."""
    kind = n["kind"]
    if not isinstance(kind, str):
        raise TypeError("kind must be a string")
    if kind not in PARSERS:
        raise ValueError(f"unknown notice kind {kind[:MAX_HOST_CHARS]!r}: one of "
                         f"{', '.join(PARSERS)}")
    return PARSERS[kind](n, _host(n["host"], "host"))


@dataclass
class Bubble:
    t_idle_ns: int
    t_pred_end_ns: int
    iteration: int | None
    op: int | None
    gaps_ns: list[int] = field(default_factory=list)   # the worker's learned gaps, ascending
    dispatched: list[str] = field(default_factory=list)
    reason: str = "no_request"
    extended: int = 0
    t_first_pred_end_ns: int = 0
    in_flight: int = 0           # prefills of this bubble awaiting their replies (recorded after)
    closed: bool = False
    # the arrival bound (module docstring): the message the next op waits for, as
    # [kind, iteration, micro-batch]; its least wire time while it has not begun to arrive;
    # the latest known time before which it cannot be in (first byte + wire time, or the end
    # of the neighbour's op that makes it)
    awaits: tuple[int, int, int] | None = None
    pending: bool = False          # the message had not begun to arrive, and nothing since
    wire_ns: int | None = None     # its least wire time
    made_ns: int | None = None     # the hold of the neighbour's op making it (same DC)
    made: bool = False             # that op has begun (its output notice came)
    maker: tuple[str, int, int] | None = None   # (host, iteration, op index) of that op
    spread_ns: int | None = None   # once made, it is expected in within this (its history)
    end_min_ns: int | None = None
    end_max_ns: int | None = None  # begun: its last byte expected by then (its history)
    t_bound_end_ns: int = 0        # the latest end the bound gave past the prediction
    t_cap_end_ns: int = 0          # the earliest end end_max_ns gave before the prediction

    def raise_end_min(self, t_ns: int | None) -> None:
        if t_ns is not None and (self.end_min_ns is None or t_ns > self.end_min_ns):
            self.end_min_ns = t_ns

    def made_at(self, t_ns: int) -> None:
        """The output notice: the op making the message ends no sooner than t_ns; the message
        is then expected in within spread_ns (an estimate, until its own arrival notice)."""
        self.made = True
        self.raise_end_min(t_ns)
        if self.pending and self.spread_ns is not None:
            self.end_max_ns = t_ns + self.spread_ns

    def arrived(self, end_min_ns: int, end_max_ns: int | None) -> None:
        """The arrival notice: the message began to arrive (so it was made); it is in no sooner
        than end_min_ns and expected by end_max_ns."""
        self.pending = False
        self.made = True
        self.raise_end_min(end_min_ns)
        self.end_max_ns = end_max_ns

    def bound_ns(self, now_ns: int, margin_ns: int, maker_from_ns: int | None = None
                 ) -> int | None:
        """The arrival bound alone (no prediction), or None. maker_from_ns: no sooner than this
        can the op making the message start (the maker's own bubble's bound, when known)."""
        bound = None if self.end_min_ns is None else self.end_min_ns - margin_ns
        if self.pending:   # its first byte comes no sooner than now, or than it is made
            if self.made:
                first = max(now_ns, self.end_min_ns or 0)
            else:
                first = max(now_ns, maker_from_ns or 0) + (self.made_ns or 0)
            rolling = first + (self.wire_ns or 0) - margin_ns
            if rolling > now_ns:   # (else it says nothing)
                bound = rolling if bound is None else max(bound, rolling)
        return bound

    def end_ns(self, now_ns: int, margin_ns: int, maker_from_ns: int | None = None) -> int:
        """The end admission uses now: the prediction, cut to the begun message's expected end
        where that is sooner, or the arrival bound where that is later."""
        est = self.t_pred_end_ns
        if self.end_max_ns is not None and self.end_max_ns < est:
            est = self.end_max_ns     # (the admission's guard is the slack)
        bound = self.bound_ns(now_ns, margin_ns, maker_from_ns)
        if bound is None or bound <= est:
            if est < self.t_pred_end_ns:
                self.t_cap_end_ns = min(self.t_cap_end_ns or est, est)
            return est
        if bound > self.t_pred_end_ns:
            self.t_bound_end_ns = max(self.t_bound_end_ns, bound)
        return bound

    def extend(self, now_ns: int, margin_ns: int) -> bool:
        """The GPU is still idle past the predicted end (no busy notice): the gap is one of
        the longer ones seen before this op; expect the next of those. False if none is left."""
        elapsed = now_ns - self.t_idle_ns
        longer = [g for g in self.gaps_ns if g > elapsed + margin_ns]
        if not longer:
            return False
        self.t_pred_end_ns = self.t_idle_ns + longer[0]
        self.extended += 1
        return True
