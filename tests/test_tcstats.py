"""testbed.emulation.tcstats: the raw netlink class counters equal pyroute2's reading of the same classes
(root: a namespace with an HTB tree and traffic through it); an interface that is not there
gives an empty dump, as pyroute2's does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.network
NS = "tcstats-t"

PROBE = """
import json, sys
from pyroute2 import IPRoute
from testbed.emulation import wanshare
from testbed.emulation.tcstats import ClassCounters
ipr = IPRoute()
idx = ipr.link_lookup(ifname="tv0")[0]
with ClassCounters() as c:
    raw = c.read(idx)
    slow = {m["handle"]: wanshare._stats_of(m) for m in ipr.get_classes(index=idx)}
    missing = [c.read(10 ** 6), list(ipr.get_classes(index=10 ** 6))]
print(json.dumps({"raw": sorted(raw.items()), "slow": sorted(slow.items()), "missing": missing}))
"""


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def test_raw_counters_equal_pyroute2s():
    import json
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "-n", NS, "link", "add", "tv0", "type", "veth", "peer", "name", "tv1")
        sh("ip", "-n", NS, "addr", "add", "10.77.0.1/24", "dev", "tv0")
        for intf in ("tv0", "tv1"):
            sh("ip", "-n", NS, "link", "set", intf, "up")
        sh("ip", "netns", "exec", NS, "tc", "qdisc", "add", "dev", "tv0", "root", "handle", "1:",
           "htb", "default", "20")
        for minor in ("1", "10", "20", "21"):
            sh("ip", "netns", "exec", NS, "tc", "class", "add", "dev", "tv0", "parent", "1:",
               "classid", f"1:{minor}", "htb", "rate", "10mbit")
        # some packets into class 1:20 (ARP for an address nobody has, then nothing answers)
        subprocess.run(["ip", "netns", "exec", NS, "ping", "-c", "3", "-i", "0.05", "-W", "1",
                        "10.77.0.2"], capture_output=True)
        out = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", PROBE], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["raw"] == doc["slow"] and len(doc["raw"]) == 4, doc
        assert any(c[0] > 0 and c[1] > 0 for _, c in doc["raw"]), doc      # something counted
        assert doc["missing"] == [{}, []], doc     # no such interface: an empty dump, as pyroute2
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
