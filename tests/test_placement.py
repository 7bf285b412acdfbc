"""Placement policies: scenario-order, atlas, dp-across-dcs, DC pins and host grids (pure)."""

from __future__ import annotations

import pytest

from testbed.spec.errors import ScenarioError
from testbed.plans.placement import from_hosts, place, place_for_system
from testbed.spec.scenario import parse_scenario
from testbed.spec.systems import SYSTEMS
from testbed.spec.training import TrainConfig

pytestmark = pytest.mark.unit


def scenario(*dcs: tuple[str, int]):
    """DCs in the given order, a full mesh of identical links."""
    names = [n for n, _ in dcs]
    wan = [{"between": [a, b], "delay_ms": 10, "rate_mbit": 100}
           for i, a in enumerate(names) for b in names[i + 1:]]
    return parse_scenario({"name": "t", "dcs": [{"name": n, "hosts": h} for n, h in dcs],
                           "wan": wan})


def config(stages: int, replicas: int, **over) -> TrainConfig:
    d = {"model": {"n_layer": 4, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": 256},
         "stages": stages, "replicas": replicas, "micro_batches": 4}
    d.update(over)
    return TrainConfig.from_dict(d)


def one_line_error(fn, field: str) -> str:
    with pytest.raises(ScenarioError) as err:
        fn()
    msg = str(err.value)
    assert err.value.field == field and msg.startswith(field + ":") and "\n" not in msg
    return msg


# --- scenario-order -------------------------------------------------------------------------

def test_scenario_order_fills_dc_by_dc():
    p = place(scenario(("east", 2), ("west", 2)), 2, 2, "scenario-order")
    assert p.hosts == (("east-h1", "east-h2"), ("west-h1", "west-h2"))
    assert p.stage_dcs == (("east", "east"), ("west", "west"))
    assert p.boundaries() == ((("east", "west"), ("east", "west")),)
    assert p.allreduce_across_wan() == (False, False)
    assert (p.policy, p.source) == ("scenario-order", "policy")


def test_scenario_order_splits_a_stage_when_counts_do_not_line_up():
    p = place(scenario(("east", 3), ("west", 3)), 2, 2, "scenario-order")
    assert p.hosts == (("east-h1", "east-h2"), ("east-h3", "west-h1"))
    assert p.stage_dcs[1] == ("east", "west")
    assert p.allreduce_across_wan() == (False, True)
    assert p.boundaries() == ((("east", "east"), ("east", "west")),)


def test_scenario_order_too_few_hosts():
    msg = one_line_error(lambda: place(scenario(("east", 2), ("west", 1)), 2, 2,
                                       "scenario-order"), "training.stages")
    assert "1 missing" in msg


# --- atlas ----------------------------------------------------------------------------------

def test_atlas_fills_largest_dc_first_with_whole_stages():
    p = place(scenario(("east", 2), ("west", 4)), 3, 2, "atlas")
    assert p.hosts == (("west-h1", "west-h2"), ("west-h3", "west-h4"), ("east-h1", "east-h2"))
    assert p.allreduce_across_wan() == (False, False, False)
    assert p.boundaries() == ((("west", "west"),) * 2, (("west", "east"),) * 2)


def test_atlas_never_splits_a_stage_where_scenario_order_does():
    sc = scenario(("east", 3), ("west", 3))
    p = place(sc, 2, 2, "atlas")
    assert p.stage_dcs == (("east", "east"), ("west", "west"))
    assert p.hosts == (("east-h1", "east-h2"), ("west-h1", "west-h2"))


def test_atlas_ties_keep_scenario_order():
    assert place(scenario(("east", 2), ("west", 2)), 2, 2, "atlas").stage_dcs == \
        (("east", "east"), ("west", "west"))
    assert place(scenario(("west", 2), ("east", 2)), 2, 2, "atlas").stage_dcs == \
        (("west", "west"), ("east", "east"))
    # three DCs, the two largest tie: scenario order among them, the small one last
    p = place(scenario(("asia", 1), ("west", 2), ("east", 2)), 2, 2, "atlas")
    assert p.stage_dcs == (("west", "west"), ("east", "east"))


def test_atlas_infeasible_names_the_count_and_the_dc():
    # east 4 -> 2 stages, west 3 -> 1 stage + 1 free host: the 4th stage needs 1 more in west
    msg = one_line_error(lambda: place(scenario(("east", 4), ("west", 3)), 4, 2, "atlas"),
                         "training.stages")
    assert "1 more host" in msg and "add 1 host to west" in msg


def test_atlas_infeasible_over_several_dcs():
    # 3 + 3 hosts hold 1 stage each with 1 host left in each: 2 stages missing, 2 hosts
    msg = one_line_error(lambda: place(scenario(("east", 3), ("west", 3)), 4, 2, "atlas"),
                         "training.stages")
    assert "2 more hosts" in msg
    assert "1 host to east" in msg and "1 host to west" in msg


def test_atlas_infeasible_with_no_spare_hosts():
    msg = one_line_error(lambda: place(scenario(("east", 2), ("west", 2)), 3, 2, "atlas"),
                         "training.stages")
    assert "2 more hosts" in msg and "add 2 hosts to east" in msg


# --- pins -----------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["atlas", "scenario-order"])
def test_pinned_dcs(policy):
    sc = scenario(("east", 4), ("west", 2))
    p = place(sc, 3, 2, policy, pinned=("east", "west", "east"))
    assert p.hosts == (("east-h1", "east-h2"), ("west-h1", "west-h2"), ("east-h3", "east-h4"))
    assert (p.policy, p.source) == (policy, "pinned-dcs")


def test_pinned_dcs_too_few_hosts():
    msg = one_line_error(lambda: place(scenario(("east", 4), ("west", 2)), 2, 2, "atlas",
                                       pinned=("west", "west")), "training.placement")
    assert "west" in msg and "2 missing" in msg and "add 2 hosts to west" in msg


def test_pinned_unknown_dc():
    msg = one_line_error(lambda: place(scenario(("east", 4), ("west", 2)), 2, 2, "atlas",
                                       pinned=("east", "mars")), "training.placement[1]")
    assert "'mars'" in msg and "east" in msg


def test_dc_pin_comes_from_the_config_and_round_trips():
    cfg = config(2, 2, placement=["west", "east"])
    assert cfg.placement is None and cfg.placement_dcs == ("west", "east")
    assert cfg.to_dict()["placement"] == ["west", "east"]
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    sc = scenario(("east", 2), ("west", 2))
    assert place_for_system(sc, cfg, SYSTEMS["atlas"]).stage_dcs == \
        (("west", "west"), ("east", "east"))
    assert place_for_system(sc, cfg, SYSTEMS["baseline"]).source == "pinned-dcs"
    # dp-across-dcs ignores a pin
    assert place_for_system(sc, cfg, SYSTEMS["dp-across-dcs"]).source == "policy"


def test_pinned_host_grid_is_used_by_every_system_but_dp_across_dcs():
    sc = scenario(("east", 2), ("west", 2))
    cfg = config(2, 2, placement=[["west-h2", "east-h1"], ["west-h1", "east-h2"]])
    assert cfg.placement_dcs is None
    for name in ("baseline", "multitcp", "temporal", "atlas"):
        p = place_for_system(sc, cfg, SYSTEMS[name])
        assert p.hosts == (("west-h2", "east-h1"), ("west-h1", "east-h2"))
        assert p.stage_dcs == (("west", "east"), ("west", "east"))
        assert p.source == "pinned-hosts"
    assert place_for_system(sc, cfg, SYSTEMS["dp-across-dcs"]).source == "policy"
    msg = one_line_error(lambda: from_hosts(sc, [["east-h1", "east-h9"]], "atlas"),
                         "training.placement[0][1]")
    assert "'east-h9'" in msg


# --- dp-across-dcs --------------------------------------------------------------------------

def test_dp_across_dcs_spreads_replicas():
    p = place(scenario(("east", 2), ("west", 2)), 2, 2, "dp-across-dcs")
    assert p.hosts == (("east-h1", "west-h1"), ("east-h2", "west-h2"))
    assert p.allreduce_across_wan() == (True, True)
    assert p.boundaries() == ((("east", "east"), ("west", "west")),)


def test_dp_across_dcs_round_robin_over_dcs_that_fit():
    sc = scenario(("east", 4), ("asia", 1), ("west", 2))
    p = place(sc, 2, 3, "dp-across-dcs")
    # r0 east, r1 west (asia cannot hold a pipeline of 2), r2 east again
    assert p.stage_dcs == (("east", "west", "east"), ("east", "west", "east"))
    assert p.hosts == (("east-h1", "west-h1", "east-h3"), ("east-h2", "west-h2", "east-h4"))


def test_dp_across_dcs_too_few_hosts():
    msg = one_line_error(lambda: place(scenario(("east", 4), ("west", 2)), 2, 4,
                                       "dp-across-dcs"), "training.replicas")
    assert "2 more hosts" in msg and "east" in msg


def test_dp_across_dcs_refuses_a_single_dc():
    msg = one_line_error(lambda: place(scenario(("east", 4), ("west", 1)), 2, 2,
                                       "dp-across-dcs"), "training.replicas")
    assert "only east" in msg and "add 1 host to west" in msg
