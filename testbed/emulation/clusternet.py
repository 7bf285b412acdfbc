"""The emulated network with its DCs on several servers (issue 25 part 2; docs/cluster.md).

One job: Network (testbed.emulation.network) built through Mininet's cluster mode. Every node is
a ClusterHost or ClusterBridge (testbed.emulation.remote) on its DC's server, reached over ssh;
every link a VXLANLink (testbed.emulation.vxlan): a veth within a server, a VXLAN tunnel (one VNI
per link, testbed.plans.crossing) between servers; every interface gets the hosts' MTU (the
underlay's less 50 bytes). Before building, the underlay between each pair of servers a
crossing link joins is measured (ping between their addresses): half its mean RTT is taken off
that link's added delay (refused, one line, where larger) and it is reported beside the link's
figures. The backend is chosen as on one machine, from every server's kernel: netem where all
have it (each probed over ssh in a throwaway namespace there). A crossing link is shaped (HTB)
at its sending gateway; with netem, delayed there too (the HTB class's leaf), with the delay
line as it enters the receiving gateway (FORWARD -i), as on one machine: rate, then
propagation (a delay line at the sender would sit before the HTB queue, in netfilter, and hold
every byte for the link's delay before the rate, which temporal sharing's slots then see
late). Each step of the build
that the one-machine Network does by pid (netlink into a namespace) is done here by a command
in the node's shell. Teardown ends, on every server, what that server's registry lists.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
from pathlib import Path

from testbed.emulation import losscounters, machine, shaping, wanstats
from testbed.emulation.minitopo import ScenarioTopo
from testbed.emulation.network import Network
from testbed.emulation.remote import ClusterBridge, ClusterHost
from testbed.emulation.serverregistry import ServerRegistry, signal_recorded
from testbed.emulation.serverleash import SILENCE_S
from testbed.emulation.servers import (SshFailed, measure_underlay, server_kernel,
                                     server_modules, server_run)
from testbed.emulation.vxlan import VXLANLink
from testbed.plans.crossing import Crossing, Underlay, crossings, delay_after_underlay, host_mtu
from testbed.spec.cluster import Cluster, scenario_placement
from testbed.spec.errors import ScenarioError, TestbedError
from testbed.spec.scenario import Scenario

_LINK_RE = re.compile(r"^\d+: ([^:@\s]+)(?:@\S+)?: <([^>]*)>.*? state (\S+)", re.MULTILINE)


def underlay_mtu(server, peer) -> int:
    """The MTU of the device by which server reaches peer's address (asked on server)."""
    out = server_run(server, f"d=$(ip -o route get {shlex.quote(peer.address)} | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'); "
                     "cat /sys/class/net/$d/mtu")
    return int(out.split()[-1])


