"""A testbed.plans.topo Plan as a Mininet Topo: only nodes and links with their addresses.

One job: the one part of the plan that needs Mininet (its build() hook); testbed.emulation.network builds
it into namespaces.
"""

from __future__ import annotations

from mininet.topo import Topo

from testbed.plans.topo import Plan


class ScenarioTopo(Topo):
    """Mininet Topo of a Plan: only nodes and links with their addresses (Mininet's build())."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        super().__init__()

    def build(self) -> None:  # noqa: D102 - Mininet's hook
        plan = self.plan
        for d, dc in enumerate(plan.scenario.dcs):
            # In its own namespace, like the hosts: a run makes nothing in the root namespace, so
            # two runs (even of one scenario) never collide on a name.
            bridge = self.addSwitch(plan.bridges[dc.name], dpid=f"{d + 1:016x}", inNamespace=True)
            gw = self.addHost(plan.gateways[dc.name], ip=f"{plan.gateway_ips[dc.name]}/24")
            self.addLink(gw, bridge, intfName1=f"{gw}-eth0", intfName2=f"{bridge}-eth1")
            for i, h in enumerate(plan.hosts_in(dc.name), start=2):
                self.addHost(h.name, ip=f"{h.ip}/24",
                             defaultRoute=f"via {plan.gateway_ips[dc.name]}")
                self.addLink(h.name, bridge, intfName1=h.intf, intfName2=f"{bridge}-eth{i}")
        for w in plan.wan:
            self.addLink(w.end_a.gateway, w.end_b.gateway,
                         intfName1=w.end_a.intf, intfName2=w.end_b.intf,
                         params1={"ip": f"{w.end_a.ip}/30"}, params2={"ip": f"{w.end_b.ip}/30"})
