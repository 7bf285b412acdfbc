"""Cross-traffic: other tenants' traffic on a WAN link, started and stopped at given times.

One job: parse a scenario's `cross_traffic:` section (testbed.features.cross.run runs it with
iperf3 between tenant hosts and reports its goodput). Form:

    cross_traffic:
      - {from: east, to: west, kind: tcp, flows: 4, congestion_control: cubic,
         start_s: 2, stop_s: 10}
      - {from: west, to: east, kind: udp, rate_mbit: 20, start_s: 0, stop_s: 8}
      - {from: east, to: west, kind: udp, start_s: 1, stop_s: 9,
         rate_trace: [[0, 10], [3, 40]]}      # [seconds after start_s, Mbit/s] steps

`from` and `to` must be joined by a WAN link (the traffic takes the scenario's route between
them, which with direct routing is that link). The traffic runs between tenant hosts,
`<dc>-x1` (10.<d>.0.201), which the plan adds to each DC that sends or receives cross-traffic;
they never train. Times are seconds after the trainers are started, in the configured system's
time (x time_scale on the wall clock, as faults' are), rates in the `wan` section's units.
congestion_control defaults to the scenario's. A TCP entry is one iperf3 client with `flows`
parallel streams; a UDP one sends at rate_mbit (iperf3 -u -b), a UDP trace one client per
step, back to back. Goodput is what the tenant's receiver got (iperf3's server intervals).
Training that ends before stop_s cuts the cross-traffic short; its results say so.

With temporal WAN sharing (Atlas), tenant packets fall in the link tree's default class
(testbed.emulation.wanshare's control class, prio 0): the tenant is not under Atlas's control and takes
what it sends, up to the link's rate, before the pipelines' slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from testbed.spec.errors import ScenarioError, shown, unknown_field
from testbed.spec.fields import checked_number
from testbed.spec.links import LinkDir

if TYPE_CHECKING:
    from testbed.spec.dcs import DataCenter, WanLink

KINDS = ("tcp", "udp")
MAX_FLOWS = 64
MAX_ENTRIES = 32
MAX_TRACE_STEPS = 1000   # rate changes in one entry's rate_trace (each is an iperf3 run)
TENANT_OCTET = 201              # <dc>-x1 is 10.<d>.0.201


def tenant_host(dc: str) -> str:
    return f"{dc}-x1"


@dataclass(frozen=True, kw_only=True, slots=True)
class Segment:
    start_s: float
    stop_s: float
    rate_mbit: float | None     # UDP; None for TCP


@dataclass(frozen=True, kw_only=True, slots=True)
class CrossFlow:
    label: str                  # "cross_traffic[1]"
    src: str                    # DC
    dst: str
    kind: str                   # tcp | udp
    start_s: float
    stop_s: float
    flows: int = 1              # TCP streams
    congestion_control: str | None = None
    segments: tuple[Segment, ...] = ()

    @property
    def direction(self) -> LinkDir:
        return LinkDir(self.src, self.dst)

    def describe(self) -> str:
        what = (f"tcp x{self.flows}" + (f" {self.congestion_control}"
                                        if self.congestion_control else "")
                if self.kind == "tcp" else
                "udp " + "/".join(f"{s.rate_mbit:g}" for s in self.segments) + " Mbit/s")
        return (f"{self.label} ({self.direction} {what}, "
                f"{self.start_s:g}-{self.stop_s:g} s)")


def parse_cross_traffic(value: Any, dcs: "tuple[DataCenter, ...]", wan: "tuple[WanLink, ...]",
                        congestion_controls: tuple[str, ...]) -> tuple[CrossFlow, ...]:
    if not isinstance(value, list):
        raise ScenarioError("cross_traffic", "must be a list", "e.g. - {from: east, to: west, "
                            "kind: tcp, flows: 4, start_s: 2, stop_s: 10}")
    if len(value) > MAX_ENTRIES:
        raise ScenarioError("cross_traffic", f"{len(value)} entries", f"use at most {MAX_ENTRIES}")
    pairs = {frozenset((w.a, w.b)) for w in wan}
    out = []
    for i, item in enumerate(value):
        where = f"cross_traffic[{i}]"
        if not isinstance(item, dict):
            raise ScenarioError(where, f"expected a mapping, got {type(item).__name__}",
                                "write from: ..., to: ..., kind: tcp|udp, start_s, stop_s")
        kind = item.get("kind")
        if kind not in KINDS:
            raise ScenarioError(f"{where}.kind", f"{shown(kind)} is not tcp or udp", "use tcp or udp")
        allowed = {"from", "to", "kind", "start_s", "stop_s"} | (
            {"flows", "congestion_control"} if kind == "tcp" else {"rate_mbit", "rate_trace"})
        for key in item:
            if key not in allowed:
                raise unknown_field(where, key, allowed, f"unknown field for {kind} cross-traffic")
        src, dst = item.get("from"), item.get("to")
        names = [dc.name for dc in dcs]
        for key, dc in (("from", src), ("to", dst)):
            if dc not in names:
                raise ScenarioError(f"{where}.{key}", f"{shown(dc)} is not a DC",
                                    f"use one of {', '.join(names)}")
        if frozenset((src, dst)) not in pairs:
            raise ScenarioError(f"{where}.to", f"no WAN link between {shown(src)} and {shown(dst)}",
                                "cross-traffic runs on a WAN link: name its two ends")
        start = checked_number(item.get("start_s", 0), f"{where}.start_s", low=0.0, high=1e6)
        if "stop_s" not in item:
            raise ScenarioError(f"{where}.stop_s", "missing", "say when it stops (seconds)")
        stop = checked_number(item["stop_s"], f"{where}.stop_s", low=0.0, high=1e6)
        if stop <= start:
            raise ScenarioError(f"{where}.stop_s", f"{stop:g} is not after start_s {start:g}",
                                "use stop_s > start_s")
        if kind == "tcp":
            flows = item.get("flows", 1)
            if isinstance(flows, bool) or not isinstance(flows, int) or not 1 <= flows <= MAX_FLOWS:
                raise ScenarioError(f"{where}.flows", f"{shown(flows)} is not a flow count",
                                    f"use an integer from 1 to {MAX_FLOWS}")
            cc = item.get("congestion_control")
            if cc is not None and cc not in congestion_controls:
                raise ScenarioError(f"{where}.congestion_control", f"{shown(cc)} is not one of "
                                    f"{', '.join(congestion_controls)}",
                                    f"use one of {', '.join(congestion_controls)}")
            out.append(CrossFlow(label=where, src=src, dst=dst, kind=kind, start_s=start,
                                 stop_s=stop, flows=flows, congestion_control=cc,
                                 segments=(Segment(start_s=start, stop_s=stop, rate_mbit=None),)))
            continue
        if ("rate_mbit" in item) == ("rate_trace" in item):
            raise ScenarioError(f"{where}.rate_mbit", "udp cross-traffic needs rate_mbit or "
                                "rate_trace", "give one of them")
        if "rate_mbit" in item:
            segs = [Segment(start_s=start, stop_s=stop,
                            rate_mbit=checked_number(item["rate_mbit"], f"{where}.rate_mbit",
                                                     low=0.01, high=1e5))]
        else:
            segs = _trace(item["rate_trace"], f"{where}.rate_trace", start, stop)
        out.append(CrossFlow(label=where, src=src, dst=dst, kind=kind, start_s=start,
                             stop_s=stop, segments=tuple(segs)))
    return tuple(out)


def _trace(steps: Any, where: str, start: float, stop: float) -> list[Segment]:
    if not isinstance(steps, list) or not steps or len(steps) > MAX_TRACE_STEPS:
        raise ScenarioError(where, f"must be a list of 1 to {MAX_TRACE_STEPS} [seconds, "
                            "rate_mbit] pairs", "e.g. rate_trace: [[0, 10], [3, 40]]")
    points = []
    for j, step in enumerate(steps):
        if not isinstance(step, list) or len(step) != 2:
            raise ScenarioError(f"{where}[{j}]", f"{shown(step)} is not a [seconds, rate_mbit] pair",
                                "write each step as [t_s, rate_mbit]")
        t = checked_number(step[0], f"{where}[{j}][0]", low=0.0, high=1e6)
        if (points and t <= points[-1][0]) or (not points and t != 0):
            raise ScenarioError(f"{where}[{j}][0]", f"{t:g} s: steps start at 0 and increase",
                                "list steps from 0 s in increasing time")
        if start + t >= stop:
            raise ScenarioError(f"{where}[{j}][0]", f"{t:g} s is past stop_s", "end the trace "
                                "before stop_s")
        points.append((t, checked_number(step[1], f"{where}[{j}][1]", low=0.01, high=1e5)))
    ends = [start + t for t, _ in points[1:]] + [stop]
    return [Segment(start_s=start + t, stop_s=end, rate_mbit=r)
            for (t, r), end in zip(points, ends)]
