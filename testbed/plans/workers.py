"""The training workers of one run, planned: placement, ports, per-worker specs (pure).

One job: from a training config and the hosts, one WorkerSpec (testbed/host/specfiles.py) per stage
replica: where it runs and listens, its neighbours, K per channel, its profile holds and pad
sizes, and what the run's features add to it (typed extras, testbed/host/extras.py). No files,
no processes: testbed.run.launch writes the specs and starts the workers.

Default placement: workers in stage-major order (s0r0, s0r1, ..., s1r0, ...) fill the hosts DC
by DC (DCs in order of first appearance, hosts in list order within a DC). So the replicas of a
stage share a DC where they fit, and the pipeline crosses the WAN between stages.

Features see each worker as a WorkerSlot (its place, its neighbours, and in profile mode the
bytes of their messages to it and the hold of the op that makes each) and give back their
extras (ExtrasSource: testbed.features.base.FeatureHandle is one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from testbed.host.extras import WorkerExtras
from testbed.host.specfiles import Peer, WorkerSpec
from testbed.plans.allreduce import hierarchy
from testbed.rules.costs import stage_costs
from testbed.rules.pipeline import compute_only
from testbed.rules.schedule import schedule_table
from testbed.spec.links import LinkDir
from testbed.spec.profiles import find_block
from testbed.spec.systems import ALLREDUCE_RULES
from testbed.spec.timescale import TimeScale
from testbed.spec.training import TrainConfig, validate_against_hosts


@dataclass(frozen=True, kw_only=True, slots=True)
class HostInfo:
    name: str
    ip: str
    dc: str


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSetup:
    """How every worker of a run is set up beyond the training config.

    scale divides every padded byte count (the emulated WAN is scaled down by the same factor);
    time_scale dilates every profile hold (the emulated world runs that many times slower);
    base_port: stage s>0 replica r listens on base_port + s*D + r, stage s's gloo store is on
    base_port + P*D + s (at replica 0's IP); connect_timeout_s: the workers' peer timeout (also
    gloo's); congestion_control: TCP_CONGESTION of the stage-to-stage sockets (None: host
    default); io_priority: SCHED_FIFO priority of the channels' I/O threads (None: normal;
    trainer.transport.Channel); connections: K, the TCP connections a
    stage-to-stage channel from a host in one DC to one in another stripes its messages over,
    per DC direction (a direction not listed: 1); allreduce: how a stage's gradient all-reduce
    runs over its replicas' DCs ("ring" | "hierarchical", testbed.plans.allreduce)."""

    scale: float = 1.0
    time_scale: TimeScale = TimeScale()
    base_port: int = 29500
    connect_timeout_s: float = 60.0
    congestion_control: str | None = None
    io_priority: int | None = None
    connections: Mapping[LinkDir, int] = field(default_factory=dict)
    allreduce: str = "ring"

    def __post_init__(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")
        if self.allreduce not in ALLREDUCE_RULES:
            raise ValueError(f"allreduce {self.allreduce!r} is not one of {ALLREDUCE_RULES}")

    def k(self, src_dc: str, dst_dc: str) -> int:
        """K of a channel from a host in src_dc to one in dst_dc, checked."""
        k = self.connections.get(LinkDir(src_dc, dst_dc), 1)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"connections[{LinkDir(src_dc, dst_dc)}] is {k!r}, not an integer "
                             f">= 1")
        return k


@dataclass(frozen=True, kw_only=True, slots=True)
class Neighbour:
    """A worker's neighbour as a feature sees it: where it is, and (profile mode; else None)
    the padded bytes of its messages to the worker and the hold of its op that makes one
    (F of prev, B of next; emulated ms)."""

    name: str
    host: str
    dc: str
    message_bytes: int | None = None
    make_hold_ms: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSlot:
    """One worker as a feature sees it when it gives the worker its extras."""

    name: str
    stage: int
    replica: int
    host: str
    dc: str
    prev: Neighbour | None
    next: Neighbour | None


class ExtrasSource(Protocol):
    def worker_extras(self, slot: WorkerSlot) -> WorkerExtras | None:
        """What this feature adds to the worker's spec, or None (nothing)."""


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


