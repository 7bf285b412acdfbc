"""The jobs run_testbed.py runs: each loads a scenario, makes a run folder, builds the network,
does its work, tears down (always), and returns the run folder.

One job per function; the work itself lives in testbed.calibrate and trainer/.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from testbed.calibrate import Settings, calibrate, table
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
    write_json(run_dir / "env.json", provenance())
    return run_dir


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
        print(f"network up in {net.timings_s['up']:.2f} s (backend {net.backend}, "
              f"{len(scenario.host_names())} hosts, {len(scenario.wan)} WAN links)", flush=True)
        doc = calibrate(net, Settings(seconds=seconds, streams=streams),
                        progress=lambda line: print(line, flush=True))
    doc["timings_s"] = {k: round(v, 3) for k, v in net.timings_s.items()}
    write_json(run_dir / "calibration.json", doc)
    print(table(doc))
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
    from trainer.metrics import compute_metrics
    from trainer.timeline_plot import plot_timeline

    scenario, cfg, systems = load_run(scenario_path, systems=systems, iterations=iterations)
    run_dir = _prepare(scenario, out_dir)
    doc = {"scenario": scenario.name, "compute": cfg.compute, "schedule": cfg.schedule,
           "scale": scenario.scale, "run_dir": str(run_dir), "systems": {}}
    with Network(scenario, run_dir, backend=backend) as net:
        doc["backend"] = net.backend
        print(f"network up in {net.timings_s['up']:.2f} s (backend {net.backend}, "
              f"{len(scenario.host_names())} hosts, {len(scenario.wan)} WAN links)", flush=True)
        hosts = [HostInfo(name=h.name, ip=h.ip, dc=h.dc) for h in net.plan.hosts]
        for name in systems:
            print(f"training ({name}): P={cfg.stages} D={cfg.replicas} M={cfg.micro_batches} "
                  f"{cfg.schedule}, {cfg.iterations} iterations, compute={cfg.compute}", flush=True)
            sys_dir = run_dir / name
            run = launch(cfg, hosts, sys_dir, net, scale=scenario.scale,
                         progress=lambda line: print("  " + line, flush=True))
            net.check()
            metrics = compute_metrics(sys_dir)
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
    doc["timings_s"] = {k: round(v, 3) for k, v in net.timings_s.items()}
    return write_json(run_dir / "metrics.json", doc)
