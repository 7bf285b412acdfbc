"""The firewall that closes a run's VXLAN tunnels to everyone on the underlay but the peer.

One job: shell scripts, run on a server's root namespace, that add and remove a run's filter.
A VXLAN device's UDP socket listens on every address of its server (port VXLAN_PORT): anyone
who reaches that port could inject frames into the emulated WAN (and, with address learning,
read it). Each server gets, per run, one chain `GDVX-<hash of the run id>` (iptables, or
ip6tables for an IPv6 underlay) reached from INPUT by UDP to VXLAN_PORT; in it, per tunnel end,
one rule that drops a datagram carrying that tunnel's VNI (xt_u32 reads it from the VXLAN
header) unless it comes from the peer server's address. Other VXLAN traffic to the port (the
server's own overlays, other VNIs) passes untouched. The chain and its jump are the only thing
a run adds to a server's firewall; end_run and `cleanup --cluster` remove them
(testbed.emulation.serverregistry). A source address can be forged on the underlay: this filter
keeps out who cannot (docs/cluster.md says what is exposed).
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex

from testbed.plans.crossing import VXLAN_PORT

CHAIN_PREFIX = "GDVX-"
# The VNI: the VXLAN header's bytes 4-6, 12 bytes into the UDP header (8 + 4). IPv4: past the
# IP header, whose length xt_u32 reads; IPv6: 40 bytes (a tunnel's datagram has no extension
# headers).
_VNI_AT = {4: "0>>22&0x3C@12>>8", 6: "52>>8"}
_TOOL = {4: "iptables", 6: "ip6tables"}


def chain(run_id: str) -> str:
    """The run's chain name (iptables allows 28 characters; a run id may be 128)."""
    return CHAIN_PREFIX + hashlib.sha256(run_id.encode()).hexdigest()[:12].upper()


def _family(peer: str) -> tuple[int, str]:
    """(4 or 6, the address without a scope id) of a peer server's underlay address."""
    addr = ipaddress.ip_address(peer.split("%", 1)[0])
    return addr.version, str(addr)


def add_script(run_id: str, vni: int, peer: str) -> str:
    """Shell that makes the run's chain and its jump if missing, then drops VNI vni from
    anyone but peer. Prints `filtered` when the rule is in place."""
    version, addr = _family(peer)
    tool, name = _TOOL[version], chain(run_id)
    jump = f"INPUT -p udp --dport {VXLAN_PORT} -j {name}"
    match = shlex.quote(f"{_VNI_AT[version]}={int(vni)}")
    return (f"{{ {tool} -w -n -L {name} >/dev/null 2>&1 || {tool} -w -N {name}; }} && "
            f"{{ {tool} -w -C {jump} 2>/dev/null || {tool} -w -I {jump}; }} && "
            f"{tool} -w -A {name} -p udp --dport {VXLAN_PORT} -m u32 --u32 {match} "
            f"! -s {shlex.quote(addr)} -j DROP && echo filtered")


def remove_script(run_id: str) -> str:
    """Shell that removes the run's chain and its jump from both families; prints
    `unfiltered <tool>` for each it removed, nothing where there was none."""
    return _remove(shlex.quote(chain(run_id)))


def remove_all_script() -> str:
    """Shell that removes every GDVX- chain (the strays of killed runs, once no run is left on
    the server) from both families."""
    return _remove(f"$({{tool}} -w -S 2>/dev/null | sed -n 's/^-N \\({CHAIN_PREFIX}[0-9A-F]*\\)$/\\1/p')")


def _remove(names: str) -> str:
    parts = []
    for tool in _TOOL.values():
        words = names.replace("{tool}", tool)
        parts.append(
            f"command -v {tool} >/dev/null && for c in {words}; do "
            f"{tool} -w -n -L \"$c\" >/dev/null 2>&1 || continue; "
            f"while {tool} -w -D INPUT -p udp --dport {VXLAN_PORT} -j \"$c\" 2>/dev/null; do :; done; "
            f"{tool} -w -F \"$c\" && {tool} -w -X \"$c\" && echo \"unfiltered {tool} $c\"; done")
    return "; ".join(parts) + "; true"
