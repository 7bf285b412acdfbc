"""How long each stage's gradient all-reduce took against its wire time (pure: spans in).

One job: the all-reduce's measured time beside an ideal ring's. Per stage with D > 1 replicas
and per measured iteration, the all-reduce time is the shortest of its replicas' ALLREDUCE spans
(the replica that reaches the all-reduce last does not wait for the others: its span is the
transfer itself); the figure is the median over iterations, in real time (divided by
time_scale). The ideal ring (reduce-scatter then all-gather): 2 (D-1) steps, each sending a 1/D
chunk of the buffer to the next replica, at the slowest hop's rate (a replica's host link
inside a DC, the routed path's bottleneck between DCs) plus that hop's one-way delay, wire bytes
= payload x 1514/1448. No window limit, no slow start: an all-reduce across the WAN is slower.
A hierarchical all-reduce's ideal (testbed.plans.allreduce): each DC's ring on its host links, the
leaders' ring across (2 (G-1) steps of a 1/G chunk), then ceil(log2 n) rounds of the whole
buffer for the broadcast inside each DC.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Sequence

from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE
from testbed.plans.allreduce import broadcast_rounds, hierarchy
from testbed.plans.systems import path_between, path_rate_mbit
from testbed.spec.timescale import TimeScale

if TYPE_CHECKING:
    from testbed.plans.placement import Placement
    from testbed.spec.scenario import Scenario


def ring_ms(buffer_bytes: int, stage_dcs: Sequence[str], scenario: "Scenario") -> float:
    """The ideal ring all-reduce's time (module docstring), configured (real) values."""
    D = len(stage_dcs)
    rate = {dc.name: dc.rate_mbit for dc in scenario.dcs}
    chunk_wire = buffer_bytes / D * WIRE_BYTES_PER_PAYLOAD_BYTE
    step_ms = 0.0
    for r in range(D):
        a, b = stage_dcs[r], stage_dcs[(r + 1) % D]
        if a == b:
            mbit, delay = rate[a] or float("inf"), 0.0     # None: an unshaped veth
        else:
            mbit, delay = path_rate_mbit(scenario, a, b), path_between(scenario, a, b).delay_ms
        step_ms = max(step_ms, chunk_wire * 8 / (mbit * 1e3) + delay)
    return 2 * (D - 1) * step_ms


def hierarchical_ms(buffer_bytes: int, stage_dcs: Sequence[str], scenario: "Scenario") -> float:
    """The ideal hierarchical all-reduce's time (module docstring), configured values; the
    ring's where the replicas share a DC."""
    hier = hierarchy(stage_dcs, lambda a, b: 1)
    if hier is None:
        return ring_ms(buffer_bytes, stage_dcs, scenario)
    rate = {dc.name: dc.rate_mbit or float("inf") for dc in scenario.dcs}
    inside = max((ring_ms(buffer_bytes, [dc] * len(g), scenario)
                  for dc, g in zip(hier.dcs, hier.groups) if len(g) > 1), default=0.0)
    across = ring_ms(buffer_bytes, hier.dcs, scenario)
    wire_bits = buffer_bytes * WIRE_BYTES_PER_PAYLOAD_BYTE * 8
    bcast = max(broadcast_rounds(len(g)) * wire_bits / (rate[dc] * 1e3)
                for dc, g in zip(hier.dcs, hier.groups))
    return inside + across + bcast


def allreduce_report(spans: Sequence[dict], placement: "Placement", scenario: "Scenario",
                     iterations: Sequence[int], time_scale: TimeScale | float,
                     allreduce: str = "ring") -> list[dict]:
    """Per stage with replicas: {stage, dcs, bytes, measured_ms, wire_ms, ratio}; allreduce:
    the system's rule ("ring" | "hierarchical"), whose ideal wire_ms is."""
    ts = TimeScale.of(time_scale)
    used = set(iterations)
    per: dict[tuple[int, int], list[int]] = defaultdict(list)
    size: dict[int, int] = {}
    for r in spans:
        if r["name"] == "ALLREDUCE" and r.get("iteration") in used:
            per[(r["stage"], r["iteration"])].append(r["t_end_ns"] - r["t_start_ns"])
            size[r["stage"]] = r.get("bytes") or 0
    out = []
    for s, dcs in enumerate(placement.stage_dcs):
        times = [min(v) for (st, _), v in per.items() if st == s]
        if len(dcs) < 2 or not times:
            continue
        measured = ts.real_span(statistics.median(times) / 1e6)
        wire = (hierarchical_ms if allreduce == "hierarchical" else ring_ms)(size[s], dcs,
                                                                               scenario)
        out.append({"stage": s, "dcs": list(dcs), "bytes": size[s], "measured_ms": measured,
                    "wire_ms": wire, "ratio": measured / wire if wire > 0 else None})
    return out
