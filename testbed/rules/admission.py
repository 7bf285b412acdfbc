"""Which queued prefill request goes into a bubble, if any. Pure: no clock, no sockets.

One job: the controller's admission rule, testable with made-up times.

A bubble is (now, end): the host's GPU is idle until `end`, the predicted start of its next
training op. A request with predicted prefill time p (the H200 profile at its prompt length,
times time_scale) fits when

    now + p + guard(p) <= end,      guard(p) = guard_ms + guard_pct % of p

and the prefill server is told to refuse it unless it can end by `end - guard(p)` (it checks
again when it holds the GPU: the controller's `now` is older by a message). Among fitting
requests, one that has waited half its time-to-first-token deadline goes first (the oldest of
those); otherwise the longest (best fit: the bubble's rest is then as small as it can be, and
short requests stay queued for the short rests; first fit by age left 74 % of the unused bubble
time as rests no queued request fitted). A request that fits no bubble waits for a larger one on
any host of the DC until its deadline passes; then it is expired (counted as a deadline miss,
never dropped silently). Only the oldest PICK_WINDOW requests are considered (bounded work per
pick).

Chunked prefill (when on): a rest that no whole request fits may take the first chunk of the
oldest request that is at least two chunks long (`take_for_chunk`); the chunk is as long as fits
(`chunk_end`, cost = the profile's chunk time + its guard), never under the profile's shortest
prompt, and never leaving a rest under it. The request then stays with that host (its prefix is
in that GPU's memory) and its next chunks go first into that host's next bubbles; the controller
keeps it (`Pending.done_tokens`), not this queue.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from testbed.spec.timescale import TimeScale

if TYPE_CHECKING:
    from testbed.spec.bubbletea import BubbleTeaConfig
    from testbed.rules.prefill_profile import PrefillProfile

NS_PER_MS = 1_000_000
# A pick looks at the oldest PICK_WINDOW requests only: under overload the queue grows to
# thousands, and a scan of all of them per dispatch cost the controller enough CPU on this
# 2-core machine to slow training (a real controller has cores of its own).
PICK_WINDOW = 256


@dataclass(kw_only=True, slots=True, order=False)
class Pending:
    id: str
    seq: int                  # arrival order (a requeued request keeps its place)
    t_arrival_ns: int
    deadline_ns: int          # t_arrival_ns + the TTFT deadline
    target_tokens: int        # prompt length the profile is read at
    output_tokens: int
    predicted_ns: int         # prefill hold on the target GPU (x time_scale)
    guard_ns: int
    attempts: int = 0
    truncated_from: int | None = None
    done_tokens: int = 0      # chunked: target tokens already prefilled on its host
    chunks: int = 0           # chunks served so far
    t_first_start_ns: int | None = None   # chunked: the first chunk's start


@dataclass(kw_only=True, slots=True)
class Pick:
    request: Pending | None
    reason: str               # "fit" | "no_request" | "none_fitted" | "guard"
    not_after_ns: int = 0     # the prefill must end by then (bubble end - guard)


@dataclass(kw_only=True)
class Admission:
    """FIFO queue of one DC's waiting requests with the fit rule above."""
    _queue: list[Pending] = field(default_factory=list)  # sorted by seq

    def __len__(self) -> int:
        return len(self._queue)

    def arrive(self, req: Pending) -> None:
        bisect.insort(self._queue, req, key=lambda r: r.seq)

    requeue = arrive

    def expire(self, now_ns: int) -> list[Pending]:
        """Remove and return the requests whose deadline has passed (the queue is in arrival
        order and every deadline is arrival + the same TTFT, so they are at its front)."""
        n = 0
        while n < len(self._queue) and self._queue[n].deadline_ns <= now_ns:
            n += 1
        gone, self._queue[:n] = self._queue[:n], []
        return gone

    def pick(self, now_ns: int, bubble_end_ns: int) -> Pick:
        """Take the oldest request that fits before bubble_end_ns (module rule), if any."""
        if not self._queue:
            return Pick(request=None, reason="no_request")
        guarded = False
        best: int | None = None
        for i, r in enumerate(self._queue[:PICK_WINDOW]):
            if now_ns + r.predicted_ns + r.guard_ns > bubble_end_ns:
                guarded = guarded or now_ns + r.predicted_ns <= bubble_end_ns
                continue
            if 2 * (now_ns - r.t_arrival_ns) >= r.deadline_ns - r.t_arrival_ns:
                best = i         # urgent: the oldest fitting one that has waited half its time
                break
            if best is None or r.predicted_ns > self._queue[best].predicted_ns:
                best = i
        if best is not None:
            r = self._queue.pop(best)
            return Pick(request=r, reason="fit", not_after_ns=bubble_end_ns - r.guard_ns)
        # "guard": one would have fitted without the guard; "none_fitted": none at all
        return Pick(request=None, reason="guard" if guarded else "none_fitted")

    def take_for_chunk(self, now_ns: int, bubble_end_ns: int,
                       cost_ns: Callable[[int, int], int], min_tokens: int
                       ) -> tuple[Pending, int] | None:
        """Remove and return the oldest request of at least 2 x min_tokens whose first chunk
        fits before bubble_end_ns, with that chunk's end (module docstring); None if none."""
        room = bubble_end_ns - now_ns
        if cost_ns(0, min_tokens) > room:
            return None
        for i, r in enumerate(self._queue[:PICK_WINDOW]):
            if r.target_tokens < 2 * min_tokens:
                continue
            end = chunk_end(0, r.target_tokens, room, cost_ns, min_tokens)
            if end is not None:
                return self._queue.pop(i), end
        return None

    def drain(self) -> list[Pending]:
        out = list(self._queue)
        self._queue = []
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Choice:
    request: Pending | None
    chunk: tuple[int, int] | None     # tokens [start, end) of request; None: all of it
    not_after_ns: int                 # the prefill must end by then
    reason: str                       # "fit", else why nothing went in (Pick.reason)
    first_chunk: bool = False         # request's first chunk: it now stays with the host


