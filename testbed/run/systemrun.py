"""Train one system (testbed.plans.systems) on a fresh emulated network and return its metrics block.

One job: put a system's choices into effect for one run. Placement (testbed.plans.placement) decides
which host runs every stage replica; K (testbed.plans.systems.connections_for) how many TCP
connections each stage-to-stage channel stripes over; the features the system and the scenario
switch on (testbed.features.registry: temporal sharing, BubbleTea, faults, cross-traffic, each a
pure plan and a run handle, testbed.features.base) are started around the training, give each
worker their typed extras, and add their metrics blocks. The training itself is
testbed.run.launch's; the figures are testbed.rules.figures', with the WAN's (delay-line counters,
link utilization, slot adherence, the queues' drops) and TCP's retransmissions
(testbed.emulation.losscounters, over the whole run) added.

Run folder: <run>/<system>/ holds the network's logs, the trainer's records (testbed/run/launch.py),
placement.json, slot_plan.json and, for temporal systems, the arbiters' slot logs and captures.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from testbed.analysis import linkuse
from testbed.analysis.allreduce import allreduce_report
from testbed.analysis.faultplot import plot_faults
from testbed.emulation import report, wanstats
from testbed.emulation.losscounters import add_up
from testbed.emulation.machine import CpuTimes
from testbed.emulation.network import Network
from testbed.emulation.results import write_json, write_text
from testbed.features.base import Clock, MetricsBlock, RunContext, SystemJob
from testbed.features.bubbletea.metrics import summary_lines as bubbletea_summary
from testbed.features.cross.metrics import summary_lines as cross_summary
from testbed.features.faults.metrics import summary_lines as fault_lines
from testbed.features.registry import Running, plan_all
from testbed.features.temporal.plan import plan_slots
from testbed.host.realtime import PRIORITY
from testbed.plans.placement import place_for_system
from testbed.plans.systems import connections_for
from testbed.plans.timeouts import timeouts_for
from testbed.plans.workers import HostInfo, WorkerSetup
from testbed.spec.errors import TestbedError
from testbed.spec.links import LinkDir, both
from testbed.spec.systems import System


if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario
    from testbed.spec.training import TrainConfig

def _network(scenario: "Scenario", sys_dir: Path, *, backend: str | None, run_id: str,
             cluster) -> Network:
    """The network a system trains on: on this machine, or over a cluster's servers."""
    if cluster is None:
        return Network(scenario, sys_dir, backend=backend, run_id=run_id)
    from testbed.emulation.clusternet import ClusterNetwork
    return ClusterNetwork(scenario, sys_dir, cluster, backend=backend, run_id=run_id)


