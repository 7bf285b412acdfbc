"""The all-reduce's plan (testbed.plans.allreduce): a flat ring or hierarchical, the same plan in
the workers' specs, in the model's time and WAN bits, and in a run's link counts (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE as WF
from testbed.plans.allreduce import broadcast_rounds, hierarchy
from testbed.plans.placement import place_for_system
from testbed.spec.scenario import parse_scenario
from testbed.spec.systems import SYSTEMS
from testbed.spec.training import TrainConfig

pytestmark = pytest.mark.unit


def split(hosts_ea: int = 4, hosts_we: int = 2, replicas: int = 3, **top) -> dict:
    """Stage 1 of P = 2 on ea, we, we in scenario order (ea 4 hosts, we 2, D = 3)."""
    return {"name": "split", "scale": 100,
            "dcs": [{"name": "ea", "hosts": hosts_ea, "rate_mbit": 1000},
                    {"name": "we", "hosts": hosts_we, "rate_mbit": 1000}],
            "wan": [{"between": ["ea", "we"], "delay_ms": 20, "rate_mbit": 100}],
            "systems": ["baseline", "multitcp", "hierarchical"],
            "training": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16,
                                   "vocab_size": 64},
                         "stages": 2, "replicas": replicas, "micro_batches": 2,
                         "micro_batch_size": 2, "schedule": "1f1b", "iterations": 3,
                         "compute": "profile",
                         "profile": {"file": "h200-transformer.json", "width": 2048,
                                     "seq": 2048, "micro_batch": 2, "n_layer": 4}},
            **top}


def test_the_plan_groups_ranks_by_dc_and_takes_the_most_connections_of_a_hop():
    k = {("ea", "we"): 3, ("we", "ea"): 5, ("we", "as"): 2, ("as", "ea"): 1}
    h = hierarchy(["ea", "we", "we", "ea", "as"], lambda a, b: k[(a, b)])
    assert h.dcs == ("ea", "we", "as")
    assert h.groups == ((0, 3), (1, 2), (4,))
    assert h.leaders == (0, 1, 4) and h.connections == 3
    assert h.leader_ring() == [("ea", "we"), ("we", "as"), ("as", "ea")]
    assert h.group_of(2) == (1, 2)
    assert hierarchy(["ea", "ea", "ea"], lambda a, b: 9) is None     # one DC: a plain ring
    assert [broadcast_rounds(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [0, 1, 2, 2, 3, 3, 4]


def test_the_workers_get_the_plan_only_where_the_system_says_so():
    from testbed.plans.workers import HostInfo, WorkerSetup, plan_workers
    from testbed.spec.links import LinkDir
    cfg = TrainConfig.from_dict(split()["training"])
    hosts = [HostInfo(name=f"ea-h{i}", ip=f"10.0.0.{i}", dc="ea") for i in range(1, 5)] + \
            [HostInfo(name=f"we-h{i}", ip=f"10.0.1.{i}", dc="we") for i in range(1, 3)]
    conns = {LinkDir("ea", "we"): 4, LinkDir("we", "ea"): 4}
    ring = plan_workers(cfg, hosts, Path("/tmp/r"), WorkerSetup(connections=conns))
    assert all(s.allreduce_groups == () and s.allreduce_connections == 1 for s in ring)
    hier = plan_workers(cfg, hosts, Path("/tmp/r"),
                        WorkerSetup(connections=conns, allreduce="hierarchical"))
    by = {(s.stage, s.replica): s for s in hier}
    assert by[(0, 0)].allreduce_groups == ()                 # stage 0 is all in ea
    assert [by[(1, r)].allreduce_groups for r in range(3)] == [((0,), (1, 2))] * 3
    assert by[(1, 2)].allreduce_connections == 4
    again = type(by[(1, 1)]).from_dict(by[(1, 1)].to_dict())        # the spec file's trip
    assert again == by[(1, 1)]
    with pytest.raises(ValueError, match="allreduce"):
        WorkerSetup(allreduce="tree")


def test_the_model_times_the_leaders_ring_over_k_and_counts_its_bits():
    from testbed.predict.predict import allreduce_ms, build
    from testbed.predict.transfer import PathSpec, transfer_ms
    from testbed.plans.systems import connections_for
    sc = parse_scenario(split(tcp_slow_start_after_idle=False))
    cfg = TrainConfig.from_dict(sc.training)
    base, hier = (build(sc, cfg, SYSTEMS[n]) for n in ("baseline", "hierarchical"))
    buffer = 2_013_592
    k = connections_for(sc, SYSTEMS["hierarchical"], "ea", "we")
    assert k > 1
    h = hierarchy(["ea", "we", "we"], lambda a, b: k)
    # by hand: we's ring of 2 (2 steps of half the buffer at 1000 Mbit/s), the leaders' ring
    # of 2 DCs (2 steps of half the buffer over k connections), we's broadcast (1 round)
    host = buffer / 2 * WF * 8 / 1e6
    ch = PathSpec(rate_mbit=100, one_way_ms=20, rtt_ms=40,
                  window_bytes=hier.forward_routes[(0, 1)].channel.window_bytes, connections=k)
    across = 2 * transfer_ms(-(-buffer // 2), ch)
    want = 2 * host + across + buffer * WF * 8 / 1e6
    assert allreduce_ms(buffer, ("ea", "we", "we"), sc, h) == pytest.approx(want, rel=1e-9)
    assert hier.allreduce_ms[1] >= want - 1e-9
    assert hier.allreduce_ms[1] < base.allreduce_ms[1] / 3
    # WAN bits an iteration: the ring 4/3 of the buffer each way (ea->we and we->ea hops),
    # the leaders 2 (G-1)/G = 1 of it
    bits = buffer * WF * 8
    for d, v in base.allreduce_link_bits.items():
        assert v == pytest.approx(bits * 4 / 3), d
    for d, v in hier.allreduce_link_bits.items():
        assert v == pytest.approx(bits), d


def test_hierarchical_is_multitcp_where_no_stage_spans_dcs():
    from testbed.predict.predict import predict
    sc = parse_scenario(split(hosts_ea=3, hosts_we=3))
    cfg = TrainConfig.from_dict(sc.training)
    assert not any(place_for_system(sc, cfg, SYSTEMS["hierarchical"]).allreduce_across_wan())
    a, b = (predict(sc, cfg, SYSTEMS[n]) for n in ("multitcp", "hierarchical"))
    assert a.iteration_time_s == b.iteration_time_s and a.allreduce_ms == b.allreduce_ms


def test_a_runs_link_counts_follow_the_plan():
    from testbed.analysis.allreduce import hierarchical_ms, ring_ms
    from testbed.analysis.linkuse import link_bytes
    from testbed.plans.placement import Placement
    from testbed.spec.links import LinkDir
    sc = parse_scenario(split())
    pl = Placement(policy="scenario-order", stage_dcs=(("ea",) * 3, ("ea", "we", "we")),
                   hosts=(("ea-h1", "ea-h2", "ea-h3"), ("ea-h4", "we-h1", "we-h2")))
    n = 3_000_000
    spans = [{"name": "ALLREDUCE", "stage": s, "replica": r, "iteration": 1, "bytes": n}
             for s in (0, 1) for r in range(3)]
    ring = link_bytes(spans, pl, sc, [1])
    assert ring == {LinkDir("ea", "we"): pytest.approx(n * 4 / 3),
                    LinkDir("we", "ea"): pytest.approx(n * 4 / 3)}
    hier = link_bytes(spans, pl, sc, [1], "hierarchical")
    assert hier == {LinkDir("ea", "we"): pytest.approx(n), LinkDir("we", "ea"): pytest.approx(n)}
    # the ideal: we's ring, the leaders' ring (2 steps of half the buffer + the delay), we's
    # broadcast; a stage in one DC is the ring's
    host = n / 2 * WF * 8 / 1e6
    want = 2 * host + 2 * (n / 2 * WF * 8 / 1e5 + 20) + n * WF * 8 / 1e6
    assert hierarchical_ms(n, ["ea", "we", "we"], sc) == pytest.approx(want)
    assert hierarchical_ms(n, ["ea"] * 3, sc) == ring_ms(n, ["ea"] * 3, sc)


def test_plan_says_how_each_system_all_reduces_over_the_wan(tmp_path):
    import yaml
    from testbed.cli.planview import plan_command
    path = tmp_path / "split.yaml"
    path.write_text(yaml.safe_dump(split()))
    lines = plan_command(str(path), ["baseline", "hierarchical"]).splitlines()
    assert "  all-reduce over the WAN: stage 1 (ea, we) (a flat ring, one connection a hop)" in lines
    assert any(line.startswith("hierarchical: ") and line.endswith("all-reduce hierarchical")
               for line in lines)
    assert ("  all-reduce over the WAN: stage 1 (ea, we) (hierarchical: each DC's ring, one "
            "leader per DC across with the system's K, a broadcast inside)") in lines
