"""A bubble on one training host as BubbleTea's controller sees it, and the notices that make
and change it. Pure: no sockets, no clock (geodc/hostproc/prefill/controller.py gives `now`).

One job: what a bubble's end is, from what the worker announced and what has been heard since
(docs/bubbletea/design.md: notices; the controller's docstring: the arrival bound).

- `Notice` / `parse_notice`: one worker datagram (every field type- and range-checked; its
  times against now by `Notice.out_of_window`), by kind: "bubble" (the GPU is idle from
  t_idle_ns until about t_pred_end_ns, the worker's learned prediction; with the arrival-bound
  fields when its next op waits for a message), "busy" (it took the GPU again), "arrival" (the
  awaited message began to arrive) and "output" (a same-DC neighbour began the op that makes
  it).
- `Bubble.end_ns(now, margin)`: the end admission uses: the learned prediction, cut to a begun
  message's expected end where sooner, or the arrival bound where later. The bound is a lower
  bound on when training takes the GPU: the message's bytes need their wire time at the lowest
  rate on their way, after the op that makes them (its profile hold); margin covers the
  notices' latency. It holds only if no notice that would lower it is lost, and only where
  bytes cannot come faster than the configured rates (no jitter, no delay or rate faults:
  geodc.plans.systems.arrival_bounds_hold).
- `Bubble.extend`: extend_bubbles' next longer learned gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True, slots=True)
class Notice:
    """One datagram from a training worker (geodc/hostproc/trainer/worker.py): kind "bubble" (the GPU is idle
    from t_idle_ns until about t_pred_end_ns), "busy" (t_ns: it took the GPU again), "arrival"
    (the message the bubble from t_idle_ns awaits began to arrive: it is in no sooner than
    end_min_ns) or "output" (a neighbour in this DC began the op that makes the message
    `awaits`, which host then awaits: not in before end_min_ns)."""

    kind: str
    host: str
    t_ns: int = 0
    t_idle_ns: int = 0
    t_pred_end_ns: int = 0
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

    def out_of_window(self, now_ns: int, window_ns: int) -> str | None:
        """The first field that is not within window_ns of now (a time) or longer than
        window_ns (a duration), or None: a notice from a running worker never is."""
        kind_times = {"busy": ("t_ns",), "bubble": ("t_idle_ns", "t_pred_end_ns"),
                      "arrival": ("t_idle_ns",), "output": ()}[self.kind]
        for key in kind_times + ("end_min_ns", "end_max_ns"):
            value = getattr(self, key)
            if value is not None and abs(value - now_ns) > window_ns:
                return key
        for key in ("wire_ns", "made_ns", "spread_ns"):
            value = getattr(self, key)
            if value is not None and value > window_ns:
                return key
        if any(g > window_ns for g in self.gaps_ns):
            return "gaps_ns"
        return None


MAX_NS = 2**63 - 1         # every time and duration of a notice: an int64 of ns, >= 0
MAX_INDEX = 2**31 - 1      # iterations, op indices, awaits' parts
MAX_HOST_CHARS = 64
MAX_GAPS = 64              # gaps_ns entries


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


def parse_notice(n: dict) -> Notice:
    """A notice from its JSON object; KeyError, TypeError or ValueError if malformed: every
    integer an int in its range (times and durations 0..MAX_NS, indices 0..MAX_INDEX), host
    names at most MAX_HOST_CHARS, gaps_ns at most MAX_GAPS. Whether its times are near now is
    the reader's check (Notice.out_of_window)."""
    host = _host(n["host"], "host")
    if "busy_ns" in n:
        return Notice(kind="busy", host=host, t_ns=_int(n["busy_ns"], "busy_ns"))
    awaits = None if n.get("awaits") is None else \
        tuple(_int(x, "awaits[]", MAX_INDEX) for x in _triple(n["awaits"], "awaits"))
    maker = None
    if n.get("maker") is not None:
        host_m, it_m, op_m = _triple(n["maker"], "maker")
        maker = (_host(host_m, "maker host"), _int(it_m, "maker iteration", MAX_INDEX),
                 _int(op_m, "maker op", MAX_INDEX))
    if "t_pred_end_ns" in n:
        return Notice(kind="bubble", host=host, t_idle_ns=_int(n["t_idle_ns"], "t_idle_ns"),
                      t_pred_end_ns=_int(n["t_pred_end_ns"], "t_pred_end_ns"),
                      iteration=_opt_int(n, "iteration", MAX_INDEX),
                      op=_opt_int(n, "op", MAX_INDEX), gaps_ns=_gaps(n.get("gaps_ns", [])),
                      awaits=awaits, pending=n.get("pending", False) is True,
                      wire_ns=_opt_int(n, "wire_ns"), made_ns=_opt_int(n, "made_ns"),
                      maker=maker, spread_ns=_opt_int(n, "spread_ns"),
                      end_min_ns=_opt_int(n, "end_min_ns"), end_max_ns=_opt_int(n, "end_max_ns"))
    end_min = _int(n["end_min_ns"], "end_min_ns")
    if "t_idle_ns" in n:
        return Notice(kind="arrival", host=host, t_idle_ns=_int(n["t_idle_ns"], "t_idle_ns"),
                      end_min_ns=end_min, end_max_ns=_opt_int(n, "end_max_ns"))
    if awaits is None:
        raise KeyError("awaits")
    return Notice(kind="output", host=host, awaits=awaits, end_min_ns=end_min)


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
