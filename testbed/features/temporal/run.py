"""Atlas's temporal WAN sharing put into effect on a running network, and checked on the wire.

One job: from a system's slot plan (testbed.features.temporal.plan) start one arbiter per gateway whose WAN
egress carries stage-to-stage transfers (testbed.features.temporal.arbiter: it builds the per-pipeline HTB classes
of testbed.emulation.wanshare and grants one transfer at a time per link direction, in the planned
order), a headers-only capture on each of those egress interfaces (traffic.capture), and tell
the launcher where each worker asks (`worker_extras`: GateExtras, testbed/host/extras.py). `stop()`
stops them; `results()` judges the slots against the capture: per link direction the share of each pipeline's bytes that left inside its
own slots (`slot_adherence`, the lowest pipeline's) and how far the first byte of each slot
landed from its grant (`switch_error_ms`, the median; `switch_error` has n, p90, max). A
pipeline's bytes are its transfers: packets from its hosts in the sending DC to its hosts
beyond, as the HTB filters classify them. `warnings` names every missed target.

A transfer between DCs X and Y is granted by the arbiter of the first link of its routed path
(X's gateway); later links of a multi-hop path carry it without slots (stated in the README).

`TemporalSharing` is the feature's run handle (testbed.features.base); its metrics block is the
slot plan's used links (`slot_plan`), with each link direction's judgement merged into the
system's wan_links and every missed target in its wan_warnings.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.emulation.procs import HostProcess
from testbed.features.base import FeatureHandle, MetricsBlock, RunContext
from testbed.features.temporal.arbiter import DEFAULT_PORT, read_log, specs_for_network, start_arbiters
from testbed.host.extras import Gate, GateExtras
from traffic import capture
from testbed.spec.errors import ScenarioError, TestbedError
from testbed.spec.links import LinkDir

if TYPE_CHECKING:
    from testbed.emulation.network import Network
    from testbed.plans.placement import Placement
    from testbed.plans.workers import WorkerSlot
    from testbed.features.temporal.plan import SlotPlan, TemporalPlan

READY_TIMEOUT_S = 10.0
ADHERENCE_TARGET = 0.95     # share of a pipeline's bytes inside its own slots
SWITCH_TARGET_MS = 1.0      # median |first byte of a slot on the wire - its grant|


class TemporalSharing(FeatureHandle):
    name = "temporal"

    def __init__(self, net: "Network", plan: "SlotPlan", placement: "Placement",
                 run_dir: Path) -> None:
        self.net = net
        self.plan = plan
        self.run_dir = run_dir
        self.links = {str(lp.direction): lp for lp in plan.used_links()}
        pipelines = {d: [row[d] for row in placement.hosts] for d in range(placement.replicas)}
        order = {link: [s.pipeline for s in lp.order] for link, lp in self.links.items()}
        specs = specs_for_network(net.plan, pipelines, order, port=DEFAULT_PORT,
                                  log_dir=run_dir / "slots")
        for spec in specs.values():   # only the link directions that carry transfers
            spec.links = [x for x in spec.links if x.link in self.links]
        self.specs = {gw: s for gw, s in specs.items() if s.links}
        self.intf = {x.link: x.intf for s in self.specs.values() for x in s.links}
        self.gateway = {x.link: gw for gw, s in self.specs.items() for x in s.links}
        self.arbiters: dict[str, HostProcess] = {}
        self.captures: dict[str, tuple[HostProcess, Path]] = {}

    def start(self) -> "TemporalSharing":
        (self.run_dir / "slots").mkdir(parents=True, exist_ok=True)
        self.arbiters = start_arbiters(self.net, self.specs, realtime=self.net.realtime)
        for link, intf in self.intf.items():
            out = self.run_dir / "slots" / f"{link.replace('->', '-to-')}.cap"
            proc = self.net.spawn(self.gateway[link], [sys.executable, "-m", "traffic.capture",
                                                       "--iface", intf, "--out", str(out),
                                                       "--min-length",
                                                       str(capture.DATA_MIN_LENGTH)],
                                  self.run_dir / "logs" / f"{self.gateway[link]}-capture.log")
            self.captures[link] = (proc, out)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for link, (proc, _) in self.captures.items():
            while not re.search(r"^ready$", proc.output(), re.MULTILINE):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise TestbedError(f"capture on {self.intf[link]} did not start: "
                                       f"{proc.output().strip()}")
                time.sleep(0.02)
        return self

    def gate_for(self, src_dc: str, dst_dc: str, replica: int) -> Gate | None:
        """Where a worker in src_dc asks before each message to dst_dc (None: same DC)."""
        if src_dc == dst_dc:
            return None
        from testbed.plans.systems import path_between
        path = path_between(self.net.scenario, src_dc, dst_dc).dcs
        link = LinkDir(path[0], path[1])
        if str(link) not in self.links:
            return None
        spec = self.specs[self.gateway[str(link)]]
        return Gate(ip=spec.listen_ip, port=spec.port, link=link, pipeline=replica)

    def worker_extras(self, slot: "WorkerSlot") -> GateExtras | None:
        """The arbiters a worker asks before its messages to prev and next (None: neither
        crosses a slotted link)."""
        gates = {key: None if nb is None else self.gate_for(slot.dc, nb.dc, slot.replica)
                 for key, nb in (("prev", slot.prev), ("next", slot.next))}
        return None if gates["prev"] is None and gates["next"] is None else GateExtras(**gates)

    def stop(self) -> None:
        """Stop the captures, then the arbiters (they put the plain HTB tree back)."""
        for proc, _ in self.captures.values():
            proc.stop(grace_s=5.0)
        for proc in self.arbiters.values():
            proc.stop(grace_s=5.0)

    def results(self, *, partial: bool, spans=()) -> MetricsBlock | None:
        """After stop(): the used links of the slot plan, each link direction's judgement
        (judged) and its warnings; None for a run that stopped early (nothing judged)."""
        if partial:
            return None
        links = self.judged()
        return MetricsBlock(key="slot_plan", value=[lp.to_dict() for lp in self.plan.used_links()],
                            wan_links=links, warnings=warnings(links))

    def judged(self) -> dict[str, dict]:
        """Per link direction, after stop(): the arbiter's slots judged against the capture.
        A link whose files cannot be read gets {"error": ...} instead of failing the run."""
        out: dict[str, dict] = {}
        for link in self.captures:
            try:
                out[link] = self._judge(link)
            except (OSError, ValueError, KeyError) as exc:
                out[link] = {"slot_adherence": None, "switch_error_ms": None,
                             "error": f"{type(exc).__name__}: {exc}"}
        return out

    def _judge(self, link: str) -> dict:
        proc, cap_path = self.captures[link]
        spec = self.specs[self.gateway[link]]
        ls = next(x for x in spec.links if x.link == link)
        # this link's pipelines: a pipeline's packets are those from its hosts here to its
        # hosts beyond (its transfers), as the HTB filters classify them
        pair = {(src, dst): d for d, srcs in ls.pipelines.items() for src in srcs
                for dst in ls.peers.get(d, [])}
        by_ip = {ip: d for d, ips in ls.pipelines.items() for ip in ips}
        slots = [s for s in read_log(spec.log_path) if s["link"] == link]
        packets = [p for p in capture.load(cap_path)
                   if p.outgoing and (p.src, p.dst) in pair]
        by_pipe = capture.slot_adherence(packets, slots, by_ip)
        switch = capture.switch_errors_ms(packets, slots, by_ip)
        activate = [s["activate_ms"] for s in slots if s.get("activate_ms") is not None]
        over, handover = slot_overheads_ms(slots, ls.rate_mbit)
        return {
            "slot_adherence": round(min(by_pipe.values()), 4) if by_pipe else None,
            "slot_adherence_by_pipeline": {str(d): round(v, 4) for d, v in by_pipe.items()},
            "switch_error_ms": None if switch["median_ms"] is None
            else round(switch["median_ms"], 3),
            "switch_error": {k: (round(v, 3) if isinstance(v, float) else v)
                             for k, v in switch.items() if k != "errors_ms"},
            "slots": len(slots),
            "slot_ends": _count(s.get("reason") for s in slots),
            "activate_ms_median": round(statistics.median(activate), 3) if activate else None,
            "slot_over_wire_ms_median": None if over is None else round(over, 3),
            "handover_ms_median": None if handover is None else round(handover, 3),
            "capture": dict(_summary(proc.output()), packets_judged=len(packets)),
        }


def slot_overheads_ms(slots: list[dict], rate_mbit: float) -> tuple[float | None, float | None]:
    """What the arbiter's turn-taking adds per slot, in the network's ms (medians): how long a
    slot was held past its granted bytes' time at the link's rate (grant to the client's first
    packet, the slot end's detection), and the hand-over (a slot's end to the next grant, when a
    request was already waiting: the switch of the HTB tree). A real Atlas scheduler has its
    own costs here; these are the emulation's."""
    done = sorted((s for s in slots
                   if s.get("t_grant") is not None and s.get("t_end") is not None),
                  key=lambda s: s["t_grant"])
    over = [(s["t_end"] - s["t_grant"]) / 1e6 - s["expected_bytes"] * 8 / (rate_mbit * 1e3)
            for s in done if s.get("expected_bytes")]
    gaps = [(b["t_grant"] - a["t_end"]) / 1e6 for a, b in zip(done, done[1:])
            if b["t_request"] < a["t_end"]]
    return (statistics.median(over) if over else None,
            statistics.median(gaps) if gaps else None)


