"""How many iterations the model simulates for a prediction of n, and what each one stands for.
Pure.

One job: keep `predict`'s cost independent of `iterations`. Up to SIMULATE_ALL_UP_TO iterations
are simulated one by one (the figures are exactly the run's definitions over all of them).
Past that, training reaches a steady state: an iteration whose figures repeat. The model
simulates PROBES iterations in turn and looks, before the last one (whose wall is its own span,
not the gap to a next start: testbed.rules.figures), for the shortest period p (1..MAX_PERIOD)
over which every iteration's signature repeats three times: its wall (the start of the next
iteration less its own), the compute start of every worker, and the wire bits and queue drops it
put on each WAN link direction, each within REL of the iteration p before. The iterations not
simulated are then that period's, in turn: each iteration of the last period stands for its
share of the n - k missing ones (`Steady.weights`), and the last simulated iteration for the
run's last. Where no period is found in the largest probe, the last half of it stands for the
rest the same way, and `Steady.repeating` is False (predict says so, with the spread of the
walls there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from testbed.rules.pipeline import PipelineModel, SimResult, simulate

SIMULATE_ALL_UP_TO = 64
PROBES = (16, 64, 256)
MAX_PERIOD = 4
REL = 1e-6


@dataclass(frozen=True, slots=True)
class Steady:
    simulated: int                      # iterations simulated
    iterations: int                     # the prediction's
    period: int = 0                     # 0: every iteration simulated
    repeating: bool = True              # False: no period found, the last half stands in
    weights: dict[int, float] = field(default_factory=dict)   # iteration -> how many it is
    spread: float = 0.0                 # (max - min) / mean of the standing-in walls

    def line(self) -> str | None:
        """What `predict` says about it, or None where every iteration was simulated."""
        if not self.period:
            return None
        if self.repeating:
            last = self.simulated - 2          # the last one before the run's own last
            return (f"{self.iterations:,} iterations from {self.simulated} simulated: "
                    f"iterations {last - 3 * self.period + 1}-{last} each repeat the one "
                    f"{self.period} before (walls, starts, WAN bits and drops within {REL:g}); "
                    f"the last {self.period} stand for the rest")
        return (f"{self.iterations:,} iterations from {self.simulated} simulated: no repeating "
                f"iteration found; the last {self.period} stand for the rest (their walls "
                f"spread {self.spread:.1%})")


def _signatures(result: SimResult, k: int) -> list[tuple]:
    """Per iteration: its compute start and every worker's (relative to it), and its WAN bits
    and drops per link direction."""
    starts: dict[int, dict[tuple[int, int], float]] = {}
    for o in result.ops:
        if o.name != "ALLREDUCE":
            w = starts.setdefault(o.iteration, {})
            w[(o.stage, o.replica)] = min(w.get((o.stage, o.replica), o.start_ms), o.start_ms)
    first = [min(starts[i].values()) for i in range(k)]
    sigs = []
    for i in range(k - 1):
        wall = first[i + 1] - first[i]
        rel = tuple(t - first[i] for _, t in sorted(starts[i].items()))
        bits = tuple(per.get(i, 0.0) for _, per in sorted(result.link_bits.items()))
        drops = tuple(per.get(i, 0.0) for _, per in sorted(result.link_drops.items()))
        sigs.append((wall, *rel, *bits, *drops))
    return sigs


def _same(a: tuple, b: tuple) -> bool:
    return all(abs(x - y) <= REL * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))


def _period(sigs: list[tuple]) -> int:
    """The shortest period over which the last three periods repeat, or 0."""
    for p in range(1, MAX_PERIOD + 1):
        if len(sigs) < 3 * p + 1:       # iteration 0 is warm-up: never part of the period
            break
        if all(_same(sigs[i], sigs[i - p]) for i in range(len(sigs) - 2 * p, len(sigs))):
            return p
    return 0


def _weights(k: int, n: int, period: int) -> dict[int, float]:
    """The last simulated iteration is the run's last; the n - k missing ones before it are
    the period's iterations (k - 1 - period .. k - 2) in turn."""
    missing = n - k
    first = k - 1 - period
    out = {}
    for j in range(period):
        out[first + j] = 1.0 + missing // period + (1 if j < missing % period else 0)
    return out


def simulate_steady(model: PipelineModel, n: int,
                    progress: Callable[[str], None] | None = None) -> tuple[SimResult, Steady]:
    """Simulate what a prediction of n iterations needs (module docstring)."""
    if n <= SIMULATE_ALL_UP_TO:
        return simulate(model, n), Steady(simulated=n, iterations=n)
    result, sigs = None, []
    for k in PROBES:
        if progress is not None:
            progress(f"simulating {k} iterations for a steady state")
        result = simulate(model, k)
        sigs = _signatures(result, k)
        p = _period(sigs)
        if p:
            return result, Steady(simulated=k, iterations=n, period=p,
                                  weights=_weights(k, n, p))
    k = PROBES[-1]
    p = (k - 1) // 2
    walls = [s[0] for s in sigs[-p:]]
    mean = sum(walls) / len(walls)
    return result, Steady(simulated=k, iterations=n, period=p, repeating=False,
                          weights=_weights(k, n, p),
                          spread=(max(walls) - min(walls)) / mean if mean > 0 else 0.0)
