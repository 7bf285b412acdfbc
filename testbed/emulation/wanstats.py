"""Every WAN packet accounted for: the delay lines' counters per link direction, and warnings.

One job: ask every running delay line (`testbed.emulation.delayline --stats PATH`) for the counters since
its previous report, wait for the reports (bounded), reshape them per link direction "a->b", and
judge them against the scenario. `testbed.emulation.network.Network.wan_stats()` is collect() for the
running network; each call starts a new interval (the delay line resets its counters), so a
call at the start of a measured phase and one at its end give that phase's figures.

Per direction (the fields are described in testbed.emulation.delayline's docstring):
    {"packets", "bytes", "dropped_loss", "dropped_queue_full", "dropped_user", "id_gaps",
     "enobufs", "verdict_errors", "late_packets", "lateness_ms": {"p50", "p99", "max"},
     "arrival_lag_ms": {"p50", "p99", "max"},
     "released", "interval_s", "rt"}
dropped_queue_full and dropped_user are None where the kernel's counters could not be read.
"""

from __future__ import annotations

import json
import math
import signal
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

from testbed.spec.errors import TestbedError
from testbed.spec.links import both

REPORT_TIMEOUT_S = 2.0
LATE_TOL_MS = 1.0     # a release later than this is worth a warning
LOSS_Z = 4.0          # binomial tolerance: drops above n p + z sqrt(n p (1 - p)) are warned of
FIELDS = ("packets", "bytes", "dropped_loss", "dropped_queue_full", "dropped_user", "id_gaps",
          "enobufs", "verdict_errors", "late_packets", "lateness_ms", "arrival_lag_ms", "released")


class _Proc(Protocol):
    pid: int

    def poll(self) -> int | None: ...

    def signal(self, sig: int, group: bool = True) -> bool: ...


class DelayLineLike(Protocol):
    """What this module needs of testbed.emulation.network.DelayLineProc."""

    gateway: str
    queues: tuple[Any, ...]   # QueueSpec, with .num
    links: tuple[str, ...]    # "a->b" per queue
    proc: _Proc
    stats_path: Path


def read_report(path: Path) -> dict | None:
    """The delay line's latest report, or None if it has written none yet."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


def request(delaylines: Sequence[DelayLineLike]) -> dict[Path, int]:
    """Send every delay line SIGUSR1 (write a report); return each report file's sequence
    number from before, which the new report will exceed."""
    before = {}
    for dl in delaylines:
        doc = read_report(dl.stats_path)
        before[dl.stats_path] = doc["seq"] if doc else 0
        if dl.proc.poll() is not None or not dl.proc.signal(signal.SIGUSR1, group=False):
            raise TestbedError(f"delay line in {dl.gateway} (links {', '.join(dl.links)}) is not "
                               f"running (exit code {dl.proc.poll()}); no packet counts")
    return before


def collect(delaylines: Sequence[DelayLineLike], timeout_s: float = REPORT_TIMEOUT_S
            ) -> dict[str, dict]:
    """request() and wait for every new report: {"a->b": counters since the previous call}."""
    before = request(delaylines)
    deadline = time.monotonic() + timeout_s
    waiting = list(delaylines)
    out: dict[str, dict] = {}
    while waiting:
        for dl in list(waiting):
            doc = read_report(dl.stats_path)
            if doc is not None and doc["seq"] > before[dl.stats_path]:
                out.update(per_direction(doc, dl))
                waiting.remove(dl)
        if not waiting:
            break
        if time.monotonic() > deadline:
            dl = waiting[0]
            raise TestbedError(f"delay line in {dl.gateway} (links {', '.join(dl.links)}) wrote "
                               f"no report to {dl.stats_path} within {timeout_s:g} s")
        time.sleep(0.005)
    return dict(sorted(out.items()))


def per_direction(doc: dict, dl: DelayLineLike) -> dict[str, dict]:
    """One delay line's report, keyed by the link direction of each of its queues."""
    out = {}
    for spec, link in zip(dl.queues, dl.links):
        q = doc["queues"][str(spec.num)]
        entry = {k: q[k] for k in FIELDS}
        entry["interval_s"] = doc["interval_s"]
        entry["rt"] = doc["rt"]
        out[link] = entry
    return out


def binomial_band(n: int, p: float, z: float = LOSS_Z) -> tuple[float, float]:
    """Where the number of n packets lost with probability p falls, z standard deviations."""
    sd = math.sqrt(n * p * (1 - p))
    return max(0.0, n * p - z * sd), n * p + z * sd


def loss_by_direction(links: Iterable[Any]) -> dict[str, float]:
    """{"a->b": loss_pct} for both directions of each scenario WanLink (.a, .b, .loss_pct)."""
    out = {}
    for link in links:
        for d in both(link.a, link.b):
            out[str(d)] = link.loss_pct
    return out


def dropped(s: dict) -> tuple[int, int, int]:
    """A direction's drops: (configured loss, queue full, delay line too slow: the kernel's
    user drops or, where /proc did not say, the ids that never reached us)."""
    return s["dropped_loss"], s["dropped_queue_full"] or 0, max(s["dropped_user"] or 0, s["id_gaps"])


def warnings(stats: Mapping[str, dict], links: Iterable[Any],
             faulted: Iterable[str] = ()) -> list[str]:
    """One line per problem: more drops than the configured loss_pct allows (binomial, LOSS_Z
    standard deviations; any kernel drop on a lossless link), releases more than LATE_TOL_MS
    late, verdicts the kernel refused, a delay line that left real-time priority. faulted:
    directions "a->b" where the scenario's faults dropped packets on purpose (loss, link_down):
    their configured-loss drops are then said to be the faults', not a problem."""
    faulted = set(faulted)
    loss_pct = loss_by_direction(links)
    out = []
    for direction, s in stats.items():
        p = loss_pct.get(direction, 0.0) / 100
        loss, queue_full, too_slow = dropped(s)
        n_dropped = loss + queue_full + too_slow
        n = s["packets"] + n_dropped
        _low, high = binomial_band(n, p)
        if n_dropped > high and direction in faulted and queue_full + too_slow <= high:
            out.append(f"note: wan {direction}: {loss} of {n} packets dropped by the "
                       f"scenario's faults (loss, link_down) and the configured loss_pct "
                       f"{100 * p:g}; queue full {queue_full}, delay line too slow {too_slow}")
        elif n_dropped > high:
            out.append(f"warning: wan {direction}: {n_dropped} of {n} packets dropped (configured "
                       f"loss {loss}, queue full {queue_full}, delay line too slow "
                       f"{too_slow}); loss_pct {100 * p:g} allows at most {high:.0f}")
        lateness = s["lateness_ms"]
        if lateness["p99"] > LATE_TOL_MS or lateness["max"] > LATE_TOL_MS:
            out.append(f"warning: wan {direction}: {s['late_packets']} of {s['released']} packets "
                       f"left the delay line more than {LATE_TOL_MS:g} ms late (p50 "
                       f"{lateness['p50']:.3f}, p99 {lateness['p99']:.3f}, max "
                       f"{lateness['max']:.3f} ms)")
        if s["verdict_errors"]:
            out.append(f"warning: wan {direction}: the kernel refused {s['verdict_errors']} "
                       f"verdicts (packets gone before their release)")
        if str(s.get("rt", "")).startswith("demoted"):
            out.append(f"warning: wan {direction}: the delay line left real-time priority "
                       f"({s['rt']}); its delay may spike while the CPUs are busy")
    return out
