"""Apply a scenario's faults (testbed.spec.faults) to a running network, on time, and record when
each took effect on the wire.

One job: a thread that sleeps until each fault's time and applies it, and a sampler that reads
the WAN interfaces' byte counters every SAMPLE_S so the results show what the wire did.

How each fault is applied (both directions of the link):
- delay, jitter, loss: the delay lines' control (testbed.emulation.delayline, SIGUSR2 and a control file,
  acknowledged), or with netem the netem leaf, changed through pyroute2. A packet read
  afterwards gets the new figures; "took effect" is the kernel arrival stamp of the first packet
  that arrived after the change.
- link_down: the link drops every packet, both ways (loss 100% in its delay lines): a cut
  inside the WAN, where the gateways' interfaces stay up, so there are no ICMP errors and no
  route changes, and TCP sees silence until its retransmissions get through. Back up: the
  configured loss again; "took effect" is the first packet that then crossed.
- rate: the HTB class of each end's WAN interface, changed through pyroute2 and read back.
  "Took effect" is when the kernel took the change (read back at once to check it); the wire's
  rate before and after is in the samples. Not with temporal WAN sharing: that tree's rates
  belong to its slot arbiter, which re-plans them at every switch (refused before the run).
- crash: SIGKILL to the named process; "took effect" is when it was seen dead.
A fault with for_s is followed by a restore event (the link's configured figures).

Times: t = 0 is the run's clock's (testbed.features.base.Clock: just before the trainers are
spawned, the same t = 0 as cross-traffic's); every time in the results is in the configured
system's time (wall seconds / time_scale), as the faults are.

`FaultsHandle` is the feature's run handle (testbed.features.base): the runner's sockets opened
at start, its threads at t = 0, its results (and the faults applied before a failure: `blame`)
once the network is down.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyroute2 import IPRoute

from testbed.emulation.results import write_text
from testbed.emulation import shaping, wanshare
from testbed.features.base import Clock, FeatureHandle, MetricsBlock, RunContext
from testbed.host.realtime import PRIORITY, set_fifo
from testbed.spec.errors import TestbedError
from testbed.spec.faults import Event, Fault, events_of
from testbed.spec.links import LinkDir

if TYPE_CHECKING:
    from testbed.emulation.network import Network
    from testbed.emulation.procs import HostProcess
    from testbed.features.faults.plan import FaultsPlan
    from testbed.plans.topo import WanPlan

SAMPLE_S = 0.05
ACK_TIMEOUT_S = 2.0
FIND_PROCESS_S = 2.0      # a crash at t = 0 may come before its process is spawned
PROCESS_MARKERS = {"trainer": "trainer.worker", "prefill": "prefill.server",
                   "decode": "prefill.decode_server"}


class FaultRunner:
    """`runner.open()` before training and `runner.begin()` at the clock's t = 0 (or both, and
    t = 0 of a clock not yet started, with `runner.start()`), `runner.stop()` after it (also on
    failure), then `runner.results()` once the network is down (the delay lines' final reports
    are in)."""

    def __init__(self, net: "Network", faults: tuple[Fault, ...], clock: Clock | None = None,
                 sample_links: tuple[tuple[str, str], ...] = ()) -> None:
        """clock: the run's (its own if None); sample_links: more WAN links (as in the wan
        section) whose wire to sample."""
        self.net = net
        self.clock = clock if clock is not None else Clock()
        self.ts = self.clock.time_scale
        self.events = events_of(faults)
        self.records: list[dict[str, Any]] = []
        self.samples: dict[str, list[tuple[float, float]]] = {}   # "a->b": (t_s, Mbit/s)
        self._links = {f.link for f in faults if f.link is not None} | set(sample_links)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._iprs: dict[str, IPRoute] = {}         # the fault thread's, per gateway
        self._sample_iprs: dict[str, IPRoute] = {}  # the sampler's (a socket per thread)
        self._shaped: dict[str, tuple[int, bool]] = {}   # WAN intf -> (ifindex, temporal tree)
        self._seq = 0

    @property
    def t0(self) -> float:
        """time.time() at t = 0."""
        return self.clock.wall0

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "FaultRunner":
        """open(), t = 0 now if the clock has not started, begin()."""
        self.open()
        if not self.clock.started:
            self.clock.start()
        self.begin()
        return self

    def open(self) -> "FaultRunner":
        try:
            self._open()
        except Exception as exc:  # noqa: BLE001 - one clear error, the run stops with it
            self.stop()
            raise TestbedError(f"faults: could not reach the WAN interfaces: "
                               f"{type(exc).__name__}: {exc}") from exc
        return self

    def begin(self) -> None:
        """The fault thread and the sampler, from the clock's t = 0 (started)."""
        assert self.clock.started, "the run's clock has no t = 0 yet"
        for target, name in ((self._apply_all, "faults"), (self._sample, "fault-sampler")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _open(self) -> None:
        """Netlink sockets in the gateways (opened here, in the main thread), and each WAN
        interface's index and tree."""
        for link in sorted(self._links):
            for end in self._wan(link).ends():
                if end.gateway not in self._iprs:
                    self._iprs[end.gateway] = self.net._ipr(end.gateway)
                    self._sample_iprs[end.gateway] = self.net._ipr(end.gateway)
                ipr = self._iprs[end.gateway]
                index = shaping._index(ipr, end.intf)
                self._shaped[end.intf] = (index, _temporal(ipr, index))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        for ipr in [*self._iprs.values(), *self._sample_iprs.values()]:
            ipr.close()
        self._iprs.clear()
        self._sample_iprs.clear()

    def applied(self) -> list[dict[str, Any]]:
        """The records of events applied so far (for an error message)."""
        return [r for r in self.records if r.get("applied_s") is not None]

    def results(self) -> dict[str, Any]:
        """{"events": [...], "wire_mbit": {"a->b": [[t_s, Mbit/s], ...]}}; each event's
        took_effect_s filled in from the delay lines' final reports where it is a packet's."""
        changes = self._delayline_changes()
        for rec in self.records:
            seq = rec.pop("_seq", None)
            if seq is not None:
                stamps = [t for t in changes.get(seq, []) if t is not None]
                rec["took_effect_s"] = (None if not stamps else
                                        round(self.clock.at_wall(min(stamps)), 4))
                if not stamps:
                    rec["note"] = "no packet crossed the link while this held"
        return {"events": self.records, "sample_s": SAMPLE_S,
                "wire_mbit": {k: [[round(t, 3), round(v, 3)] for t, v in s]
                              for k, s in self.samples.items()}}

    # ---- the fault thread ---------------------------------------------------------------------
    def now_s(self) -> float:
        """Configured seconds since t = 0."""
        return self.clock.now_s()

    def _apply_all(self) -> None:
        if self.net.realtime:
            # On time though the trainers and delay lines keep the CPUs busy (below the delay
            # lines); refused, it runs on at normal priority.
            set_fifo(PRIORITY["fault"])
        for ev in self.events:
            if self._stop.wait(max(0.0, self.ts.emulated_span(ev.at_s) - self.clock.elapsed())):
                return
            rec: dict[str, Any] = {"fault": ev.fault.label, "kind": ev.fault.kind,
                                   "restore": ev.restore, "what": ev.describe(),
                                   "at_s": ev.at_s, "applied_s": None, "took_effect_s": None}
            try:
                self._apply(ev, rec)
            except Exception as exc:  # noqa: BLE001 - recorded: the run goes on, or stops itself
                rec["error"] = f"{type(exc).__name__}: {exc}"
            self.records.append(rec)

    def _apply(self, ev: Event, rec: dict[str, Any]) -> None:
        f = ev.fault.scaled(self.ts.factor)
        if f.kind == "crash":
            self._crash(f, rec)
            return
        w = self._wan(f.link)
        configured = w.link
        if f.kind == "rate":
            rate = configured.rate_mbit if ev.restore else f.rate_mbit
            for end in w.ends():
                _set_rate(self._iprs[end.gateway], *self._shaped[end.intf], rate)
            rec["applied_s"] = round(self.now_s(), 4)
            rec["took_effect_s"] = rec["applied_s"]   # the kernel's (read back just below)
            for end in w.ends():
                _check_rate(self._iprs[end.gateway], end.intf, rate)
            rec["rate_mbit"] = self.ts.real_rate(rate)
            return
        figures: dict[str, float] = {}
        if f.kind == "delay":
            figures = ({"delay_ms": configured.delay_ms, "jitter_ms": configured.jitter_ms}
                       if ev.restore else {"delay_ms": f.delay_ms, "jitter_ms": f.jitter_ms})
        elif f.kind == "loss":
            figures = {"loss_pct": configured.loss_pct if ev.restore else f.loss_pct}
        elif f.kind == "link_down":
            figures = {"loss_pct": configured.loss_pct if ev.restore else 100.0}
        rec["figures"] = {k: self.ts.real_span(v) if k in ("delay_ms", "jitter_ms") else v
                          for k, v in figures.items()}   # configured units, as the fault's
        rec["applied_s"], rec["_seq"] = self._set_figures(w, figures)

    def _set_figures(self, w: "WanPlan", figures: dict[str, float]) -> tuple[float, int | None]:
        """Delay line control (each direction's queue, in its receiving gateway), or netem."""
        if self.net.backend == "netem":
            for end in w.ends():
                _set_netem(self._iprs[end.gateway], end.intf, w, figures)
            return round(self.now_s(), 4), None
        self._seq += 1
        seq = self._seq
        nums = {2 * w.index + 1, 2 * w.index + 2}
        acks = []
        for dl in self.net.delaylines:
            mine = [q.num for q in dl.queues if q.num in nums]
            if not mine:
                continue
            doc = {"seq": seq, "queues": {str(n): figures for n in mine}}
            write_text(dl.control_path, json.dumps(doc))
            if not dl.proc.signal(signal.SIGUSR2, group=False):
                raise TestbedError(f"{dl.proc.describe()} has exited; its links take no new "
                                   f"figures")
            acks.append(Path(f"{dl.control_path}.ack"))
        applied = []
        deadline = time.monotonic() + ACK_TIMEOUT_S
        for ack in acks:
            while True:
                doc = _read_json(ack)
                if doc is not None and doc.get("seq") == seq:
                    applied.append(doc["applied"])
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no acknowledgement in {ack} within {ACK_TIMEOUT_S:g} s")
                time.sleep(0.002)
        # the first direction's change; the other's follows within a millisecond or so
        return round(self.clock.at_wall(min(applied)), 4), seq

    def _crash(self, f: Fault, rec: dict[str, Any]) -> None:
        deadline = time.monotonic() + FIND_PROCESS_S
        while True:
            procs = self._processes(f.process, f.host)
            if procs or time.monotonic() > deadline or self._stop.is_set():
                break
            time.sleep(0.02)
        if not procs:
            rec["error"] = f"no {f.process} process on {f.host} (this system runs none there)"
            return
        for p in procs:
            p.signal(signal.SIGKILL, group=False)   # refused if it exited meanwhile
        rec["applied_s"] = round(self.now_s(), 4)
        rec["pids"] = [p.pid for p in procs]
        while any(p.poll() is None for p in procs) and not self._stop.is_set():
            time.sleep(0.005)
        rec["took_effect_s"] = round(self.now_s(), 4)

    def _processes(self, process: str, host: str) -> list["HostProcess"]:
        if process == "delayline":
            return [dl.proc for dl in self.net.delaylines if dl.gateway == host
                    and dl.proc.poll() is None]
        marker = PROCESS_MARKERS[process]
        return [p for p in list(self.net.procs) if p.host == host and p.poll() is None
                and any(marker in a for a in p.argv)]

    # ---- the sampler ---------------------------------------------------------------------------
    def _sample(self) -> None:
        """Every SAMPLE_S, each faulted link's bytes sent per direction (the sending gateway's
        WAN interface, after its HTB), as Mbit/s in configured units."""
        ends = [(str(LinkDir(e.gateway.removesuffix('-gw'), o.gateway.removesuffix('-gw'))), e)
                for link in sorted(self._links)
                for e, o in (self._wan(link).ends(), reversed(self._wan(link).ends()))]
        last: dict[str, tuple[float, int]] = {}
        while not self._stop.wait(SAMPLE_S):
            for key, end in ends:
                try:
                    sent = _tx_bytes(self._sample_iprs[end.gateway], self._shaped[end.intf][0])
                except Exception:  # noqa: BLE001 - the network is going down
                    return
                now = self.now_s()
                if key in last:
                    t, b = last[key]
                    mbit = self.ts.real_rate((sent - b) * 8 / 1e6
                                             / max(1e-9, self.ts.emulated_span(now - t)))
                    self.samples.setdefault(key, []).append((now, mbit))
                last[key] = (now, sent)

    # ---- helpers -------------------------------------------------------------------------------
    def _wan(self, link: tuple[str, str] | None) -> "WanPlan":
        for w in self.net.plan.wan:
            if w.link.between == link:
                return w
        raise KeyError(link)

    def _delayline_changes(self) -> dict[int, list[float | None]]:
        """seq -> first-packet arrival stamps, from each delay line's latest report."""
        out: dict[int, list[float | None]] = {}
        for path in sorted(self.net.run_dir.glob("logs/*-delayline-stats*.json")):
            doc = _read_json(path)
            for change in (doc or {}).get("changes", []):
                out.setdefault(change["seq"], []).extend(
                    change["first_packet"].get(q) for q in change["queues"])
        return out


def _set_rate(ipr: IPRoute, index: int, temporal: bool, rate_mbit: float) -> None:
    """The link's rate on interface index: HTB 1:10 of testbed.emulation.shaping's tree, one change-class
    message without rate tables (shaping.change_class_msg; with the queue full, each extra
    netlink dump here cost 5-20 ms, and pyroute2's rate tables more). A temporal tree's
    rates belong to its slot arbiter (another process re-plans them at every switch), so a rate
    fault there is refused (testbed.features.faults.plan.check refuses it before the run)."""
    if temporal:
        raise RuntimeError("rate faults are not applied to a temporal-sharing tree")
    shaping.set_rate(ipr, index, rate_mbit)


def _check_rate(ipr: IPRoute, intf: str, rate_mbit: float) -> None:
    """Raise unless the kernel holds rate_mbit on intf (read back)."""
    rate_bps = int(rate_mbit * 1e6)
    got = shaping.read_back(ipr, intf).get("rate_bps")
    if got is None or abs(got - rate_bps) > max(8, rate_bps * 0.001):
        raise RuntimeError(f"{intf}: kernel holds rate {got} bit/s after asking for {rate_bps}")


def _temporal(ipr: IPRoute, index: int) -> bool:
    return any(c["handle"] == wanshare.PARENT_HANDLE for c in ipr.get_classes(index=index))


def _set_netem(ipr: IPRoute, intf: str, w: "WanPlan", figures: dict[str, float]) -> None:
    """Change the netem leaf (netem backend): the link's current figures with these replaced.
    Run on a kernel with netem: the stock-kernel ring (tests/test_backends.py)."""
    link = w.link
    now = {"delay_ms": link.delay_ms, "jitter_ms": link.jitter_ms, "loss_pct": link.loss_pct,
           **figures}
    ipr.tc("change", "netem", shaping._index(ipr, intf), shaping.LEAF_HANDLE,
           parent=shaping.CLASS_HANDLE, delay=int(now["delay_ms"] * 1000),
           jitter=int(now["jitter_ms"] * 1000), loss=now["loss_pct"],
           limit=max(1000, link.queue_bytes // 1500))


def _tx_bytes(ipr: IPRoute, index: int) -> int:
    """Bytes sent by the interface with this ifindex (looked up once, in start())."""
    link = ipr.get_links(index)[0]
    stats = link.get_attr("IFLA_STATS64")
    return int(stats["tx_bytes"])


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _lead(runner: FaultRunner) -> str | None:
    """'stopped after the scenario's fault ...' (the last three applied), or None."""
    last = [r for r in runner.applied() if not r["restore"]][-3:]
    if not last:
        return None
    causes = "; ".join(f"{r['what']}, applied at {r['applied_s']:.3f} s" for r in last)
    return f"stopped after the scenario's fault {causes}"


class FaultsHandle(FeatureHandle):
    """The faults (and the wire's samples) of one system's run, on the run's clock."""

    name = "faults"
    clocked = True

    def __init__(self, plan: "FaultsPlan", ctx: RunContext) -> None:
        self.runner = FaultRunner(ctx.net, plan.faults, ctx.clock,
                                  sample_links=plan.sample_links).open()
        if plan.faults:
            ctx.progress(f"faults: {len(self.runner.events)} events, the first at "
                         f"{self.runner.events[0].at_s:g} s")

    def begin(self) -> None:
        self.runner.begin()

    def stop(self) -> None:
        self.runner.stop()    # idempotent: its threads are gone before its results are read

    def blame(self) -> str | None:
        return _lead(self.runner)

    def results(self, *, partial: bool, spans=()) -> MetricsBlock:
        """The events and the wire's samples, the same for a run that stopped early (the plot
        is testbed.run.systemrun's: it draws cross-traffic's results too)."""
        return MetricsBlock(key="faults", value=self.runner.results())
