"""The WAN slot plan: slot lengths by hand, round-robin order, window limit, gating (pure)."""

from __future__ import annotations

import json

import pytest

from testbed.plans.placement import place, place_for_system
from testbed.spec.scenario import load_scenario, parse_scenario
from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE, plan_slots
from testbed.plans.systems import window_bytes
from testbed.spec.systems import SYSTEMS
from testbed.spec.training import TrainConfig

pytestmark = pytest.mark.unit

WINDOW_100 = 62914 * 0.73     # bytes one connection advertises at scale 100


def two_dc(hosts: int = 2, **top):
    return parse_scenario({"name": "t", "scale": 100,
                           "dcs": [{"name": "east", "hosts": hosts},
                                   {"name": "west", "hosts": hosts}],
                           "wan": [{"between": ["east", "west"], "delay_ms": 20,
                                    "rate_mbit": 100}], **top})


def measured(stages=2, replicas=2, micro_batches=3, schedule="gpipe",
             n_embd=64) -> TrainConfig:
    # one activation: micro_batch_size 2 x seq_len 32 x n_embd 64 x 4 B = 16384 B
    return TrainConfig.from_dict({
        "model": {"n_layer": 4, "n_embd": n_embd, "n_head": 4, "seq_len": 32, "vocab_size": 256},
        "stages": stages, "replicas": replicas, "micro_batches": micro_batches,
        "micro_batch_size": 2, "schedule": schedule})


def link(plan, src, dst):
    return next(lk for lk in plan.links if (lk.src_dc, lk.dst_dc) == (src, dst))


def test_wire_overhead_constant():
    assert WIRE_BYTES_PER_PAYLOAD_BYTE == 1514 / 1448
    assert window_bytes(100) == pytest.approx(WINDOW_100)


def test_window_limited_slot_by_hand():
    sc, cfg = two_dc(), measured()
    pl = place(sc, 2, 2, "scenario-order")
    plan = plan_slots(sc, cfg, pl, SYSTEMS["temporal"])          # K = 1
    fwd = link(plan, "east", "west")
    (c,) = fwd.crossings
    assert (c.kind, c.boundary, c.pipelines, c.connections) == ("activation", 0, (0, 1), 1)
    assert c.payload_bytes == 16384 and c.wire_bytes == round(16384 * 1514 / 1448) == 17131
    assert c.rtt_ms == 40 and c.window_limited
    # one window per RTT: 16384 B / 45 927 B x 40 ms = 14.27 ms (payload against payload window)
    assert c.slot_ms == pytest.approx(16384 / WINDOW_100 * 40, rel=1e-4)
    assert c.slot_ms == pytest.approx(14.270, abs=1e-3)
    assert c.slots_per_iteration == 2 * 3
    assert c.stagger_ms == pytest.approx((0.0, c.slot_ms))
    (g,) = link(plan, "west", "east").crossings
    assert (g.kind, g.src_dc, g.dst_dc) == ("gradient", "west", "east")


def test_rate_limited_slot_by_hand():
    sc = two_dc(connections=16)
    plan = plan_slots(sc, measured(n_embd=256), place(sc, 2, 2, "atlas"), SYSTEMS["atlas"])
    (c,) = link(plan, "east", "west").crossings
    # 65536 B: 16 stripes of 4 KiB (testbed.rules.stripes), so all 16 connections carry it
    assert c.connections == 16 and not c.window_limited
    # 16 windows / 40 ms = 153.7 Mbit/s > 100 Mbit/s: 68523 B x 8 / 100 Mbit/s = 5.48 ms
    assert c.wire_bytes == round(65536 * 1514 / 1448) == 68523
    assert c.slot_ms == pytest.approx(68523 * 8 / 100e3)
    assert c.window_limit_mbit == pytest.approx(16 * WINDOW_100 * 1514 / 1448 * 8 / 0.040 / 1e6)


def test_a_small_message_uses_only_the_connections_its_stripes_fill():
    sc = two_dc(connections=16)
    plan = plan_slots(sc, measured(), place(sc, 2, 2, "atlas"), SYSTEMS["atlas"])
    (c,) = link(plan, "east", "west").crossings
    assert c.payload_bytes == 16384 and c.connections == 4    # 16384 // 4096 stripes


