"""The kernel's own loss figures of a run: TCP's retransmissions in every host's namespace and
the drops of every WAN queue.

One job: read them. A host's TCP counters are its network namespace's /proc/net/snmp (`Tcp:`)
and /proc/net/netstat (`TcpExt:`), read as /proc/<pid>/net/... of the host's shell (a process
in that namespace: no namespace switch, no subprocess). A WAN direction's queue drops are the
`drops` of the bfifo leaves on the gateway's egress interface (testbed.emulation.shaping's one
leaf, or temporal sharing's control and per-pipeline leaves, testbed.emulation.wanshare), read
over netlink. For a node on another server both come as text through its shell: the two
/proc files, and `tc -s -j qdisc show`. Every namespace and qdisc is new with each network, so one reading at the end of
the training (before temporal sharing restores the plain tree) covers the whole run, its
connection set-up and warm-up iteration included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# name in the run's records -> (section, counter) of /proc/net/snmp or /proc/net/netstat
TCP_FIELDS = {
    "out_segments": ("Tcp", "OutSegs"),
    "retransmitted_segments": ("Tcp", "RetransSegs"),
    "fast_retransmits": ("TcpExt", "TCPFastRetrans"),
    "timeouts": ("TcpExt", "TCPTimeouts"),
    "lost_retransmits": ("TcpExt", "TCPLostRetransmit"),
    "spurious_rtos": ("TcpExt", "TCPSpuriousRTOs"),
    # why segments were sent again without a drop to answer for them: the receiver's DSACKs
    # (it already had them), reordering the sender detected, tail loss probes, and resends
    # while the original still sat in the host's own queue
    "dsack_received_segments": ("TcpExt", "TCPDSACKRecvSegs"),
    "reordering_detected": ("TcpExt", "TCPSACKReorder"),
    "loss_probes": ("TcpExt", "TCPLossProbes"),
    "spurious_rtx_host_queues": ("TcpExt", "TCPSpuriousRtxHostQueues"),
}


def parse_proc_net(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/snmp or /proc/net/netstat text -> {section: {counter: value}}: each section is
    a line of names and a line of values, both starting with "Section:"."""
    out: dict[str, dict[str, int]] = {}
    lines = [line.split() for line in text.splitlines() if line.strip()]
    for names, values in zip(lines, lines[1:]):
        if names[0] != values[0] or len(names) != len(values) or not names[0].endswith(":"):
            continue
        try:
            out[names[0][:-1]] = dict(zip(names[1:], map(int, values[1:])))
        except ValueError:     # (names, names) or (values, names): not a section's pair
            continue
    return out


def tcp_counters(pid: int, proc: Path = Path("/proc")) -> dict[str, int]:
    """TCP_FIELDS of the namespace process pid lives in (missing counters left out)."""
    return tcp_fields(*((proc / str(pid) / "net" / name).read_text()
                        for name in ("snmp", "netstat")))


def tcp_fields(*texts: str) -> dict[str, int]:
    """TCP_FIELDS of /proc/net/snmp and /proc/net/netstat texts (missing counters left out)."""
    sections: dict[str, dict[str, int]] = {}
    for text in texts:
        sections.update(parse_proc_net(text))
    return {key: sections[sec][field] for key, (sec, field) in TCP_FIELDS.items()
            if field in sections.get(sec, {})}


def add_up(per_host: dict[str, dict[str, int]]) -> dict[str, Any]:
    """Every host's TCP counters summed, and the hosts that retransmitted most."""
    total = {key: sum(c.get(key, 0) for c in per_host.values()) for key in TCP_FIELDS}
    most = sorted(per_host, key=lambda h: -per_host[h].get("retransmitted_segments", 0))
    return dict(total, hosts=len(per_host),
                most_retransmits={h: per_host[h].get("retransmitted_segments", 0)
                                  for h in most[:3] if per_host[h].get("retransmitted_segments")})


def queue_counters(ipr: Any, intf: str) -> dict[str, int]:
    """The bfifo leaves on intf (pyroute2 IPRoute in its namespace): their drops, packets and
    bytes sent, summed, and how many leaves."""
    found = ipr.link_lookup(ifname=intf)
    if not found:
        raise FileNotFoundError(f"no interface {intf!r} in this namespace")
    out = {"drops": 0, "packets": 0, "bytes": 0, "leaves": 0}
    for q in ipr.get_qdiscs(index=found[0]):
        if q.get_attr("TCA_KIND") != "bfifo":
            continue
        stats2 = q.get_attr("TCA_STATS2")      # 64-bit byte counts; TCA_STATS's wrap at 4 GB
        basic = stats2.get_attr("TCA_STATS_BASIC") if stats2 is not None else None
        queue = stats2.get_attr("TCA_STATS_QUEUE") if stats2 is not None else None
        if basic is None or queue is None:
            old = q.get_attr("TCA_STATS")
            if old is None:
                continue
            basic, queue = old, {"drops": old["drop"]}
        out["leaves"] += 1
        out["drops"] += int(queue["drops"])
        out["packets"] += int(basic["packets"])
        out["bytes"] += int(basic["bytes"])
    return out


def queue_counters_of_tc(tc_json: str) -> dict[str, int]:
    """queue_counters from `tc -s -j qdisc show dev INTF` (for an interface reached only
    through a shell, such as one on another server)."""
    out = {"drops": 0, "packets": 0, "bytes": 0, "leaves": 0}
    for q in json.loads(tc_json):
        if q.get("kind") != "bfifo":
            continue
        out["leaves"] += 1
        for key in ("drops", "packets", "bytes"):
            out[key] += int(q[key])
    return out
