"""Routes are computed once per network (testbed.plans.routing.dc_paths / path_table): planning a
large scenario asks for a pair's path thousands of times (issue 23: `show` on 50 DCs never
finished, `plan` took 56 s). The cached answer must be the uncached one, and a different
network (delays, links, routing policy, time_scale's dilated delays) must get its own."""

from __future__ import annotations

import pytest

from testbed.plans.routing import dc_paths, edges_of, path_table, paths
from testbed.plans.systems import path_between
from testbed.spec.scenario import parse_scenario

pytestmark = pytest.mark.unit


def ring(n: int, delay_ms: float = 10.0, routing: str = "shortest-delay", **extra) -> dict:
    dcs = [{"name": f"d{i}", "hosts": 1} for i in range(n)]
    wan = [{"between": [f"d{i}", f"d{(i + 1) % n}"], "delay_ms": delay_ms * (1 + i % 3),
            "rate_mbit": 100} for i in range(n)]
    return {"name": "ring", "dcs": dcs, "wan": wan, "routing": routing, **extra}


def test_cached_paths_are_the_computed_ones_and_shared_between_equal_networks() -> None:
    sc = parse_scenario(ring(12))
    fresh = paths([dc.name for dc in sc.dcs], edges_of(sc), sc.routing)
    assert dc_paths(sc) == fresh
    assert dict(path_table(sc)) == {(p.src, p.dst): p for p in fresh}
    again = parse_scenario(ring(12))            # another object, the same network
    assert path_table(again) is path_table(sc)
    assert path_between(again, "d0", "d6") == next(p for p in fresh if (p.src, p.dst) == ("d0", "d6"))
    listed = dc_paths(sc)
    listed.clear()                              # a caller's list is its own
    assert dc_paths(sc) == fresh
    with pytest.raises(TypeError):
        path_table(sc)[("d0", "d1")] = fresh[0]  # the shared table cannot be changed


@pytest.mark.parametrize("change", [
    {"routing": "direct"},
    {"delay": 20.0},
    {"time_scale": 4},
])
def test_a_different_network_gets_its_own_routes(change: dict) -> None:
    base = parse_scenario(ring(9))
    doc = ring(9, delay_ms=change.get("delay", 10.0), routing=change.get("routing", "shortest-delay"))
    if "time_scale" in change:
        other = parse_scenario(dict(doc, time_scale=change["time_scale"])).emulated()
    else:
        other = parse_scenario(doc)
    assert path_table(other) is not path_table(base)
    assert dc_paths(other) == paths([dc.name for dc in other.dcs], edges_of(other), other.routing)
