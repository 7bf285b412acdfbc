"""Train one system (geodc.plans.systems) on a fresh emulated network and return its metrics block.

One job: put a system's choices into effect for one run. Placement (geodc.plans.placement) decides
which host runs every stage replica; K (geodc.plans.systems.connections_for) how many TCP
connections each stage-to-stage channel stripes over; for temporal sharing, geodc.features.temporal.run
starts the per-link arbiters and captures from the slot plan (geodc.features.temporal.plan) and the workers
ask them for every cross-DC message. The training itself is geodc.run.launch's; the figures are
geodc.rules.figures', with the WAN's (delay-line counters, link utilization, slot adherence) added.

Run folder: <run>/<system>/ holds the network's logs, the trainer's records (geodc/run/launch.py),
placement.json, slot_plan.json and, for temporal systems, the arbiters' slot logs and captures.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from geodc.host.realtime import PRIORITY
from geodc.features.bubbletea import run as bubbletea
from geodc.analysis import linkuse
from geodc.emulation import report
from geodc.features.temporal import run as temporal
from geodc.emulation import wanstats
from geodc.analysis.allreduce import allreduce_report
from geodc.spec.errors import ScenarioError, TestbedError
from geodc.features.faults.run import FaultRunner, after_fault
from geodc.analysis.faultplot import plot_faults
from geodc.features.cross.run import CrossTraffic
from geodc.features.cross.metrics import summary_lines as cross_summary
from geodc.emulation.machine import CpuTimes
from geodc.emulation.network import Network
from geodc.plans.placement import place_for_system
from geodc.emulation.results import write_json, write_text
from geodc.features.temporal.plan import plan_slots
from geodc.features.checks import check_faults
from geodc.plans.timeouts import timeouts_for
from geodc.plans.systems import arrival_bounds_hold, connections_for, host_path_rate_mbit
from geodc.spec.systems import System


if TYPE_CHECKING:
    from geodc.spec.scenario import Scenario
    from geodc.spec.training import TrainConfig


def run_system(scenario: "Scenario", cfg: "TrainConfig", system: System, run_dir: Path, *,
               backend: str | None, progress: Callable[[str], None],
               timeout_s: float | None = None) -> dict:
    from geodc.run.launch import HostInfo, launch
    from geodc.host.spans import read_jsonl
    from geodc.rules.figures import in_real_time, metrics_from_records
    from geodc.analysis.metrics import congestion_control_in_use
    from geodc.analysis.timeline_plot import plot_timeline, timeline_extras

    placement = place_for_system(scenario, cfg, system)
    prediction = None
    if cfg.compute == "profile":   # the model's, for the limits now and the check at the end
        from geodc.predict.predict import predict
        prediction = predict(scenario, cfg, system, cfg.iterations)
    limits = timeouts_for(cfg, None if prediction is None else prediction.iteration_time_s,
                          timeout_s)
    placed = replace(cfg, placement=placement.hosts, placement_dcs=None)
    slots = plan_slots(scenario, placed, placement, system)
    sys_dir = run_dir / system.name
    sys_dir.mkdir(parents=True)
    write_json(sys_dir / "placement.json", placement.to_dict())
    write_json(sys_dir / "slot_plan.json", slots.to_dict())
    T = scenario.time_scale
    emulated = scenario.emulated()   # the rates the network shapes
    why_not = arrival_bounds_hold(scenario) if system.fill_bubbles else None
    arrival = ("off" if not system.fill_bubbles or not scenario.bubbletea.arrival_bound else
               "on" if why_not is None else f"off: {why_not}")   # BubbleTea's arrival bound
    check_faults(scenario, system)   # load_run checked it too; a caller may not have
    runner = cross = None
    up = False            # past the build: a failure from here on leaves partial results
    stopped_s = None      # when the failure was first seen, on the faults' clock
    try:
        with Network(scenario, sys_dir, backend=backend,
                     run_id=f"{run_dir.name}-{system.name}") as net:
            up = True
            record = report.announce(net, sys_dir, indent="  ")
            if system.temporal and net.backend != "delayline":
                # the temporal tree replaces the link's HTB leaf, where netem would hold the delay
                raise ScenarioError("backend", f"{system.name} (temporal WAN sharing) runs on "
                                    "the delayline backend only", "set backend: delayline")
            hosts = [HostInfo(name=h.name, ip=h.ip, dc=h.dc) for h in net.plan.hosts
                     if h.role == "train"]
            net.wan_stats()  # start this system's interval of WAN packet counts
            cpu_before = CpuTimes.now()
            sharing = temporal.start(net, slots, placement, sys_dir) if system.temporal else None
            prefill = inbound = None
            try:
                if system.fill_bubbles:
                    prefill = bubbletea.start(net, scenario, cfg, placement, sys_dir, system.name)
                    if arrival == "on":
                        inbound = lambda a, b: host_path_rate_mbit(emulated, a, b)  # noqa: E731
                    elif arrival != "off":
                        progress(f"bubbletea: no arrival bound ({why_not}: bytes can come "
                                 f"faster than the configured rates)")
                    progress(f"bubbletea: {prefill.load['kept']} requests over "
                             f"{', '.join(f'{dc} {len(r)}' for dc, r in prefill.load['per_dc'].items())}"
                             f" ({prefill.load['refused']} refused, {prefill.load['truncated']} "
                             f"truncated to {prefill.load['context_tokens']} tokens)")
                if scenario.cross_traffic:   # receivers up before t = 0
                    cross = CrossTraffic(net, scenario.cross_traffic, sys_dir / "logs", T,
                                         scenario.congestion_control).prepare()
                if scenario.faults or scenario.cross_traffic:
                    runner = FaultRunner(net, scenario.faults, T,
                                         sample_links=cross_links(scenario)).start()
                    if scenario.faults:
                        progress(f"faults: {len(runner.events)} events, the first at "
                                 f"{runner.events[0].at_s:g} s")
                if cross is not None:        # one t = 0 with the faults: the trainers' start
                    cross.start(runner.mono0)
                    progress(f"cross-traffic: {len(scenario.cross_traffic)} tenants")
                try:
                    run = launch(placed, hosts, sys_dir, net, scale=scenario.scale,
                                 progress=progress, time_scale=T, timeout_s=limits.run_s * T,
                                 connect_timeout_s=limits.peer_s * T,  # also gloo's timeout
                                 congestion_control=scenario.congestion_control,
                                 connections=lambda a, b: connections_for(scenario, system, a, b),
                                 gate=None if sharing is None else sharing.gate_for,
                                 io_priority=PRIORITY["worker_io"] if net.realtime else None,
                                 gpu_share=None if prefill is None else prefill.gpu_share,
                                 inbound_rate=inbound)
                except BaseException:
                    stopped_s = None if runner is None else round(runner.now_s(), 3)
                    raise
            finally:
                try:
                    if cross is not None:
                        cross.stop()
                finally:
                    try:
                        if runner is not None:
                            runner.stop()
                    finally:
                        if sharing is not None:
                            sharing.stop()
                        crashed = prefill.crashed() if prefill is not None else []
                        prefill_cpu = prefill.cpu_seconds() if prefill is not None else {}
                        if prefill is not None:
                            prefill.stop()
            shared = sharing.results() if sharing is not None else {}
            net.check()
            wan_links = net.wan_stats()
    except (TestbedError, KeyboardInterrupt) as exc:
        if not up:           # the network was never built: nothing ran, nothing to keep
            raise
        if runner is not None:
            runner.stop()    # idempotent: its threads are gone before its results are read
        if stopped_s is None and runner is not None:
            stopped_s = round(runner.now_s(), 3)
        # Partial results, written and marked incomplete, before the error goes on; the plot
        # after, so a second Ctrl-C during it cannot lose them.
        why = "interrupted (Ctrl-C, SIGTERM or SIGHUP)" if isinstance(exc, KeyboardInterrupt) else \
            after_fault(runner, str(exc))
        partial = partial_metrics(sys_dir, system.name, cfg, why,
                                  None if runner is None else runner.results(),
                                  None if cross is None else cross.results())
        partial["stopped_s"] = stopped_s   # on the faults' clock: how soon it was seen
        write_json(sys_dir / "metrics.json", partial)
        if "faults" in partial:
            partial["faults"]["plot_png"] = str(plot_faults(
                partial["faults"], sys_dir / "wire.png", system.name,
                partial.get("cross_traffic") or []))
            write_json(sys_dir / "metrics.json", partial)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise RunIncomplete(why, partial) from exc
    faults = None if runner is None else runner.results()
    cross_results = None if cross is None else cross.results()
    spans = list(read_jsonl(run.spans_path))   # read once: the metrics and the links' use
    metrics = metrics_from_records(spans, list(read_jsonl(run.loss_path)),
                                   json.loads(run.plan_path.read_text()))
    used = metrics["iterations_averaged"]
    # the measured iterations' summed walls, in emulated seconds (before in_real_time)
    use = linkuse.utilization(spans, placement, scenario, used,
                              metrics["iteration_time_s"] * len(used))
    # every link direction: the delay line's counters (if any), the training's use, the slots
    wan_links = {key: dict(wan_links.get(key, {}), **use[key], **shared.get(key, {}))
                 for key in use}
    ar = allreduce_report(spans, placement, scenario, used, T)
    metrics = in_real_time(metrics, T)
    metrics.update(
        system=system.name,
        choices={"placement": placement.policy, "placement_source": placement.source,
                 "connections": system.connections, "wan_sharing": system.wan_sharing},
        placement=placement.to_dict(),
        connections={f"{x}->{y}": connections_for(scenario, system, x, y)
                     for a, b in sorted({p for row in placement.boundaries() for p in row})
                     if a != b for x, y in ((a, b), (b, a))},
        slot_plan=[lp.to_dict() for lp in slots.used_links()] if system.temporal else [],
        wan_links=wan_links, network=record, allreduce=ar,
        cpu=cpu_before.usage(CpuTimes.now()),
        congestion_control=dict(net.congestion_control,
                                in_use=congestion_control_in_use(run.spans_path)),
        transport_io_realtime=sorted({x for r in spans if r["name"] == "SETUP"
                                      for x in r.get("io_realtime", [])}),
        allreduce_io_realtime=sorted({r["allreduce_realtime"] for r in spans
                                      if r["name"] == "SETUP" and r.get("allreduce_realtime")}),
        wall_s=round(run.wall_s, 3), timeouts=limits.to_dict(), complete=True,
        timings_s={k: round(v, 3) for k, v in net.timings_s.items()})
    lossy = {f"{x}->{y}" for f in scenario.faults if f.kind in ("loss", "link_down")
             for x, y in (f.link, f.link[::-1])}
    metrics["wan_warnings"] = (wanstats.warnings({k: v for k, v in wan_links.items()
                                                  if "packets" in v}, scenario.wan, lossy)
                               + temporal.warnings(shared))
    extra = shown_iteration = None
    if prefill is not None:
        from geodc.rules.bubbletea_figures import bubbletea_metrics
        records = list(read_jsonl(prefill.merge_records()))
        metrics["bubbletea"] = bubbletea_metrics(spans, records, time_scale=T,
                                                 load={k: v for k, v in prefill.load.items()
                                                       if k != "per_dc"},
                                                 crashed=crashed)
        metrics["bubbletea"]["cpu_s"] = prefill_cpu
        metrics["bubbletea"]["arrival_bound"] = arrival
        extra = timeline_extras(records)
        filled = metrics["bubbletea"]["iterations"]    # draw one the prefills could fill
        shown_iteration = filled[len(filled) // 2]
    if cross_results is not None:
        metrics["cross_traffic"] = cross_results
    if faults is not None:
        metrics["faults"] = faults
        metrics["faults"]["plot_png"] = str(plot_faults(faults, sys_dir / "wire.png",
                                                        f"{scenario.name} {system.name}",
                                                        cross_results or []))
    if prediction is not None:    # after the bubbletea block: compared too
        from geodc.analysis.model_check import compare
        metrics["model"] = compare(prediction, metrics)
        if scenario.faults or scenario.cross_traffic:
            metrics["model"]["left_out"] = "the scenario's faults and cross-traffic"
    metrics["timeline_png"] = str(plot_timeline(run.spans_path, sys_dir / "timeline.png",
                                                title=f"{scenario.name} {system.name}",
                                                extra_spans=extra, iteration=shown_iteration))
    from geodc.analysis.trace import trace_events
    slot_logs = [r for log in sorted((sys_dir / "slots").glob("*-arbiter.jsonl"))
                 for r in read_jsonl(log)]
    metrics["trace_json"] = str(write_json(sys_dir / "trace.json", trace_events(
        spans, extra or [], slot_logs, time_scale=T, title=f"{scenario.name} {system.name}")))
    write_json(sys_dir / "metrics.json", metrics)   # this system's block, kept if a later fails
    return metrics


def cross_links(scenario: "Scenario") -> tuple[tuple[str, str], ...]:
    """The WAN links (as the wan section names them) that carry cross-traffic."""
    return tuple(sorted({(w.a, w.b) for f in scenario.cross_traffic for w in scenario.wan
                         if {w.a, w.b} == {f.src, f.dst}}))


class RunIncomplete(TestbedError):
    """A system's run stopped before the end; .partial is its metrics block (complete: false),
    already written to <system>/metrics.json."""

    def __init__(self, message: str, partial: dict) -> None:
        super().__init__(message)
        self.partial = partial


def partial_metrics(sys_dir: Path, system: str, cfg: "TrainConfig", error: str,
                    faults: dict | None, cross: list | None = None) -> dict:
    """What a run that stopped early leaves: the iterations the last stage finished and their
    loss, the trainers' spans merged (for a look in trace viewers), the faults applied."""
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
    out = {"system": system, "complete": False, "error": error,
           "iterations_done": len(losses), "iterations_planned": cfg.iterations,
           "loss": [losses[i] for i in sorted(losses)]}
    if cross is not None:
        out["cross_traffic"] = cross
    if faults is not None:
        out["faults"] = faults
    return out