def warnings(links: dict[str, dict]) -> list[str]:
    """One line per link direction that missed a target: slot adherence >= 95%, median switch
    error <= 1 ms, a complete capture."""
    out = []
    for key, v in links.items():
        if v.get("error"):
            out.append(f"warning: slots on {key} not judged: {v['error']}")
        if v.get("slot_adherence") is not None and v["slot_adherence"] < ADHERENCE_TARGET:
            out.append(f"warning: slots on {key}: only {v['slot_adherence']:.1%} of a pipeline's "
                       f"bytes left inside its own slots (target {ADHERENCE_TARGET:.0%})")
        if v.get("switch_error_ms") is not None and v["switch_error_ms"] > SWITCH_TARGET_MS:
            out.append(f"warning: slots on {key}: median switch error {v['switch_error_ms']:.2f} "
                       f"ms (target {SWITCH_TARGET_MS:g} ms)")
        drops = (v.get("capture") or {}).get("kernel_drops")
        if drops:
            out.append(f"warning: the capture on {key} lost {drops} packets: its adherence "
                       "counts only what it saw")
    return out


def _summary(output: str) -> dict:
    """The capture's last JSON line (packets, bytes, kernel drops), or {}."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return {}
    return {}


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def start(net: "Network", plan: "SlotPlan", placement: "Placement",
          run_dir: Path) -> TemporalSharing:
    sharing = TemporalSharing(net, plan, placement, run_dir)
    try:
        return sharing.start()
    except BaseException:
        sharing.stop()   # what started; the network's teardown ends the rest
        raise


def start_feature(plan: "TemporalPlan", ctx: RunContext) -> TemporalSharing:
    """The feature's start (testbed.features.temporal.feature): on the delayline backend only."""
    if ctx.net.backend != "delayline":
        # the temporal tree replaces the link's HTB leaf, where netem would hold the delay
        raise ScenarioError("backend", f"{ctx.job.system.name} (temporal WAN sharing) runs on "
                            "the delayline backend only", "set backend: delayline")
    return start(ctx.net, plan.slots, ctx.job.placement, ctx.sys_dir)
