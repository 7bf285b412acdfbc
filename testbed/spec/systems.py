"""Training systems as plain data: the one table of the systems there are and what each does
differently (where it places stages, how many TCP connections a transfer uses, how the WAN links
are shared). Pure; testbed.plans.systems computes from it (connections, paths), the scenario checks
names against it.

    baseline       scenario-order placement, 1 connection, transfers share the WAN concurrently
    multitcp       scenario-order placement, the scenario's K connections, concurrent
    temporal       scenario-order placement, 1 connection, temporal WAN slots
    atlas          Atlas placement (all replicas of a stage in one DC), K connections, temporal
    atlas-concurrent  Atlas placement, K connections, concurrent: Atlas without its slots (the
                   step before temporal sharing in the gain's waterfall, testbed.predict.whatif)
    dp-across-dcs  each pipeline in one DC, so every stage's all-reduce crosses the WAN
    hierarchical   multitcp with a geo-aware all-reduce: where a stage's replicas span DCs, each
                   DC all-reduces inside, one leader per DC all-reduces across over K
                   connections (the buffer in K parts, each its own ring), then broadcasts
                   inside (testbed.plans.allreduce); what a system that knows its DCs would run
    <any>+bubbletea  the same system, with prefill requests filling its bubbles (fill_bubbles;
                   testbed.features.bubbletea runs it, the scenario's `bubbletea:` section configures it)

The baseline is Varuna's design as the Atlas paper compares against it (pipelines across DCs
in the order the GPUs come, one TCP connection per transfer, transfers sharing the WAN as TCP
does); its all-reduce is a flat ring (PyTorch DDP's, gloo's or NCCL's ring over the replicas in
rank order), so a stage split over DCs runs its ring over the WAN, one connection a hop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from testbed.spec.errors import ScenarioError

BUBBLETEA_SUFFIX = "+bubbletea"
PLACEMENTS = ("scenario-order", "atlas", "dp-across-dcs")
CONNECTION_RULES = ("one", "scenario")
WAN_SHARING = ("concurrent", "temporal")
ALLREDUCE_RULES = ("ring", "hierarchical")


@dataclass(frozen=True, kw_only=True, slots=True)
class System:
    name: str
    placement: str      # "scenario-order" | "atlas" | "dp-across-dcs" (testbed.plans.placement)
    connections: str    # "one" (1 per transfer) | "scenario" (the scenario's K per link)
    wan_sharing: str    # "concurrent" | "temporal" (testbed.features.temporal.plan)
    allreduce: str = "ring"     # "ring" | "hierarchical" (testbed.plans.allreduce)
    fill_bubbles: bool = False

    def __post_init__(self) -> None:
        for value, allowed in ((self.placement, PLACEMENTS), (self.connections, CONNECTION_RULES),
                               (self.wan_sharing, WAN_SHARING), (self.allreduce, ALLREDUCE_RULES)):
            if value not in allowed:
                raise ValueError(f"system {self.name}: {value!r} is not one of {allowed}")

    @property
    def temporal(self) -> bool:
        return self.wan_sharing == "temporal"

    @property
    def without_bubbles(self) -> str:
        """The name of the same system without prefill in its bubbles."""
        return self.name.removesuffix(BUBBLETEA_SUFFIX)


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System(name="baseline", placement="scenario-order", connections="one",
           wan_sharing="concurrent"),
    System(name="multitcp", placement="scenario-order", connections="scenario",
           wan_sharing="concurrent"),
    System(name="temporal", placement="scenario-order", connections="one",
           wan_sharing="temporal"),
    System(name="atlas", placement="atlas", connections="scenario", wan_sharing="temporal"),
    System(name="atlas-concurrent", placement="atlas", connections="scenario",
           wan_sharing="concurrent"),
    System(name="dp-across-dcs", placement="dp-across-dcs", connections="one",
           wan_sharing="concurrent"),
    System(name="hierarchical", placement="scenario-order", connections="scenario",
           wan_sharing="concurrent", allreduce="hierarchical"),
)}


def get_system(name: str, field: str = "systems") -> System:
    """The system called `name` (one of SYSTEMS, or one of them + "+bubbletea": the same
    choices with fill_bubbles), or ScenarioError on `field` listing the names there are."""
    base = name.removesuffix(BUBBLETEA_SUFFIX) if isinstance(name, str) else None
    if base not in SYSTEMS:
        raise ScenarioError(field, f"{name!r} is not a system",
                            f"use one of {', '.join(SYSTEMS)}, each optionally with "
                            f"{BUBBLETEA_SUFFIX}")
    if base == name:
        return SYSTEMS[name]
    return replace(SYSTEMS[base], name=name, fill_bubbles=True)