def plan_workers(cfg: TrainConfig, hosts: Sequence[HostInfo], run_dir: Path,
                 setup: WorkerSetup = WorkerSetup(), extras: Sequence[ExtrasSource] = (), *,
                 recv_timeout_s: float = 120.0) -> list[WorkerSpec]:
    """One spec per worker, in stage-major order (setup: WorkerSetup). Each of extras (the
    run's feature handles) sees every worker's slot and may add its typed extras to its spec."""
    ts = setup.time_scale
    place = plan_placement(cfg, hosts)
    P, D = cfg.stages, cfg.replicas
    costs = stage_costs(cfg.profile, P, cfg.tp) if cfg.compute == "profile" else None
    block = find_block(cfg.profile) if cfg.profile is not None else None
    pads = [int(costs[s].activation_bytes / setup.scale) if costs is not None and block is not None
            else 0 for s in range(P)]
    hier = [hierarchy([h.dc for h in place[s]], setup.k) if setup.allreduce == "hierarchical"
            else None for s in range(P)]
    specs = []
    for s in range(P):
        for r in range(D):
            h = place[s][r]
            name = worker_name(s, r, h.name)
            prev = nxt = None
            k_prev = k_next = 1
            if s > 0:
                ph = place[s - 1][r]
                prev = Peer(name=worker_name(s - 1, r, ph.name), host=ph.name, ip=ph.ip,
                            port=setup.base_port + s * D + r, dc=ph.dc, pad_bytes=pads[s - 1])
                k_prev = setup.k(ph.dc, h.dc)
            if s < P - 1:
                nh = place[s + 1][r]
                nxt = Peer(name=worker_name(s + 1, r, nh.name), host=nh.name, ip=nh.ip,
                           port=setup.base_port + (s + 1) * D + r, dc=nh.dc, pad_bytes=pads[s + 1])
                k_next = setup.k(h.dc, nh.dc)
            hold_f = hold_b = hold_o = 0.0
            pad, ar_pad = pads[s], 0
            if costs is not None and block is not None:
                hold_f = ts.emulated_span(costs[s].forward_ms)
                hold_b = ts.emulated_span(costs[s].backward_ms)
                hold_o = ts.emulated_span(costs[s].optimizer_ms)
                ar_pad = int(costs[s].rail_gradient_bytes / setup.scale)   # one rail
            neighbours = {}
            for key, peer, stage in (("prev", prev, s - 1), ("next", nxt, s + 1)):
                if peer is None:
                    neighbours[key] = None
                    continue
                src = place[stage][r]
                made = size = None
                if costs is not None:   # the op that makes the message: F before, B after
                    size = int(costs[stage].activation_bytes / setup.scale)
                    made = ts.emulated_span(costs[stage].forward_ms if key == "prev"
                                            else costs[stage].backward_ms)
                neighbours[key] = Neighbour(name=peer.name, host=src.name, dc=src.dc,
                                            message_bytes=size, make_hold_ms=made)
            slot = WorkerSlot(name=name, stage=s, replica=r, host=h.name, dc=h.dc,
                              prev=neighbours["prev"], next=neighbours["next"])
            tag = f"trainer-s{s}r{r}"
            specs.append(WorkerSpec(
                run_id=run_dir.name, name=name, stage=s, replica=r, host=h.name, ip=h.ip,
                dc=h.dc, listen_port=setup.base_port + s * D + r if s > 0 else None, prev=prev,
                next=nxt, dp_master_ip=place[s][0].ip, dp_master_port=setup.base_port + P * D + s,
                config=cfg.to_dict(), scale=setup.scale, hold_forward_ms=hold_f,
                hold_backward_ms=hold_b, hold_opt_ms=hold_o,
                pad_bytes=pad, allreduce_pad_bytes=ar_pad,
                spans_path=str(run_dir / "spans" / f"{tag}.jsonl"),
                loss_path=str(run_dir / "loss" / f"{tag}.jsonl"),
                connect_timeout_s=setup.connect_timeout_s, recv_timeout_s=recv_timeout_s,
                congestion_control=setup.congestion_control, connections_next=k_next,
                connections_prev=k_prev, io_priority=setup.io_priority,
                allreduce_groups=() if hier[s] is None else hier[s].groups,
                allreduce_connections=1 if hier[s] is None else hier[s].connections,
                extras=tuple(x for x in (source.worker_extras(slot) for source in extras)
                             if x is not None)))
    return specs


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