def run_system(scenario: "Scenario", cfg: "TrainConfig", system: System, run_dir: Path, *,
               backend: str | None, progress: Callable[[str], None],
               timeout_s: float | None = None, cluster=None) -> dict:
    from testbed.run.launch import launch

    placement = place_for_system(scenario, cfg, system)
    prediction = None
    if cfg.compute == "profile":   # the model's, for the limits now and the check at the end
        from testbed.predict.predict import predict
        prediction = predict(scenario, cfg, system, cfg.iterations)
    limits = timeouts_for(cfg, None if prediction is None else prediction.iteration_time_s,
                          timeout_s)
    job = SystemJob(scenario=scenario, cfg=replace(cfg, placement=placement.hosts,
                                                   placement_dcs=None),
                    placement=placement, system=system)
    plans = plan_all(job)          # every feature's checks, before anything is built
    sys_dir = run_dir / system.name
    sys_dir.mkdir(parents=True)
    write_json(sys_dir / "placement.json", placement.to_dict())
    write_json(sys_dir / "slot_plan.json", plan_slots(scenario, job.cfg, placement,
                                                      system).to_dict())
    ts = scenario.dilation
    features = Running()
    up = False            # past the build: a failure from here on leaves partial results
    stopped_s = None      # when the failure was first seen, on the run's clock
    try:
        with ExitStack() as stack:
            net = stack.enter_context(_network(scenario, sys_dir, backend=backend,
                                               run_id=f"{run_dir.name}-{system.name}",
                                               cluster=cluster))
            up = True
            record = report.announce(net, sys_dir, indent="  ")
            hosts = [HostInfo(name=h.name, ip=h.ip, dc=h.dc) for h in net.plan.hosts
                     if h.role == "train"]
            net.wan_stats()  # start this system's interval of WAN packet counts
            cpu_before = CpuTimes.now()
            # Whatever happens, every started feature stops before the network goes down, in
            # today's order (cross-traffic, faults, temporal, BubbleTea: not the reverse of
            # the start order, so not one stack entry each; testbed.features.registry says why)
            stack.callback(features.stop)
            features.start(plans, RunContext(job=job, net=net, sys_dir=sys_dir,
                                             progress=progress, clock=Clock(ts)))
            try:
                run = launch(job.cfg, hosts, sys_dir, net, _worker_setup(job, limits, net),
                             features.handles, timeout_s=ts.emulated_span(limits.run_s),
                             progress=progress)
            except TestbedError as exc:
                stopped_s = features.clock_reading()
                cause = net.diagnose(exc)   # e.g. a worker's ssh ended: its server is gone
                if cause is exc:
                    raise
                raise cause from exc
            except BaseException:
                stopped_s = features.clock_reading()
                raise
            losses = net.loss_counters()   # before temporal sharing restores the plain tree
            features.stop()   # (the stack's callback finds them stopped) before the checks
            net.check()
            wan_links = net.wan_stats()
    except (TestbedError, KeyboardInterrupt) as exc:
        if not up:           # the network was never built: nothing ran, nothing to keep
            raise
        why = "interrupted (Ctrl-C, SIGTERM or SIGHUP)" if isinstance(exc, KeyboardInterrupt) \
            else features.blame(str(exc))
        partial = _write_partial(sys_dir, system.name, cfg, why, features.results(partial=True),
                                 stopped_s if stopped_s is not None else features.clock_reading())
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise RunIncomplete(why, partial) from exc
    for key, q in losses["queues"].items():
        wan_links.setdefault(key, {})["queue"] = q
    metrics = _metrics(job, sys_dir, run, features, wan_links, prediction, limits, losses=losses,
                       record=record, cpu_before=cpu_before,
                       congestion_control=net.congestion_control, timings_s=net.timings_s)
    write_json(sys_dir / "metrics.json", metrics)   # this system's block, kept if a later fails
    return metrics


def _worker_setup(job: SystemJob, limits: Any, net: Network) -> WorkerSetup:
    """How the system's workers are set up on this network (testbed.plans.workers)."""
    ts, dcs = job.scenario.dilation, job.placement.dcs_used()
    return WorkerSetup(
        scale=job.scenario.scale, time_scale=ts,
        connect_timeout_s=ts.emulated_span(limits.peer_s),   # also gloo's timeout
        congestion_control=job.scenario.congestion_control,
        io_priority=PRIORITY["worker_io"] if net.realtime else None,
        connections={LinkDir(a, b): connections_for(job.scenario, job.system, a, b)
                     for a in dcs for b in dcs},
        allreduce=job.system.allreduce)


def _write_partial(sys_dir: Path, system: str, cfg: "TrainConfig", why: str,
                   blocks: list[MetricsBlock], stopped_s: float | None) -> dict:
    """The one partial-results path: what ran, each feature's block (what it has after an
    early stop), written and marked incomplete, before the error goes on; the plot after, so a
    second Ctrl-C during it cannot lose them."""
    partial = partial_metrics(sys_dir, system, cfg, why)
    partial.update((b.key, b.value) for b in blocks)
    partial["stopped_s"] = stopped_s   # on the run's clock: how soon it was seen
    write_json(sys_dir / "metrics.json", partial)
    if "faults" in partial:
        partial["faults"]["plot_png"] = str(plot_faults(
            partial["faults"], sys_dir / "wire.png", system,
            partial.get("cross_traffic") or []))
        write_json(sys_dir / "metrics.json", partial)
    return partial


