"""Rate (and, with netem, delay) shaping of emulated links, planned as data, applied via pyroute2.

One job: the qdisc tree on each shaped interface. `plan_*` functions are pure and return
`TcOp`s; `apply()` sends them through pyroute2 and `read_back()` checks what the kernel holds.
The delay line (NFQUEUE, testbed.emulation.delayline) is not here; testbed.emulation.network starts it.

Per shaped interface (egress), one tree:

    <if> -- htb 1:0 (default 1:10) -- htb class 1:10 (rate, ceil = rate) -- leaf 10:0
                                                                           bfifo  (delayline backend:
                                                                                   limit = queue bytes)
                                                                           netem  (netem backend: delay,
                                                                                   jitter, loss, limit)
A WAN link a<->b gets this tree on a's WAN interface (a->b) and on b's (b->a). With the delay line,
the delay of a->b is added after the rate, in b's FORWARD chain, as on a real path (queue, then
propagation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import re
import socket

from pyroute2 import IPRoute
from pyroute2.netlink import NLM_F_ACK, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWTCLASS, tcmsg
from pyroute2.netlink.rtnl.tcmsg import sched_pfifo
from pyroute2.netlink.rtnl.tcmsg.common import tick_in_usec

from testbed.spec.scenario import MTU_BYTES

# bfifo takes the same option struct (u32 limit) as pfifo, in bytes; pyroute2 lists only pfifo.
tcmsg.plugins.setdefault("bfifo", sched_pfifo)

ROOT_HANDLE = 0x10000      # 1:0
CLASS_HANDLE = 0x10010     # 1:10
LEAF_HANDLE = 0x100000     # 10:0


@dataclass(frozen=True, kw_only=True, slots=True)
class TcOp:
    """One pyroute2 tc call: ipr.tc(command, kind, index_of(intf), handle, **params)."""
    command: str
    kind: str
    intf: str
    handle: int
    params: dict[str, Any] = field(default_factory=dict)


def burst_bytes(rate_bps: float) -> int:
    """HTB bucket: 1 ms at the rate (at least two full frames). A GSO super-packet larger than
    the bucket still goes out whole and is paid for by waiting, so the rate holds; a larger
    bucket would let bursts out at veth speed, which inflates BBR's bandwidth samples until it
    overdrives the queue (seen: 128 KB at 10 Mbit/s gave steady losses and RTOs)."""
    return int(max(rate_bps / 8 * 0.001, 2 * MTU_BYTES))


def plan_link(intf: str, rate_mbit: float, queue_bytes: int, *, netem: dict[str, float] | None = None) -> list[TcOp]:
    """The tree above for one interface. netem: {delay_ms, jitter_ms, loss_pct} or None."""
    rate_bps = int(rate_mbit * 1e6)
    burst = burst_bytes(rate_bps)
    ops = [
        TcOp(command="add", kind="htb", intf=intf, handle=ROOT_HANDLE,
             params={"default": 0x10, "r2q": max(1, rate_bps // 8 // 60000)}),
        TcOp(command="add-class", kind="htb", intf=intf, handle=CLASS_HANDLE,
             params={"parent": ROOT_HANDLE, "rate": f"{rate_bps}bit", "ceil": f"{rate_bps}bit", "burst": burst,
                     "cburst": burst, "quantum": 60000}),
    ]
    if netem is None:
        ops.append(TcOp(command="add", kind="bfifo", intf=intf, handle=LEAF_HANDLE,
                        params={"parent": CLASS_HANDLE, "limit": int(queue_bytes)}))
    else:
        ops.append(TcOp(command="add", kind="netem", intf=intf, handle=LEAF_HANDLE,
                        params={"parent": CLASS_HANDLE,
                                "delay": int(netem.get("delay_ms", 0) * 1000),
                                "jitter": int(netem.get("jitter_ms", 0) * 1000),
                                "loss": netem.get("loss_pct", 0),
                                "limit": max(1000, queue_bytes // MTU_BYTES)}))
    return ops


def apply(ipr: IPRoute, ops: list[TcOp]) -> None:
    """Send each op; a NetlinkError propagates (nothing is silently ignored)."""
    for op in ops:
        ipr.tc(op.command, op.kind, _index(ipr, op.intf), op.handle, **op.params)


def set_rate(ipr: IPRoute, intf: str | int, rate_mbit: float) -> None:
    """Change a shaped interface's rate at run time (the class must exist: change-class).
    intf: its name or ifindex. One netlink message (change_class_msg)."""
    rate_bps = int(rate_mbit * 1e6)
    burst = burst_bytes(rate_bps)
    index = intf if isinstance(intf, int) else _index(ipr, intf)
    ipr.nlm_request_batch([change_class_msg(index, CLASS_HANDLE, ROOT_HANDLE, {
        "rate": f"{rate_bps}bit", "ceil": f"{rate_bps}bit", "burst": burst, "cburst": burst,
        "quantum": 60000})])


def change_class_msg(index: int, handle: int, parent: int, params: dict[str, Any]) -> tcmsg.tcmsg:
    """pyroute2's "change-class" message for an HTB class, without the legacy rate tables
    (TCA_HTB_RTAB/CTAB: the kernel computes its own since Linux 3.8 and ignores them; pyroute2
    spends most of an ipr.tc("change-class") call computing 2 x 256 entries in Python, which
    under load made a rate change tens of ms late). Send with ipr.nlm_request_batch."""
    options = tcmsg.sched_htb.get_class_parameters(dict(params))
    options["attrs"] = [a for a in options["attrs"] if a[0] not in ("TCA_HTB_RTAB", "TCA_HTB_CTAB")]
    msg = tcmsg.tcmsg()
    msg["family"] = socket.AF_UNSPEC
    msg["index"] = index
    msg["handle"] = handle
    msg["parent"] = parent
    msg["attrs"] = [["TCA_KIND", "htb"], ["TCA_OPTIONS", options]]
    msg["header"]["type"] = RTM_NEWTCLASS
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | NLM_F_REPLACE   # pyroute2's "change"
    return msg


def read_back(ipr: IPRoute, intf: str) -> dict[str, Any]:
    """What the kernel holds on intf: {'rate_bps': .., 'leaf': kind, 'limit': ..}, and with a
    netem leaf its 'delay_us', 'jitter_us' and 'loss_pct' (the kernel keeps delays in psched
    ticks and loss as a share of 2^32 - 1: converted back here)."""
    index = _index(ipr, intf)
    out: dict[str, Any] = {}
    for cls in ipr.get_classes(index=index):
        if cls["handle"] != CLASS_HANDLE:
            continue
        opts = cls.get_attr("TCA_OPTIONS")
        parms = opts.get_attr("TCA_HTB_PARMS")
        rate64 = opts.get_attr("TCA_HTB_RATE64")
        out["rate_bps"] = int(rate64 or parms["rate"]) * 8
    for q in ipr.get_qdiscs(index=index):
        if q["handle"] == LEAF_HANDLE:
            out["leaf"] = q.get_attr("TCA_KIND")
            opts = q.get_attr("TCA_OPTIONS")
            if out["leaf"] == "bfifo" and opts is not None:
                out["limit"] = int(opts["limit"])
            elif out["leaf"] == "netem" and opts is not None:
                out["limit"] = int(opts["limit"])
                out["delay_us"] = round(opts["delay"] / tick_in_usec)
                out["jitter_us"] = round(opts["jitter"] / tick_in_usec)
                out["loss_pct"] = round(opts["loss"] / 0xFFFFFFFF * 100, 4)
    return out


def _index(ipr: IPRoute, intf: str) -> int:
    found = ipr.link_lookup(ifname=intf)
    if not found:
        raise FileNotFoundError(f"no interface {intf!r} in this namespace")
    return found[0]


def tc_command(op: TcOp) -> str:
    """The `tc` command line doing what apply() does for op (htb, its class, a bfifo or netem
    leaf): for a node reached only through a shell, such as one on another server."""
    p = op.params
    if op.kind == "htb" and op.command == "add":
        return (f"tc qdisc add dev {op.intf} root handle {op.handle >> 16:x}: htb "
                f"default {p['default']:x} r2q {p['r2q']}")
    if op.kind == "htb" and op.command == "add-class":
        return (f"tc class add dev {op.intf} parent {p['parent'] >> 16:x}: classid "
                f"{op.handle >> 16:x}:{op.handle & 0xFFFF:x} htb rate {p['rate']} "
                f"ceil {p['ceil']} burst {p['burst']} cburst {p['cburst']} quantum {p['quantum']}")
    if op.kind == "bfifo":
        return f"{_leaf_command(op)} bfifo limit {p['limit']}"
    if op.kind == "netem" and op.command == "add":
        delay = f" delay {p['delay']}us" + (f" {p['jitter']}us" if p["jitter"] else "")
        loss = f" loss {p['loss']:g}%" if p["loss"] else ""
        return f"{_leaf_command(op)} netem limit {p['limit']}{delay}{loss}"
    raise ValueError(f"no tc command for {op.kind} {op.command}")


def _leaf_command(op: TcOp) -> str:
    """`tc qdisc add` of a leaf under its HTB class, up to the leaf's kind."""
    parent = op.params["parent"]
    return (f"tc qdisc add dev {op.intf} parent {parent >> 16:x}:{parent & 0xFFFF:x} "
            f"handle {op.handle >> 16:x}:")


_TC_UNITS = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}


def parse_tc_rate_bps(text: str) -> int | None:
    """The `rate` of `tc class show` output in bit/s (tc prints it rounded, e.g. 100Mbit)."""
    m = re.search(r"\brate (\d+(?:\.\d+)?)([KMG]?)bit", text)
    return None if m is None else int(float(m.group(1)) * _TC_UNITS[m.group(2)])