def choose(queue: Admission, partial: Pending | None, pick_at_ns: int, bubble_end_ns: int,
           chunk_ns: Callable[[int, int], tuple[int, int]], min_tokens: int,
           chunking: bool) -> Choice:
    """What a host's bubble takes next (the controller's rule; the model uses it too): the
    request whose prefix the host holds (`partial`: its next chunk, as long as fits); else a
    whole request (Admission.pick); else, with chunking, a first chunk (take_for_chunk).
    chunk_ns(start, end) is a chunk's (hold, guard)."""
    def cost(done: int, end: int) -> int:
        return sum(chunk_ns(done, end))

    if partial is not None:
        end = chunk_end(partial.done_tokens, partial.target_tokens, bubble_end_ns - pick_at_ns,
                        cost, min_tokens)
        if end is None:
            return Choice(request=None, chunk=None, not_after_ns=0, reason="none_fitted")
        chunk = (partial.done_tokens, end)
        return Choice(request=partial, chunk=chunk, reason="fit",
                      not_after_ns=bubble_end_ns - chunk_ns(*chunk)[1])
    pick = queue.pick(pick_at_ns, bubble_end_ns)
    if pick.request is not None:
        return Choice(request=pick.request, chunk=None, not_after_ns=pick.not_after_ns,
                      reason="fit")
    got = queue.take_for_chunk(pick_at_ns, bubble_end_ns, cost, min_tokens) if chunking \
        else None
    if got is None:
        return Choice(request=None, chunk=None, not_after_ns=0, reason=pick.reason)
    r, end = got
    return Choice(request=r, chunk=(0, end), first_chunk=True, reason="fit",
                  not_after_ns=bubble_end_ns - chunk_ns(0, end)[1])


def chunk_end(done: int, target: int, room_ns: int, cost_ns: Callable[[int, int], int],
              min_tokens: int, upto: int | None = None) -> int | None:
    """The largest end in (done, upto] (upto: target by default) whose chunk [done, end) costs
    at most room_ns, with neither the chunk nor the rest after it under min_tokens (the whole
    rest may be shorter); None if there is none. cost_ns grows with end."""
    upto = target if upto is None else upto
    if cost_ns(done, upto) <= room_ns and (upto == target or target - upto >= min_tokens):
        return upto
    lo, hi = done + min_tokens, min(upto, target - min_tokens)
    if lo > hi or cost_ns(done, lo) > room_ns:
        return None
    while lo < hi:                       # the largest end in [lo, hi] that fits
        mid = (lo + hi + 1) // 2
        if cost_ns(done, mid) <= room_ns:
            lo = mid
        else:
            hi = mid - 1
    return lo


def chunk_hold_ns(profile: "PrefillProfile", cfg: "BubbleTeaConfig", done: int, end: int, *,
                  time_scale: TimeScale | float) -> tuple[int, int]:
    """A chunk's predicted hold and its guard (the profile's chunk time, cfg's guard), dilated
    by time_scale, in ns: what the controller and the model (testbed.predict.bubbletea) admit by."""
    ts = TimeScale.of(time_scale)
    ms = profile.chunk_ms(done, end)
    return (int(ts.emulated_span(ms) * NS_PER_MS),
            int(ts.emulated_span(cfg.guard_for_ms(ms)) * NS_PER_MS))


def make_pending(*, id: str, seq: int, t_arrival_ns: int, target_tokens: int,
                 output_tokens: int, deadline_ms: float, predict_ms: Callable[[int], float],
                 guard_ms: Callable[[float], float], time_scale: TimeScale | float,
                 truncated_from: int | None = None) -> Pending:
    """A request as the queue holds it; every time dilated by time_scale."""
    ts = TimeScale.of(time_scale)
    p_ms = predict_ms(target_tokens)
    return Pending(id=id, seq=seq, t_arrival_ns=t_arrival_ns,
                   deadline_ns=t_arrival_ns + int(ts.emulated_span(deadline_ms) * NS_PER_MS),
                   target_tokens=target_tokens, output_tokens=output_tokens,
                   predicted_ns=int(ts.emulated_span(p_ms) * NS_PER_MS),
                   guard_ns=int(ts.emulated_span(guard_ms(p_ms)) * NS_PER_MS),
                   truncated_from=truncated_from)
