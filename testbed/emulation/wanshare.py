"""Workload-aware temporal sharing of a WAN link (Atlas): the HTB tree that gives one pipeline
the whole link at a time, planned as data and applied via pyroute2 (like testbed.emulation.shaping).

One job: the qdisc tree on a gateway's WAN egress interface and switching which pipeline owns
it. Who owns it when is decided by testbed.features.temporal.arbiter; this module only plans, applies, switches
(`activate`) and reads the kernel's counters (`class_stats`).

Tree (replaces testbed.emulation.shaping's plain htb 1:0 -> 1:10 -> bfifo on that interface):

    <if> -- htb 1:0 (default 1:10)
              `-- class 1:1   rate = ceil = link
                    |-- class 1:10        control:  rate C, ceil L, prio 0   -- bfifo 10:0
                    |-- class 1:(20+d)    active:   rate A, ceil L, prio 1, quantum 60000
                    |                     inactive: rate F, ceil L, prio 1, quantum 1514
                    |                                                  -- bfifo (20+d):0 each
    u32 filters on 1:0, first match wins:
      prio 1: IP total length < 256 bytes ((tot_len & 0xff00) == 0: pure ACKs, SYNs, arbiter
              messages) -> 1:10, so one pipeline's ACKs for data in the other direction are never
              held back by this direction's slots;
      prio 2: source IP of each of pipeline d's sending hosts -> 1:(20+d) (hex minor 0x20 + d);
              with `peers` given for d, only packets from those hosts to one of d's peers (its
              hosts beyond the link): a pipeline's stage-to-stage transfers, not other traffic
              of the same hosts (a gloo all-reduce to another pipeline's host stays in 1:10).
    Anything else (ARP, unclassified hosts, transit traffic of other DCs) -> 1:10 (default).
    Every bfifo holds the link's queue_bytes.

Rates: the guaranteed rates add up to exactly the link's rate L: C = 5% of L for control,
F = max(0.1% of L, 8 kbit) for each inactive pipeline, A = L - C - (n-1) F for the active one.
What a class does not use is lent, control first (prio 0), then among the pipelines by DRR
with quanta 60000 : 1514, so the active pipeline borrows about 40 times more than an inactive
one. Measured (100 Mbit/s, two saturating flows): active 99.3-99.5%, inactive 0.5-0.7%, and
the switch shows within the next 250 ms window. An inactive pipeline never starves (F), and
when the active one has nothing queued the link is not left idle (work-conserving); the wire
never carries more than L.

Why not "active rate = ceil = L, inactive rate = ceil = F, control rate = ceil = L":
(1) HTB lets a class under its own rate send without asking its parent, so rates that add up to
more than L (control L + active L) let the wire exceed L; (2) HTB keeps a class's token debt
(in nanoseconds, clamped at 60 s) across a rate change (htb_change_class never resets tokens):
a class at ceil F that just sent a 12 KB GSO packet at F = 100 kbit owes about 1 s, and once
raised to L it still may not send until that time has passed. Measured with that tree: after
switching back to a pipeline that had been sending at its floor, the link carried nothing for
0.25-0.5 s. With ceil = L everywhere a debt only means the class borrows instead.
And why the same prio for every pipeline: HTB reads a class's prio when the class becomes
backlogged, so a prio changed while packets are queued takes effect only after it has drained
(measured: the old owner kept the spare 5% at its stale prio); the quantum is read at every
DRR round.

`activate(ipr, intf, d)` is two "change-class" messages sent in one batch: the old owner down
first, then d up, so the guaranteed rates never add up to more than L. Through pyroute2
(nlm_request_batch) it took about 0.8 ms in a loop and 1.2-1.5 ms in the arbiter under load,
nearly all of it pyroute2 encoding the messages; apply_temporal encodes them once
(switch_message) and the arbiter sends those bytes over a raw socket (testbed.emulation.nlbatch):
about 0.01 ms.
"""

