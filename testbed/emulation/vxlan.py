"""A WAN link between gateways on two servers: Mininet's RemoteGRELink, with VXLAN for gretap.

One job: the tunnel. Mininet's RemoteGRELink makes a gretap device in each server's root
namespace and moves it into the node; this kernel has no gretap (docs/cluster.md), so
VXLANLink does the same with `ip link add ... type vxlan id VNI local A remote B dstport 4789
dev <underlay device>`, one VNI per link (testbed.plans.crossing), every command on the node's
own server over ssh (RemoteMixin.rcmd / cmd). The device is closed to the underlay before it
exists: `nolearning` (its one forwarding entry is the peer, made with it; a datagram from
elsewhere teaches it nothing) and the run's filter on the server (testbed.emulation.underlayfilter:
its VNI from the peer's address only). The device is made under a temporary name
(`gdvx<VNI>`, so two links never collide in a server's root namespace), moved into the node's
namespace, renamed there to the plan's interface name and given the hosts' MTU (underlay MTU
less 50 bytes: 1450 on a 1500 underlay). Its UDP socket stays in the server's root namespace;
the device goes with the node's namespace when the node's processes end. Within one server the
link is a plain veth pair (RemoteLink), given the same MTU.
"""

from __future__ import annotations

import re

from mininet.examples.cluster import RemoteLink

from testbed.emulation.underlayfilter import add_script
from testbed.plans.crossing import VXLAN_PORT
from testbed.spec.errors import TestbedError

_DEV_SRC_RE = re.compile(r"dev (\S+) .*src (\S+)")


def underlay_route(node, peer_ip: str) -> tuple[str, str]:
    """(device, source address) by which node's server reaches peer_ip, asked on that server."""
    out = node.rcmd(f"ip -o route get {peer_ip}")   # rcmd quotes each word for the server
    m = _DEV_SRC_RE.search(out)
    if not m:
        raise TestbedError(f"server {node.server}: no route to {peer_ip}: {out.strip()[-200:]}")
    return m.group(1), m.group(2)


class VXLANLink(RemoteLink):
    """`net.addLink(gw1, gw2, cls=VXLANLink, vni=N, mtu=1450, ...)`."""

    def __init__(self, node1, node2, *, vni: int, mtu: int, **kwargs) -> None:
        self.vni = vni
        self.mtu = mtu
        super().__init__(node1, node2, **kwargs)

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None,  # noqa: N802
                     node1=None, node2=None, deleteIntfs=True):
        node1 = self.node1 if node1 is None else node1
        node2 = self.node2 if node2 is None else node2
        out = super().makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2,
                                   deleteIntfs=deleteIntfs)
        if self.tunnel is None:   # a veth on one server: the hosts' MTU there too
            for node, name in ((node1, intfname1), (node2, intfname2)):
                node.cmd(f"ip link set dev {name} mtu {self.mtu}")
        return out

    def makeTunnel(self, node1, node2, intfname1, intfname2,  # noqa: N802 - Mininet's API
                   addr1=None, addr2=None):
        tmp = f"gdvx{self.vni}"
        for node, peer, name, addr in ((node1, node2, intfname1, addr1),
                                       (node2, node1, intfname2, addr2)):
            dev, src = underlay_route(node, peer.serverIP)
            out = node.rcmd(["sh", "-c", add_script(node.registry.run_id, self.vni, peer.serverIP)])
            if "filtered" not in out:
                raise TestbedError(f"server {node.server}: the filter for VXLAN {self.vni} "
                                   f"(iptables with its u32 match, on the server): "
                                   f"{out.strip()[-200:]}")
            out = node.rcmd(f"ip link add {tmp} type vxlan id {self.vni} local {src} "
                            f"remote {peer.serverIP} dstport {VXLAN_PORT} dev {dev} nolearning")
            if out.strip():
                raise TestbedError(f"server {node.server}: VXLAN {self.vni} for {name}: "
                                   f"{out.strip()[-200:]}")
            out = node.rcmd(f"ip link set {tmp} netns {node.pid}")
            if out.strip():
                node.rcmd(f"ip link del {tmp}")
                raise TestbedError(f"server {node.server}: moving {tmp} into {node.name}: "
                                   f"{out.strip()[-200:]}")
            cmd = f"ip link set {tmp} name {name} mtu {self.mtu}"
            if addr:
                cmd += f" address {addr}"
            out = node.cmd(f"{cmd} && ip link set {name} up && echo ok")
            if "ok" not in out:
                raise TestbedError(f"{node.name} on {node.server}: {cmd}: {out.strip()[-200:]}")
        self.tunnel = True   # RemoteLink.stop deletes both interfaces (each over its ssh)
        return self.tunnel

    def stop(self) -> None:
        if self.tunnel:
            self.intf1.delete()
            self.intf2.delete()
            self.tunnel = None
        else:
            super().stop()
