"""WAN links that cross servers (issue 25 part 2): their VXLAN numbers, MTU, and the underlay's share.

Pure: given a placement (testbed.spec.cluster.Placement) it says which WAN links cross servers and
gives each its own VXLAN network identifier (one VNI per link, VNI_BASE + the link's index in the
scenario, so the same scenario always gets the same numbers); it says what MTU the emulated hosts
get so no packet of theirs fragments in the tunnel (the underlay's MTU less VXLAN's 50 bytes,
never above 1500); and it takes the underlay's own round-trip time off each crossing link's
configured delay (half per direction), refusing, as one ScenarioError line, a link whose delay is
smaller than what the underlay already adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.spec.errors import ScenarioError

VNI_BASE = 4200           # VNI of the scenario's WAN link 0; VXLAN allows 1 .. 2**24 - 1
VXLAN_PORT = 4789         # IANA's VXLAN UDP port
VXLAN_OVERHEAD_BYTES = 50  # outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14
HOST_MTU_MAX = 1500


@dataclass(frozen=True, kw_only=True, slots=True)
class Crossing:
    """One WAN link between DCs on different servers."""
    index: int            # the link's index in the scenario's wan list
    a: str                # DC a
    b: str                # DC b
    server_a: str
    server_b: str
    vni: int

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Underlay:
    """ping between two servers' underlay addresses (ms)."""
    rtt_ms: float          # mean
    mdev_ms: float         # ping's mdev: the jitter
    min_ms: float
    max_ms: float


def crossings(wan: list[tuple[str, str]], dc_server: dict[str, str]) -> list[Crossing]:
    """The WAN links (a, b), in scenario order, whose DCs sit on different servers."""
    out = []
    for i, (a, b) in enumerate(wan):
        if dc_server[a] != dc_server[b]:
            out.append(Crossing(index=i, a=a, b=b, server_a=dc_server[a],
                                server_b=dc_server[b], vni=VNI_BASE + i))
    return out


def host_mtu(underlay_mtu: int) -> int:
    """The MTU of every emulated interface so a packet fits the tunnel unfragmented: 1450 on a
    1500-byte underlay, 1500 on one of 1550 or more (jumbo frames)."""
    if underlay_mtu - VXLAN_OVERHEAD_BYTES < 576:
        raise ScenarioError("cluster underlay", f"MTU {underlay_mtu} leaves under 576 bytes "
                            "inside VXLAN", "give the servers' underlay an MTU of 1500 or more")
    return min(HOST_MTU_MAX, underlay_mtu - VXLAN_OVERHEAD_BYTES)


def delay_after_underlay(link: str, delay_ms: float, underlay: Underlay) -> float:
    """The one-way delay the delay line must add on a crossing link so that, with the underlay's
    own delay (half its mean RTT), the link has its configured delay_ms; ScenarioError where the
    underlay alone is longer."""
    one_way = underlay.rtt_ms / 2
    if one_way > delay_ms:
        raise ScenarioError(f"wan.{link}.delay_ms", f"{delay_ms:g} ms one way is less than the "
                            f"underlay's own {one_way:.3f} ms (RTT {underlay.rtt_ms:.3f} ms, "
                            f"jitter {underlay.mdev_ms:.3f} ms, measured between its servers)",
                            "place both DCs on one server, or give the link at least that delay")
    return delay_ms - one_way
