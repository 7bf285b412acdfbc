"""Fidelity asserts: measured samples against a target, within a stated tolerance. Used by root
(`network`) tests and the benchmarks in bench/; the unit and loopback rings hold no wall-clock
fidelity asserts. On failure the message lists every sample with its deviation, the target,
the tolerance and how many samples were inside, so one run tells what went wrong."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["assert_within", "retried", "within"]

T = TypeVar("T")

CENTERS = {"median": statistics.median, "mean": statistics.fmean}


def within(samples: Iterable[float], target: float, *, rel: float = 0.0, abs: float = 0.0,
           below: float | None = None, above: float | None = None, share: float = 1.0,
           center: str | None = None) -> tuple[bool, str]:
    """(ok, report). A sample is inside when it lies within target - below .. target + above;
    each side defaults to max(rel x |target|, abs) (a deadline, say, may fire late by more than
    it may fire early). ok: the samples' `center` ("median", "mean") is inside, or else at
    least `share` of the samples are."""
    values = [float(x) for x in samples]
    sym = max(rel * math.fabs(target), abs)
    lo = sym if below is None else below
    hi = sym if above is None else above
    if min(rel, abs, lo, hi) < 0 or not 0 < share <= 1 or center not in (None, *CENTERS):
        raise ValueError(f"bad tolerance: rel={rel}, abs={abs}, below={below}, above={above}, "
                         f"share={share}, center={center!r}")
    tol = f"+- {sym:.3g}" if lo == hi else f"-{lo:.3g}/+{hi:.3g}"
    head = f"target {target:g} {tol} (rel {rel:g}, abs {abs:g})"
    if not values:
        return False, f"{head}: no samples"
    inside = [target - lo <= x <= target + hi for x in values]
    if center is not None:
        value = CENTERS[center](values)
        ok = target - lo <= value <= target + hi
        verdict = f"{center} {value:.6g} ({value - target:+.3g})"
    else:
        need = math.ceil(share * len(values) - 1e-9)
        ok = sum(inside) >= need
        verdict = f"{sum(inside)} of {len(values)} inside, {need} needed"
    lines = [f"{head}: {verdict}"]
    lines += [f"  [{i}] {x:.6g} ({x - target:+.3g}){'' if ok_i else '  outside'}"
              for i, (x, ok_i) in enumerate(zip(values, inside))]
    return ok, "\n".join(lines)


def assert_within(samples: Iterable[float], target: float, *, rel: float = 0.0,
                  abs: float = 0.0, below: float | None = None, above: float | None = None,
                  share: float = 1.0, center: str | None = None, what: str = "value") -> None:
    """Assert that the samples meet target within the tolerance (see within()); the message
    names `what` and lists every sample."""
    ok, report = within(samples, target, rel=rel, abs=abs, below=below, above=above,
                        share=share, center=center)
    assert ok, f"{what}: {report}"


def retried(measure: Callable[[int], T], ok: Callable[[T], bool], tries: int, *,
            gap_s: float = 0.0) -> list[T]:
    """Every result of measure(0), measure(1), ... up to `tries` of them, stopping at the first
    one ok() accepts; the last is the verdict, assert ok() on it and show them all. For
    wall-clock figures on a shared machine: one VM stall (steal time, a neighbour's burst)
    misses a try, a real bias misses every one. Anything that is not a wall-clock figure (an
    exit code, a count) is asserted inside measure, where it fails the first try. gap_s: wait
    between tries."""
    if tries < 1:
        raise ValueError(f"tries must be at least 1, not {tries}")
    results: list[T] = []
    for i in range(tries):
        if i and gap_s:
            time.sleep(gap_s)
        results.append(measure(i))
        if ok(results[-1]):
            break
    return results
