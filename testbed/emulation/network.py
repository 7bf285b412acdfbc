"""The emulated multi-datacenter network: build it, run processes in its hosts, tear it down.

One job: lifecycle. `Network` is a context manager: `start()` builds the Mininet topology from
`testbed.plans.topo`, routes between DCs, applies shaping (`testbed.emulation.shaping`), starts and supervises
the delay lines (`testbed.emulation.delayline`) when the kernel has no netem, and records everything in a
`testbed.emulation.registry.Registry`; `stop()` (also on errors, Ctrl-C, SIGTERM and SIGHUP) undoes it
all in reverse. Measuring lives in `traffic/` and `testbed.run.calibrate`; planning in `testbed.plans.topo`.

A dead delay line turns its link into a black hole (NFQUEUE fails closed), so a supervisor
thread watches it and interrupts the main thread with a `TestbedError` naming the link.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from mininet.link import Link
from mininet.log import setLogLevel
from mininet.net import Mininet
from mininet.nodelib import LinuxBridge
from mininet.util import ensureRoot
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from testbed.emulation import interrupts, leash, limits, losscounters, machine, shaping, wanstats

from testbed.emulation import results
from testbed.emulation.delayline import QueueSpec
from testbed.spec.errors import ScenarioError, TestbedError
from testbed.emulation.tools import iperf
from testbed.emulation.procs import HostProcess, open_log, stop_all
from testbed.emulation.registry import Registry
from testbed.spec.scenario import (MAX_QUEUE_BYTES, MIN_TCP_BUFFER_BYTES, MTU_BYTES,
                              REAL_TCP_WMEM_MAX_BYTES, Scenario, scaled_tcp_rmem_max_bytes)
from testbed.emulation.minitopo import ScenarioTopo
from testbed.plans.topo import Plan, make_plan
from testbed.host.tcpcc import set_congestion_control
from testbed.spec.paths import REPO_ROOT
from testbed.spec.timescale import TimeScale

REQUIRED_TOOLS = {"mnexec": "mininet", "brctl": "bridge-utils", "iptables": "iptables",
                  "ifconfig": "net-tools", "ip": "iproute2"}
LINUX_TCP_RTO_MIN_US = 200_000   # TCP_RTO_MIN, the default of net.ipv4.tcp_rto_min_us
RTNH_F_ONLINK = 4
# How long a delay line may take to print READY. One that dies is reported at once (its exit is
# polled), so this bounds only a hung start; it is long because Python's own start is slow on an
# emulated CPU: 5-12 s for two delay lines starting at once in the stock-kernel guest (QEMU
# without KVM: scripts/stock_kernel.py), where this machine takes 0.06 s.
DELAYLINE_READY_TIMEOUT_S = 60.0
CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, kw_only=True, slots=True)
class DelayLineProc:
    gateway: str
    queues: tuple[QueueSpec, ...]
    links: tuple[str, ...]     # "a->b" per queue, for error messages and wan_stats()
    proc: HostProcess
    stats_path: Path           # where it writes its counters on SIGUSR1 (testbed.emulation.wanstats)
    control_path: Path         # new figures it applies on SIGUSR2 (testbed.features.faults.run)


def probe_netem(ipr: IPRoute) -> bool:
    """Does this kernel have netem? Try it on lo of a namespace we own, then remove it."""
    index = ipr.link_lookup(ifname="lo")[0]
    try:
        ipr.tc("add", "netem", index, 0x10000, delay=1000)
    except NetlinkError as exc:
        if exc.code in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
            return False
        raise
    ipr.tc("del", "netem", index, 0x10000)
    return True


def kernel_has_netem() -> bool:
    """probe_netem in a throwaway network namespace (a forked child), before anything is built."""
    pid = os.fork()
    if pid == 0:  # child: own namespace, answer by exit code, never return into the caller
        code = 2
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) == 0:
                with IPRoute() as ipr:
                    code = 0 if probe_netem(ipr) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise TestbedError("could not probe the kernel for netem (unshare of a network namespace failed)")
    return code == 0


def congestion_control_available(cc: str) -> bool:
    """Can a socket here run cc? Set it on a throwaway socket (as root this also loads a
    module the kernel has but has not loaded; tcp_available_congestion_control lists only
    loaded ones)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            set_congestion_control(sock, cc)
        except OSError:
            return False
    return True