from __future__ import annotations

import errno
import ipaddress
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from testbed.emulation import shaping
from testbed.spec.scenario import ETH_FRAME_BYTES, TCP_MSS_BYTES
from testbed.emulation.shaping import TcOp

if TYPE_CHECKING:
    from testbed.emulation.nlbatch import RequestBatch
    from testbed.emulation.tcstats import ClassCounters

ROOT_HANDLE = 0x10000          # 1:0
PARENT_HANDLE = 0x10001        # 1:1
CONTROL_HANDLE = 0x10010       # 1:10
CONTROL_LEAF = 0x100000        # 10:0
PIPELINE_MINOR_BASE = 0x20
TC_H_ROOT = 0xFFFFFFFF
ETH_P_IP = 0x0800
SMALL_PACKET_BYTES = 256       # IP total length below this -> control class
FILTER_PRIO_SMALL = 1
FILTER_PRIO_PIPELINE = 2
PRIO_CONTROL, PRIO_PIPELINE = 0, 1
QUANTUM = 60000           # control, parent and the active pipeline
INACTIVE_QUANTUM = 1514   # an inactive pipeline's DRR quantum when borrowing: 1/40 of the active's
CONTROL_SHARE = 0.05
FLOOR_SHARE = 0.001
FLOOR_MIN_BPS = 8000


def class_handle(d: int) -> int:
    """HTB class of pipeline d: 1:(0x20 + d)."""
    if not 0 <= d <= 0xFFFF - PIPELINE_MINOR_BASE:
        raise ValueError(f"pipeline {d} out of range")
    return 0x10000 | (PIPELINE_MINOR_BASE + d)


def leaf_handle(d: int) -> int:
    """bfifo leaf of pipeline d: (0x20 + d):0."""
    return (PIPELINE_MINOR_BASE + d) << 16


def pipeline_of_handle(handle: int) -> int | None:
    minor = handle & 0xFFFF
    if handle >> 16 == 1 and minor >= PIPELINE_MINOR_BASE:
        return minor - PIPELINE_MINOR_BASE
    return None


