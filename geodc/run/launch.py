"""Start a P x D training run on a list of hosts through a Spawner, wait, merge its records.

One job: run lifecycle. `plan_workers` is pure (placement, ports, per-worker specs, profile
hold times and pad sizes). `launch` writes the specs, starts one `python -m geodc.hostproc.trainer.worker` per
stage replica through the given `Spawner` (geodc/emulation/procs.py: `LocalSpawner` here, a Mininet-host
spawner in the testbed), waits for all with a deadline, stops all on the first failure and
raises with that worker's log tail, then merges the per-worker JSONL files.

Default placement: workers in stage-major order (s0r0, s0r1, ..., s1r0, ...) fill the hosts DC
by DC (DCs in order of first appearance, hosts in list order within a DC). So the replicas of a
stage share a DC where they fit, and the pipeline crosses the WAN between stages.

Run folder:
    trainer_plan.json           placement, ports, K per channel, stage costs, compute-only timeline
    specs/trainer-s{S}r{R}.json one per worker (geodc/host/specfiles.py)
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

from geodc.spec.errors import TestbedError
from geodc.emulation.procs import HostProcess, Spawner, wait_all, worker_env
from geodc.spec.training import TrainConfig, validate_against_hosts
from geodc.host.spans import merge_jsonl
from geodc.rules.stages import split_layers
from geodc.spec.profiles import find_block
from geodc.rules.costs import stage_costs
from geodc.rules.pipeline import compute_only
from geodc.rules.schedule import schedule_table
from geodc.host.specfiles import Peer, WorkerSpec



@dataclass(frozen=True, kw_only=True, slots=True)
class HostInfo:
    name: str
    ip: str
    dc: str


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainRun:
    run_dir: Path
    spans_path: Path
    loss_path: Path
    plan_path: Path
    specs: list[WorkerSpec]
    wall_s: float


def worker_name(stage: int, replica: int, host: str) -> str:
    return f"s{stage}r{replica}@{host}"


def plan_placement(cfg: TrainConfig, hosts: Sequence[HostInfo]) -> list[list[HostInfo]]:
    """hosts[stage][replica]: the explicit placement, else the default rule (module docstring)."""
    validate_against_hosts(cfg, len(hosts), [h.name for h in hosts])
    by_name = {h.name: h for h in hosts}
    if cfg.placement is not None:
        return [[by_name[name] for name in row] for row in cfg.placement]
    dcs: list[str] = []
    for h in hosts:
        if h.dc not in dcs:
            dcs.append(h.dc)
    ordered = [h for dc in dcs for h in hosts if h.dc == dc]
    return [[ordered[s * cfg.replicas + r] for r in range(cfg.replicas)]
            for s in range(cfg.stages)]


def plan_workers(cfg: TrainConfig, hosts: Sequence[HostInfo], run_dir: Path, scale: float = 1.0,
                 base_port: int = 29500, connect_timeout_s: float = 60.0,
                 recv_timeout_s: float = 120.0, time_scale: float = 1.0,
                 congestion_control: str | None = None,
                 connections: Callable[[str, str], int] | None = None,
                 gate: Callable[[str, str, int], dict | None] | None = None,
                 io_priority: int | None = None,
                 gpu_share: Callable[[str], dict | None] | None = None,
                 inbound_rate: Callable[[str, str], float | None] | None = None
                 ) -> list[WorkerSpec]:
    """One spec per worker, in stage-major order. Ports: stage s>0 replica r listens on
    base_port + s*D + r; stage s's gloo store is on base_port + P*D + s (at replica 0's IP).
    scale divides every padded byte count (the emulated WAN is scaled down by the same factor);
    time_scale multiplies every profile hold (the emulated world runs that many times slower).
    congestion_control: TCP_CONGESTION of the stage-to-stage sockets (None: host default).
    connections(src_dc, dst_dc): K, the TCP connections a stage-to-stage channel from a host in
    src_dc to one in dst_dc stripes its messages over (None: 1 everywhere).
    gate(src_dc, dst_dc, replica): the WAN arbiter a worker asks before each message it sends
    from src_dc to dst_dc ({"ip", "port", "link", "pipeline"}, geodc.features.temporal.run), or None.
    io_priority: SCHED_FIFO priority of the stage-to-stage channels' I/O threads (None: normal;
    geodc.hostproc.trainer.transport.Channel).
    gpu_share(host): how the host's GPU is shared with a prefill server (BubbleTea):
    {"gpu_lock_path": str, "bubble_notify": {"ip", "port", "allreduce"} | None}, or None (not
    shared; "allreduce": also announce the gap that holds the gradient all-reduce); the
    worker then holds that lock for its compute and announces its bubbles (geodc/hostproc/trainer/worker.py).
    inbound_rate(src_dc, dst_dc): the lowest rate (Mbit/s, as the network shapes it) on the way
    from a host in src_dc to one in dst_dc, or None (unshaped); with the neighbours' padded
    message bytes and the hold of the op that makes the message it becomes the spec's
    inbound_prev / inbound_next (profile mode; what bounds a bubble's end: geodc/hostproc/trainer/worker.py)."""
    if scale <= 0 or time_scale <= 0:
        raise ValueError(f"scale and time_scale must be > 0, got {scale}, {time_scale}")

    def k_of(src: HostInfo, dst: HostInfo) -> int:
        if connections is None:
            return 1
        k = connections(src.dc, dst.dc)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"connections({src.dc!r}, {dst.dc!r}) gave {k!r}, not an integer "
                             f">= 1")
        return k

    place = plan_placement(cfg, hosts)
    P, D = cfg.stages, cfg.replicas
    costs = stage_costs(cfg.profile, P) if cfg.compute == "profile" else None
    block = find_block(cfg.profile) if cfg.profile is not None else None
    pads = [int(costs[s].activation_bytes / scale) if costs is not None and block is not None
            else 0 for s in range(P)]
    specs = []
    for s in range(P):
        for r in range(D):
            h = place[s][r]
            name = worker_name(s, r, h.name)
            prev = nxt = None
            k_prev = k_next = 1
            gate_prev = gate_next = None
            if s > 0:
                ph = place[s - 1][r]
                prev = Peer(name=worker_name(s - 1, r, ph.name), host=ph.name, ip=ph.ip,
                            port=base_port + s * D + r, dc=ph.dc, pad_bytes=pads[s - 1])
                k_prev = k_of(ph, h)
                gate_prev = gate(h.dc, ph.dc, r) if gate is not None else None
            if s < P - 1:
                nh = place[s + 1][r]
                nxt = Peer(name=worker_name(s + 1, r, nh.name), host=nh.name, ip=nh.ip,
                           port=base_port + (s + 1) * D + r, dc=nh.dc, pad_bytes=pads[s + 1])
                k_next = k_of(h, nh)
                gate_next = gate(h.dc, nh.dc, r) if gate is not None else None
            hold_f = hold_b = hold_o = 0.0
            pad, ar_pad = pads[s], 0
            if costs is not None and block is not None:
                hold_f, hold_b = costs[s].forward_ms * time_scale, costs[s].backward_ms * time_scale
                hold_o = costs[s].optimizer_ms * time_scale
                ar_pad = int(costs[s].gradient_bytes / scale)
            tag = f"trainer-s{s}r{r}"
            lock_path, notify = _gpu_share_of(gpu_share, h.name)
            inbound = {}
            for key, peer, stage in (("prev", prev, s - 1), ("next", nxt, s + 1)):
                if peer is None or inbound_rate is None or costs is None:
                    continue
                src = place[stage][r]
                rate = inbound_rate(src.dc, h.dc)
                # the op that makes the message: F of the stage before, B of the one after
                made = costs[stage].forward_ms if key == "prev" else costs[stage].backward_ms
                inbound[key] = {"rate_mbit": None if rate is None else float(rate),
                                "bytes": int(costs[stage].activation_bytes / scale),
                                "hold_ms": made * time_scale, "same_dc": src.dc == h.dc}
            specs.append(WorkerSpec(
                run_id=run_dir.name, name=name, stage=s, replica=r, host=h.name, ip=h.ip,
                dc=h.dc, listen_port=base_port + s * D + r if s > 0 else None, prev=prev,
                next=nxt, dp_master_ip=place[s][0].ip, dp_master_port=base_port + P * D + s,
                config=cfg.to_dict(), scale=scale, hold_forward_ms=hold_f, hold_backward_ms=hold_b,
                hold_opt_ms=hold_o,
                pad_bytes=pad, allreduce_pad_bytes=ar_pad,
                spans_path=str(run_dir / "spans" / f"{tag}.jsonl"),
                loss_path=str(run_dir / "loss" / f"{tag}.jsonl"),
                connect_timeout_s=connect_timeout_s, recv_timeout_s=recv_timeout_s,
                congestion_control=congestion_control, connections_next=k_next,
                connections_prev=k_prev, gate_next=gate_next, gate_prev=gate_prev,
                io_priority=io_priority, gpu_lock_path=lock_path, bubble_notify=notify,
                inbound_prev=inbound.get("prev"), inbound_next=inbound.get("next")))
    return specs