def set_route_congestion_control(ipr: IPRoute, cc: str) -> int:
    """Give every IPv4 route of a host (its subnet and its default route) the congestion control
    cc (the route metric RTAX_CC_ALGO, `ip route ... congctl cc`), so every TCP connection over
    them runs cc unless its socket picks another (TCP_CONGESTION): gloo's sockets too. A host
    namespace could make only tcp_allowed_congestion_control its default (reno or bbr here, not
    cubic); a route's congctl has no such limit. Returns how many routes were changed."""
    n = 0
    for r in ipr.get_routes(family=socket.AF_INET, table=254):
        keep = {k: r.get_attr(k) for k in ("RTA_DST", "RTA_GATEWAY", "RTA_OIF", "RTA_PREFSRC")}
        args = {"dst": keep["RTA_DST"] or "0.0.0.0", "dst_len": r["dst_len"], "oif": keep["RTA_OIF"],
                "scope": r["scope"], "proto": r["proto"], "table": 254,
                "metrics": {"RTAX_CC_ALGO": cc}}
        if keep["RTA_GATEWAY"]:
            args["gateway"] = keep["RTA_GATEWAY"]
        if keep["RTA_PREFSRC"]:
            args["prefsrc"] = keep["RTA_PREFSRC"]
        ipr.route("replace", **args)
        n += 1
    return n


def route_congestion_controls(ipr: IPRoute) -> set[str]:
    """The congctl of every IPv4 route of a host, read back ('' for a route without one)."""
    out = set()
    for r in ipr.get_routes(family=socket.AF_INET, table=254):
        metrics = r.get_attr("RTA_METRICS")
        out.add((metrics.get_attr("RTAX_CC_ALGO") if metrics else None) or "")
    return out


def host_tcp_sysctls(scale: float, ts: TimeScale = TimeScale(),
                     slow_start_after_idle: bool = True) -> dict[str, str]:
    """Per-host TCP settings. Buffer limits of a real server, scaled down with the WAN (so one
    flow stays window-limited as it would be on the real link); at scale 1 the real server's
    own. With time_scale T, the minimum retransmission timeout is T times Linux's 200 ms, so
    RTOs, and the idle restart that counts them (slow start after idle), keep their ratio to
    the dilated RTT; the other kernel timers are not dilated (README: what each scaling keeps).
    Slow start after idle as the scenario says (Linux's default: on)."""
    rmem = scaled_tcp_rmem_max_bytes(scale)
    wmem = max(MIN_TCP_BUFFER_BYTES, int(REAL_TCP_WMEM_MAX_BYTES / scale))
    out = {
        "net.ipv4.tcp_rmem": f"{min(4096, rmem)} {min(131072, rmem)} {rmem}",
        "net.ipv4.tcp_wmem": f"{min(4096, wmem)} {min(16384, wmem)} {wmem}",
    }  # net.core.[rw]mem_max are machine-wide (read-only in a namespace): left alone
    out["net.ipv4.tcp_slow_start_after_idle"] = "1" if slow_start_after_idle else "0"
    if ts.dilated:
        out["net.ipv4.tcp_rto_min_us"] = str(int(ts.emulated_span(LINUX_TCP_RTO_MIN_US)))
    return out


