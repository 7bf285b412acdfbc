"""Start and stop BubbleTea's processes around one system's training run (systems "+bubbletea").

One job: the lifecycle of the prefill side on the emulated network. Before training: the request
load (testbed.features.bubbletea.load, from the scenario's `bubbletea:` section) split over the DCs that train, in
proportion to their training hosts; a decode server on every decode host of those DCs; a
controller (prefill.controller) on each such DC's first decode host; a prefill server
(prefill.server) on every training host, sharing the host's GPU lock with the training worker.
`BubbleTeaHandle` is the feature's run handle (testbed.features.base): its worker_extras give each
training worker its GpuShareExtras (testbed/host/extras.py: its lock, where to send its notices,
and with the arrival bound how fast its inputs can come). After training: SIGTERM the
controllers (they write what stayed unserved), then the servers, and merge every record into
<system dir>/prefill_records.jsonl; its metrics block is testbed.rules.bubbletea_figures'.

The prefill-side processes run at nice BUBBLETEA_NICE: on a real server the inference stack has
CPU cores of its own, here it shares 2 cores with the training workers, whose holds and
transport must not wait behind it (that wait would be a slowdown the real system does not have).
The controller's notice thread alone runs at SCHED_FIFO (testbed.host.realtime's "notice", where the
network runs real-time): the arrival bound needs the notices heard within its margin.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.emulation.procs import HostProcess, stop_all
from testbed.features.base import FeatureHandle, MetricsBlock, RunContext
from testbed.features.bubbletea.plan import BubbleTeaPlan, check, hosts_by_dc, make_requests
from testbed.host.extras import GpuShareExtras, Inbound, NoticeAddress
from testbed.host.realtime import PRIORITY
from testbed.plans.systems import host_path_rate_mbit
from testbed.spec.errors import TestbedError

if TYPE_CHECKING:
    from testbed.emulation.network import Network
    from testbed.plans.placement import Placement
    from testbed.plans.workers import WorkerSlot
    from testbed.spec.scenario import Scenario
    from testbed.spec.training import TrainConfig

PREFILL_PORT = 28000
DECODE_PORT = 28100
NOTICE_PORT = 28200
BUBBLETEA_NICE = 10
READY_TIMEOUT_S = 60.0
REPLY_GRACE_S = 15.0   # a controller waits for its in-flight prefills before it records


@dataclass
class BubbleTeaRun:
    sys_dir: Path
    locks: dict[str, str]                      # training host -> GPU lock path
    notify: dict[str, NoticeAddress]           # training host -> controller notice address
    load: dict[str, Any]
    controllers: list[HostProcess] = field(default_factory=list)
    servers: list[HostProcess] = field(default_factory=list)
    record_paths: list[Path] = field(default_factory=list)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU time (user + system) each kind of prefill-side process has used so far, summed:
        work the emulation adds on this machine's cores beside the training workers."""
        out: dict[str, float] = {}
        for p in self.controllers + self.servers:
            kind = next((k for k in ("controller", "decode_server", "server") if
                         f"prefill.{k}" in " ".join(p.argv)), "other")
            out[kind] = out.get(kind, 0.0) + _cpu_s(p.pid)
        return {k: round(v, 2) for k, v in out.items()}

    def stop(self) -> None:
        """Controllers first (they record what stayed unserved), then the servers."""
        stuck = stop_all(self.controllers, grace_s=REPLY_GRACE_S)
        stuck += stop_all(self.servers, grace_s=3.0)
        if stuck:
            raise TestbedError("BubbleTea processes would not stop: "
                               + ", ".join(p.describe() for p in stuck))

    def crashed(self) -> list[str]:
        """Prefill-side processes that died during training (training went on without them)."""
        return [p.describe() for p in self.controllers + self.servers
                if p.poll() not in (None, 0)]

    def merge_records(self) -> Path:
        from testbed.host.spans import merge_jsonl
        out = self.sys_dir / "prefill_records.jsonl"
        merge_jsonl([p for p in self.record_paths if p.exists()], out, sort_key="t_start_ns")
        return out


