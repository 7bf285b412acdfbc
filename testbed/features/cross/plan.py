"""Cross-traffic's plan for one system, with no network: the scenario's tenants' flows
(testbed.spec.cross) and the congestion control a TCP tenant runs without its own. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from testbed.spec.cross import CrossFlow

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario


@dataclass(frozen=True, kw_only=True, slots=True)
class CrossPlan:
    name: ClassVar[str] = "cross"
    flows: tuple[CrossFlow, ...]
    congestion_control: str | None     # the scenario's (a TCP flow's own goes first)

    def to_dict(self) -> dict:
        return {"flows": [f.describe() for f in self.flows],
                "congestion_control": self.congestion_control}


def plan(scenario: "Scenario") -> CrossPlan | None:
    """The scenario's cross-traffic, or None: it has none."""
    if not scenario.cross_traffic:
        return None
    return CrossPlan(flows=scenario.cross_traffic,
                     congestion_control=scenario.congestion_control)
