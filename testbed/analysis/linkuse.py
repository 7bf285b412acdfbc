"""How busy each WAN link direction was during the measured iterations, from the workers' own
records (pure: spans in, fractions out).

Bytes: every SEND_F / SEND_B span between stage replicas in different DCs adds its message
bytes to each link direction of the routed path (testbed.plans.routing.dc_paths); an ALLREDUCE span
of a stage whose replicas sit in different DCs adds what a ring all-reduce sends to the next
rank, 2 (D-1) / D x the buffer (gloo's ring pattern, assumed, not captured); a hierarchical
all-reduce (testbed.plans.allreduce) sends only its leaders' ring across, 2 (G-1) / G x the buffer
from each DC's leader to the next DC's (G DCs). Wire bytes are
payload x 1514/1448 (TCP/IP/Ethernet headers at MTU 1500, testbed.features.temporal.plan). Utilization =
wire bits / (the emulated rate x the measured iterations' wall time).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Sequence

from testbed.plans.allreduce import hierarchy
from testbed.plans.routing import dc_paths
from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE
from testbed.spec.links import LinkDir, hops

if TYPE_CHECKING:
    from testbed.plans.placement import Placement
    from testbed.spec.scenario import Scenario


def link_bytes(spans: Sequence[dict], placement: "Placement", scenario: "Scenario",
               iterations: Sequence[int], allreduce: str = "ring") -> dict[LinkDir, float]:
    """Link direction -> payload bytes that crossed it in the given iterations; allreduce: the
    system's rule ("ring" | "hierarchical", module docstring)."""
    paths = {(p.src, p.dst): p.dcs for p in dc_paths(scenario)}
    dcs = placement.stage_dcs
    D = len(dcs[0]) if dcs else 0
    hier = [hierarchy(row, lambda a, b: 1) if allreduce == "hierarchical" else None
            for row in dcs]
    used = set(iterations)
    out: dict[LinkDir, float] = defaultdict(float)

    def add(src: str, dst: str, n: float) -> None:
        if src == dst:
            return
        for d in hops(paths[(src, dst)]):
            out[d] += n

    for r in spans:
        if r.get("iteration") not in used or not r.get("bytes"):
            continue
        s, rep = r["stage"], r["replica"]
        if r["name"] == "SEND_F":
            add(dcs[s][rep], dcs[s + 1][rep], r["bytes"])
        elif r["name"] == "SEND_B":
            add(dcs[s][rep], dcs[s - 1][rep], r["bytes"])
        elif r["name"] == "ALLREDUCE" and D > 1 and hier[s] is None:
            add(dcs[s][rep], dcs[s][(rep + 1) % D], r["bytes"] * 2 * (D - 1) / D)
        elif r["name"] == "ALLREDUCE" and D > 1 and rep in hier[s].leaders:
            G = len(hier[s].dcs)
            i = hier[s].leaders.index(rep)
            add(hier[s].dcs[i], hier[s].dcs[(i + 1) % G], r["bytes"] * 2 * (G - 1) / G)
    return dict(out)


def utilization(spans: Sequence[dict], placement: "Placement", scenario: "Scenario",
                iterations: Sequence[int], window_s: float,
                allreduce: str = "ring") -> dict[str, dict]:
    """Per link direction of the scenario: {"training_bytes", "training_wire_bytes",
    "utilization"} over window_s seconds of emulated time (the measured iterations' walls)."""
    emulated = scenario.emulated()
    got = link_bytes(spans, placement, scenario, iterations, allreduce)
    out = {}
    for w in emulated.wan:
        for d in w.directions:
            key = str(d)
            payload = got.get(d, 0.0)
            wire = payload * WIRE_BYTES_PER_PAYLOAD_BYTE
            capacity = w.rate_mbit * 1e6 / 8 * window_s
            out[key] = {"training_bytes": int(payload), "training_wire_bytes": int(wire),
                        "utilization": round(wire / capacity, 4) if capacity > 0 else 0.0}
    return out