def _metrics(job: SystemJob, sys_dir: Path, run: Any, features: Running, wan_links: dict,
             prediction: Any, limits: Any, *, losses: dict, record: dict, cpu_before: CpuTimes,
             congestion_control: dict, timings_s: dict) -> dict:
    """A complete run's metrics block: the trainers' figures, the WAN's, every feature's."""
    from testbed.host.spans import read_jsonl
    from testbed.rules.figures import in_real_time, metrics_from_records
    from testbed.analysis.metrics import congestion_control_in_use
    from testbed.analysis.timeline_plot import plot_timeline, timeline_extras

    scenario, system, placement = job.scenario, job.system, job.placement
    ts = scenario.dilation
    spans = list(read_jsonl(run.spans_path))   # read once: the metrics and the links' use
    blocks = features.results(partial=False, spans=spans)
    metrics = metrics_from_records(spans, list(read_jsonl(run.loss_path)),
                                   json.loads(run.plan_path.read_text()))
    used = metrics["iterations_averaged"]
    # the measured iterations' summed walls, in emulated seconds (before in_real_time)
    use = linkuse.utilization(spans, placement, scenario, used,
                              metrics["iteration_time_s"] * len(used), system.allreduce)
    # every link direction: the delay line's counters (if any), the training's use, the slots
    shared = {key: v for b in blocks for key, v in b.wan_links.items()}
    wan_links = {key: dict(wan_links.get(key, {}), **use[key], **shared.get(key, {}))
                 for key in use}
    ar = allreduce_report(spans, placement, scenario, used, ts, system.allreduce)
    metrics = in_real_time(metrics, ts)
    metrics.update(
        system=system.name,
        choices={"placement": placement.policy, "placement_source": placement.source,
                 "connections": system.connections, "wan_sharing": system.wan_sharing,
                 "allreduce": system.allreduce},
        placement=placement.to_dict(),
        connections={str(d): connections_for(scenario, system, *d)
                     for a, b in sorted({p for row in placement.boundaries() for p in row})
                     if a != b for d in both(a, b)},
        slot_plan=[],    # (temporal sharing's block, where it runs)
        wan_links=wan_links, network=record, allreduce=ar,
        tcp=dict(add_up(losses["tcp"]), errors=losses["errors"]),
        cpu=cpu_before.usage(CpuTimes.now()),
        congestion_control=dict(congestion_control,
                                in_use=congestion_control_in_use(run.spans_path)),
        transport_io_realtime=sorted({x for r in spans if r["name"] == "SETUP"
                                      for x in r.get("io_realtime", [])}),
        allreduce_io_realtime=sorted({r["allreduce_realtime"] for r in spans
                                      if r["name"] == "SETUP" and r.get("allreduce_realtime")}),
        wall_s=round(run.wall_s, 3), timeouts=limits.to_dict(), complete=True,
        timings_s={k: round(v, 3) for k, v in timings_s.items()})
    lossy = {str(d) for f in scenario.faults if f.kind in ("loss", "link_down")
             for d in both(*f.link)}
    metrics["wan_warnings"] = (wanstats.warnings({k: v for k, v in wan_links.items()
                                                  if "packets" in v}, scenario.wan, lossy)
                               + [w for b in blocks for w in b.warnings])
    metrics.update((b.key, b.value) for b in blocks)
    if "faults" in metrics:
        metrics["faults"]["plot_png"] = str(plot_faults(metrics["faults"], sys_dir / "wire.png",
                                                        f"{scenario.name} {system.name}",
                                                        metrics.get("cross_traffic") or []))
    if prediction is not None:    # after the bubbletea block: compared too
        from testbed.analysis.model_check import compare
        metrics["model"] = compare(prediction, metrics)
        if scenario.faults or scenario.cross_traffic:
            metrics["model"]["left_out"] = "the scenario's faults and cross-traffic"
    drawn = [b for b in blocks if b.spans is not None]   # other processes' records (prefills)
    extra = timeline_extras([r for b in drawn for r in b.spans]) if drawn else None
    shown_iteration = next((b.iteration for b in blocks if b.iteration is not None), None)
    metrics["timeline_png"] = str(plot_timeline(run.spans_path, sys_dir / "timeline.png",
                                                title=f"{scenario.name} {system.name}",
                                                extra_spans=extra, iteration=shown_iteration,
                                                time_scale=ts))
    from testbed.analysis.trace import trace_events
    slot_logs = [r for log in sorted((sys_dir / "slots").glob("*-arbiter.jsonl"))
                 for r in read_jsonl(log)]
    metrics["trace_json"] = str(write_json(sys_dir / "trace.json", trace_events(
        spans, extra or [], slot_logs, time_scale=ts, title=f"{scenario.name} {system.name}")))
    return metrics


class RunIncomplete(TestbedError):
    """A system's run stopped before the end; .partial is its metrics block (complete: false),
    already written to <system>/metrics.json."""

    def __init__(self, message: str, partial: dict) -> None:
        super().__init__(message)
        self.partial = partial