def _gpu_share_of(gpu_share: Callable[[str], dict | None] | None,
                  host: str) -> tuple[str | None, dict | None]:
    """(gpu_lock_path, bubble_notify) of a host from the gpu_share callback, checked."""
    share = gpu_share(host) if gpu_share is not None else None
    if share is None:
        return None, None
    lock_path = share.get("gpu_lock_path") if isinstance(share, dict) else None
    if not isinstance(lock_path, str) or not lock_path:
        raise ValueError(f"gpu_share({host!r}) gave {share!r}: need a dict with a non-empty "
                         f"'gpu_lock_path'")
    notify = share.get("bubble_notify")
    if notify is not None and not (isinstance(notify, dict) and isinstance(notify.get("ip"), str)
                                   and isinstance(notify.get("port"), int)):
        raise ValueError(f"gpu_share({host!r}) gave bubble_notify {notify!r}: need "
                         f"{{'ip': str, 'port': int}} or None")
    return str(lock_path), None if notify is None else {
        "ip": notify["ip"], "port": notify["port"],
        "allreduce": bool(notify.get("allreduce", False))}


def compute_only_timeline(cfg: TrainConfig, specs: Sequence[WorkerSpec]) -> dict:
    """Simulated iteration on the profile hold times with no communication (`compute_only` in
    the plan and in metrics.json): a lower bound, not the model's prediction (model/, which adds
    the network). Empty in measured mode (durations unknown beforehand)."""
    if cfg.compute != "profile":
        return {}
    hold = {s.stage: (s.hold_forward_ms, s.hold_backward_ms, s.hold_opt_ms) for s in specs}
    sim = compute_only(schedule_table(cfg.schedule, cfg.stages, cfg.micro_batches),
                   [hold[s][0] for s in range(cfg.stages)], [hold[s][1] for s in range(cfg.stages)],
                   opt_ms=[hold[s][2] for s in range(cfg.stages)])
    return {"iteration_time_s": sim.window_ms / 1e3, "bubble_fraction": sim.mean_bubble,
            "per_stage_bubble": sim.bubble}