class ClusterNetwork(Network):
    """`with ClusterNetwork(scenario, run_dir, cluster) as net:` like Network."""

    def __init__(self, scenario: Scenario, run_dir: Path, cluster: Cluster, *,
                 backend: str | None = None, run_id: str | None = None,
                 realtime: bool = True) -> None:
        super().__init__(scenario, run_dir, backend=backend, run_id=run_id, realtime=realtime)
        if scenario.faults:
            raise ScenarioError("faults", "faults across servers are not built yet",
                                "drop --cluster or the faults")
        self.cluster = cluster
        self.cluster_path = cluster.path
        self.placement = scenario_placement(cluster, scenario)
        self.crossing: dict[int, Crossing] = {
            c.index: c for c in crossings([(w.a, w.b) for w in scenario.wan],
                                          self.placement.dc_server)}
        self.server_registry = ServerRegistry(self.run_id)
        self.underlay: dict[tuple[str, str], Underlay] = {}
        self.mtu = 1500
        self.added_delay_ms: dict[int, float] = {}
        self.servers_netem: dict[str, bool] = {}
        self._server_modules_before: dict[str, frozenset[str] | None] = {}
        self.server_modules_loaded: dict[str, list[str] | str] = {}
        names = {h.name: h.dc for h in self.plan.hosts}
        names.update({gw: dc for dc, gw in self.plan.gateways.items()})
        names.update({br: dc for dc, br in self.plan.bridges.items()})
        self._node_dc = names

    # ---- before the build: the underlay ------------------------------------------------------
    def start(self) -> None:
        mtus = []
        for c in self.crossing.values():
            key = (c.server_a, c.server_b)
            if key not in self.underlay:
                a, b = self.cluster.server(c.server_a), self.cluster.server(c.server_b)
                self.underlay[key] = measure_underlay(a, b)
                mtus += [underlay_mtu(a, b), underlay_mtu(b, a)]
        self.mtu = host_mtu(min(mtus)) if mtus else 1500
        for w in self.plan.wan:
            c = self.crossing.get(w.index)
            self.added_delay_ms[w.index] = w.link.delay_ms if c is None else delay_after_underlay(
                c.name, w.link.delay_ms, self.underlay[(c.server_a, c.server_b)])
        super().start()
        self.server_modules_loaded = {
            name: machine.modules_between(before, server_modules(self.cluster.server(name)))
            for name, before in self._server_modules_before.items()}

    def _choose_backend(self) -> str:
        """Every server's kernel probed (before anything is built there): netem only where all
        of them have it; the modules each server had loaded before, for the record."""
        for name in sorted(set(self.placement.dc_server.values())):
            self._server_modules_before[name], self.servers_netem[name] = server_kernel(
                self.cluster.server(name))
        lacking = [name for name, has in self.servers_netem.items() if not has]
        if self.requested_backend == "netem" and lacking:
            raise ScenarioError(self._backend_field, f"netem was asked for but the kernel of "
                                f"server {lacking[0]} has no netem", "use delayline or auto")
        if self.requested_backend == "auto":
            return "delayline" if lacking else "netem"
        return self.requested_backend

    def cluster_record(self) -> dict:
        """Placement on servers, hosts' MTU, the underlay between each pair of servers, and
        what each server's kernel has (netem) and loaded for the run."""
        return dict(self.placement.to_dict(self.cluster), host_mtu=self.mtu,
                    underlay={f"{a}<->{b}": dataclasses.asdict(u)
                              for (a, b), u in self.underlay.items()},
                    netem=self.servers_netem, modules_loaded=self.server_modules_loaded)

    def underlay_of(self, index: int) -> dict | None:
        """The underlay figures of WAN link index, if it crosses servers (for its report)."""
        c = self.crossing.get(index)
        if c is None:
            return None
        u = self.underlay[(c.server_a, c.server_b)]
        return {"servers": [c.server_a, c.server_b], "vni": c.vni, "rtt_ms": u.rtt_ms,
                "jitter_ms": u.mdev_ms, "min_ms": u.min_ms, "max_ms": u.max_ms,
                "added_delay_ms": self.added_delay_ms[index], "host_mtu": self.mtu}

    # ---- the build, through each node's server -----------------------------------------------
    def _mininet(self, topo: ScenarioTopo):
        for name in topo.nodes():
            server = self.cluster.server(self.placement.dc_server[self._node_dc[name]])
            cls = ClusterBridge if topo.isSwitch(name) else ClusterHost
            topo.nodeInfo(name).update(cls=cls, cluster_server=server,
                                       registry=self.server_registry)
        wan = {(w.end_a.gateway, w.end_b.gateway): w.index for w in self.plan.wan}
        for a, b, key, info in topo.links(withKeys=True, withInfo=True):
            index = wan.get((info["node1"], info["node2"]))
            c = self.crossing.get(index) if index is not None else None
            info.update(cls=VXLANLink, vni=c.vni if c else 0, mtu=self.mtu)
        return super()._mininet(topo)

    def _link_states(self, node_name: str) -> dict[str, str]:
        out = self.node(node_name).cmd("ip -o link show")
        # A VXLAN device's operstate stays UNKNOWN; its carrier is LOWER_UP.
        return {name: "UP" if state == "UNKNOWN" and "LOWER_UP" in flags.split(",") else state
                for name, flags, state in _LINK_RE.findall(out)}

    def _add_route(self, node_name: str, dst: str, via: str, intf: str) -> None:
        self._sh(node_name, f"ip route add {dst} via {via} dev {intf} onlink")

    def _route_congestion_control(self, node_name: str, cc: str) -> set[str]:
        out = self._sh(node_name, "ip -4 route show | while read -r r; do "
                       f"ip route replace $r congctl {cc} || exit 1; done; ip -4 route show")
        routes = [line for line in out.splitlines() if line.strip() and line.strip() != "ok"]
        return {(re.search(r"congctl (\S+)", r) or [None, ""])[1] for r in routes}

    def _apply_tc(self, node_name: str, ops: list) -> None:
        self._sh(node_name, " && ".join(shaping.tc_command(op) for op in ops))

    def _held_rate_bps(self, node_name: str, intf: str) -> tuple[int | None, float]:
        out = self._sh(node_name, f"tc class show dev {intf} classid 1:10")
        got = shaping.parse_tc_rate_bps(out)
        return got, 0.005 * (got or 0)   # tc prints the rate rounded (e.g. 33.3Mbit)

    def listening(self, host, proc, port: int) -> bool:
        return bool(self.node(host).cmd(f"ss -Htln 'sport = :{port}'").strip())

    def _sh(self, node_name: str, script: str) -> str:
        """script in node's shell (on its server); its output; TestbedError if it fails."""
        out = self.node(node_name).cmd(f"{{ {script} ; }} 2>&1 && echo ok")
        if not out.rstrip().endswith("ok"):
            raise TestbedError(f"{node_name}: {script[:100]}: {out.strip()[-300:]}")
        return out.rstrip()[:-2]

    # ---- the WAN: the underlay taken off the delay ------------------------------------------
    def _added_delay_ms(self, w) -> float:
        return self.added_delay_ms[w.index]

    def wan_stats(self) -> dict[str, dict]:
        """Network.wan_stats, each delay line asked by a signal sent on its server (over ssh, to
        the pid its registry entry names, checked by start time); the report file is read here
        (the run folder is at the same path on every server: docs/cluster.md)."""
        if not self.delaylines:
            return {}
        return wanstats.collect([dataclasses.replace(dl, proc=_SignalOnServer(
            dl.proc, self.node(dl.gateway).cluster_server)) for dl in self.delaylines],
            timeout_s=wanstats.REPORT_TIMEOUT_S + 10)

    # ---- supervision: a server lost is the run stopped --------------------------------------
    def _supervised_failure(self) -> str | None:
        """Network's (a delay line died), and first: a node's ssh ended, i.e. its server is
        gone or unreachable (ssh's keep-alives give up after about 6 s)."""
        nodes = self.net.nameToNode if self.net is not None else {}
        for name in self._node_dc:
            node = nodes.get(name)
            if node is not None and node.lost():
                return self._lost(node.cluster_server, f"the ssh to its node {name} ended")
        failure = super()._supervised_failure()
        if failure is None:
            return None
        for dl in self.delaylines:   # a delay line ended: its ssh, or the line itself?
            if dl.proc.poll() is not None and dl.gateway in nodes:
                server = nodes[dl.gateway].cluster_server
                if not _answers(server):
                    return self._lost(server, f"the ssh to the delay line in {dl.gateway} ended")
        return failure

    def diagnose(self, exc: TestbedError) -> TestbedError:
        """A process that ended with ssh's own failure (exit 255) may be a server gone: each
        server is asked (ConnectTimeout 5 s); the first that does not answer is the failure.
        (A failure the supervisor raises meanwhile goes through: it says more.)"""
        if self.server_registry.lost_servers:
            return TestbedError(self.failure or str(exc))
        for server in self.server_registry.servers.values():
            if not _answers(server):
                self.failure = self._lost(server, f"it stopped answering ssh ({str(exc)[:80]}...)")
                return TestbedError(self.failure)
        return exc

    def _lost(self, server, why: str) -> str:
        """A server found gone: its nodes are asked nothing more; the run's failure line."""
        self.server_registry.lost_servers.add(server.name)
        return (f"server {server.name} ({server.destination}) lost: {why}, so the run was "
                f"stopped; the server ends the run's processes itself {SILENCE_S:g} s after it "
                f"last heard from here; once it is back, check with: python run_testbed.py "
                f"cleanup --cluster {self.cluster.path}")

    def _supervises(self) -> bool:
        return True   # the servers, with or without delay lines

    # ---- loss counters: Network.loss_counters, each read through its node's shell ----------
    def _tcp_counters(self, host: str) -> dict[str, int]:
        snmp, netstat = self._sh(host, "cat /proc/net/snmp; echo @@; "
                                 "cat /proc/net/netstat").split("@@")
        return losscounters.tcp_fields(snmp, netstat)

    def _queue_counters(self, gateway: str, intf: str) -> dict[str, int]:
        return losscounters.queue_counters_of_tc(self._sh(gateway, f"tc -s -j qdisc show dev {intf}"))

    # ---- teardown on every server --------------------------------------------------------
    def stop(self) -> None:
        try:
            super().stop()
        finally:
            left = self.server_registry.cleanup()
            if left:
                print(f"warning: teardown incomplete on servers: {'; '.join(left)}",
                      file=sys.stderr)


def _answers(server) -> bool:
    """Whether server still answers ssh (a no-op command, ConnectTimeout 5 s)."""
    try:
        server_run(server, "true", timeout_s=10)
    except SshFailed:
        return False
    return True


class _SignalOnServer:
    """A remote process's local ssh (poll) with signals sent on its server (signal_recorded):
    what testbed.emulation.wanstats needs of a delay line's process."""

    def __init__(self, proc, server) -> None:
        self.proc, self.server, self.pid = proc, server, proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def signal(self, sig: int, group: bool = True) -> bool:  # noqa: ARG002 - one process
        path = getattr(self.proc.popen, "remote_record", None)
        return path is not None and signal_recorded(self.server, path, sig)