def test_order_is_round_robin_over_pipelines_micro_batch_by_micro_batch():
    sc = two_dc(hosts=3)
    plan = plan_slots(sc, measured(replicas=3), place(sc, 2, 3, "scenario-order"),
                      SYSTEMS["temporal"])
    fwd = link(plan, "east", "west")
    assert [(s.micro_batch, s.pipeline) for s in fwd.order] == \
        [(m, p) for m in range(3) for p in range(3)]
    assert fwd.slots_per_iteration == len(fwd.order) == 9
    assert fwd.busy_ms == pytest.approx(9 * fwd.crossings[0].slot_ms)
    assert fwd.busy_fraction is None and plan.iteration_ms is None      # measured mode
    assert [s.label for s in fwd.order[:2]] == ["A0.m0.p0", "A0.m0.p1"]


def test_order_follows_the_schedule_across_boundaries():
    # stages east, west, east: east->west carries boundary 0's activations and boundary 1's
    # gradients (stage 2 in east back to stage 1 in west); GPipe does every forward first
    sc = two_dc()
    pl = place(sc, 3, 1, "atlas", pinned=("east", "west", "east"))
    plan = plan_slots(sc, measured(stages=3, replicas=1, micro_batches=2), pl,
                      SYSTEMS["atlas"])
    fwd = link(plan, "east", "west")
    assert [(c.kind, c.boundary) for c in fwd.crossings] == [("activation", 0), ("gradient", 1)]
    assert [s.label for s in fwd.order] == ["A0.m0.p0", "A0.m1.p0", "G1.m0.p0", "G1.m1.p0"]


def test_concurrent_systems_get_the_links_but_no_slots():
    sc = two_dc()
    pl = place(sc, 2, 2, "scenario-order")
    plan = plan_slots(sc, measured(), pl, SYSTEMS["baseline"])
    fwd = link(plan, "east", "west")
    assert plan.sharing == fwd.sharing == "concurrent" and fwd.order == ()
    assert fwd.crossings[0].pipelines == (0, 1)
    assert any("concurrent" in line for line in plan.summary_lines())


def test_no_wan_crossings_for_dp_across_dcs():
    sc = two_dc()
    plan = plan_slots(sc, measured(), place(sc, 2, 2, "dp-across-dcs"),
                      SYSTEMS["dp-across-dcs"])
    assert plan.used_links() == ()
    assert "no stage boundary crosses the WAN" in "\n".join(plan.summary_lines())


def test_multi_hop_transfer_is_gated_on_its_first_link():
    sc = parse_scenario({"name": "t", "scale": 100,
                         "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2},
                                 {"name": "c", "hosts": 2}],
                         "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100},
                                 {"between": ["b", "c"], "delay_ms": 10, "rate_mbit": 50}]})
    pl = place(sc, 2, 2, "atlas", pinned=("a", "c"))
    plan = plan_slots(sc, measured(n_embd=256), pl, SYSTEMS["atlas"])
    (c,) = link(plan, "a", "b").crossings
    assert c.path == ("a", "b", "c") and c.dst_dc == "c"
    assert c.path_rate_mbit == 50 and c.rtt_ms == 40 and c.connections == 6
    assert link(plan, "b", "c").crossings == ()
    assert link(plan, "c", "b").crossings[0].kind == "gradient"


def test_profile_mode_bytes_and_busy_fraction():
    sc = load_scenario("topologies/two_dc.yaml")
    cfg = TrainConfig.from_dict(sc.training)
    plan = plan_slots(sc, cfg, place_for_system(sc, cfg, SYSTEMS["atlas"]), SYSTEMS["atlas"])
    fwd = link(plan, "east", "west")
    (c,) = fwd.crossings
    assert c.payload_bytes == 335544              # the profile's 33.5 MB activation / scale 100
    assert plan.iteration_ms and plan.iteration_ms > 0
    assert fwd.busy_fraction == pytest.approx(fwd.busy_ms / plan.iteration_ms)
    doc = json.loads(json.dumps(plan.to_dict()))
    assert doc["links"][0]["crossings"][0]["slot_ms"] == pytest.approx(c.slot_ms)
    assert any("order:" in line for line in plan.summary_lines())
