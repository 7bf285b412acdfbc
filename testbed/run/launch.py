"""Start a P x D training run on a list of hosts through a Spawner, wait, merge its records.

One job: run lifecycle. The plan is testbed.plans.workers' (pure: placement, ports, per-worker
specs with the features' typed extras, profile hold times and pad sizes). `launch` writes the
specs, starts one `python -m trainer.worker` per stage replica through the given
`Spawner` (testbed/emulation/procs.py: `LocalSpawner` here, a Mininet-host spawner in the
testbed), waits for all with a deadline, stops all on the first failure and raises with that
worker's log tail, then merges the per-worker JSONL files.

Run folder:
    trainer_plan.json           placement, ports, K per channel, stage costs, each worker's
                                extras, compute-only timeline
    specs/trainer-s{S}r{R}.json one per worker (testbed/host/specfiles.py)
    logs/{host}-trainer.log     worker stdout/stderr
    spans/trainer-s{S}r{R}.jsonl, loss/trainer-s{S}r{R}.jsonl   per worker
    trainer_spans.jsonl, trainer_loss.jsonl                      merged
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from testbed.emulation.procs import HostProcess, Spawner, wait_all, worker_env
from testbed.host.spans import merge_jsonl
from testbed.host.specfiles import WorkerSpec
from testbed.plans.workers import (ExtrasSource, HostInfo, WorkerSetup, compute_only_timeline,
                                 plan_workers)
from testbed.rules.stages import split_layers
from testbed.spec.errors import TestbedError
from testbed.spec.timescale import TimeScale
from testbed.spec.training import TrainConfig



@dataclass(frozen=True, kw_only=True, slots=True)
class TrainRun:
    run_dir: Path
    spans_path: Path
    loss_path: Path
    plan_path: Path
    specs: list[WorkerSpec]
    wall_s: float


def launch(cfg: TrainConfig, hosts: Sequence[HostInfo], run_dir: Path, spawner: Spawner,
           setup: WorkerSetup = WorkerSetup(), extras: Sequence[ExtrasSource] = (), *,
           timeout_s: float = 600.0, python: str = sys.executable,
           env: dict[str, str] | None = None,
           progress: Callable[[str], None] | None = None) -> TrainRun:
    """Run training to the end; raise TestbedError (with the failing worker's log tail) if any
    worker fails or the run passes timeout_s. hosts are in topology order; setup and extras (the
    features' typed additions to each worker's spec) as testbed.plans.workers.plan_workers."""
    run_dir = Path(run_dir)
    specs = plan_workers(cfg, hosts, run_dir, setup, extras,
                         recv_timeout_s=max(30.0, timeout_s))
    plan_path = run_dir / "trainer_plan.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = {"config": cfg.to_dict(), "scale": setup.scale, "time_scale": setup.time_scale.factor,
            "congestion_control": setup.congestion_control, "base_port": setup.base_port,
            "layers_per_stage": [len(x) for x in split_layers(cfg.model.n_layer, cfg.stages)],
            "workers": [{"name": s.name, "stage": s.stage, "replica": s.replica, "host": s.host,
                         "ip": s.ip, "dc": s.dc, "listen_port": s.listen_port,
                         "hold_forward_ms": s.hold_forward_ms,
                         "hold_backward_ms": s.hold_backward_ms,
                         "hold_opt_ms": s.hold_opt_ms, "pad_bytes": s.pad_bytes,
                         "allreduce_pad_bytes": s.allreduce_pad_bytes,
                         "connections_next": s.connections_next,
                         "connections_prev": s.connections_prev,
                         "extras": [e.to_dict() for e in s.extras]} for s in specs],
            "compute_only": compute_only_timeline(cfg, specs)}
    plan_path.write_text(json.dumps(plan, indent=1))
    env = worker_env(env)
    procs: list[HostProcess] = []
    t0 = time.monotonic()
    try:
        # Last stage first: listeners come up before their connectors (connect retries anyway).
        for spec in reversed(specs):
            spec_path = run_dir / "specs" / f"trainer-s{spec.stage}r{spec.replica}.json"
            spec.write(spec_path)
            argv = [python, "-m", "trainer.worker", "--spec", str(spec_path)]
            procs.append(spawner.spawn(spec.host, argv, run_dir / "logs" /
                                       f"{spec.host}-trainer.log", env))
        last = next(s for s in specs if s.stage == cfg.stages - 1 and s.replica == 0)
        wait_all(procs, timeout_s, on_tick=None if progress is None else
                 _loss_reporter(Path(last.loss_path), cfg.iterations, progress,
                                setup.time_scale))
    except (RuntimeError, TimeoutError) as exc:
        for proc in procs:
            proc.stop()
        raise TestbedError(f"training run in {run_dir} failed: {exc}") from exc
    except BaseException:
        for proc in procs:
            proc.stop()
        raise
    wall_s = time.monotonic() - t0
    spans_path, loss_path = run_dir / "trainer_spans.jsonl", run_dir / "trainer_loss.jsonl"
    merge_jsonl([Path(s.spans_path) for s in specs], spans_path)
    merge_jsonl([Path(s.loss_path) for s in specs
                 if s.stage == cfg.stages - 1], loss_path, sort_key="iteration")
    return TrainRun(run_dir=run_dir, spans_path=spans_path, loss_path=loss_path,
                    plan_path=plan_path, specs=specs, wall_s=wall_s)


def _loss_reporter(loss_path: Path, iterations: int, progress: Callable[[str], None],
                   time_scale: TimeScale) -> Callable[[], None]:
    """A tick function that reports each new iteration the last stage has logged: its time (in
    real time: the wall between the last stage's ends of iteration, undilated; none for the
    first) and loss."""
    seen = [0]
    last_end = [None]

    def tick() -> None:
        try:
            lines = loss_path.read_text().splitlines()
        except FileNotFoundError:
            return
        for line in lines[seen[0]:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                return  # a line still being written: read it next tick
            seen[0] += 1
            end = rec.get("t_end_ns")
            took = (f"{time_scale.real_span((end - last_end[0]) / 1e9):.3f} s, "
                    if end is not None and last_end[0] is not None else "")
            last_end[0] = end
            progress(f"iteration {rec['iteration'] + 1}/{iterations}: {took}"
                     f"loss {rec['loss']:.3f} (replica 0)")

    return tick
