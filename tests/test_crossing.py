"""testbed.plans.crossing (issue 25 part 2): which WAN links cross servers for a placement, one VNI
per crossing link, the hosts' MTU inside VXLAN, and the underlay's RTT taken off a crossing
link's delay (refused, one line, where the underlay alone is longer)."""

from __future__ import annotations

import pytest

from testbed.plans.crossing import (VNI_BASE, Underlay, crossings, delay_after_underlay,
                                  host_mtu)
from testbed.spec.cluster import default_placement
from testbed.spec.errors import ScenarioError

pytestmark = pytest.mark.unit

WAN = [("eu", "us"), ("us", "asia"), ("eu", "asia")]


def test_default_placement_crosses_only_links_between_blocks():
    dc_server = default_placement(["eu", "us", "asia"], ["s1", "s2"])
    assert dc_server == {"eu": "s1", "us": "s1", "asia": "s2"}
    got = crossings(WAN, dc_server)
    assert [(c.name, c.server_a, c.server_b) for c in got] == [("us-asia", "s1", "s2"),
                                                               ("eu-asia", "s1", "s2")]


def test_one_vni_per_crossing_link_from_the_link_index():
    got = crossings(WAN, {"eu": "s1", "us": "s2", "asia": "s3"})
    assert [c.vni for c in got] == [VNI_BASE, VNI_BASE + 1, VNI_BASE + 2]
    assert len({c.vni for c in got}) == 3
    assert crossings(WAN, {"eu": "s1", "us": "s1", "asia": "s1"}) == []


def test_host_mtu_leaves_room_for_vxlan():
    assert host_mtu(1500) == 1450
    assert host_mtu(1550) == 1500
    assert host_mtu(9000) == 1500
    with pytest.raises(ScenarioError, match="underlay"):
        host_mtu(600)


def test_underlay_rtt_is_taken_off_half_per_direction():
    u = Underlay(rtt_ms=0.09, mdev_ms=0.01, min_ms=0.07, max_ms=0.12)
    assert delay_after_underlay("east-west", 20.0, u) == pytest.approx(19.955)


def test_underlay_longer_than_the_delay_is_one_line():
    u = Underlay(rtt_ms=3.0, mdev_ms=0.2, min_ms=2.8, max_ms=3.5)
    with pytest.raises(ScenarioError) as err:
        delay_after_underlay("east-west", 1.0, u)
    text = str(err.value)
    assert text.startswith("wan.east-west.delay_ms: 1 ms one way is less than the underlay's")
    assert "\n" not in text and "; " in text
