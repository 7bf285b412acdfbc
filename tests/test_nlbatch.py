"""testbed.emulation.nlbatch: a switch sent as bytes encoded once (wanshare.switch_message over a raw
netlink socket) leaves the kernel's HTB classes exactly as pyroute2's activate() does, and a
request the kernel refuses raises OSError naming it (root: a namespace with the temporal tree).
Also pure: a message that is not whole or asks for no ACK is refused before anything is sent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.emulation.nlbatch import RequestBatch

REPO = Path(__file__).resolve().parent.parent
NS = "nlbatch-t"

PROBE = """
import json
from pyroute2 import IPRoute
from testbed.emulation import wanshare
from testbed.emulation.nlbatch import RequestBatch
ipr = IPRoute()
layout = wanshare.apply_temporal(ipr, "tv0", 100, 100000, {0: ["10.77.0.1"], 1: ["10.77.0.3"],
                                                          2: ["10.77.0.4"]}, active=0)
def rates():
    return {d: v["rate_bps"] for d, v in wanshare.read_back(ipr, "tv0")["pipelines"].items()}
out = {"start": rates()}
with RequestBatch() as batch:
    took = [wanshare.activate(ipr, "tv0", 2, layout=layout, batch=batch)]
    out["raw"] = rates()
    wanshare.activate(ipr, "tv0", 0, layout=layout)           # back, through pyroute2
    wanshare.activate(ipr, "tv0", 2, layout=layout)
    out["pyroute2"] = rates()
    for k in range(50):
        took.append(wanshare.activate(ipr, "tv0", k % 3, layout=layout, batch=batch))
    out["after_50"] = rates()
    out["active"] = layout.active
    # a switch the kernel refuses part-way (the new owner's class is gone: "down" applied,
    # "up" refused) leaves the owner unknown; the next switch puts every other class down
    ok_index, layout.ifindex = layout.ifindex, 10 ** 6
    layout.encoded.clear()
    try:
        wanshare.activate(ipr, "tv0", 0, layout=layout, batch=batch)
    except OSError:
        pass
    layout.ifindex = ok_index
    layout.encoded.clear()
    out["unknown"] = layout.active
    wanshare.activate(ipr, "tv0", 2, layout=layout, batch=batch)
    out["recovered"] = rates()
    out["took_ms_median"] = sorted(took)[len(took) // 2] * 1e3
    bad = bytearray(wanshare.switch_message(layout, 1, "active"))
    bad[20:24] = (10 ** 6).to_bytes(4, "little")               # tcm_ifindex: no such interface
    try:
        batch.request([bytes(bad)])
        out["bad"] = None
    except OSError as exc:
        out["bad"] = [exc.errno, str(exc)]
print(json.dumps(out))
"""


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.mark.network
def test_switch_bytes_set_the_classes_as_pyroute2_does():
    sh("ip", "netns", "add", NS)
    try:
        sh("ip", "-n", NS, "link", "add", "tv0", "type", "veth", "peer", "name", "tv1")
        for intf in ("tv0", "tv1"):
            sh("ip", "-n", NS, "link", "set", intf, "up")
        out = subprocess.run(["ip", "netns", "exec", NS, sys.executable, "-c", PROBE], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        start, raw = doc["start"], doc["raw"]
        assert start["0"] > start["2"] and raw["2"] == start["0"] and raw["0"] == start["2"], doc
        assert doc["pyroute2"] == raw, doc
        assert doc["after_50"]["1"] == start["0"] and doc["active"] == 1, doc  # 49 % 3 == 1
        assert doc["bad"] is not None and doc["bad"][0] == 19, doc              # ENODEV
        assert doc["unknown"] is None and doc["recovered"] == raw, doc
        print(f"\nactivate() over the raw socket: median {doc['took_ms_median']:.3f} ms")
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


@pytest.mark.loopback
def test_refuses_messages_that_are_not_whole_or_ask_no_ack():
    import struct
    with RequestBatch() as batch:
        whole_no_ack = struct.pack("=IHHII", 16, 0, 0x1, 0, 0)
        with pytest.raises(ValueError, match="ACK"):
            batch.request([whole_no_ack])
        with pytest.raises(ValueError, match="header says"):
            batch.request([struct.pack("=IHHII", 20, 0, 0x5, 0, 0)])
        with pytest.raises(ValueError, match="aligned"):
            batch.request([struct.pack("=IHHIIB", 17, 0, 0x5, 0, 0, 0)])
