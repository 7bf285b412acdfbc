"""The summed burst of a WAN link direction: the bytes its queue must hold when every pipeline
that crosses it sends its message at once.

One job: that figure from a system's slot plan (testbed.features.temporal.plan). A message puts
on the wire in its first round trip its whole payload when it fits the K connections' windows,
else K windows; a crossing sends that for each of its pipelines, and the crossings gated on the
direction (those whose routed path starts there) add up. In wire bytes (headers included, as
HTB and the queue count them). Transit crossings of multi-hop paths are not counted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE

if TYPE_CHECKING:
    from testbed.features.temporal.plan import SlotPlan
    from testbed.spec.links import LinkDir


def first_round_bytes(payload_bytes: int, connections: int, window_bytes: float) -> int:
    """Wire bytes one message sends in its first round trip over `connections` windows."""
    return round(min(payload_bytes, connections * window_bytes) * WIRE_BYTES_PER_PAYLOAD_BYTE)


def summed_burst_bytes(plan: "SlotPlan") -> dict["LinkDir", int]:
    """Per used link direction, every pipeline's first round of one message, summed."""
    return {link.direction: sum(len(c.pipelines) * first_round_bytes(
                c.payload_bytes, c.connections, plan.window_bytes) for c in link.crossings)
            for link in plan.used_links()}
