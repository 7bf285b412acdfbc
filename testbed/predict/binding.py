"""Which resource bounds a system's iteration, and by how much: the what-if's reasons. Pure.

One job: from a scenario, a system's placement and the model's prediction for it, an estimate
(seconds per iteration) of what each resource alone would take, and which of them is the
tightest. Each is computed from the configured figures the model uses, not read off the model's
internals:

- compute: one pipeline's iteration with no communication (testbed.rules.pipeline.compute_only),
  plus the longest all-reduce of a stage that sits in one DC;
- latency: compute plus, at every stage boundary that crosses the WAN, the slowest pipeline's
  activation there and gradient back, each alone (testbed.predict.transfer.transfer_ms): the first
  micro-batch's forward and the last one's backward wait for them whatever else overlaps (warm,
  and in slow start after idle where the scenario keeps it);
- allreduce: compute plus the longest all-reduce (the prediction's) of a stage whose replicas
  sit in several DCs, so that its ring crosses the WAN;
- rate: on each WAN link direction, the pipelines' activation and gradient bits per iteration
  (stage boundary s -> s+1 of pipeline r crossing DCs: M messages each way of the profile's
  activation bytes, their wire bytes) at the link's rate;
- window (concurrent sharing, where a message needs more than one round trip): the same bits
  at what the connections' windows allow, pipelines x stripes x (stripe / round trips) / RTT,
  if that is below the link's rate; in slow start after idle too, where the scenario keeps it
  (testbed.predict.transfer's rounds);
- slots (temporal sharing): every message on the link one at a time, each holding it for its
  transfer time less the one-way delay (testbed.predict.transfer.transfer_ms), warm and, where the
  scenario keeps slow start after idle, restarting it; left out where it is the rate's figure.

The binding one (`binding`) is the largest estimate not above the iteration time by more than
SLACK (an estimate is a bound only roughly: a pipeline may keep several messages in flight),
else the smallest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE, message_payload_bytes
from testbed.plans.systems import (connections_for, path_between, path_rate_mbit, path_rtt_ms,
                                 window_bytes)
from testbed.predict.transfer import PathSpec, rounds_needed, transfer_ms
from testbed.rules.costs import stage_costs
from testbed.rules.pipeline import compute_only
from testbed.rules.schedule import schedule_table
from testbed.rules.stripes import stripe_count
from testbed.spec.links import LinkDir, hops

if TYPE_CHECKING:
    from testbed.plans.placement import Placement
    from testbed.predict.predict import Prediction
    from testbed.spec.scenario import Scenario
    from testbed.spec.systems import System
    from testbed.spec.training import TrainConfig

SLACK = 1.25
SAME = 0.05          # a slot estimate within 5% of the rate's is the rate's


@dataclass(frozen=True, kw_only=True, slots=True)
class Bound:
    kind: str        # "compute" | "allreduce" | "latency" | "rate" | "window" | "slots"
    seconds: float   # per iteration
    text: str        # what it is, with its figures

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seconds": self.seconds, "text": self.text}


@dataclass(slots=True)
class _Link:
    """One WAN link direction's pipeline traffic per iteration; dicts keyed by slow start
    after idle (False: warm connections, True: restarting slow start)."""
    bits: float = 0.0
    pipelines: int = 0
    messages: int = 0
    stripes: int = 0
    rtt_ms: float = 0.0
    window_bits_per_ms: dict = field(default_factory=dict)   # what the windows allow
    limited: dict = field(default_factory=dict)     # every message needs several round trips
    hold_ms: dict = field(default_factory=dict)     # the slots' total hold
    rounds: dict = field(default_factory=dict)      # the most round trips a message takes


def bounds(scenario: "Scenario", cfg: "TrainConfig", system: "System",
           placement: "Placement", prediction: "Prediction") -> list[Bound]:
    """Every resource's estimate for `system` (module docstring)."""
    costs = stage_costs(cfg.profile, cfg.stages, cfg.tp)
    compute_s = compute_only(schedule_table(cfg.schedule, cfg.stages, cfg.micro_batches),
                             [c.forward_ms for c in costs], [c.backward_ms for c in costs],
                             opt_ms=[c.optimizer_ms for c in costs]).window_ms / 1e3
    ar = prediction.allreduce_ms
    split = [s for s, wide in enumerate(placement.allreduce_across_wan()) if wide]
    local = max((ar[s] for s in range(cfg.stages) if s not in split), default=0.0) / 1e3
    out = [Bound(kind="compute", seconds=compute_s + local, text=(
        f"compute-bound: {compute_s:.2f} s of compute"
        + (f" + {local:.2f} s all-reduce inside a DC" if local >= 0.005 else "")
        + f" per iteration, WAN busy {max(prediction.wan_utilization.values(), default=0):.0%}"))]
    if split:
        s = max(split, key=lambda k: ar[k])
        dcs = sorted(set(placement.stage_dcs[s]))
        out.append(Bound(kind="allreduce", seconds=compute_s + ar[s] / 1e3, text=(
            f"stage {s}'s replicas split over {' and '.join(dcs)}: its all-reduce crosses the "
            f"WAN ({ar[s] / 1e3:.1f} s per iteration"
            + (f"; {len(split)} stages split" if len(split) > 1 else "") + ")")))
    out += _link_bounds(scenario, cfg, system, placement, compute_s)
    seen: set[tuple[str, float]] = set()      # the same figure again (the other direction of a
    kept = []                                 # link, slow start that changes nothing): once
    for b in out:
        key = (b.kind, round(b.seconds, 9))
        if key not in seen:
            seen.add(key)
            kept.append(b)
    return kept