def link_layer_bytes(payload_bytes: int) -> int:
    """Bytes HTB counts for payload_bytes of TCP payload sent in full-size segments (1448 bytes
    of payload per 1514-byte frame, testbed.spec.scenario)."""
    return -(-int(payload_bytes) * ETH_FRAME_BYTES // TCP_MSS_BYTES)


@dataclass(frozen=True, kw_only=True, slots=True)
class Rates:
    link_bps: int
    control_bps: int
    floor_bps: int
    active_bps: int


def plan_rates(link_bps: int, n_pipelines: int, *, control_share: float = CONTROL_SHARE,
               floor_bps: int | None = None) -> Rates:
    """Guaranteed rates that add up to the link rate (see the module docstring)."""
    link_bps = int(link_bps)
    control = max(FLOOR_MIN_BPS, int(link_bps * control_share))
    floor = int(floor_bps) if floor_bps is not None else max(FLOOR_MIN_BPS, int(link_bps * FLOOR_SHARE))
    active = link_bps - control - max(0, n_pipelines - 1) * floor
    if active < link_bps // 2:
        raise ValueError(f"{n_pipelines} pipelines with a floor of {floor} bit/s and control "
                         f"{control} bit/s leave the active pipeline {active} of {link_bps} bit/s")
    return Rates(link_bps=link_bps, control_bps=control, floor_bps=floor, active_bps=active)


@dataclass(kw_only=True, slots=True)
class TemporalLayout:
    """What apply_temporal built on one interface, and which pipeline owns it now."""
    intf: str
    queue_bytes: int
    pipelines: dict[int, tuple[str, ...]]   # d -> sending host IPs
    rates: Rates
    active: int | None = None
    switches: int = 0
    ifindex: int = 0
    encoded: dict[tuple[int, str], bytes] = field(default_factory=dict)   # switch_message's


_LAYOUTS: dict[str, TemporalLayout] = {}


def _class_params(rates: Rates, role: str) -> dict[str, Any]:
    link = rates.link_bps
    rate, prio, quantum = {"control": (rates.control_bps, PRIO_CONTROL, QUANTUM),
                           "active": (rates.active_bps, PRIO_PIPELINE, QUANTUM),
                           "inactive": (rates.floor_bps, PRIO_PIPELINE, INACTIVE_QUANTUM)}[role]
    return {"parent": PARENT_HANDLE, "rate": f"{rate}bit", "ceil": f"{link}bit",
            "burst": shaping.burst_bytes(rate), "cburst": shaping.burst_bytes(link),
            "prio": prio, "quantum": quantum}


def _ip_key(ip: str, offset: int) -> str:
    return f"0x{int(ipaddress.IPv4Address(ip)):08x}/0xffffffff+{offset}"


def plan_temporal(intf: str, link_rate_mbit: float, queue_bytes: int,
                  pipelines: dict[int, list[str]], *, active: int | None = None,
                  rates: Rates | None = None,
                  peers: dict[int, list[str]] | None = None) -> list[TcOp]:
    """The tree of the module docstring, as tc operations (pure). active: the pipeline that
    owns the link at first (default: the lowest-numbered)."""
    if not pipelines:
        raise ValueError(f"{intf}: no pipelines")
    link_bps = int(link_rate_mbit * 1e6)
    rates = rates or plan_rates(link_bps, len(pipelines))
    active = min(pipelines) if active is None else active
    if active not in pipelines:
        raise ValueError(f"{intf}: active pipeline {active} is not one of {sorted(pipelines)}")
    seen: dict[str, int] = {}
    for d, ips in pipelines.items():
        for ip in ips:
            if seen.setdefault(ip, d) != d:
                raise ValueError(f"{intf}: host {ip} is in pipelines {seen[ip]} and {d}; "
                                 f"classification is by source address")
    burst = shaping.burst_bytes(link_bps)
    ops = [
        TcOp(command="add", kind="htb", intf=intf, handle=ROOT_HANDLE,
             params={"default": CONTROL_HANDLE & 0xFFFF, "r2q": max(1, link_bps // 8 // QUANTUM)}),
        TcOp(command="add-class", kind="htb", intf=intf, handle=PARENT_HANDLE,
             params={"parent": ROOT_HANDLE, "rate": f"{link_bps}bit", "ceil": f"{link_bps}bit",
                     "burst": burst, "cburst": burst, "quantum": QUANTUM}),
        TcOp(command="add-class", kind="htb", intf=intf, handle=CONTROL_HANDLE,
             params=_class_params(rates, "control")),
        TcOp(command="add", kind="bfifo", intf=intf, handle=CONTROL_LEAF,
             params={"parent": CONTROL_HANDLE, "limit": int(queue_bytes)}),
    ]
    for d in sorted(pipelines):
        ops.append(TcOp(command="add-class", kind="htb", intf=intf, handle=class_handle(d),
                        params=_class_params(rates, "active" if d == active else "inactive")))
        ops.append(TcOp(command="add", kind="bfifo", intf=intf, handle=leaf_handle(d),
                        params={"parent": class_handle(d), "limit": int(queue_bytes)}))
    ops.append(TcOp(command="add-filter", kind="u32", intf=intf, handle=0,
                    params={"parent": ROOT_HANDLE, "prio": FILTER_PRIO_SMALL, "protocol": ETH_P_IP,
                            "target": CONTROL_HANDLE,
                            # pyroute2 places a key's mask bytes from +offset on: byte 2 of the
                            # IP header is the high byte of tot_len.
                            "keys": ["0x0/0xff+2"]}))
    peers = peers or {}
    for d in sorted(pipelines):
        for ip in pipelines[d]:
            keys = ([[_ip_key(ip, 12), _ip_key(dst, 16)] for dst in peers[d]] if peers.get(d)
                    else [[_ip_key(ip, 12)]])
            for key in keys:
                ops.append(TcOp(command="add-filter", kind="u32", intf=intf, handle=0,
                                params={"parent": ROOT_HANDLE, "prio": FILTER_PRIO_PIPELINE,
                                        "protocol": ETH_P_IP, "target": class_handle(d),
                                        "keys": key}))
    return ops


def remove_root(ipr: IPRoute, intf: str) -> None:
    """Delete intf's root qdisc (and with it the whole tree); nothing there is fine."""
    index = shaping._index(ipr, intf)
    for q in ipr.get_qdiscs(index=index):
        if q["parent"] != TC_H_ROOT or q["handle"] == 0:
            continue
        try:
            ipr.tc("del", q.get_attr("TCA_KIND"), index, q["handle"])
        except NetlinkError as exc:
            if exc.code not in (errno.ENOENT, errno.EINVAL):
                raise


def apply_temporal(ipr: IPRoute, intf: str, link_rate_mbit: float, queue_bytes: int,
                   pipelines: dict[int, list[str]], *, active: int | None = None,
                   rates: Rates | None = None,
                   peers: dict[int, list[str]] | None = None) -> TemporalLayout:
    """Replace intf's tree by the temporal-sharing tree; returns (and remembers, for activate)
    its layout. Packets queued in the old tree are dropped."""
    pipelines = {int(d): list(ips) for d, ips in pipelines.items()}
    link_bps = int(link_rate_mbit * 1e6)
    rates = rates or plan_rates(link_bps, len(pipelines))
    ops = plan_temporal(intf, link_rate_mbit, queue_bytes, pipelines, active=active, rates=rates,
                        peers=peers)
    remove_root(ipr, intf)
    shaping.apply(ipr, ops)
    layout = TemporalLayout(intf=intf, queue_bytes=int(queue_bytes),
                            pipelines={d: tuple(ips) for d, ips in pipelines.items()}, rates=rates,
                            active=min(pipelines) if active is None else active,
                            ifindex=shaping._index(ipr, intf))
    for d in layout.pipelines:      # encoded now, so no switch pays for it
        for role in ("active", "inactive"):
            switch_message(layout, d, role)
    _LAYOUTS[intf] = layout
    return layout


def layout_of(ipr: IPRoute, intf: str) -> TemporalLayout:
    """The remembered layout of intf, or one read from the kernel (another process built it)."""
    layout = _LAYOUTS.get(intf)
    if layout is None:
        layout = _layout_from_kernel(ipr, intf)
        _LAYOUTS[intf] = layout
    return layout


def activate(ipr: IPRoute, intf: str, d: int, *, layout: TemporalLayout | None = None,
             batch: "RequestBatch | None" = None) -> float:
    """Give the link on intf to pipeline d: the previous owner's class down to the floor, then
    d's up (two change-class calls). Returns the seconds it took (0 if d already owned it).
    batch: send the layout's messages encoded once (switch_message) over that raw socket
    (testbed.emulation.nlbatch: the arbiter's switches), not through pyroute2's encoder."""
    layout = layout or layout_of(ipr, intf)
    if d not in layout.pipelines:
        raise KeyError(f"{intf}: no pipeline {d} (has {sorted(layout.pipelines)})")
    if layout.active == d:
        return 0.0
    t0 = time.perf_counter()
    if not layout.ifindex:
        layout.ifindex = shaping._index(ipr, intf)
    old = layout.active
    # Owner unknown (a switch failed part-way: the kernel applies each message on its own):
    # every other pipeline down, so the guaranteed rates add up to L again.
    others = [old] if old is not None else [p for p in sorted(layout.pipelines) if p != d]
    steps = [(p, "inactive") for p in others] + [(d, "active")]
    layout.active = None
    if batch is not None:
        batch.request([switch_message(layout, p, role) for p, role in steps])
    else:   # one send; the kernel applies them in order; raises on error
        ipr.nlm_request_batch([_change_class_msg(layout.rates, layout.ifindex, p, role)
                               for p, role in steps])
    layout.active = d
    layout.switches += 1
    return time.perf_counter() - t0


def switch_message(layout: TemporalLayout, d: int, role: str) -> bytes:
    """Pipeline d's change-class message to role ("active" / "inactive") as netlink bytes,
    encoded on first use and kept in the layout (rates and ifindex do not change after
    apply_temporal)."""
    key = (d, role)
    if key not in layout.encoded:
        msg = _change_class_msg(layout.rates, layout.ifindex, d, role)
        msg.encode()
        layout.encoded[key] = bytes(msg.data)
    return layout.encoded[key]


def _change_class_msg(rates: Rates, index: int, d: int, role: str) -> tcmsg:
    """The "change-class" message for pipeline d's class in role (shaping.change_class_msg)."""
    kwarg = _class_params(rates, role)
    kwarg.pop("parent")
    return shaping.change_class_msg(index, class_handle(d), PARENT_HANDLE, kwarg)


def time_activate(ipr: IPRoute, intf: str, n: int = 200) -> dict[str, float]:
    """Switch the link round the pipelines n times; activate()'s time in ms (median, p90, max)."""
    layout = layout_of(ipr, intf)
    order = sorted(layout.pipelines)
    if len(order) < 2:
        raise ValueError(f"{intf}: timing switches needs two pipelines")
    start = layout.active
    samples = []
    for k in range(n):
        cur = layout.active
        nxt = order[(order.index(cur) + 1) % len(order)] if cur in order else order[k % len(order)]
        samples.append(activate(ipr, intf, nxt, layout=layout) * 1e3)
    if start is not None:
        activate(ipr, intf, start, layout=layout)
    samples.sort()
    return {"n": n, "median_ms": statistics.median(samples),
            "p90_ms": samples[min(n - 1, int(0.9 * n))], "max_ms": samples[-1]}


def _stats_of(msg) -> tuple[int, int, int]:
    """(bytes, packets, backlog bytes) of a class message: TCA_STATS2, else TCA_STATS."""
    st2 = msg.get_attr("TCA_STATS2")
    if st2 is not None:
        basic = st2.get_attr("TCA_STATS_BASIC")
        queue = st2.get_attr("TCA_STATS_QUEUE")
        if basic is not None:
            return (int(basic["bytes"]), int(basic["packets"]),
                    int(queue["backlog"]) if queue is not None else 0)
    st = msg.get_attr("TCA_STATS")
    if st is not None:
        return int(st["bytes"]), int(st["packets"]), int(st["backlog"])
    return 0, 0, 0


def class_stats(ipr: IPRoute, intf: str, *, index: int | None = None,
                counters: "ClassCounters | None" = None) -> dict[int, tuple[int, int, int]]:
    """{pipeline d: (bytes, packets, backlog bytes)} of d's class on intf, as HTB counts them
    (link-layer bytes dequeued, i.e. sent on the wire; backlog still queued). counters: read
    them over that raw netlink socket (testbed.emulation.tcstats: the arbiter's polls), not pyroute2's."""
    index = index if index is not None else shaping._index(ipr, intf)
    if counters is not None:
        return {d: c for h, c in counters.read(index).items()
                if (d := pipeline_of_handle(h)) is not None}
    out = {}
    for msg in ipr.get_classes(index=index):
        d = pipeline_of_handle(msg["handle"])
        if d is not None:
            out[d] = _stats_of(msg)
    return out


def control_stats(ipr: IPRoute, intf: str) -> tuple[int, int, int]:
    """(bytes, packets, backlog) of the control class 1:10."""
    for msg in ipr.get_classes(index=shaping._index(ipr, intf)):
        if msg["handle"] == CONTROL_HANDLE:
            return _stats_of(msg)
    raise FileNotFoundError(f"{intf}: no class 1:10")


def read_back(ipr: IPRoute, intf: str) -> dict[str, Any]:
    """What the kernel holds on intf: {'link_bps', 'control': {...}, 'pipelines': {d: {rate_bps,
    ceil_bps, prio, limit}}, 'active': d or None, 'filters': count}."""
    index = shaping._index(ipr, intf)
    out: dict[str, Any] = {"link_bps": None, "control": {}, "pipelines": {}, "active": None}
    for cls in ipr.get_classes(index=index):
        opts = cls.get_attr("TCA_OPTIONS")
        if opts is None:
            continue
        parms = opts.get_attr("TCA_HTB_PARMS")
        rate = int(opts.get_attr("TCA_HTB_RATE64") or parms["rate"]) * 8
        ceil = int(opts.get_attr("TCA_HTB_CEIL64") or parms["ceil"]) * 8
        info = {"rate_bps": rate, "ceil_bps": ceil, "prio": int(parms["prio"]),
                "quantum": int(parms["quantum"])}
        handle = cls["handle"]
        if handle == PARENT_HANDLE:
            out["link_bps"] = rate
        elif handle == CONTROL_HANDLE:
            out["control"] = info
        elif (d := pipeline_of_handle(handle)) is not None:
            out["pipelines"][d] = info
    # The active pipeline: the one guaranteed more than the others (all equal: none).
    rates = sorted(((p["rate_bps"], d) for d, p in out["pipelines"].items()), reverse=True)
    if rates and (len(rates) == 1 or rates[0][0] > rates[1][0]):
        out["active"] = rates[0][1]
    for q in ipr.get_qdiscs(index=index):
        if q.get_attr("TCA_KIND") != "bfifo":
            continue
        opts = q.get_attr("TCA_OPTIONS")
        limit = int(opts["limit"]) if opts is not None else None
        if q["parent"] == CONTROL_HANDLE:
            out["control"]["limit"] = limit
        elif (d := pipeline_of_handle(q["parent"])) is not None and d in out["pipelines"]:
            out["pipelines"][d]["limit"] = limit
    out["filters"] = sum(1 for f in ipr.get_filters(index=index, parent=ROOT_HANDLE)
                         if f.get_attr("TCA_KIND") == "u32" and f.get_attr("TCA_OPTIONS") is not None
                         and f.get_attr("TCA_OPTIONS").get_attr("TCA_U32_CLASSID") is not None)
    return out


def _layout_from_kernel(ipr: IPRoute, intf: str) -> TemporalLayout:
    got = read_back(ipr, intf)
    if not got["link_bps"] or not got["pipelines"]:
        raise FileNotFoundError(f"{intf}: no temporal-sharing tree (apply_temporal first)")
    pipes = got["pipelines"]
    floor = min(p["rate_bps"] for d, p in pipes.items() if d != got["active"]) if len(pipes) > 1 \
        else FLOOR_MIN_BPS
    active_bps = pipes[got["active"]]["rate_bps"] if got["active"] is not None else \
        got["link_bps"] - got["control"]["rate_bps"] - (len(pipes) - 1) * floor
    rates = Rates(link_bps=got["link_bps"], control_bps=got["control"]["rate_bps"], floor_bps=floor,
                  active_bps=active_bps)
    limit = next((p.get("limit") for p in pipes.values() if p.get("limit")), 0)
    return TemporalLayout(intf=intf, queue_bytes=int(limit or 0),
                          pipelines={d: () for d in pipes}, rates=rates, active=got["active"],
                          ifindex=shaping._index(ipr, intf))


def forget(intf: str) -> None:
    """Drop the remembered layout of intf (after its tree was replaced)."""
    _LAYOUTS.pop(intf, None)
