"""The two encodings of one shaping tree give the same kernel state: shaping.apply (pyroute2,
for a node in this machine's namespaces) and shaping.tc_command (a `tc` command line, for a node
reached only through its shell on another server). Both build the tree on the two ends of one
veth pair in a namespace made here, and `tc -d` prints each back from the kernel. The netem leaf's
case needs a kernel with netem (the stock-kernel ring runs it; here it skips, saying so)."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from pyroute2 import NetNS

from testbed.emulation import shaping

pytestmark = pytest.mark.network


@pytest.fixture
def veth():
    ns = f"geodc-tc{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "ta", "type", "veth", "peer", "name", "tb"],
                       check=True)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)


def kernel_tree(ns: str, dev: str) -> str:
    """Qdiscs and classes on dev as `tc -d` prints them, with the device's name taken out."""
    out = "".join(subprocess.run(["ip", "netns", "exec", ns, "tc", "-d", what, "show", "dev", dev],
                                 capture_output=True, text=True, check=True).stdout
                  for what in ("qdisc", "class"))
    return re.sub(rf"\b{dev}\b", "DEV", out)


@pytest.mark.parametrize("rate_mbit, queue_bytes", [(100, 150_000), (2.5, 9_000), (10_000, 4_000_000)],
                         ids=["100mbit", "2.5mbit", "10gbit"])
def test_tc_commands_give_the_tree_apply_gives(veth, rate_mbit, queue_bytes):
    with NetNS(veth) as ipr:
        shaping.apply(ipr, shaping.plan_link("ta", rate_mbit, queue_bytes))
        by_netlink = shaping.read_back(ipr, "ta")
        commands = " && ".join(shaping.tc_command(op)
                               for op in shaping.plan_link("tb", rate_mbit, queue_bytes))
        subprocess.run(["ip", "netns", "exec", veth, "sh", "-c", commands], check=True)
        by_shell = shaping.read_back(ipr, "tb")
    assert by_netlink == by_shell == {"rate_bps": int(rate_mbit * 1e6), "leaf": "bfifo",
                                      "limit": queue_bytes}
    a, b = kernel_tree(veth, "ta"), kernel_tree(veth, "tb")
    assert "htb" in a and "bfifo" in a and "quantum 60000" in a, a
    assert a == b, f"pyroute2:\n{a}\ntc:\n{b}"


@pytest.mark.parametrize("netem", [{"delay_ms": 9.97, "jitter_ms": 2, "loss_pct": 1},
                                   {"delay_ms": 20}], ids=["jitter-loss", "delay"])
def test_tc_commands_give_the_netem_leaf_apply_gives(veth, netem):
    from testbed.emulation.network import kernel_has_netem
    if not kernel_has_netem():
        pytest.skip("this kernel lacks netem (make test-stock-kernel boots one that has it)")
    with NetNS(veth) as ipr:
        shaping.apply(ipr, shaping.plan_link("ta", 20, 150_000, netem=netem))
        by_netlink = shaping.read_back(ipr, "ta")
        commands = " && ".join(shaping.tc_command(op)
                               for op in shaping.plan_link("tb", 20, 150_000, netem=netem))
        subprocess.run(["ip", "netns", "exec", veth, "sh", "-c", commands], check=True)
        by_shell = shaping.read_back(ipr, "tb")
    assert by_netlink == by_shell == {
        "rate_bps": 20_000_000, "leaf": "netem", "limit": 1000,
        "delay_us": round(netem["delay_ms"] * 1000), "jitter_us": round(netem.get("jitter_ms", 0) * 1000),
        "loss_pct": netem.get("loss_pct", 0)}, (by_netlink, by_shell)
    a, b = kernel_tree(veth, "ta"), kernel_tree(veth, "tb")
    assert "netem" in a and a == b, f"pyroute2:\n{a}\ntc:\n{b}"
