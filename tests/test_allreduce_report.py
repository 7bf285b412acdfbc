"""The all-reduce report: each stage's measured all-reduce beside an ideal ring (pure)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_allreduce_report_against_the_ideal_ring() -> None:
    """The report takes, per iteration, the replica that arrived last (shortest span), and
    compares the median with 2 (D-1) chunks of 1/D at the host link's rate."""
    from testbed.analysis.allreduce import allreduce_report, ring_ms
    from testbed.plans.placement import Placement
    from testbed.spec.scenario import parse_scenario
    from testbed.spec.timescale import TimeScale
    from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE as WF
    sc = parse_scenario({"name": "ar", "dcs": [{"name": "ea", "hosts": 2, "rate_mbit": 1000},
                                               {"name": "we", "hosts": 2, "rate_mbit": 1000}],
                         "wan": [{"between": ["ea", "we"], "delay_ms": 10, "rate_mbit": 100}]})
    n = 1_000_000
    assert ring_ms(n, ["ea", "ea"], sc) == pytest.approx(2 * (n / 2 * WF * 8 / 1e6))
    assert ring_ms(n, ["ea", "we"], sc) == pytest.approx(2 * (n / 2 * WF * 8 / 1e5 + 10))
    pl = Placement(policy="atlas", stage_dcs=(("ea", "ea"),), hosts=(("ea-h1", "ea-h2"),))
    spans = [{"name": "ALLREDUCE", "stage": 0, "replica": rep, "iteration": it, "bytes": n,
              "t_start_ns": 0, "t_end_ns": int(ms * 1e6)}
             for it, (a, b) in enumerate([(30, 10), (50, 12), (20, 14), (90, 99)])
             for rep, ms in enumerate((a, b))]
    out = allreduce_report(spans, pl, sc, [0, 1, 2], time_scale=TimeScale(2.0))
    assert len(out) == 1 and out[0]["measured_ms"] == pytest.approx(12 / 2)
    assert out[0]["wire_ms"] == pytest.approx(ring_ms(n, ["ea", "ea"], sc))
    assert out[0]["ratio"] == pytest.approx(6 / out[0]["wire_ms"])