def launch(cfg: TrainConfig, hosts: Sequence[HostInfo], run_dir: Path, spawner: Spawner,
           scale: float = 1.0, base_port: int = 29500, timeout_s: float = 600.0,
           python: str = sys.executable, env: dict[str, str] | None = None,
           connect_timeout_s: float = 60.0,
           progress: Callable[[str], None] | None = None, time_scale: float = 1.0,
           congestion_control: str | None = None,
           connections: Callable[[str, str], int] | None = None,
           gate: Callable[[str, str, int], dict | None] | None = None,
           io_priority: int | None = None,
           gpu_share: Callable[[str], dict | None] | None = None,
           inbound_rate: Callable[[str, str], float | None] | None = None) -> TrainRun:
    """Run training to the end; raise TestbedError (with the failing worker's log tail) if any
    worker fails or the run passes timeout_s. hosts are in topology order; scale divides padded
    message sizes; connections(src_dc, dst_dc) is K per stage-to-stage channel and gpu_share(host)
    the host's GPU lock and bubble-notice address, inbound_rate(src_dc, dst_dc) the lowest
    rate between (plan_workers)."""
    run_dir = Path(run_dir)
    specs = plan_workers(cfg, hosts, run_dir, scale, base_port, connect_timeout_s,
                         recv_timeout_s=max(30.0, timeout_s), time_scale=time_scale,
                         congestion_control=congestion_control, connections=connections,
                         gate=gate, io_priority=io_priority, gpu_share=gpu_share,
                         inbound_rate=inbound_rate)
    plan_path = run_dir / "trainer_plan.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    plan = {"config": cfg.to_dict(), "scale": scale, "time_scale": time_scale,
            "congestion_control": congestion_control, "base_port": base_port,
            "layers_per_stage": [len(x) for x in split_layers(cfg.model.n_layer, cfg.stages)],
            "workers": [{"name": s.name, "stage": s.stage, "replica": s.replica, "host": s.host,
                         "ip": s.ip, "dc": s.dc, "listen_port": s.listen_port,
                         "hold_forward_ms": s.hold_forward_ms,
                         "hold_backward_ms": s.hold_backward_ms,
                         "hold_opt_ms": s.hold_opt_ms, "pad_bytes": s.pad_bytes,
                         "allreduce_pad_bytes": s.allreduce_pad_bytes,
                         "connections_next": s.connections_next,
                         "connections_prev": s.connections_prev,
                         "gate_next": s.gate_next, "gate_prev": s.gate_prev,
                         "gpu_lock_path": s.gpu_lock_path,
                         "bubble_notify": s.bubble_notify} for s in specs],
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
            argv = [python, "-m", "geodc.hostproc.trainer.worker", "--spec", str(spec_path)]
            procs.append(spawner.spawn(spec.host, argv, run_dir / "logs" /
                                       f"{spec.host}-trainer.log", env))
        last = next(s for s in specs if s.stage == cfg.stages - 1 and s.replica == 0)
        wait_all(procs, timeout_s, on_tick=None if progress is None else
                 _loss_reporter(Path(last.loss_path), cfg.iterations, progress))
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


def _loss_reporter(loss_path: Path, iterations: int,
                   progress: Callable[[str], None]) -> Callable[[], None]:
    """A tick function that reports each new iteration the last stage has logged."""
    seen = [0]

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
            progress(f"iteration {rec['iteration'] + 1}/{iterations}: "
                     f"loss {rec['loss']:.3f} (replica 0)")

    return tick
