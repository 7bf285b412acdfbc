"""The jobs run_testbed.py runs: each loads a scenario, makes a run folder, builds the network,
does its work, tears down (always), and returns the run folder.

One job per function; the work itself lives in testbed.calibrate and trainer/.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from testbed.calibrate import Settings, calibrate, paths_table, table
from testbed import wanstats
from testbed.machine import CpuTimes
from testbed.network import Network, check_environment
from testbed.results import new_run_dir, provenance, write_json, write_text
from testbed.errors import ScenarioError
from testbed.scenario import Scenario, load_scenario

if TYPE_CHECKING:
    from trainer.config import TrainConfig


def _prepare(scenario: Scenario, out_dir: Path) -> Path:
    check_environment()
    run_dir = new_run_dir(out_dir, scenario.name)
    write_text(run_dir / "scenario.resolved.yaml", yaml.safe_dump(scenario.raw, sort_keys=False))
    return run_dir


def network_record(net: Network) -> dict:
    """How the emulated network was run: what shapes every figure of the run beside it."""
    scenario = net.scenario
    return {"backend": net.backend, "routing": scenario.routing, "scale": scenario.scale,
            "time_scale": scenario.time_scale, "congestion_control": dict(net.congestion_control),
            "delay_line_realtime": dict(net.realtime_status), "cpu_idle": net.cpu_idle}


def _network_up(net: Network, run_dir: Path) -> dict:
    """Once the network is up: env.json (machine, versions and the network's record), and one
    progress line."""
    record = network_record(net)
    write_json(run_dir / "env.json", dict(provenance(), network=record))
    print(f"network up in {net.timings_s['up']:.2f} s (backend {net.backend}, "
          f"{len(net.scenario.host_names())} hosts, {len(net.scenario.wan)} WAN links, "
          f"{net.scenario.congestion_control}, {net.scenario.routing} routing"
          + (f", time_scale {net.scenario.time_scale:g}" if net.scenario.time_scale != 1 else "")
          + ")", flush=True)
    return record


def calibrate_job(scenario_path: str, *, out_dir: Path, backend: str | None = None,
                  seconds: float = 6.0, streams: int = 4) -> Path:
    if seconds < 2:
        raise ScenarioError("--seconds", f"{seconds:g} is too short",
                            "use at least 2 (goodput is the steady state from 2 s on)")
    if streams < 1:
        raise ScenarioError("--streams", f"{streams} is not a flow count", "use 1 or more")
    scenario = load_scenario(scenario_path)
    run_dir = _prepare(scenario, out_dir)
    with Network(scenario, run_dir, backend=backend) as net:
        record = _network_up(net, run_dir)
        cpu_before = CpuTimes.now()
        doc = calibrate(net, Settings(seconds=seconds, streams=streams),
                        progress=lambda line: print(line, flush=True))
        doc["network"] = record
        doc["cpu"] = cpu_before.usage(CpuTimes.now())
    doc["timings_s"] = {k: round(v, 3) for k, v in net.timings_s.items()}
    write_json(run_dir / "calibration.json", doc)
    cc = doc["congestion_control"]
    print(f"congestion control: {cc['per_socket']} (iperf3 -C, and every host route's congctl)")
    if scenario.time_scale != 1:
        print(f"time_scale {scenario.time_scale:g}: figures in real time ({doc['figures']})")
    print(table(doc))
    print(f"paths ({scenario.routing} routing):")
    print(paths_table(doc))
    bad = [f"{p['from']}->{p['to']}" for p in doc["paths"] if not p["ok"]]
    if bad:
        print(f"warning: {len(bad)} DC pairs did not take their planned path or RTT: {', '.join(bad)}")
    for line in doc["wan_warnings"]:
        print(line)
    _steal_note(doc["wan_warnings"], doc["cpu"], indent="")
    return run_dir / "calibration.json"


SUPPORTED_SYSTEMS = ("baseline",)


def load_run(scenario_path: str, *, systems: list[str] | None = None,
             iterations: int | None = None) -> tuple[Scenario, "TrainConfig", list[str]]:
    """Everything `run` checks before building anything (also what `validate` checks):
    the scenario, its training section against its hosts, and the systems asked for."""
    from trainer.config import TrainConfig, validate_against_hosts

    scenario = load_scenario(scenario_path)
    if scenario.training is None:
        raise ScenarioError("training", f"{scenario_path} has no training section",
                            "add one (see topologies/two_dc.yaml) or use the calibrate command")
    training = dict(scenario.training)
    if iterations is not None:
        training["iterations"] = iterations
    cfg = TrainConfig.from_dict(training)
    validate_against_hosts(cfg, len(scenario.host_names()), scenario.host_names())
    systems = list(systems or scenario.systems)
    for i, name in enumerate(systems):
        if name not in SUPPORTED_SYSTEMS:
            raise ScenarioError(f"systems[{i}]", f"{name!r} is not available yet",
                                f"use {', '.join(SUPPORTED_SYSTEMS)}")
    return scenario, cfg, systems


def run_job(scenario_path: str, *, out_dir: Path, backend: str | None = None,
            systems: list[str] | None = None, iterations: int | None = None) -> Path:
    """Build the network, train once per system on it, write metrics.json and timelines."""
    from trainer.launch import HostInfo, launch
    from trainer.metrics import compute_metrics, congestion_control_in_use, in_real_time
    from trainer.timeline_plot import plot_timeline

    scenario, cfg, systems = load_run(scenario_path, systems=systems, iterations=iterations)
    run_dir = _prepare(scenario, out_dir)
    doc = {"scenario": scenario.name, "compute": cfg.compute, "schedule": cfg.schedule,
           "scale": scenario.scale, "time_scale": scenario.time_scale,
           "routing": scenario.routing, "congestion_control": scenario.congestion_control,
           "run_dir": str(run_dir), "systems": {}}
    with Network(scenario, run_dir, backend=backend) as net:
        doc["backend"] = net.backend
        doc["network"] = _network_up(net, run_dir)
        hosts = [HostInfo(name=h.name, ip=h.ip, dc=h.dc) for h in net.plan.hosts]
        for name in systems:
            print(f"training ({name}): P={cfg.stages} D={cfg.replicas} M={cfg.micro_batches} "
                  f"{cfg.schedule}, {cfg.iterations} iterations, compute={cfg.compute}", flush=True)
            sys_dir = run_dir / name
            net.wan_stats()  # start this system's interval of WAN packet counts
            cpu_before = CpuTimes.now()
            run = launch(cfg, hosts, sys_dir, net, scale=scenario.scale,
                         progress=lambda line: print("  " + line, flush=True),
                         time_scale=scenario.time_scale, timeout_s=600.0 * scenario.time_scale,
                         connect_timeout_s=60.0 * scenario.time_scale,  # also gloo's timeout
                         congestion_control=scenario.congestion_control)
            net.check()
            wan_links = net.wan_stats()
            metrics = in_real_time(compute_metrics(sys_dir), scenario.time_scale)
            metrics["wan_links"] = wan_links
            metrics["cpu"] = cpu_before.usage(CpuTimes.now())
            metrics["wan_warnings"] = wanstats.warnings(wan_links, scenario.wan)
            metrics["congestion_control"] = dict(net.congestion_control,
                                                 in_use=congestion_control_in_use(run.spans_path))
            metrics["wall_s"] = round(run.wall_s, 3)
            metrics["timeline_png"] = str(plot_timeline(run.spans_path, sys_dir / "timeline.png",
                                                        title=f"{scenario.name} {name}"))
            doc["systems"][name] = metrics
            whose = "target model" if cfg.compute == "profile" else "model"
            print(f"  iteration {metrics['iteration_time_s']:.3f} s, "
                  f"{metrics['tokens_per_s']:.0f} tokens/s ({whose}), "
                  f"bubble {metrics['bubble_fraction']:.2f}, "
                  f"GPU utilization {metrics['gpu_utilization']:.2f}, "
                  f"loss {metrics['loss'][0]:.3f} -> {metrics['loss'][-1]:.3f}", flush=True)
            print("  " + wan_summary(wan_links, metrics["cpu"]), flush=True)
            for line in metrics["wan_warnings"]:
                print("  " + line, flush=True)
            _steal_note(metrics["wan_warnings"], metrics["cpu"], indent="  ")
    doc["timings_s"] = {k: round(v, 3) for k, v in net.timings_s.items()}
    return write_json(run_dir / "metrics.json", doc)


def _steal_note(warnings: list[str], cpu: dict[str, float], indent: str) -> None:
    """Beside late-release warnings, the CPU share this VM's host took (their usual cause)."""
    if warnings and cpu["steal_pct"] > 0:
        print(f"{indent}note: this VM's host took {cpu['steal_pct']:g}% of the CPU time (steal) "
              "meanwhile; its stalls delay every process in the guest, the real-time delay "
              "lines included", flush=True)


def wan_summary(stats: dict[str, dict], cpu: dict[str, float]) -> str:
    """One line: what crossed the WAN, how late the delay lines released it, and how much CPU
    the machine's host took meanwhile (steal: a VM's stalls, which cause late releases)."""
    if not stats:
        return "wan: no delay-line counts (netem backend)"
    packets = sum(s["packets"] for s in stats.values())
    dropped = sum(sum(wanstats.dropped(s)) for s in stats.values())
    worst = max(stats.items(), key=lambda kv: kv[1]["lateness_ms"]["max"])
    return (f"wan: {packets} packets over {len(stats)} directions, {dropped} dropped; "
            f"release lateness max {worst[1]['lateness_ms']['max']:.3f} ms ({worst[0]}), "
            f"p99 up to {max(s['lateness_ms']['p99'] for s in stats.values()):.3f} ms; "
            f"CPU busy {cpu['busy_pct']:g}%, stolen by the host {cpu['steal_pct']:g}%")
