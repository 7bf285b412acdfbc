"""The `cross_traffic:` section (testbed.spec.cross): parsed and checked, a UDP rate trace cut into
back-to-back segments, and a tenant host <dc>-x1 in each DC that sends or receives it. Pure."""

from __future__ import annotations

import pytest

from testbed.spec.errors import ScenarioError
from testbed.spec.scenario import parse_scenario
from testbed.plans.topo import make_plan

pytestmark = pytest.mark.unit

BASE = {"name": "x",
        "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}, {"name": "c", "hosts": 1}],
        "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100},
                {"between": ["b", "c"], "delay_ms": 10, "rate_mbit": 100}]}


def cross(*items):
    return parse_scenario(dict(BASE, cross_traffic=list(items)))


def test_entries_parse_and_a_trace_is_segments():
    sc = cross({"from": "a", "to": "b", "kind": "tcp", "flows": 3, "congestion_control": "bbr",
                "start_s": 1, "stop_s": 5},
               {"from": "b", "to": "a", "kind": "udp", "start_s": 2, "stop_s": 9,
                "rate_trace": [[0, 10], [3, 40]]},
               {"from": "b", "to": "a", "kind": "udp", "rate_mbit": 5, "stop_s": 4})
    tcp, trace, udp = sc.cross_traffic
    assert (tcp.flows, tcp.congestion_control, tcp.start_s, tcp.stop_s) == (3, "bbr", 1, 5)
    assert [(s.start_s, s.stop_s, s.rate_mbit) for s in trace.segments] == [(2, 5, 10), (5, 9, 40)]
    assert [(s.start_s, s.stop_s, s.rate_mbit) for s in udp.segments] == [(0, 4, 5)]
    assert tcp.describe() == "cross_traffic[0] (a->b tcp x3 bbr, 1-5 s)"
    assert trace.describe() == "cross_traffic[1] (b->a udp 10/40 Mbit/s, 2-9 s)"


def test_tenant_hosts_only_where_cross_traffic_runs():
    sc = cross({"from": "a", "to": "b", "kind": "tcp", "stop_s": 5})
    plan = make_plan(sc.emulated())
    tenants = [(h.name, h.ip, h.role) for h in plan.hosts if h.role == "tenant"]
    assert tenants == [("a-x1", "10.1.0.201", "tenant"), ("b-x1", "10.2.0.201", "tenant")]
    assert "b-s-eth3" in plan.bridge_ports("b")       # gateway, one trainer, the tenant
    assert len(plan.bridge_ports("c")) == 2
    assert [h.name for h in make_plan(parse_scenario(BASE).emulated()).hosts] == ["a-h1", "b-h1", "c-h1"]


@pytest.mark.parametrize("item, field, fix", [
    ({"from": "a", "to": "b", "kind": "icmp", "stop_s": 1}, "cross_traffic[0].kind", "tcp or udp"),
    ({"from": "a", "to": "c", "kind": "tcp", "stop_s": 1}, "cross_traffic[0].to", "a WAN link"),
    ({"from": "z", "to": "b", "kind": "tcp", "stop_s": 1}, "cross_traffic[0].from", "use one of"),
    ({"from": "a", "to": "b", "kind": "tcp"}, "cross_traffic[0].stop_s", "say when"),
    ({"from": "a", "to": "b", "kind": "tcp", "start_s": 3, "stop_s": 3}, "cross_traffic[0].stop_s",
     "stop_s > start_s"),
    ({"from": "a", "to": "b", "kind": "tcp", "flows": 0, "stop_s": 1}, "cross_traffic[0].flows",
     "1 to 64"),
    ({"from": "a", "to": "b", "kind": "tcp", "congestion_control": "vegas", "stop_s": 1},
     "cross_traffic[0].congestion_control", "cubic"),
    ({"from": "a", "to": "b", "kind": "tcp", "rate_mbit": 5, "stop_s": 1},
     "cross_traffic[0].rate_mbit", "congestion_control, flows"),
    ({"from": "a", "to": "b", "kind": "udp", "stop_s": 1}, "cross_traffic[0].rate_mbit", "one of"),
    ({"from": "a", "to": "b", "kind": "udp", "stop_s": 1, "rate_mbit": 5, "rate_trace": [[0, 1]]},
     "cross_traffic[0].rate_mbit", "one of"),
    ({"from": "a", "to": "b", "kind": "udp", "stop_s": 9, "rate_trace": [[1, 5]]},
     "cross_traffic[0].rate_trace[0][0]", "from 0 s"),
    ({"from": "a", "to": "b", "kind": "udp", "stop_s": 2, "rate_trace": [[0, 5], [3, 5]]},
     "cross_traffic[0].rate_trace[1][0]", "before stop_s"),
    ({"from": "a", "to": "b", "kind": "udp", "stop_s": 2, "rate_mbit": -1},
     "cross_traffic[0].rate_mbit", "use a number"),
    (["a", "b"], "cross_traffic[0]", "write from"),
])
def test_bad_cross_traffic_names_the_field_and_the_fix(item, field, fix):
    with pytest.raises(ScenarioError) as err:
        cross(item)
    assert err.value.field == field and fix in str(err.value), str(err.value)