class Network:
    """`with Network(scenario, run_dir) as net:` builds, and always tears down, the testbed."""

    def __init__(self, scenario: Scenario, run_dir: Path, *, backend: str | None = None,
                 run_id: str | None = None, realtime: bool = True) -> None:
        self.scenario = scenario   # as configured; the network is built from its emulated()
        self.plan: Plan = make_plan(scenario.emulated())
        self.run_dir = run_dir
        self.requested_backend = backend or scenario.backend
        self._backend_field = "--backend" if backend else "backend"
        self.backend = ""
        self.run_id = run_id or run_dir.name
        self.cluster_path: str | None = None   # the cluster file, where nodes are on servers
        self.net: _RecordingMininet | None = None
        self.registry: Registry | None = None
        self.procs: list[HostProcess] = []
        self._procs_lock = threading.Lock()
        self.delaylines: list[DelayLineProc] = []
        self.realtime = realtime   # delay lines at SCHED_FIFO, idle CPUs polling (False: neither)
        self.cpu_idle = "off"      # "poll" while the network holds the no-halt request (machine)
        self._wakeup_fd: int | None = None
        self.realtime_status: dict[str, str] = {}  # gateway -> "fifo:50", "refused:EPERM", "off"
        self.failure: str | None = None
        self._stop_supervisor = threading.Event()
        self._supervisor_lock = threading.Lock()
        self._stopping = False
        self._supervisor: threading.Thread | None = None
        self._old_handlers: dict[int, object] = {}
        self.timings_s: dict[str, float] = {}
        self.congestion_control: dict[str, str] = {}
        self.kernel_modules_loaded: list[str] | str = []   # by the build, then the run (machine)
        self._modules_before: frozenset[str] | None = None
        self._owner_pid = os.getpid()

    # ---- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> "Network":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop()
        if exc_type is None and self.failure:  # a delay line died as the body ended
            raise TestbedError(self.failure)

    def start(self) -> None:
        t0 = time.monotonic()
        check_environment()
        self._modules_before = machine.loaded_modules()   # before the netem probe and the build
        if self.requested_backend not in ("auto", "netem", "delayline"):
            raise ScenarioError(self._backend_field, f"{self.requested_backend!r} is not a "
                                "backend", "use auto, netem or delayline")
        self.backend = self._choose_backend()
        if not congestion_control_available(self.scenario.congestion_control):
            have = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
            raise ScenarioError("congestion_control", f"{self.scenario.congestion_control!r} is "
                                "not available in this kernel", f"use one of {', '.join(have)}")
        rto_min = Path("/proc/sys/net/ipv4/tcp_rto_min_us")
        if self.scenario.dilation.dilated and not rto_min.exists():
            raise ScenarioError("time_scale", "needs net.ipv4.tcp_rto_min_us (Linux 6.11 or "
                                "later) to dilate the minimum RTO", "use time_scale: 1 here")
        topo = ScenarioTopo(self.plan)   # a shell (pty, open files) per namespace
        limits.check_free_ptys(len(topo.nodes()))
        limits.reserve_open_files(len(topo.nodes()))
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.registry = Registry(self.run_id, cluster=self.cluster_path)
        leash.ensure()   # before the first host shell: every process of the run dies with us
        self._install_signal_handlers()
        setLogLevel("error")
        self.net = self._mininet(topo)
        self.net.build()
        self.net.start()
        self._verify_interfaces()
        self._configure_gateways()
        self._configure_hosts()
        self._shape()
        if self.backend == "delayline":
            if self.realtime:
                # A halted vCPU wakes through the hypervisor (ms on a busy host): keep idle
                # CPUs polling while the delay lines must keep time (testbed.emulation.machine).
                self._wakeup_fd, self.cpu_idle = machine.hold_cpu_wakeup_latency()
            self._start_delaylines()
        self.kernel_modules_loaded = machine.modules_loaded_since(self._modules_before)
        self._start_supervisor()
        self.timings_s["up"] = time.monotonic() - t0

    def stop(self) -> None:
        """Undo everything start() did, in reverse, even if a step fails. A second Ctrl-C,
        SIGTERM or SIGHUP during teardown is held back so it cannot leave it half done. What
        could not be removed stays listed in the registry for `run_testbed.py cleanup`."""
        if os.getpid() != self._owner_pid:
            return  # a forked child (pyroute2's netns helper) never tears down the network
        self._stopping = True  # first: from here on a SIGUSR1 handler does nothing
        t0 = time.monotonic()
        with self._supervisor_lock:  # from here on the supervisor sends no SIGUSR1
            self._stop_supervisor.set()
        held = self._hold_signals()
        errors: list[str] = []
        try:
            if self._supervisor is not None:
                self._supervisor.join(timeout=2)
                self._supervisor = None
            # Workers first, delay lines last (their links must carry the workers' goodbyes).
            stuck = stop_all(list(reversed(self.procs)))
            stuck += stop_all([dl.proc for dl in reversed(self.delaylines)])
            errors += [f"{p.describe()} would not die" for p in stuck]
            self.procs.clear()
            self.delaylines.clear()
            if self.net is not None:
                net, self.net = self.net, None
                try:
                    net.stop()
                except Exception as exc:  # noqa: BLE001 - go on tearing down, report below
                    # Mininet asserts on a network interrupted mid-build: remove what the
                    # registry lists (the hosts' processes, the interfaces) as cleanup would
                    left = [] if self.registry is None else [
                        line for line in self.registry.remove_all()
                        if line.startswith("could not")]
                    if left or self.registry is None:
                        errors.append(f"mininet stop: {type(exc).__name__}: {exc}; " +
                                      "; ".join(left))
            if self.registry is not None:
                if errors:
                    print(f"warning: teardown incomplete ({'; '.join(errors)}); "
                          f"run: python run_testbed.py cleanup", file=sys.stderr)
                else:
                    self.registry.close()
                self.registry = None
        finally:
            machine.release_cpu_wakeup_latency(self._wakeup_fd)
            self._wakeup_fd = None
            self._restore_signal_handlers(held)
            if self.backend:   # past the build's start: what the whole run loaded (arbiters'
                # qdiscs, a congestion control set later) goes into env.json too
                self.kernel_modules_loaded = machine.modules_loaded_since(self._modules_before)
                results.record_modules(self.run_dir / "env.json", self.kernel_modules_loaded)
            self.timings_s["down"] = time.monotonic() - t0

    # ---- running things in hosts -----------------------------------------------------------
    def node(self, name: str):
        if self.net is None:
            raise TestbedError("the network is not running")
        try:
            return self.net[name]
        except KeyError:
            raise TestbedError(f"no host {name!r} in scenario {self.scenario.name}") from None

    def spawn(self, host: str, argv: Sequence[str], log_path: Path,
              env: dict[str, str] | None = None) -> HostProcess:
        """Start argv inside host's namespace (its own process group), output to log_path."""
        node = self.node(host)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path = unused_path(log_path)  # a process per log: never overwrite an earlier one's
        with open_log(log_path) as log:
            popen = node.popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, env=leash.child_env(env),
                               cwd=str(REPO_ROOT))
        assert self.registry is not None
        self.registry.add_pid(popen.pid, f"{Path(argv[0]).name} in {host}")
        proc = HostProcess(host, argv, popen, log_path, on_exit=self._forget)
        with self._procs_lock:   # spawned from several threads (cross-traffic's scheduler too)
            self.procs.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], timeout_s: float, name: str = "") -> str:
        """Run argv in host to completion; return its output. Raise TestbedError on failure."""
        log_path = self.run_dir / "logs" / f"{host}-{name or Path(argv[0]).name}.log"
        proc = self.spawn(host, argv, log_path)
        try:
            rc = proc.wait(timeout_s)
        except TimeoutError as exc:
            proc.stop()
            raise TestbedError(str(exc)) from None
        out = proc.output(tail_chars=10_000_000)
        if rc != 0:
            raise TestbedError(f"{' '.join(argv)} in {host} exited with {rc}: {out[-500:]}")
        return out

    def host_ip(self, name: str) -> str:
        return self.plan.host(name).ip

    def wan_stats(self) -> dict[str, dict]:
        """Per WAN direction "a->b", what the delay lines counted since the previous call
        (packets, bytes, drops by cause, id gaps, lateness; see testbed.emulation.wanstats), and start
        a new interval. Empty with the netem backend (nothing to count)."""
        if self.backend != "delayline" or not self.delaylines:
            return {}
        return wanstats.collect(self.delaylines)

    def loss_counters(self) -> dict[str, dict]:
        """The kernel's loss figures since the network was built (testbed.emulation.losscounters):
        {"tcp": {host: TCP counters} for every host, "queues": {"a->b": the WAN queue's drops,
        packets, bytes}}. Read them before temporal sharing restores the plain tree. What
        cannot be read is left out and named in "errors" (a figure, not worth a run)."""
        tcp, queues, errors = {}, {}, []
        for h in self.plan.hosts:
            try:
                tcp[h.name] = self._tcp_counters(h.name)
            except (OSError, KeyError, ValueError, TestbedError) as exc:
                errors.append(f"{h.name}: {type(exc).__name__}: {exc}")
        for w in self.plan.wan:
            for end, direction in zip(w.ends(), w.link.directions):
                try:
                    queues[str(direction)] = self._queue_counters(end.gateway, end.intf)
                except Exception as exc:  # noqa: BLE001 - netlink errors of any kind
                    errors.append(f"{direction}: {type(exc).__name__}: {exc}")
        return {"tcp": tcp, "queues": queues, "errors": errors}

    def _tcp_counters(self, host: str) -> dict[str, int]:
        return losscounters.tcp_counters(self.node(host).pid)

    def _queue_counters(self, gateway: str, intf: str) -> dict[str, int]:
        with self._ipr(gateway) as ipr:
            return losscounters.queue_counters(ipr, intf)

    def diagnose(self, exc: TestbedError) -> TestbedError:
        """The failure to report for exc, raised by work on this network (here exc itself;
        testbed.emulation.clusternet names a lost server instead)."""
        return exc

    def check(self) -> None:
        """Raise if a supervised process (a delay line) has died."""
        if self.failure:
            raise TestbedError(self.failure)

    def _forget(self, pid: int) -> None:
        with self._procs_lock:
            self.procs[:] = [p for p in self.procs if p.pid != pid]

    # ---- building --------------------------------------------------------------------------
    # Each step below reaches a node through one of these hooks; testbed.emulation.clusternet
    # gives them versions that go through the node's server (ssh), not its pid.
    def _ipr(self, node_name: str) -> IPRoute:
        return IPRoute(netns=f"/proc/{self.node(node_name).pid}/ns/net")

    def _mininet(self, topo: ScenarioTopo) -> Mininet:
        return _RecordingMininet(self.registry, topo=topo, switch=LinuxBridge, controller=None,
                                 link=Link, build=False, autoSetMacs=False, waitConnected=False)

    def _link_states(self, node_name: str) -> dict[str, str]:
        """Interface name -> operational state ("UP", ...) in a node."""
        with self._ipr(node_name) as ipr:
            return {link.get_attr("IFLA_IFNAME"): link.get_attr("IFLA_OPERSTATE")
                    for link in ipr.get_links()}

    def _add_route(self, node_name: str, dst: str, via: str, intf: str) -> None:
        with self._ipr(node_name) as ipr:
            # onlink: the next hop is on this veth; don't wait for its carrier.
            ipr.route("add", dst=dst, gateway=via, flags=RTNH_F_ONLINK,
                      oif=ipr.link_lookup(ifname=intf)[0])

    def _route_congestion_control(self, node_name: str, cc: str) -> set[str]:
        """Give every route of a host cc; the congctls its routes then hold."""
        with self._ipr(node_name) as ipr:
            set_route_congestion_control(ipr, cc)
            return route_congestion_controls(ipr)

    def _apply_tc(self, node_name: str, ops: list) -> None:
        with self._ipr(node_name) as ipr:
            shaping.apply(ipr, ops)

    def _held_rate_bps(self, node_name: str, intf: str) -> tuple[int | None, float]:
        """The rate the kernel holds on intf's shaping class, and the tolerance of its reading."""
        with self._ipr(node_name) as ipr:
            return shaping.read_back(ipr, intf).get("rate_bps"), 8

    def cluster_record(self) -> dict | None:
        """The servers the network is spread over (testbed.emulation.clusternet); None here."""
        return None

    def underlay_of(self, index: int) -> dict | None:
        """What carries WAN link index besides the emulation (a cluster's underlay): None here."""
        return None

    def listening(self, host: str, proc: HostProcess, port: int) -> bool:
        """Does proc (started in host) listen on TCP port yet?"""
        return iperf.listening(proc.pid, port)

    def _verify_interfaces(self, timeout_s: float = 5.0) -> None:
        """Every host, gateway and bridge holds the interfaces the plan gave it, and each has
        its carrier (read via netlink). A veth's carrier follows its peer's state through the
        kernel's link watch, up to a second later: traffic sent before it is lost (a first
        ARP went unanswered for 1 s), so wait for it."""
        want: dict[str, set[str]] = {h.name: {h.intf} for h in self.plan.hosts}
        for gw in self.plan.gateways.values():
            want[gw] = {f"{gw}-eth0"}
        for w in self.plan.wan:
            for end in w.ends():
                want[end.gateway].add(end.intf)
        for dc in self.plan.scenario.dcs:
            bridge = self.plan.bridges[dc.name]
            want[bridge] = {bridge, *self.plan.bridge_ports(dc.name)}
        deadline = time.monotonic() + timeout_s
        for name, intfs in want.items():
            while True:
                state = self._link_states(name)
                if not intfs <= set(state):
                    raise TestbedError(f"{name} lacks {sorted(intfs - set(state))} after "
                                       f"Mininet built it (has {sorted(state)}); the build "
                                       f"was disturbed, run again")
                down = sorted(i for i in intfs if state[i] != "UP")
                if not down:
                    break
                if time.monotonic() > deadline:
                    raise TestbedError(f"{name}: {', '.join(down)} had no carrier "
                                       f"{timeout_s:g} s after the build")
                time.sleep(0.02)

    def _configure_gateways(self) -> None:
        for dc, gw in self.plan.gateways.items():
            self._sysctl(gw, {"net.ipv4.ip_forward": "1"})
            for route in self.plan.routes:
                if route.gateway == gw:
                    self._add_route(gw, route.dst, route.via, route.intf)

    def _configure_hosts(self) -> None:
        sysctls = host_tcp_sysctls(self.scenario.scale, self.scenario.dilation,
                                   self.scenario.tcp_slow_start_after_idle)
        cc = self.scenario.congestion_control
        routes: set[str] = set()
        for h in self.plan.hosts:
            self._sysctl(h.name, sysctls)
            routes |= self._route_congestion_control(h.name, cc)
        if routes != {cc}:
            raise TestbedError(f"host routes hold congestion controls {sorted(routes)}, asked "
                               f"for {cc}")
        # The testbed's own sockets (trainer transport, iperf3 -C) also set it per socket.
        self.congestion_control = {"configured": cc, "per_socket": cc, "host_routes": cc}
        for dc in self.plan.scenario.dcs:
            if dc.rate_mbit is None:
                continue
            # 10 ms of the configured rate: bytes, so not dilated by time_scale
            configured_mbit = self.scenario.dc(dc.name).rate_mbit
            queue = max(100 * MTU_BYTES, int(configured_mbit * 1e6 / 8 * 0.01))
            for i, h in enumerate(self.plan.hosts_in(dc.name), start=2):
                self._apply_tc(h.name, shaping.plan_link(h.intf, dc.rate_mbit, queue))
                bridge = self.plan.bridges[dc.name]
                self._apply_tc(bridge, shaping.plan_link(f"{bridge}-eth{i}", dc.rate_mbit, queue))

    def _sysctl(self, node_name: str, values: dict[str, str]) -> None:
        node = self.node(node_name)
        for key, value in values.items():
            path = "/proc/sys/" + key.replace(".", "/")
            out = node.cmd(f"echo '{value}' > {path} && echo ok")
            if "ok" not in out:
                raise TestbedError(f"could not set {key}={value} in {node_name}: {out.strip()}")

    def _choose_backend(self) -> str:
        """Probe the kernel (before building anything) and pick or check the backend."""
        has_netem = kernel_has_netem()
        if self.requested_backend == "netem" and not has_netem:
            raise ScenarioError(self._backend_field, "netem was asked for but this kernel has "
                                "no netem", "use delayline or auto")
        if self.requested_backend == "auto":
            return "netem" if has_netem else "delayline"
        return self.requested_backend

    def _shape(self) -> None:
        for w in self.plan.wan:
            link = w.link
            netem = None
            if self.backend == "netem":
                netem = {"delay_ms": self._added_delay_ms(w), "jitter_ms": link.jitter_ms,
                         "loss_pct": link.loss_pct}
            for end in w.ends():
                self._apply_tc(end.gateway, shaping.plan_link(end.intf, link.rate_mbit,
                                                              link.queue_bytes, netem=netem))
                got, tol = self._held_rate_bps(end.gateway, end.intf)
                want = int(link.rate_mbit * 1e6)
                if abs((got or 0) - want) > max(tol, want * 0.001):
                    raise TestbedError(f"{end.intf}: kernel holds rate {got} bit/s, "
                                       f"asked for {want}")

    def _start_delaylines(self) -> None:
        per_gw: dict[str, list[tuple[QueueSpec, str, str]]] = {}
        lossy = {f.link for f in self.scenario.faults if f.kind == "loss"}
        ts = self.scenario.dilation
        for w in self.plan.wan:
            link = w.link
            # NFQUEUE holds what is in flight on the link (rate x (delay + jitter)); counted in
            # packets, which may be single segments (with loss, GSO is off), with 2x headroom.
            # The largest figures the scenario's faults give the link count too.
            mine = [f for f in self.scenario.faults if f.link == link.between]
            rate = max([link.rate_mbit]
                       + [ts.emulated_rate(f.rate_mbit) for f in mine if f.rate_mbit])
            delay = max([link.delay_ms + link.jitter_ms] + [
                ts.emulated_span(f.delay_ms + (f.jitter_ms or 0)) for f in mine
                if f.delay_ms is not None])
            # In flight is cut at the WAN queue's cap, as the queue is: NFQUEUE's maxlen is a
            # u32, and what it lets the kernel hold is bounded.
            in_flight = min(rate * 1e6 / 8 * delay / 1e3, MAX_QUEUE_BYTES)
            maxlen = max(1024, int(2 * in_flight // 1000))
            # a->b is delayed as it enters b's gateway, and b->a as it enters a's.
            for k, (d, src, dst) in enumerate(zip(link.directions, w.ends(),
                                                  (w.end_b, w.end_a))):
                spec = QueueSpec(num=2 * w.index + k + 1, delay_ms=self._added_delay_ms(w),
                                 jitter_ms=link.jitter_ms, loss_pct=link.loss_pct, maxlen=maxlen,
                                 gso=link.between not in lossy)
                gw, match = self._delay_at(w, src, dst)
                per_gw.setdefault(gw, []).append((spec, match, str(d)))
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        for gw, items in per_gw.items():
            # Each delay line draws its own jitter and loss (seeded by its first queue number).
            stats_path = unused_path(self.run_dir / "logs" / f"{gw}-delayline-stats.json")
            control_path = unused_path(self.run_dir / "logs" / f"{gw}-delayline-control.json")
            argv = [sys.executable, "-m", "testbed.emulation.delayline", "--seed", str(items[0][0].num),
                    "--stats", str(stats_path), "--control", str(control_path)]
            if not self.realtime:
                argv.append("--no-realtime")
            for spec, _intf, _name in items:
                argv += ["--queue", spec.format()]
            proc = self.spawn(gw, argv, self.run_dir / "logs" / f"{gw}-delayline.log", env=env)
            with self._procs_lock:   # supervised separately, stopped after the workers
                self.procs.remove(proc)
            # Listed at once, so stop() ends it even if a later step of start() fails.
            self.delaylines.append(DelayLineProc(gateway=gw, queues=tuple(s for s, _, _ in items),
                                                 links=tuple(n for _, _, n in items), proc=proc,
                                                 stats_path=stats_path,
                                                 control_path=control_path))
        for dl, items in zip(self.delaylines, per_gw.values()):
            self.realtime_status[dl.gateway] = _wait_ready(dl.proc, timeout_s=DELAYLINE_READY_TIMEOUT_S)
            for spec, match, _name in items:
                out = self.node(dl.gateway).cmd(f"iptables -w -A FORWARD {match} -j NFQUEUE "
                                                f"--queue-num {spec.num} && echo ok")
                if "ok" not in out:
                    raise TestbedError(f"iptables NFQUEUE rule in {dl.gateway} failed: "
                                       f"{out.strip()}")
        refused = [f"{gw}: {st}" for gw, st in self.realtime_status.items()
                   if not st.startswith("fifo") and st != "off"]
        if refused:
            print(f"warning: real-time priority refused for the delay lines ({', '.join(refused)}); "
                  f"delay may spike while the CPUs are busy", file=sys.stderr)

    def _added_delay_ms(self, w) -> float:
        """The one-way delay the emulation adds on WAN link w (its delay line or netem leaf;
        emulated ms)."""
        return w.link.delay_ms

    def _delay_at(self, w, src, dst) -> tuple[str, str]:
        """Where a direction src -> dst of WAN link w is delayed: (gateway, iptables match).
        Here as it enters dst's gateway, after src's rate (queue, then propagation)."""
        return dst.gateway, f"-i {dst.intf}"

    # ---- supervision -----------------------------------------------------------------------
    def _supervised_failure(self) -> str | None:
        """Why the run cannot go on (a supervised process died), or None; polled 10 times a
        second by the supervisor thread."""
        for dl in self.delaylines:
            rc = dl.proc.poll()
            if rc is not None:
                return (f"delay line in {dl.gateway} (links {', '.join(dl.links)}) died with "
                        f"exit code {rc}; those links dropped every packet, so the run was "
                        f"stopped. Log: {dl.proc.log_path}")
        return None

    def _supervises(self) -> bool:
        """Whether anything needs watching (here: the delay lines)."""
        return bool(self.delaylines)

    def _start_supervisor(self) -> None:
        if not self._supervises():
            return
        main_id = threading.main_thread().ident

        def watch() -> None:
            while not self._stop_supervisor.wait(0.1):
                failure = self._supervised_failure()
                if failure is None:
                    continue
                with self._supervisor_lock:
                    if self._stop_supervisor.is_set():
                        return
                    self.failure = failure
                    # Interrupt the main thread only where our handler is installed (SIGUSR1's
                    # default action would kill the process untidily); else the next check()
                    # raises.
                    if main_id is not None and signal.SIGUSR1 in self._old_handlers:
                        signal.pthread_kill(main_id, signal.SIGUSR1)
                    return

        self._supervisor = threading.Thread(target=watch, name="delayline-supervisor", daemon=True)
        self._supervisor.start()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        owner = os.getpid()

        # pyroute2 forks helper processes (for netns sockets) that inherit these handlers and
        # are stopped with SIGTERM; in such a child the handler must just die, or the child's
        # copy of our stack would run the teardown and destroy the real network.
        def in_owner(signum: int) -> bool:
            if os.getpid() == owner:
                return True
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return False

        def on_usr1(signum, frame):  # noqa: ARG001
            # Once stop() has begun, teardown must run whole: __exit__ raises the failure after.
            if in_owner(signum) and not self._stopping:
                raise TestbedError(self.failure or "a supervised process died")

        def on_term(signum, frame):  # noqa: ARG001
            if in_owner(signum):
                if signum == signal.SIGHUP:
                    interrupts.detach_from_terminal()
                raise KeyboardInterrupt(f"interrupted ({signal.Signals(signum).name})")

        for sig, handler in ((signal.SIGUSR1, on_usr1), (signal.SIGTERM, on_term),
                             (signal.SIGHUP, on_term)):
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _hold_signals(self) -> dict[int, object]:
        """During teardown, SIGINT, SIGTERM and SIGHUP are noted, not acted on."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        owner = os.getpid()

        def note(signum, frame):  # noqa: ARG001
            if os.getpid() != owner:  # a forked pyroute2 helper: just die
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            elif signum == signal.SIGHUP:
                interrupts.detach_from_terminal()

        return {sig: signal.signal(sig, note)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def _restore_signal_handlers(self, held: dict[int, object]) -> None:
        # What start() replaced goes back first, then what stop() held (SIGTERM appears in
        # both: its handler from before start() wins).
        for sig, handler in held.items():
            if sig not in self._old_handlers:
                signal.signal(sig, handler)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()


class _RecordingMininet(Mininet):
    """Mininet that lists each host's shell in the registry the moment it exists, so even a
    build killed half-way leaves nothing `cleanup` does not know about, and that changes
    nothing outside its namespaces: Mininet's init() is skipped but for its root check (its
    fixLimits() writes machine-wide sysctls in the root namespace and this process's NOFILE
    and NPROC limits, never restored; what a network needs, testbed.emulation.limits takes, and the
    hosts' TCP settings are written in each host's own namespace). LinuxBridge.setup() only
    reads the root namespace's bridge-nf sysctls (a warning, silenced by setLogLevel)."""

    def __init__(self, registry: Registry, **kwargs) -> None:
        self._registry = registry
        ensureRoot()
        Mininet.inited = True   # Mininet.__init__ then skips Mininet.init()
        super().__init__(**kwargs)

    def addHost(self, name, cls=None, **params):  # noqa: N802 - Mininet's API
        host = super().addHost(name, cls=cls, **params)
        if not getattr(host, "isRemote", False):   # a remote one is in its server's registry
            self._registry.add_pid(host.pid, f"mininet host {name}")
        return host

    def addSwitch(self, name, cls=None, **params):  # noqa: N802 - Mininet's API
        switch = super().addSwitch(name, cls=cls, **params)
        if not getattr(switch, "isRemote", False):
            self._registry.add_pid(switch.pid, f"mininet bridge {name}")
        return switch


def unused_path(path: Path) -> Path:
    """path, or path with -2, -3, ... before its suffix: the first that does not exist yet."""
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
    return candidate


def _wait_ready(proc: HostProcess, timeout_s: float) -> str:
    """Wait for the delay line's `READY rt=<status> <queues>` line; return its rt status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # The READY line lists every queue: read it all, and only a whole line.
        ready = re.search(r"^READY(?: rt=(\S+))?.*\n", proc.output(1 << 20), re.MULTILINE)
        if ready:
            return ready.group(1) or "unknown"
        if proc.poll() is not None:
            raise TestbedError(f"{proc.describe()} failed to start: {proc.output().strip()}")
        time.sleep(0.01)
    raise TestbedError(f"{proc.describe()} not ready after {timeout_s:.0f} s: {proc.output().strip()}")


def check_environment() -> None:
    """Root and the system tools Mininet and the delay line need; one clear line if missing."""
    if os.geteuid() != 0:
        raise TestbedError("building the emulated network needs root; run with sudo")
    missing = [f"{tool} (apt package {pkg})" for tool, pkg in REQUIRED_TOOLS.items()
               if shutil.which(tool) is None]
    if missing:
        raise TestbedError(f"missing tools: {', '.join(missing)}; run: sudo make setup")
