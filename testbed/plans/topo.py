"""Scenario -> an addressing and routing plan. Pure: no Mininet (testbed.emulation.minitopo makes the plan
a Mininet Topo).

One job: decide names, interfaces, addresses and routes; build nothing. `testbed.emulation.network` turns
the Topo into namespaces and applies the routes and shaping.

    DC d (0-based):  hosts  <dc>-h<i>   10.<d+1>.0.<i>/24   default via the DC gateway
                     decode hosts <dc>-d<i>  10.<d+1>.0.<100+i>/24 (BubbleTea; never train)
                     tenant host <dc>-x1  10.<d+1>.0.201/24 (cross-traffic; never trains)
                     gateway <dc>-gw    10.<d+1>.0.254/24 on <dc>-gw-eth0 (to the DC bridge)
                     bridge  <dc>-s     a Linux bridge in its own namespace
    WAN link k:      <a>-gw-eth<n> 10.254.x.y/30  <->  <b>-gw-eth<m> 10.254.x.y+1/30
Nothing is made in the root namespace, so two runs, even of one scenario, never collide.
Routes between DCs: `testbed.plans.routing` (a configured link carries its DC pair's traffic; pairs
without one take the lowest total one-way delay; or `routing: shortest-delay` for every pair).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from testbed.plans.routing import edges_of, next_hops
from testbed.spec.scenario import EmulatedScenario, Scenario, WanLink
from testbed.spec.cross import tenant_host


@dataclass(frozen=True, kw_only=True, slots=True)
class HostPlan:
    name: str
    dc: str
    ip: str        # without prefix length
    intf: str
    role: str = "train"   # "train" (one GPU, runs a stage) | "decode" (BubbleTea decode server)
    #                       | "tenant" (another tenant's cross-traffic, testbed.features.cross.run)


@dataclass(frozen=True, kw_only=True, slots=True)
class WanEnd:
    gateway: str
    intf: str
    ip: str        # without prefix length


@dataclass(frozen=True, kw_only=True, slots=True)
class WanPlan:
    link: WanLink
    index: int
    end_a: WanEnd
    end_b: WanEnd

    def ends(self) -> tuple[WanEnd, WanEnd]:
        return (self.end_a, self.end_b)


@dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    gateway: str
    dst: str       # subnet, e.g. 10.2.0.0/24
    via: str       # next-hop address on a WAN link
    intf: str      # the gateway's interface on that link


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    scenario: Scenario
    hosts: tuple[HostPlan, ...]
    gateways: dict[str, str]      # dc -> gateway name
    gateway_ips: dict[str, str]   # dc -> gateway address on the DC subnet
    subnets: dict[str, str]       # dc -> subnet
    bridges: dict[str, str]       # dc -> bridge name
    wan: tuple[WanPlan, ...]
    routes: tuple[Route, ...]

    def host(self, name: str) -> HostPlan:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    def hosts_in(self, dc: str) -> list[HostPlan]:
        return [h for h in self.hosts if h.dc == dc]

    def bridge_ports(self, dc: str) -> list[str]:
        """The ports of a DC's bridge: eth1 to the gateway, then one per host in plan order."""
        n = len(self.hosts_in(dc))
        return [f"{self.bridges[dc]}-eth{i}" for i in range(1, n + 2)]



def make_plan(scenario: EmulatedScenario) -> Plan:
    if not isinstance(scenario, EmulatedScenario):
        raise TypeError("make_plan takes the emulated scenario: pass scenario.emulated()")
    hosts: list[HostPlan] = []
    gateways, gateway_ips, subnets, bridges = {}, {}, {}, {}
    for d, dc in enumerate(scenario.dcs):
        subnets[dc.name] = f"10.{d + 1}.0.0/24"
        gateways[dc.name] = f"{dc.name}-gw"
        gateway_ips[dc.name] = f"10.{d + 1}.0.254"
        bridges[dc.name] = f"{dc.name}-s"
        for i in range(1, dc.hosts + 1):
            name = f"{dc.name}-h{i}"
            hosts.append(HostPlan(name=name, dc=dc.name, ip=f"10.{d + 1}.0.{i}", intf=f"{name}-eth0"))
        for i in range(1, dc.decode_hosts + 1):
            name = f"{dc.name}-d{i}"
            hosts.append(HostPlan(name=name, dc=dc.name, ip=f"10.{d + 1}.0.{100 + i}",
                                  intf=f"{name}-eth0", role="decode"))
        if dc.name in scenario.tenant_dcs():
            name = tenant_host(dc.name)
            hosts.append(HostPlan(name=name, dc=dc.name, ip=f"10.{d + 1}.0.201",
                                  intf=f"{name}-eth0", role="tenant"))
    next_port = {dc.name: 1 for dc in scenario.dcs}
    wan: list[WanPlan] = []
    base = int(ipaddress.IPv4Address("10.254.0.0"))
    for k, link in enumerate(scenario.wan):
        ip_a = str(ipaddress.IPv4Address(base + 4 * k + 1))
        ip_b = str(ipaddress.IPv4Address(base + 4 * k + 2))
        ends = []
        for dc, ip in ((link.a, ip_a), (link.b, ip_b)):
            ends.append(WanEnd(gateway=gateways[dc], intf=f"{gateways[dc]}-eth{next_port[dc]}", ip=ip))
            next_port[dc] += 1
        wan.append(WanPlan(link=link, index=k, end_a=ends[0], end_b=ends[1]))
    routes = _routes(scenario, wan, gateways, subnets)
    return Plan(scenario=scenario, hosts=tuple(hosts), gateways=gateways, gateway_ips=gateway_ips,
                subnets=subnets, bridges=bridges, wan=tuple(wan), routes=tuple(routes))


def _routes(scenario: Scenario, wan: list[WanPlan], gateways: dict[str, str],
            subnets: dict[str, str]) -> list[Route]:
    """One route per (gateway, other DC), towards testbed.plans.routing's next hop."""
    link_to: dict[tuple[str, str], tuple[str, str]] = {}  # (dc, neighbour) -> (via ip, intf)
    for w in wan:
        link_to[(w.link.a, w.link.b)] = (w.end_b.ip, w.end_a.intf)
        link_to[(w.link.b, w.link.a)] = (w.end_a.ip, w.end_b.intf)
    hops = next_hops([dc.name for dc in scenario.dcs], edges_of(scenario), scenario.routing)
    routes = []
    for dc in scenario.dcs:
        for dst in scenario.dcs:
            if dst.name == dc.name:
                continue
            via, intf = link_to[(dc.name, hops[(dc.name, dst.name)])]
            routes.append(Route(gateway=gateways[dc.name], dst=subnets[dst.name], via=via, intf=intf))
    return routes