def partial_metrics(sys_dir: Path, system: str, cfg: "TrainConfig", error: str) -> dict:
    """What a run that stopped early leaves: the iterations the last stage finished and their
    loss, the trainers' spans merged (for a look in trace viewers). The features' blocks are
    added after (run_system's one partial path)."""
    last = sorted(sys_dir.glob(f"loss/*s{cfg.stages - 1}r*.jsonl"))
    losses: dict[int, float] = {}
    for path in last:
        for r in _whole_records(path):
            if "iteration" in r and "loss" in r:
                losses.setdefault(int(r["iteration"]), float(r["loss"]))
    spans = [r for path in sorted(sys_dir.glob("spans/*.jsonl")) for r in _whole_records(path)]
    if spans:
        spans.sort(key=lambda r: (r.get("t_start_ns", 0), r.get("stage", 0), r.get("replica", 0)))
        write_text(sys_dir / "trainer_spans.jsonl", "".join(json.dumps(r) + "\n" for r in spans))
    return {"system": system, "complete": False, "error": error,
            "iterations_done": len(losses), "iterations_planned": cfg.iterations,
            "loss": [losses[i] for i in sorted(losses)]}


def _whole_records(path: Path) -> list[dict]:
    """A JSONL file's records, leaving out a line its killed writer left half written."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} ms"


def summary_lines(metrics: dict, cfg: "TrainConfig") -> list[str]:
    """What a person reads after each system: iteration time, utilizations, WAN."""
    whose = "target model" if cfg.compute == "profile" else "model"
    lines = [f"iteration {metrics['iteration_time_s']:.3f} s, "
             f"{metrics['tokens_per_s']:.0f} tokens/s ({whose}), "
             f"bubble {metrics['bubble_fraction']:.1%}, "
             f"GPU utilization {metrics['gpu_utilization']:.1%}, "
             f"loss {metrics['loss'][0]:.3f} -> {metrics['loss'][-1]:.3f}"]
    used = [(k, v) for k, v in metrics["wan_links"].items() if v.get("training_bytes")]
    if used:
        lines.append("WAN utilization (training): " + ", ".join(
            f"{k} {v['utilization']:.0%}" + (f" (slot adherence {_pct(v['slot_adherence'])}, "
                                               f"median switch error {_ms(v['switch_error_ms'])})"
                                               if "slot_adherence" in v else "")
            for k, v in used))
    lines += bubbletea_summary(metrics.get("bubbletea"))
    lines += fault_lines(metrics.get("faults"))
    lines += cross_summary(metrics.get("cross_traffic") or [])
    if metrics.get("model"):
        from testbed.analysis.model_check import summary_line
        lines.append(summary_line(metrics["model"]))
    if metrics.get("allreduce"):
        lines.append("all-reduce (median, the last replica in): " + ", ".join(
            f"stage {a['stage']} {a['measured_ms']:.1f} ms (ideal ring {a['wire_ms']:.1f} ms"
            + (f", x{a['ratio']:.2f})" if a["ratio"] else ")") for a in metrics["allreduce"]))
    lines.append(report.wan_summary({k: v for k, v in metrics["wan_links"].items()
                                     if "packets" in v}, metrics["cpu"]))
    lines += metrics["wan_warnings"]
    lines += loss_lines(metrics)
    over = metrics.get("compute_overruns")
    if over and over["count"]:
        lines.append(f"warning: {over['count']} of {over['ops']} compute ops ran past their "
                     f"profile hold ({over['total_ms']:.1f} ms in all, max {over['max_ms']:.2f} "
                     f"ms; F {over['by_op']['F']}, B {over['by_op']['B']}, OPT "
                     f"{over['by_op']['OPT']}): the small model's CPU time exceeded the "
                     "target's GPU time there, and the run is that much slower")
    return lines


def loss_lines(metrics: dict) -> list[str]:
    """One line when TCP retransmitted or a WAN queue dropped during the run, else none."""
    tcp = metrics.get("tcp") or {}
    drops = {k: v["queue"]["drops"] for k, v in metrics["wan_links"].items()
             if (v.get("queue") or {}).get("drops")}
    if not tcp.get("retransmitted_segments") and not drops:
        return []
    spurious = tcp.get("dsack_received_segments") or 0
    why = (f", {spurious:,} of them spurious (the receiver already had them: reordered on the "
           f"way, not lost; {tcp.get('reordering_detected', 0):,} reorderings seen)"
           if spurious else "")
    return [f"losses over the run: TCP retransmitted {tcp.get('retransmitted_segments', 0):,} "
            f"of {tcp.get('out_segments', 0):,} segments ({tcp.get('timeouts', 0):,} timeouts"
            f"{why}); WAN queue drops: "
            + (", ".join(f"{k} {n:,}" for k, n in drops.items()) or "none")]
