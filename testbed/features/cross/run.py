"""Cross-traffic's run: the scenario's `cross_traffic:` flows (testbed.spec.cross) run with iperf3
between tenant hosts, started and stopped on the configured schedule, and their goodput.

Times are seconds after the run's clock's t = 0 (testbed.features.base.Clock: when the trainers
are started, the faults' t = 0 too), in the configured system's time (x time_scale on the wall
clock, as faults' are). A TCP entry is one iperf3 client with `flows` parallel
streams; a UDP one sends at rate_mbit (iperf3 -u -b), a UDP trace one client per step, back to
back. Goodput is what the tenant's receiver got (iperf3's server intervals). Training that ends
before stop_s cuts the cross-traffic short; its results say so. `CrossHandle` is the feature's
run handle (testbed.features.base): the receivers up at start, the schedule from t = 0.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.features.base import Clock, FeatureHandle, MetricsBlock, RunContext
from testbed.spec.cross import CrossFlow, Segment, tenant_host
from testbed.spec.errors import TestbedError

if TYPE_CHECKING:
    from testbed.emulation.network import Network
    from testbed.emulation.procs import HostProcess
    from testbed.features.cross.plan import CrossPlan

BASE_PORT = 5300
UDP_PAYLOAD_BYTES = 1400        # one datagram per packet at MTU 1500
INTERVAL_S = 0.5


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
    """`prepare()` (the receivers up), `start()` (the schedule from the clock's t = 0),
    `stop()` when training ends (cuts what still runs), then `results()`."""

    def __init__(self, net: "Network", flows: tuple[CrossFlow, ...], logs: Path,
                 clock: Clock | None = None, congestion_control: str | None = None) -> None:
        """clock: the run's (its own if None)."""
        self.net = net
        self.flows = flows
        self.logs = logs
        self.clock = clock if clock is not None else Clock()
        self.ts = self.clock.time_scale
        self.cc = congestion_control
        self.running: list[_Running] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def prepare(self) -> "CrossTraffic":
        """Start every receiver (iperf3 -s) and wait until each listens."""
        from testbed.emulation.tools import iperf
        port = BASE_PORT
        for flow in self.flows:
            for seg in flow.segments:
                server = self.net.spawn(tenant_host(flow.dst), iperf.server_argv(port)
                                        + ["-i", f"{self.ts.emulated_span(INTERVAL_S):g}"],
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

    def start(self) -> "CrossTraffic":
        """Run the schedule from the clock's t = 0 (now, if it has not started). prepare()
        first."""
        if not self.clock.started:
            self.clock.start()
        self._thread = threading.Thread(target=self._schedule, name="cross-traffic", daemon=True)
        self._thread.start()
        return self

    def _schedule(self) -> None:
        for r in sorted(self.running, key=lambda r: r.segment.start_s):
            wait = self.ts.emulated_span(r.segment.start_s) - self.clock.elapsed()
            if self._stop.wait(max(0.0, wait)):
                return
            r.started_s = self.clock.now_s()
            r.client = self.net.spawn(tenant_host(r.flow.src), self._client_argv(r),
                                      self.logs / f"cross-{r.flow.label}-{r.port}-client.log")

    def _client_argv(self, r: _Running) -> list[str]:
        ip = self.net.host_ip(tenant_host(r.flow.dst))
        seconds = self.ts.emulated_span(r.segment.stop_s - r.segment.start_s)
        argv = ["iperf3", "-c", ip, "-p", str(r.port), "-t", f"{seconds:.3f}", "-J",
                "-i", f"{self.ts.emulated_span(INTERVAL_S):g}"]
        if r.flow.kind == "tcp":
            argv += ["-P", str(r.flow.flows), "-C", r.flow.congestion_control or self.cc or "cubic"]
        else:
            rate_bps = self.ts.emulated_rate(r.segment.rate_mbit * 1e6)
            argv += ["-u", "-b", f"{rate_bps:.0f}", "-l", str(UDP_PAYLOAD_BYTES)]
        return argv

    def stop(self) -> None:
        """Stop scheduling; end clients still running (training ended first) and let their
        servers write what they received."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        from testbed.emulation.procs import stop_all
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
                    t = r.started_s + self.ts.real_span(s["start"])
                    intervals.append([round(t, 3),
                                      round(self.ts.real_rate(s["bits_per_second"]) / 1e6, 3)])
                    received += int(s.get("bytes", 0))
                    ran_s += self.ts.real_span(float(s.get("seconds", 0.0)))
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


class CrossHandle(FeatureHandle):
    """The tenants' flows of one system's run, on the run's clock."""

    name = "cross"
    clocked = True

    def __init__(self, plan: "CrossPlan", ctx: RunContext) -> None:
        self.ctx = ctx
        self.cross = CrossTraffic(ctx.net, plan.flows, ctx.sys_dir / "logs", ctx.clock,
                                  plan.congestion_control).prepare()   # receivers before t = 0

    def begin(self) -> None:
        self.cross.start()
        self.ctx.progress(f"cross-traffic: {len(self.cross.flows)} tenants")

    def stop(self) -> None:
        self.cross.stop()

    def results(self, *, partial: bool, spans=()) -> MetricsBlock:
        """Each flow's goodput (also for a run that stopped early: what it got so far)."""
        return MetricsBlock(key="cross_traffic", value=self.cross.results())
