"""The faults' plan for one system, with no network: the scenario's faults (testbed.spec.faults)
as events, and the WAN links whose wire the runner samples (the faulted ones and those that carry
cross-traffic: the samples show what the wire did). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from testbed.spec.errors import ScenarioError
from testbed.spec.faults import Fault, events_of

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario
    from testbed.spec.systems import System


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultsPlan:
    name: ClassVar[str] = "faults"
    faults: tuple[Fault, ...]
    sample_links: tuple[tuple[str, str], ...]   # more WAN links to sample (as the wan section)

    def to_dict(self) -> dict:
        return {"events": [ev.describe() for ev in events_of(self.faults)],
                "sample_links": [list(link) for link in self.sample_links]}


def check(scenario: "Scenario", system: "System") -> None:
    """A rate fault cannot hold under temporal WAN sharing: its slot arbiter re-plans the
    link's rates at every switch (testbed.features.faults.run)."""
    rate_faults = [f.label for f in scenario.faults if f.kind == "rate"]
    if system.temporal and rate_faults:
        raise ScenarioError(rate_faults[0], f"{system.name} shares the WAN in time: its slot "
                            "arbiter re-plans the link's rates at every switch, so a rate fault "
                            "cannot hold there", "drop the rate faults or run a system without "
                            "temporal sharing")


def cross_links(scenario: "Scenario") -> tuple[tuple[str, str], ...]:
    """The WAN links (as the wan section names them) that carry cross-traffic."""
    return tuple(sorted({(w.a, w.b) for f in scenario.cross_traffic for w in scenario.wan
                         if {w.a, w.b} == {f.src, f.dst}}))


def plan(scenario: "Scenario", system: "System") -> FaultsPlan | None:
    """The system's faults (checked: check), or None: no faults and no cross-traffic to
    sample the wire for."""
    check(scenario, system)
    if not scenario.faults and not scenario.cross_traffic:
        return None
    return FaultsPlan(faults=scenario.faults, sample_links=cross_links(scenario))