def fault_lines(faults: dict | None) -> list[str]:
    """One line per fault event: when it was due, applied and seen on the wire."""
    out = []
    for ev in (faults or {}).get("events", []):
        if ev.get("error"):
            out.append(f"fault {ev['what']}: not applied: {ev['error']}")
            continue
        took = ev.get("took_effect_s")
        out.append(f"fault {ev['what']}: applied at {ev['applied_s']:.3f} s, on the wire at "
                   + ("n/a" if took is None else f"{took:.3f} s") +
                   (f" ({ev['note']})" if ev.get("note") else ""))
    return out


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
             f"bubble {metrics['bubble_fraction']:.2f}, "
             f"GPU utilization {metrics['gpu_utilization']:.2f}, "
             f"loss {metrics['loss'][0]:.3f} -> {metrics['loss'][-1]:.3f}"]
    used = [(k, v) for k, v in metrics["wan_links"].items() if v.get("training_bytes")]
    if used:
        lines.append("WAN utilization (training): " + ", ".join(
            f"{k} {v['utilization']:.0%}" + (f" (slot adherence {_pct(v['slot_adherence'])}, "
                                               f"median switch error {_ms(v['switch_error_ms'])})"
                                               if "slot_adherence" in v else "")
            for k, v in used))
    bt = metrics.get("bubbletea")
    if bt is not None:
        pf = bt["prefill"]
        lines.append(f"bubbletea: GPU utilization {bt['gpu_utilization']:.1%} (training "
                     f"{bt['training_only']:.1%} + prefill {bt['prefill_share']:.1%}), "
                     f"{pf['requests_per_s']:.1f} requests/s, "
                     f"{pf['prompt_tokens_per_s']:.0f} prompt tokens/s, TTFT p50 "
                     f"{_ms(pf['ttft_ms']['p50'])} p99 {_ms(pf['ttft_ms']['p99'])}, KV p50 "
                     f"{_ms(pf['kv_transfer_ms']['p50'])}, deadline misses "
                     f"{pf['deadline_misses']}, training waited for prefill "
                     f"{bt['gpu_wait']['count']}x ({bt['gpu_wait']['total_ms']:.1f} ms), "
                     f"overlaps {bt['overlap']['count']}")
        if bt["crashed"]:
            lines.append("warning: BubbleTea processes died during training (training went "
                         "on): " + "; ".join(bt["crashed"]))
    lines += fault_lines(metrics.get("faults"))
    lines += cross_summary(metrics.get("cross_traffic") or [])
    if metrics.get("model"):
        from geodc.analysis.model_check import summary_line
        lines.append(summary_line(metrics["model"]))
    if metrics.get("allreduce"):
        lines.append("all-reduce (median, the last replica in): " + ", ".join(
            f"stage {a['stage']} {a['measured_ms']:.1f} ms (ideal ring {a['wire_ms']:.1f} ms"
            + (f", x{a['ratio']:.2f})" if a["ratio"] else ")") for a in metrics["allreduce"]))
    lines.append(report.wan_summary({k: v for k, v in metrics["wan_links"].items()
                                     if "packets" in v}, metrics["cpu"]))
    lines += metrics["wan_warnings"]
    over = metrics.get("compute_overruns")
    if over and over["count"]:
        lines.append(f"warning: {over['count']} of {over['ops']} compute ops ran past their "
                     f"profile hold ({over['total_ms']:.1f} ms in all, max {over['max_ms']:.2f} "
                     f"ms; F {over['by_op']['F']}, B {over['by_op']['B']}, OPT "
                     f"{over['by_op']['OPT']}): the small model's CPU time exceeded the "
                     "target's GPU time there, and the run is that much slower")
    return lines
