"""Systems as data and the K-connections rule (pure, no root)."""

from __future__ import annotations

import math

import pytest

from testbed.spec import scenario as scenario_mod
from testbed.spec.errors import ScenarioError
from testbed.spec.scenario import RCV_WINDOW_FRACTION, parse_scenario, scaled_tcp_rmem_max_bytes
from testbed.plans.systems import auto_connections, connections_for, path_rate_mbit, path_rtt_ms, window_bytes
from testbed.spec.systems import SYSTEMS, System, get_system

pytestmark = pytest.mark.unit


def two(delay_ms: float = 20, rate_mbit: float = 100, **top) -> dict:
    return {"name": "t", "scale": 100,
            "dcs": [{"name": "east", "hosts": 2}, {"name": "west", "hosts": 2}],
            "wan": [{"between": ["east", "west"], "delay_ms": delay_ms, "rate_mbit": rate_mbit}],
            **top}


def test_the_systems_table():
    assert SYSTEMS == {
        "baseline": System(name="baseline", placement="scenario-order", connections="one",
                           wan_sharing="concurrent"),
        "multitcp": System(name="multitcp", placement="scenario-order", connections="scenario",
                           wan_sharing="concurrent"),
        "temporal": System(name="temporal", placement="scenario-order", connections="one",
                           wan_sharing="temporal"),
        "atlas": System(name="atlas", placement="atlas", connections="scenario",
                        wan_sharing="temporal"),
        "atlas-concurrent": System(name="atlas-concurrent", placement="atlas",
                                   connections="scenario", wan_sharing="concurrent"),
        "dp-across-dcs": System(name="dp-across-dcs", placement="dp-across-dcs",
                                connections="one", wan_sharing="concurrent"),
        "hierarchical": System(name="hierarchical", placement="scenario-order",
                               connections="scenario", wan_sharing="concurrent",
                               allreduce="hierarchical"),
    }
    assert {s.allreduce for n, s in SYSTEMS.items() if n != "hierarchical"} == {"ring"}
    assert not any(s.fill_bubbles for s in SYSTEMS.values())
    # every system is a name the scenario parser accepts, also with +bubbletea
    assert set(SYSTEMS) == set(scenario_mod.SYSTEMS)
    assert all(scenario_mod.is_system_name(n + "+bubbletea") for n in SYSTEMS)
    assert not scenario_mod.is_system_name("bubbletea")
    sc = parse_scenario(two(systems=list(SYSTEMS)))
    assert sc.systems == tuple(SYSTEMS)


def test_get_system_names_the_choices():
    assert get_system("atlas", "systems[0]") is SYSTEMS["atlas"]
    with pytest.raises(ScenarioError) as err:
        get_system("zeus", "systems[2]")
    assert err.value.field == "systems[2]"
    msg = str(err.value)
    assert "'zeus'" in msg and "\n" not in msg
    assert all(name in msg for name in SYSTEMS)


def test_bubbletea_variant_is_the_same_choices_with_fill_bubbles():
    for name, base in SYSTEMS.items():
        s = get_system(name + "+bubbletea")
        assert s.fill_bubbles and s.name == name + "+bubbletea" and s.without_bubbles == name
        assert (s.placement, s.connections, s.wan_sharing) == \
            (base.placement, base.connections, base.wan_sharing)
    with pytest.raises(ScenarioError):
        get_system("zeus+bubbletea")


def test_window_is_the_scaled_receive_buffer_share():
    assert scaled_tcp_rmem_max_bytes(1) == 6291456
    assert scaled_tcp_rmem_max_bytes(100) == 62914
    assert scaled_tcp_rmem_max_bytes(1e6) == 4096          # floor
    assert window_bytes(100) == pytest.approx(62914 * RCV_WINDOW_FRACTION)   # ~45.9 KB


def test_auto_k_arithmetic_and_clamps():
    w = window_bytes(100)                                   # 45927.2 B
    # 100 Mbit/s x 40 ms = 500 000 B in flight; 500 000 / 45 927 = 10.9 -> 11
    assert auto_connections(100, 40, w) == 11 == math.ceil(100e6 / 8 * 0.040 / w)
    assert auto_connections(10000, 200, w) == 16            # clamped at 16
    assert auto_connections(1, 1, w) == 1                   # at least 1
    assert auto_connections(0.01, 0, w) == 1
    # an exact multiple of the window needs exactly that many (no float round-up)
    # 0.24 Mbit/s x 100 ms = 3000 B = 1 window; 0.48 -> 2 windows; 0.49 -> just over 2
    assert auto_connections(0.24, 100, 3000) == 1
    assert auto_connections(0.48, 100, 3000) == 2
    assert auto_connections(0.49, 100, 3000) == 3


def test_auto_k_on_a_scenario_path():
    sc = parse_scenario(two())                              # RTT 40 ms, 100 Mbit/s, scale 100
    assert sc.connections == "auto"
    assert path_rtt_ms(sc, "east", "west") == 40
    assert connections_for(sc, SYSTEMS["atlas"], "east", "west") == 11
    assert connections_for(sc, SYSTEMS["multitcp"], "west", "east") == 11
    # time dilation leaves rate x RTT, so K, unchanged
    assert connections_for(parse_scenario(two(time_scale=10)), SYSTEMS["atlas"],
                           "east", "west") == 11


def test_auto_k_over_a_multi_hop_path_uses_the_bottleneck():
    sc = parse_scenario({"name": "t", "scale": 100,
                         "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1},
                                 {"name": "c", "hosts": 1}],
                         "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100},
                                 {"between": ["b", "c"], "delay_ms": 10, "rate_mbit": 50}]})
    assert path_rtt_ms(sc, "a", "c") == 40 and path_rate_mbit(sc, "a", "c") == 50
    # 50 Mbit/s x 40 ms = 250 000 B / 45 927 = 5.4 -> 6
    assert connections_for(sc, SYSTEMS["atlas"], "a", "c") == 6


def test_configured_k_intra_dc_and_one_connection_systems():
    sc = parse_scenario(two(connections=3))
    assert sc.connections == 3
    assert connections_for(sc, SYSTEMS["multitcp"], "east", "west") == 3
    assert connections_for(sc, SYSTEMS["atlas"], "west", "east") == 3
    assert connections_for(sc, SYSTEMS["atlas"], "east", "east") == 1      # intra-DC
    for name in ("baseline", "temporal", "dp-across-dcs"):
        assert connections_for(sc, SYSTEMS[name], "east", "west") == 1


@pytest.mark.parametrize("bad", [0, 17, "many", True, 2.5, None])
def test_bad_connections_field(bad):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(two(connections=bad))
    assert err.value.field == "connections"
    assert "auto" in str(err.value) and "16" in str(err.value)
