"""Cross-traffic: other tenants' traffic on a WAN link, started and stopped at given times.

One job: parse a scenario's `cross_traffic:` section, run it with iperf3 between tenant hosts,
and report its goodput. Form:

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
(geodc.emulation.wanshare's control class, prio 0): the tenant is not under Atlas's control and takes
what it sends, up to the link's rate, before the pipelines' slots.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from geodc.spec.errors import ScenarioError, TestbedError, shown, unknown_field
from geodc.spec.scenario import checked_number

if TYPE_CHECKING:
    from geodc.emulation.network import Network
    from geodc.emulation.procs import HostProcess
    from geodc.spec.scenario import DataCenter, WanLink

KINDS = ("tcp", "udp")
MAX_FLOWS = 64
MAX_ENTRIES = 32
MAX_TRACE_STEPS = 1000   # rate changes in one entry's rate_trace (each is an iperf3 run)
BASE_PORT = 5300
UDP_PAYLOAD_BYTES = 1400        # one datagram per packet at MTU 1500
INTERVAL_S = 0.5
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

    def describe(self) -> str:
        what = (f"tcp x{self.flows}" + (f" {self.congestion_control}"
                                        if self.congestion_control else "")
                if self.kind == "tcp" else
                "udp " + "/".join(f"{s.rate_mbit:g}" for s in self.segments) + " Mbit/s")
        return (f"{self.label} ({self.src}->{self.dst} {what}, "
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


# ---- running it ---------------------------------------------------------------------------------
@dataclass(slots=True)
class _Running:
    flow: CrossFlow
    segment: Segment
    port: int
    server: "HostProcess"
    client: "HostProcess | None" = None
    started_s: float | None = None     # configured time the client was started
    cut_short: bool = False


class CrossTraffic:
    """`prepare()` (the receivers up), `start(mono0)` (the schedule from t = 0), `stop()` when
    training ends (cuts what still runs), then `results()`."""

    def __init__(self, net: "Network", flows: tuple[CrossFlow, ...], logs: Path,
                 time_scale: float = 1.0, congestion_control: str | None = None) -> None:
        self.net = net
        self.flows = flows
        self.logs = logs
        self.T = time_scale
        self.cc = congestion_control
        self.running: list[_Running] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mono0 = 0.0

    def prepare(self) -> "CrossTraffic":
        """Start every receiver (iperf3 -s) and wait until each listens."""
        from geodc.emulation.tools import iperf
        port = BASE_PORT
        for flow in self.flows:
            for seg in flow.segments:
                server = self.net.spawn(tenant_host(flow.dst), iperf.server_argv(port)
                                        + ["-i", f"{INTERVAL_S * self.T:g}"],
                                        self.logs / f"cross-{flow.label}-{port}-server.log")
                self.running.append(_Running(flow=flow, segment=seg, port=port, server=server))
                port += 1
        deadline = time.monotonic() + 10
        for r in self.running:       # every server listening before t = 0
            while not iperf.listening(r.server.pid, r.port):
                if time.monotonic() > deadline or r.server.poll() is not None:
                    raise TestbedError(f"cross-traffic server {r.server.describe()} did not "
                                       f"listen on {r.port}: {r.server.output()[-300:]}")
                time.sleep(0.02)
        return self

    def start(self, mono0: float | None = None) -> "CrossTraffic":
        """Run the schedule from t = 0 at time.monotonic() mono0 (the faults' t = 0; now if
        None). prepare() first."""
        self._mono0 = time.monotonic() if mono0 is None else mono0
        self._thread = threading.Thread(target=self._schedule, name="cross-traffic", daemon=True)
        self._thread.start()
        return self

    def _schedule(self) -> None:
        for r in sorted(self.running, key=lambda r: r.segment.start_s):
            wait = r.segment.start_s * self.T - (time.monotonic() - self._mono0)
            if self._stop.wait(max(0.0, wait)):
                return
            r.started_s = (time.monotonic() - self._mono0) / self.T
            r.client = self.net.spawn(tenant_host(r.flow.src), self._client_argv(r),
                                      self.logs / f"cross-{r.flow.label}-{r.port}-client.log")

    def _client_argv(self, r: _Running) -> list[str]:
        ip = self.net.host_ip(tenant_host(r.flow.dst))
        seconds = (r.segment.stop_s - r.segment.start_s) * self.T
        argv = ["iperf3", "-c", ip, "-p", str(r.port), "-t", f"{seconds:.3f}", "-J",
                "-i", f"{INTERVAL_S * self.T:g}"]
        if r.flow.kind == "tcp":
            argv += ["-P", str(r.flow.flows), "-C", r.flow.congestion_control or self.cc or "cubic"]
        else:
            rate_bps = r.segment.rate_mbit * 1e6 / self.T
            argv += ["-u", "-b", f"{rate_bps:.0f}", "-l", str(UDP_PAYLOAD_BYTES)]
        return argv

    def stop(self) -> None:
        """Stop scheduling; end clients still running (training ended first) and let their
        servers write what they received."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        from geodc.emulation.procs import stop_all
        # servers whose client never started: at once, all together
        stop_all([r.server for r in self.running if r.client is None])
        for r in self.running:
            if r.client is not None and r.client.poll() is None:
                r.cut_short = True
                r.client.stop(grace_s=2.0)
        for r in self.running:
            if r.server.poll() is None:
                try:
                    r.server.wait(3.0)   # its report, written once the client has gone
                except TimeoutError:
                    r.server.stop()

    def results(self) -> list[dict[str, Any]]:
        """Per entry: what was configured, when it ran, the receiver's goodput (Mbit/s in
        configured units; mean over the time it ran, and per INTERVAL_S), TCP retransmits or
        UDP loss."""
        out = []
        for flow in self.flows:
            mine = [r for r in self.running if r.flow is flow]
            intervals: list[list[float]] = []
            received = 0
            ran_s = 0.0
            retransmits: int | None = 0
            lost = packets = 0
            errors = []
            for r in mine:
                if r.client is None:
                    errors.append(f"port {r.port}: never started (training ended first)")
                    continue
                doc = _json_doc(r.server.output(1 << 22))
                # a client ended early (training finished first) leaves its server's report
                # whole, with "error": "the client has terminated"
                if doc is None or ("error" in doc and not (r.cut_short and doc.get("intervals"))):
                    errors.append(f"port {r.port}: {(doc or {}).get('error', 'no report')}")
                    continue
                for iv in doc.get("intervals", []):   # the receiver's, each INTERVAL_S
                    s = iv["sum"]
                    t = r.started_s + s["start"] / self.T
                    intervals.append([round(t, 3), round(s["bits_per_second"] * self.T / 1e6, 3)])
                    received += int(s.get("bytes", 0))
                    ran_s += float(s.get("seconds", 0.0)) / self.T
                end = doc.get("end", {})
                udp = end.get("sum") or {}          # UDP: the receiver's loss count
                lost += int(udp.get("lost_packets", 0) or 0)
                packets += int(udp.get("packets", 0) or 0)
                client = _json_doc(r.client.output(1 << 22)) or {}
                sent = (client.get("end") or {}).get("sum_sent")
                if sent is None or retransmits is None:   # cut short: no sender's total
                    retransmits = None
                else:
                    retransmits += int(sent.get("retransmits", 0) or 0)
            entry = {"what": flow.describe(), "label": flow.label, "from": flow.src,
                     "to": flow.dst, "kind": flow.kind, "start_s": flow.start_s,
                     "stop_s": flow.stop_s,
                     "started_s": min((r.started_s for r in mine if r.started_s is not None),
                                      default=None),
                     "cut_short": any(r.cut_short for r in mine) or any(r.client is None
                                                                      for r in mine),
                     "goodput_mbit": round(received * 8 / 1e6 / ran_s, 3) if ran_s else None,
                     "received_bytes": received, "intervals_mbit": intervals}
            if flow.kind == "tcp":
                entry.update(flows=flow.flows, congestion_control=flow.congestion_control
                             or self.cc, retransmits=retransmits)
            else:
                entry.update(rate_mbit=[s.rate_mbit for s in flow.segments],
                             lost_packets=lost, packets=packets,
                             lost_pct=round(100 * lost / packets, 3) if packets else None)
            if errors:
                entry["errors"] = errors
            out.append(entry)
        return out


def _json_doc(text: str) -> dict | None:
    try:
        return json.loads(text[text.index("{"):])
    except ValueError:
        return None


def summary_lines(entries: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in entries:
        extra = ((f", {e['retransmits']} retransmits" if e["retransmits"] is not None
                  else ", retransmits unknown (cut short)") if e["kind"] == "tcp"
                 else f", {e['lost_pct']}% lost" if e.get("lost_pct") is not None else "")
        good = "n/a" if e["goodput_mbit"] is None else f"{e['goodput_mbit']:.1f} Mbit/s"
        out.append(f"cross-traffic {e['what']}: goodput {good}{extra}"
                   + (" (cut short: training ended first)" if e["cut_short"] else "")
                   + (f"; {'; '.join(e['errors'])}" if e.get("errors") else ""))
    return out
