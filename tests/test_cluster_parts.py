"""Pure parts of `calibrate --cluster` (issue 25 part 2): the tc commands that shape a node
reached only through its shell (the same tree as shaping.apply, netem leaf included), tc's printed rate read back,
a VXLAN device's UNKNOWN operstate read as up when it has carrier, and ping's summary as the
underlay's figures."""

from __future__ import annotations

import pytest

from testbed.emulation import shaping
from testbed.emulation.clusternet import ClusterNetwork
from testbed.emulation.servers import parse_underlay

pytestmark = pytest.mark.unit


def test_tc_commands_build_the_shaping_tree():
    got = [shaping.tc_command(op) for op in shaping.plan_link("gw-eth1", 100, 150000)]
    assert got == [
        "tc qdisc add dev gw-eth1 root handle 1: htb default 10 r2q 208",
        "tc class add dev gw-eth1 parent 1: classid 1:10 htb rate 100000000bit "
        "ceil 100000000bit burst 12500 cburst 12500 quantum 60000",
        "tc qdisc add dev gw-eth1 parent 1:10 handle 10: bfifo limit 150000"]
    leaf = shaping.plan_link("x", 20, 150000, netem={"delay_ms": 9.97, "jitter_ms": 2,
                                                      "loss_pct": 1})[2]
    assert shaping.tc_command(leaf) == ("tc qdisc add dev x parent 1:10 handle 10: netem limit "
                                        "1000 delay 9970us 2000us loss 1%")
    bare = shaping.plan_link("x", 20, 3_000_000, netem={"delay_ms": 5})[2]
    assert shaping.tc_command(bare) == ("tc qdisc add dev x parent 1:10 handle 10: netem limit "
                                        "2000 delay 5000us")
    with pytest.raises(ValueError, match="no tc command for fq"):
        shaping.tc_command(shaping.TcOp(command="add", kind="fq", intf="x", handle=1, params={}))


def test_tc_rate_read_back():
    text = "class htb 1:10 root leaf 10: prio 0 rate 33333Kbit ceil 33333Kbit burst 12500b"
    assert shaping.parse_tc_rate_bps(text) == 33_333_000
    assert shaping.parse_tc_rate_bps("class htb 1:10 rate 2500bit") == 2500
    assert shaping.parse_tc_rate_bps("nothing") is None


class _Node:
    def __init__(self, out: str) -> None:
        self.out = out

    def cmd(self, _text: str) -> str:
        return self.out


def test_link_states_take_a_vxlan_with_carrier_as_up():
    out = ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode\\ x\n"
           "2: gw-eth0@if7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue state UP\n"
           "3: gw-eth1: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc htb state UNKNOWN\n"
           "4: gw-eth2: <BROADCAST,MULTICAST,UP> mtu 1450 qdisc htb state UNKNOWN\n")
    net = ClusterNetwork.__new__(ClusterNetwork)
    net.node = lambda name: _Node(out)
    assert net._link_states("gw") == {"lo": "UP", "gw-eth0": "UP", "gw-eth1": "UP",
                                      "gw-eth2": "UNKNOWN"}


def test_underlay_from_ping_summary():
    u = parse_underlay("20 packets transmitted, 20 received, 0% packet loss, time 970ms\n"
                       "rtt min/avg/max/mdev = 0.056/0.070/0.102/0.010 ms\n")
    assert (u.rtt_ms, u.mdev_ms, u.min_ms, u.max_ms) == (0.07, 0.01, 0.056, 0.102)