def binding(candidates: Sequence[Bound], iteration_s: float) -> Bound:
    """The tightest estimate (module docstring)."""
    within = [b for b in candidates if b.seconds <= SLACK * iteration_s]
    if within:
        return max(within, key=lambda b: b.seconds)
    return min(candidates, key=lambda b: b.seconds)


def _link_bounds(scenario: "Scenario", cfg: "TrainConfig", system: "System",
                 placement: "Placement", compute_s: float) -> list[Bound]:
    payloads = message_payload_bytes(cfg, scenario.scale)
    window = window_bytes(scenario.scale)
    rates = {d: w.rate_mbit for w in scenario.wan for d in w.directions}
    host_rate = {dc.name: dc.rate_mbit for dc in scenario.dcs}
    modes = (False, True) if scenario.tcp_slow_start_after_idle else (False,)
    links: dict[LinkDir, _Link] = {}
    # per boundary, the slowest pipeline's message there and back (alone): ms, one way, rounds
    crossing: dict[bool, dict[int, tuple[float, float, int]]] = {m: {} for m in modes}
    for s, row in enumerate(placement.boundaries()):
        for (a, b), n in Counter(pair for pair in row if pair[0] != pair[1]).items():
            there_back = {m: (0.0, 0.0, 0) for m in modes}
            for src, dst in ((a, b), (b, a)):       # activations there, gradients back
                path = path_between(scenario, src, dst)
                rate = path_rate_mbit(scenario, src, dst)
                if host_rate[src] is not None:
                    rate = min(rate, host_rate[src])
                spec = PathSpec(rate_mbit=rate, one_way_ms=path.delay_ms,
                                rtt_ms=path_rtt_ms(scenario, src, dst), window_bytes=window,
                                connections=connections_for(scenario, system, src, dst))
                k = stripe_count(payloads[s], spec.connections)
                wire_bits = payloads[s] * WIRE_BYTES_PER_PAYLOAD_BYTE * 8
                count = n * cfg.micro_batches
                for m in modes:
                    ms, way, most = there_back[m]
                    there_back[m] = (ms + transfer_ms(payloads[s], spec, m),
                                     way + spec.one_way_ms,
                                     max(most, rounds_needed(payloads[s] / k, window, m)[0]))
                for link in hops(path.dcs):
                    g = links.setdefault(link, _Link())
                    g.bits += count * wire_bits
                    g.pipelines += n
                    g.messages += count
                    g.stripes, g.rtt_ms = max(g.stripes, k), max(g.rtt_ms, spec.rtt_ms)
                    for m in modes:
                        rounds = rounds_needed(payloads[s] / k, window, m)[0]
                        g.rounds[m] = max(g.rounds.get(m, 0), rounds)
                        g.limited[m] = g.limited.get(m, True) and rounds > 1
                        # n pipelines x k connections, each a stripe per `rounds` round trips
                        g.window_bits_per_ms[m] = g.window_bits_per_ms.get(m, 0.0) + (
                            n * k * (wire_bits / k) / (rounds * spec.rtt_ms))
                        g.hold_ms[m] = g.hold_ms.get(m, 0.0) + count * (
                            transfer_ms(payloads[s], spec, m) - spec.one_way_ms)
            for m in modes:
                if there_back[m][0] > crossing[m].get(s, (0.0,))[0]:
                    crossing[m][s] = there_back[m]
    out = []
    for m, by_boundary in crossing.items():
        if not by_boundary:
            continue
        ms = sum(v[0] for v in by_boundary.values())
        way = sum(v[1] for v in by_boundary.values())
        most = max(v[2] for v in by_boundary.values())
        n = len(by_boundary)
        out.append(Bound(kind="latency", seconds=compute_s + ms / 1e3, text=(
            f"latency-bound: a micro-batch's activation and gradient cross {n} WAN boundar"
            + ("ies" if n > 1 else "y") + f" in {ms:.0f} ms ({way:.0f} ms of it delay, "
            f"{most} round trip" + ("s" if most > 1 else "") + " each"
            + (" in slow start after idle" if m else "")
            + f"), {compute_s + ms / 1e3:.2f} s with the compute")))
    for link, g in sorted(links.items()):
        rate = rates[link]
        rate_s = g.bits / (rate * 1e3) / 1e3
        real = scenario.scale
        out.append(Bound(kind="rate", seconds=rate_s, text=(
            f"rate-limited on {link}: {_bits(g.bits * real)} per iteration at "
            f"{_rate(rate * real)} ({rate_s:.1f} s)")))
        for m in (g.window_bits_per_ms if system.wan_sharing == "concurrent" else ()):
            allowed = g.window_bits_per_ms[m]
            if not g.limited[m] or allowed >= rate * 1e3:
                continue
            est = g.bits / allowed / 1e3
            out.append(Bound(kind="window", seconds=est, text=(
                f"window-limited on {link}" + (" in slow start after idle" if m else "")
                + f": {g.pipelines} pipeline" + ("s" if g.pipelines > 1 else "")
                + f" x {g.stripes} connection"
                + ("s" if g.stripes > 1 else "")
                + (f" x {_bytes(window * real)} / {g.rtt_ms:g} ms RTT" if not m else
                   f", {g.rounds[m]} round trips of {g.rtt_ms:g} ms a message")
                + f" = {_rate(allowed / 1e3 * real)} of {_rate(rate * real)} ({est:.1f} s)")))
        for m in (g.hold_ms if system.temporal else ()):
            est = g.hold_ms[m] / 1e3
            if abs(est - rate_s) <= SAME * rate_s:
                continue
            out.append(Bound(kind="slots", seconds=est, text=(
                f"slots on {link}: {g.messages:,} messages per iteration one at a time, "
                f"{g.hold_ms[m] / g.messages:.0f} ms each ({g.rounds[m]} round trip"
                + ("s" if g.rounds[m] > 1 else "")
                + (" in slow start after idle" if m else "") + f"; {est:.1f} s)")))
    return out


def _rate(mbit: float) -> str:
    return f"{mbit / 1000:.3g} Gbit/s" if mbit >= 1000 else f"{mbit:.3g} Mbit/s"


def _bits(bits: float) -> str:
    for unit, size in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6)):
        if bits >= size:
            return f"{bits / size:.3g} {unit}"
    return f"{bits / 1e3:.3g} kbit"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"
