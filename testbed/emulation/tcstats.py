"""Traffic-control class counters read over a raw netlink socket, without pyroute2's parsing.

One job: the bytes, packets and backlog of every class on one interface, fast. The temporal-WAN
arbiter (testbed.features.temporal.arbiter) reads them every 0.5-5 ms while a slot runs, at real-time priority on
the same 2 cores as the trainers; pyroute2's get_classes() parses every attribute of every class
into Python objects (about 0.9 ms of CPU per dump of five classes here), this reads the two it
needs with struct (the same dump, a small fraction of the CPU).

    counters = ClassCounters()          # in the namespace whose interfaces it reads
    counters.read(ifindex)  -> {handle: (bytes, packets, backlog bytes)}
    counters.close()

The request is an RTM_GETTCLASS dump for one ifindex; each reply's TCA_STATS2 nest gives
TCA_STATS_BASIC (u64 bytes, u32 packets) and TCA_STATS_QUEUE (u32 qlen, u32 backlog, ...),
as `tc -s class show` prints them (TCA_STATS, the older fixed struct, when there is no
TCA_STATS2). Layouts: linux/netlink.h, linux/rtnetlink.h, linux/gen_stats.h, linux/pkt_sched.h.
"""

from __future__ import annotations

import errno
import os
import socket
import struct

NETLINK_ROUTE = 0
RTM_GETTCLASS = 42
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLMSG_HDR = struct.Struct("=IHHII")        # len, type, flags, seq, pid
TCMSG = struct.Struct("=BBHiIII")          # family, pad, pad, ifindex, handle, parent, info
RTATTR = struct.Struct("=HH")              # len, type
TCA_STATS, TCA_STATS2 = 3, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
BASIC = struct.Struct("=QI")               # bytes, packets
QUEUE = struct.Struct("=IIIII")            # qlen, backlog, drops, requeues, overlimits
TC_STATS = struct.Struct("=QIIIIIII")      # bytes, packets, drops, overlimits, bps, pps, qlen, backlog
RECV_BYTES = 1 << 16


def _attrs(buf: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """{type: (payload start, payload end)} of the rtattrs in buf[start:end] (4-byte aligned)."""
    out = {}
    while start + RTATTR.size <= end:
        length, kind = RTATTR.unpack_from(buf, start)
        if length < RTATTR.size:
            break
        out[kind & 0x3FFF] = (start + RTATTR.size, start + length)   # without NLA_F_NESTED
        start += (length + 3) & ~3
    return out


def parse_class(buf: bytes, start: int, end: int) -> tuple[int, tuple[int, int, int]]:
    """(handle, (bytes, packets, backlog)) of one RTM_NEWTCLASS message's payload buf[start:end]
    (after the netlink header)."""
    _fam, _p1, _p2, _ifindex, handle, _parent, _info = TCMSG.unpack_from(buf, start)
    attrs = _attrs(buf, start + TCMSG.size, end)
    if TCA_STATS2 in attrs:
        nested = _attrs(buf, *attrs[TCA_STATS2])
        if TCA_STATS_BASIC in nested:
            nbytes, packets = BASIC.unpack_from(buf, nested[TCA_STATS_BASIC][0])
            backlog = (QUEUE.unpack_from(buf, nested[TCA_STATS_QUEUE][0])[1]
                       if TCA_STATS_QUEUE in nested else 0)
            return handle, (nbytes, packets, backlog)
    if TCA_STATS in attrs:
        nbytes, packets, *_rest, backlog = TC_STATS.unpack_from(buf, attrs[TCA_STATS][0])
        return handle, (nbytes, packets, backlog)
    return handle, (0, 0, 0)


def messages(buf: bytes):
    """(type, seq, payload start, message end) of each netlink message in buf."""
    pos = 0
    while pos + NLMSG_HDR.size <= len(buf):
        length, kind, _flags, seq, _pid = NLMSG_HDR.unpack_from(buf, pos)
        if length < NLMSG_HDR.size:
            raise OSError(errno.EPROTO, f"netlink: bad message length {length}")
        yield kind, seq, pos + NLMSG_HDR.size, pos + length
        pos += (length + 3) & ~3


class RawRouteSocket:
    """A raw NETLINK_ROUTE socket in the caller's network namespace; a context manager."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClassCounters(RawRouteSocket):
    """The class counters of one interface at a time (module docstring)."""

    def read(self, ifindex: int) -> dict[int, tuple[int, int, int]]:
        """{class handle: (bytes, packets, backlog bytes)} of every class on ifindex."""
        self.seq += 1
        req = TCMSG.pack(socket.AF_UNSPEC, 0, 0, ifindex, 0, 0, 0)
        self.sock.send(NLMSG_HDR.pack(NLMSG_HDR.size + len(req), RTM_GETTCLASS,
                                      NLM_F_REQUEST | NLM_F_DUMP, self.seq, 0) + req)
        out: dict[int, tuple[int, int, int]] = {}
        while True:
            buf = self.sock.recv(RECV_BYTES)
            for kind, seq, start, end in messages(buf):
                if seq != self.seq:
                    continue
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", buf, start)[0]
                    raise OSError(code, f"RTM_GETTCLASS on ifindex {ifindex}: "
                                        f"{os.strerror(code)}")
                handle, counters = parse_class(buf, start, end)
                out[handle] = counters
