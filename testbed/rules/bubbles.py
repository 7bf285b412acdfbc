"""Bubble prediction for one stage replica: how long the GPU will sit idle before each op.

One job: learn, per op index, the idle gap that precedes that op, and predict the next one. Pure
(no torch, no clock, no I/O): the worker feeds it measurements and asks it questions.

The ops of one iteration are this stage's schedule row (testbed/rules/schedule.py, e.g. ["F0", "F1",
"B0", ...]) followed by "OPT"; op index k is the position in that list. The gap before op k is
the time from the end of the previous compute op (for k = 0: the previous iteration's OPT) to the
moment op k wanted the GPU (before any wait for the GPU lock: a prefill that overran does not
lengthen the gap it overran). The prediction for op k is the minimum gap at k over the last
`history` iterations (HISTORY_ITERATIONS; the minimum: a notice that promises too long a bubble costs training time,
one that promises too short a bubble only wastes some of it). Iteration 0 (warm-up: connection
set-up, slow start, first allocations) is not learned from: its gaps were up to 30x the steady
ones and led to overruns of 130 ms. A prediction needs MIN_HISTORY iterations (with one, the
first filled iteration overran most), so the first notices come in iteration 3 (k = 0: 4).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

MIN_NOTICE_MS = 1.0     # predicted bubbles shorter than this are not announced
# Iterations a prediction looks back over. Gaps were bimodal on atlas_bubbletea (the WAN
# slots' order shifts: one gap was 96 ms in 5 iterations and 38 ms in 2); with 3 the short mode
# aged out and came back as a 49 ms overrun.
HISTORY_ITERATIONS = 8
WARMUP_ITERATIONS = 1   # iterations whose gaps are not learned from
MIN_HISTORY = 2         # iterations learned from before an op's bubble is predicted
OPT = "OPT"


@dataclass(slots=True)
class BubblePredictor:
    """Per op index: the gaps of the last `history` iterations; prediction = their minimum."""

    row: Sequence[str]                      # this stage's schedule row (without OPT)
    history: int = HISTORY_ITERATIONS
    _gaps: dict[int, deque[tuple[int, int]]] = field(default_factory=dict, init=False,
                                                     repr=False)

    def __post_init__(self) -> None:
        if self.history < 1:
            raise ValueError(f"history must be >= 1, got {self.history}")
        self.row = list(self.row)

    @property
    def ops(self) -> list[str]:
        """The ops of one iteration: the row's actions, then OPT."""
        return [*self.row, OPT]

    @property
    def n_ops(self) -> int:
        return len(self.row) + 1

    def next_op(self, iteration: int, k: int) -> tuple[int, int]:
        """(iteration, op index) of the op after op k: k + 1, or op 0 of the next iteration
        after OPT."""
        self._check(k)
        return (iteration, k + 1) if k + 1 < self.n_ops else (iteration + 1, 0)

    def observe(self, iteration: int, k: int, gap_ns: int) -> None:
        """Record the idle gap (ns) that preceded op k of `iteration`. A second observation for
        the same (iteration, k) replaces the first."""
        self._check(k)
        if iteration < WARMUP_ITERATIONS:
            return
        gaps = self._gaps.setdefault(k, deque(maxlen=self.history))
        if gaps and gaps[-1][0] == iteration:
            gaps.pop()
        gaps.append((iteration, max(0, int(gap_ns))))

    def announced_ns(self, k: int, *, dp: bool, fill_allreduce: bool) -> int | None:
        """The gap a worker announces before op k (its bubble notice), or None: no prediction
        yet, one under MIN_NOTICE_MS, or the gap before OPT while it holds the gradient
        all-reduce (dp) and that gap is not to be filled (docs/bubbletea/design.md)."""
        if dp and k == len(self.row) and not fill_allreduce:
            return None
        pred = self.predict_ns(k)
        return None if pred is None or pred < MIN_NOTICE_MS * 1e6 else pred

    def predict_ns(self, k: int) -> int | None:
        """Predicted idle gap (ns) before op k; None while op k has no history."""
        self._check(k)
        gaps = self._gaps.get(k)
        if not gaps or len(gaps) < min(MIN_HISTORY, self.history):
            return None
        return min(g for _, g in gaps)

    def history_ns(self, k: int) -> list[int]:
        """The gaps before op k in the history, ascending (what a bubble that has outlasted
        the prediction may still last: the controller extends it to the next one)."""
        self._check(k)
        return sorted({g for _, g in self._gaps.get(k, ())})

    def _check(self, k: int) -> None:
        if not 0 <= k < self.n_ops:
            raise IndexError(f"op index {k} outside 0..{self.n_ops - 1}")