def start(net: "Network", scenario: "Scenario", train_cfg: "TrainConfig",
          placement: "Placement", sys_dir: Path, system_name: str) -> BubbleTeaRun:
    """Start every prefill-side process of one system's run (module docstring)."""
    from prefill.controller import ControllerSpec, Endpoint
    from prefill.decode_server import DecodeSpec
    from prefill.server import PrefillSpec
    from testbed.emulation.procs import worker_env

    cfg = check(scenario, placement, system_name)
    base = sys_dir / "bubbletea"
    by_dc = hosts_by_dc(placement)
    load = make_requests(cfg, train_cfg.compute, {dc: len(hs) for dc, hs in by_dc.items()})
    env = worker_env()
    python = ["nice", "-n", str(BUBBLETEA_NICE), sys.executable]
    run = BubbleTeaRun(sys_dir=sys_dir, locks={}, notify={}, load=load)
    try:
        for dc in by_dc:
            decode = [net.plan.host(n) for n in scenario.decode_host_names(dc)]
            ctl_host = decode[0]
            decoders = []
            for h in decode:
                spec = DecodeSpec(host=h.name, dc=dc, ip=h.ip, port=DECODE_PORT,
                                  records_path=str(base / "records" / f"decode-{h.name}.jsonl"),
                                  model=cfg.model,
                                  max_new_tokens_cap=(cfg.decode_tokens_max
                                                      if train_cfg.compute == "profile" else None))
                path = base / "specs" / f"decode-{h.name}.json"
                spec.write(path)
                run.record_paths.append(Path(spec.records_path))
                run.servers.append(net.spawn(h.name, python + ["-m", "prefill.decode_server",
                                                               "--spec", str(path)],
                                             sys_dir / "logs" / f"{h.name}-decode.log", env))
                decoders.append(Endpoint(host=h.name, ip=h.ip, port=DECODE_PORT))
            prefills = []
            for name in by_dc[dc]:
                h = net.plan.host(name)
                lock = str(base / "gpu" / f"{name}.lock")
                spec = PrefillSpec(host=name, dc=dc, ip=h.ip, port=PREFILL_PORT,
                                   gpu_lock_path=lock,
                                   records_path=str(base / "records" / f"prefill-{name}.jsonl"),
                                   model=cfg.model, compute=train_cfg.compute,
                                   profile=cfg.profile, time_scale=scenario.time_scale,
                                   scale=scenario.scale, kv_fraction=cfg.kv_fraction,
                                   decode_servers=[{"ip": d.ip, "port": d.port}
                                                   for d in decoders])
                path = base / "specs" / f"prefill-{name}.json"
                spec.write(path)
                run.record_paths.append(Path(spec.records_path))
                run.servers.append(net.spawn(name, python + ["-m", "prefill.server", "--spec",
                                                             str(path)],
                                             sys_dir / "logs" / f"{name}-prefill.log", env))
                run.locks[name] = lock
                run.notify[name] = NoticeAddress(ip=ctl_host.ip, port=NOTICE_PORT,
                                                 allreduce=cfg.fill_allreduce)
                prefills.append(Endpoint(host=name, ip=h.ip, port=PREFILL_PORT))
            req_path = base / f"requests-{dc}.json"
            req_path.parent.mkdir(parents=True, exist_ok=True)
            req_path.write_text(json.dumps(load["per_dc"][dc]))
            cspec = ControllerSpec(dc=dc, host=ctl_host.name, ip=ctl_host.ip,
                                   notice_port=NOTICE_PORT,
                                   records_path=str(base / "records" / f"controller-{dc}.jsonl"),
                                   requests_path=str(req_path), prefill_servers=prefills,
                                   decode_servers=decoders, bubbletea=cfg.to_dict(),
                                   compute=train_cfg.compute, time_scale=scenario.time_scale,
                                   connect_timeout_s=scenario.dilation.emulated_span(60.0),
                                   notice_priority=PRIORITY["notice"] if net.realtime else None)
            path = base / "specs" / f"controller-{dc}.json"
            cspec.write(path)
            run.record_paths.append(Path(cspec.records_path))
            run.controllers.append(net.spawn(ctl_host.name, python + [
                "-m", "prefill.controller", "--spec", str(path)],
                sys_dir / "logs" / f"{ctl_host.name}-controller.log", env))
        _wait_ready(run)
    except BaseException:
        stop_all(run.controllers + run.servers)
        raise
    return run


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _wait_ready(run: BubbleTeaRun) -> None:
    """Until every server says it listens and every controller has started (or one died)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    want = {id(p): ("listening" if p in run.servers else "controller") for p in
            run.servers + run.controllers}
    pending = list(run.servers + run.controllers)
    while pending:
        for p in list(pending):
            if p.poll() is not None:
                raise TestbedError(f"BubbleTea process failed to start: {p.describe()}\n"
                                   f"{p.output(2000)}")
            if want[id(p)] in p.output(4000):
                pending.remove(p)
        if time.monotonic() > deadline:
            raise TestbedError("BubbleTea processes not ready after "
                               f"{READY_TIMEOUT_S:.0f} s: "
                               + ", ".join(p.describe() for p in pending))
        time.sleep(0.05)


class BubbleTeaHandle(FeatureHandle):
    """BubbleTea's prefill side of one +bubbletea system's run."""

    name = "bubbletea"

    def __init__(self, plan: BubbleTeaPlan, ctx: RunContext) -> None:
        job = ctx.job
        self.plan = plan
        self.time_scale = ctx.clock.time_scale
        self.emulated = job.scenario.emulated()   # the rates the network shapes
        self.crashed: list[str] = []
        self.cpu_s: dict[str, float] = {}
        self.run = start(ctx.net, job.scenario, job.cfg, job.placement, ctx.sys_dir,
                         job.system.name)
        if plan.arrival not in ("on", "off"):
            ctx.progress(f"bubbletea: no arrival bound ({plan.why_not}: bytes can come "
                         f"faster than the configured rates)")
        load = self.run.load
        ctx.progress(f"bubbletea: {load['kept']} requests over "
                     f"{', '.join(f'{dc} {len(r)}' for dc, r in load['per_dc'].items())}"
                     f" ({load['refused']} refused, {load['truncated']} "
                     f"truncated to {load['context_tokens']} tokens)")

    def worker_extras(self, slot: "WorkerSlot") -> GpuShareExtras | None:
        """The host's GPU lock and notice address; with the arrival bound, how fast a message
        from each neighbour can come (profile mode: the lowest rate on its way as the network
        shapes it, its bytes, the hold of the op making it)."""
        if slot.host not in self.run.locks:
            return None
        inbound: dict[str, Inbound] = {}
        for key, nb in (("prev", slot.prev), ("next", slot.next)):
            if self.plan.arrival != "on" or nb is None or nb.message_bytes is None:
                continue
            rate = host_path_rate_mbit(self.emulated, nb.dc, slot.dc)
            inbound[key] = Inbound(rate_mbit=None if rate is None else float(rate),
                                   bytes=nb.message_bytes, hold_ms=nb.make_hold_ms,
                                   same_dc=nb.dc == slot.dc)
        return GpuShareExtras(lock_path=self.run.locks[slot.host],
                              notify=self.run.notify.get(slot.host),
                              inbound_prev=inbound.get("prev"), inbound_next=inbound.get("next"))

    def stop(self) -> None:
        """What died during training and the CPU time used, read first; then the processes."""
        self.crashed = self.run.crashed()
        self.cpu_s = self.run.cpu_seconds()
        self.run.stop()

    def results(self, *, partial: bool, spans=()) -> MetricsBlock | None:
        """The bubbletea block (testbed.rules.bubbletea_figures) from the trainers' spans and
        every prefill-side record, which the timeline and the trace draw too; None for a run
        that stopped early."""
        if partial:
            return None
        from testbed.host.spans import read_jsonl
        from testbed.rules.bubbletea_figures import bubbletea_metrics
        records = list(read_jsonl(self.run.merge_records()))
        block = bubbletea_metrics(spans, records, time_scale=self.time_scale,
                                  load={k: v for k, v in self.run.load.items() if k != "per_dc"},
                                  crashed=self.crashed)
        block["cpu_s"] = self.cpu_s
        block["arrival_bound"] = self.plan.arrival
        filled = block["iterations"]    # draw one the prefills could fill
        return MetricsBlock(key="bubbletea", value=block, spans=records,
                            iteration=filled[len(filled) // 2])
