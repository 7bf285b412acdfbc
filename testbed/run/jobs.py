"""The jobs run_testbed.py runs: each loads a scenario, makes a run folder, builds the network,
does its work, tears down (always), and returns the run folder.

One job per function; the work itself lives in testbed.run.calibrate and trainer/.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.emulation import interrupts

from testbed.emulation import report
from testbed.run.calibrate import Settings, calibrate, paths_table, table
from testbed.spec.links import LinkDir
from testbed.emulation.machine import CpuTimes
from testbed.emulation.network import Network, check_environment
from testbed.emulation.registry import live_runs
from testbed.emulation.results import new_run_dir, provenance, write_json, write_text
from testbed.run.diskspace import check_room, estimate_bytes
from testbed.run.repeats import combine
from testbed.features.checks import load_run
from testbed.spec.scenario import Scenario, load_scenario
from testbed.spec.systems import get_system
from testbed.spec.yamlfile import dump_yaml

if TYPE_CHECKING:
    from testbed.run.progress import Progress


def _prepare(scenario: Scenario, out_dir: Path) -> Path:
    check_environment()
    run_dir = new_run_dir(out_dir, scenario.name)
    write_text(run_dir / "scenario.resolved.yaml", dump_yaml(scenario.raw))
    return run_dir


def calibrate_job(scenario_path: str, *, out_dir: Path, backend: str | None = None,
                  seconds: float = 6.0, streams: int = 4, cluster=None) -> Path:
    scenario = load_scenario(scenario_path)
    scenario.check_emulable()
    if scenario.time_scale_auto:   # the T a run of it would take (its training sizes it)
        from testbed.run.autoscale import resolve
        scenario, _ = resolve(*load_run(scenario_path)[:2])
    run_dir = _prepare(scenario, out_dir)
    other_runs = live_runs()   # their load on the machine skews the measurements
    if cluster is None:
        net = Network(scenario, run_dir, backend=backend)
    else:   # DCs on the cluster file's servers (testbed.spec.cluster.Cluster)
        from testbed.emulation.clusternet import ClusterNetwork
        net = ClusterNetwork(scenario, run_dir, cluster, backend=backend)
    with net:
        record = report.announce(net, run_dir)   # with the servers and underlay, if a cluster
        cpu_before = CpuTimes.now()
        doc = calibrate(net, Settings(seconds=seconds, streams=streams),
                        progress=lambda line: print(line, flush=True))
        doc["network"] = record
        doc["other_runs"] = other_runs
        doc["cpu"] = cpu_before.usage(CpuTimes.now())
    doc["timings_s"] = {k: round(v, 3) for k, v in net.timings_s.items()}
    write_json(run_dir / "calibration.json", doc)
    cc = doc["congestion_control"]
    print(f"congestion control: {cc['per_socket']} (iperf3 -C, and every host route's congctl)")
    if scenario.dilation.dilated:
        print(f"time_scale {scenario.dilation}: figures in real time ({doc['figures']})")
    print(table(doc))
    print(f"paths ({scenario.routing} routing):")
    print(paths_table(doc))
    bad = [str(LinkDir(p["from"], p["to"])) for p in doc["paths"] if not p["ok"]]
    if bad:
        print(f"warning: {len(bad)} DC pairs did not take their planned path or RTT: {', '.join(bad)}")
    for line in doc["wan_warnings"]:
        print(line)
    report.steal_note(doc["wan_warnings"], doc["cpu"], indent="")
    return run_dir / "calibration.json"


def run_job(scenario_path: str, *, out_dir: Path, backend: str | None = None,
            systems: list[str] | None = None, iterations: int | None = None,
            progress: "Progress | None" = None, quiet: bool = False,
            timeout_s: float | None = None, cluster=None, repeat: int = 1) -> Path:
    """Train once per system, each on a fresh network (testbed.run.systemrun); write metrics.json
    with one block per system and, when baseline ran, each system's speedup over it.
    repeat: each system trains that many times, each on a fresh network (the first in
    RUN/SYSTEM, the others in RUN/SYSTEM/repeats/), its block their combination
    (testbed.run.repeats).
    progress: a sweep's (testbed.run.progress), else one of this run's own (none when quiet).
    cluster: a testbed.spec.cluster.Cluster to spread the DCs over its servers (None: here)."""
    from testbed.run.progress import Progress
    from testbed.analysis.reproduce import SCHEMA_VERSION
    from testbed.run.systemrun import RunIncomplete, run_system, summary_lines

    scenario, cfg, systems = load_run(scenario_path, systems=systems, iterations=iterations)
    from testbed.run.autoscale import check_after, resolve
    scenario, auto = resolve(scenario, cfg, say=print if progress is None else progress.line)
    check_room(out_dir, estimate_bytes(cfg, len(systems) * repeat))
    run_dir = _prepare(scenario, out_dir)
    other_runs = live_runs()   # their load on the machine skews this run's timings
    own = progress is None
    if progress is None:
        progress = Progress(len(systems) * cfg.iterations * repeat, quiet=quiet)
    try:
        say = progress.line
        doc = {"schema_version": SCHEMA_VERSION,
               "scenario": scenario.name, "compute": cfg.compute, "schedule": cfg.schedule,
               "scale": scenario.scale, "time_scale": scenario.time_scale,
               "routing": scenario.routing, "congestion_control": scenario.congestion_control,
               "connections": scenario.connections, "run_dir": str(run_dir), "complete": True,
               "systems": {}}
        if auto is not None:
            doc["time_scale_auto"] = auto
        # From the start, a small metrics.json that says the run has not finished: what is
        # left if the run dies where it cannot write (a full disk, SIGKILL).
        write_json(run_dir / "metrics.json", dict(doc, complete=False, stopped_at=None,
                                                  error="running (or killed)"))
        for name in systems:
            interrupts.check()
            progress.where(f"{scenario.name} {name}")
            say(f"training ({name}): P={cfg.stages} D={cfg.replicas} M={cfg.micro_batches} "
                f"{cfg.schedule}, {cfg.iterations} iterations, compute={cfg.compute}")
            try:
                blocks, folders = [], []
                for k in range(repeat):
                    where = run_dir
                    if k:
                        say(f"  repeat {k + 1} of {repeat} ({name}), on a fresh network")
                        where = run_dir / name / "repeats" / f"{run_dir.name}-r{k + 1}"
                        where.mkdir(parents=True)
                    blocks.append(run_system(scenario, cfg, get_system(name), where,
                                             backend=backend,
                                             progress=lambda line: say("  " + line),
                                             timeout_s=timeout_s, cluster=cluster))
                    folders.append(str((where / name).relative_to(run_dir)))
                metrics = blocks[0]
                if repeat > 1:
                    metrics = combine(blocks, folders)
                    write_json(run_dir / name / "metrics.json", metrics)
            except (RunIncomplete, KeyboardInterrupt) as exc:
                # the systems that finished, and this one's partial block, marked incomplete
                written = run_dir / name / "metrics.json"
                doc["systems"][name] = getattr(exc, "partial", None) or (
                    json.loads(written.read_text()) if written.exists() else
                    {"system": name, "complete": False})
                doc.update(complete=False, stopped_at=name,
                           error=str(exc) or "interrupted (Ctrl-C, SIGTERM or SIGHUP)")
                write_json(run_dir / "metrics.json", doc)
                if isinstance(exc, RunIncomplete):
                    raise RunIncomplete(f"{exc} (partial results: {run_dir / 'metrics.json'})",
                                        exc.partial) from exc
                raise
            doc["systems"][name] = metrics
            doc["backend"] = metrics["network"]["backend"]
            late = check_after(auto, scenario, cfg, metrics)
            if auto is not None:
                metrics["time_scale_auto"] = dict(auto)
            if late:
                say("  " + late)
            for line in summary_lines(metrics, cfg):
                say("  " + line)
            report.steal_note(metrics["wan_warnings"], metrics["cpu"], indent="  ", say=say)
        # The run's environment: the machine's, and the network each system ran on (the first's
        # record as "network"; every system's folder has its own env.json too).
        write_json(run_dir / "env.json", dict(
            provenance(), network=next(iter(doc["systems"].values()))["network"],
            networks={n: m["network"] for n, m in doc["systems"].items()},
            other_runs=other_runs, **({"time_scale_auto": auto} if auto else {})))
        if "baseline" in doc["systems"]:
            base = doc["systems"]["baseline"]["iteration_time_s"]
            for name, m in doc["systems"].items():
                m["speedup_vs_baseline"] = round(base / m["iteration_time_s"], 3)
            say("speedup vs baseline: " + ", ".join(
                f"{n} {m['speedup_vs_baseline']:.2f}x" for n, m in doc["systems"].items()))
        for name, m in doc["systems"].items():   # X+bubbletea against X, when both ran
            other = doc["systems"].get(get_system(name).without_bubbles)
            if "bubbletea" in m and other is not None:
                bt = m["bubbletea"]
                its = [i for i in bt["iterations"] if i < len(other["iteration_walls_s"])]
                without_s = sum(other["iteration_walls_s"][i] for i in its) / max(1, len(its))
                bt["iteration_time_without_s"] = without_s
                bt["training_slowdown"] = round(bt["iteration_time_s"] / without_s - 1.0, 4)
                bt["gpu_utilization_without"] = other["gpu_utilization"]
                say(f"{name}: iterations {its[0]}-{its[-1]} took {bt['iteration_time_s']:.3f} s vs "
                    f"{without_s:.3f} s without BubbleTea ({bt['training_slowdown']:+.1%}); "
                    f"GPU utilization {bt['gpu_utilization']:.1%} vs "
                    f"{other['gpu_utilization']:.1%}")
        path = write_json(run_dir / "metrics.json", doc)
        from testbed.analysis.reproduce import reproduce
        reproduce([str(run_dir)], run_dir, figures=False)   # the run's own tables (Markdown, CSV)
        return path
    finally:
        if own:
            progress.close()
