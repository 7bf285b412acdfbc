"""Headers-only packet capture with scapy inside an emulated node, and what it says about slots.

One job: record when which TCP/IP packet crossed an interface, and judge the arbiter's slots
(testbed.features.temporal.arbiter) against it.

Capture: `python -m traffic.capture --iface X --out FILE [--seconds N] [--snaplen B]
[--min-length L]`, run in a gateway's namespace (testbed.emulation.network.Network.spawn). scapy opens the
socket (conf.L2listen, an AF_PACKET socket that also sees outgoing packets) with the BPF filter
"ip and tcp" (with --min-length: "and ip[2:2] >= L", packets of at least L bytes of IP length,
so the kernel leaves out the ACKs, which the slot analyses below skip anyway: a third to half of
the packets, and of the capture's CPU, on a link carrying data both ways) compiled by libpcap; we read only the first `snaplen` bytes of each packet (default 128: Ethernet, IP and TCP
headers) with the kernel's nanosecond receive stamp (SO_TIMESTAMPNS; for an outgoing packet: the
time the qdisc handed it to the driver, i.e. when it went on the wire, on time.time_ns()'s clock).
It prints "ready" once listening, stops after N seconds or on SIGTERM/SIGINT, and prints one JSON
summary line (packets, bytes, kernel drops from PACKET_STATISTICS).

File: MAGIC, then one 24-byte record per packet (little-endian struct "<q4s4sHHHBB"):
t_ns, src IP, dst IP, IP total length, TCP source port, TCP destination port, flags (bit 0:
outgoing), IP + TCP header bytes. A GSO/GRO super-packet is one record (its IP total length
covers all its segments); `frame_bytes` estimates the link-layer bytes HTB counted for it.

Analysis (pure): `slot_adherence` (share of each pipeline's data bytes that crossed inside its own
slots) and `switch_errors_ms` (first data packet of a slot's pipeline vs. the grant time).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import select
import signal
import socket
import statistics
import struct
import sys
import time
from bisect import bisect_right
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from testbed.spec.scenario import TCP_MSS_BYTES

MAGIC = b"GTCAP1\n\0"
RECORD = struct.Struct("<q4s4sHHHBB")
FLAG_OUTGOING = 1
DATA_MIN_LENGTH = 256          # IP total length of a data packet (smaller: ACKs, control)
MSS = TCP_MSS_BYTES            # TCP payload per segment at MTU 1500 with timestamps
ETH_HEADER = 14
SOL_PACKET = 263
PACKET_STATISTICS = 6
SO_TIMESTAMPNS = 35
SO_RCVBUFFORCE = 33
PACKET_OUTGOING = 4
ETH_P_IP = 0x0800


class Packet(NamedTuple):
    t_ns: int
    src: str
    dst: str
    length: int                # IP total length
    sport: int = 0
    dport: int = 0
    outgoing: bool = True
    hdr_len: int = 52          # IP + TCP headers


# ---- file -----------------------------------------------------------------------------------
def pack(p: Packet) -> bytes:
    return RECORD.pack(p.t_ns, socket.inet_aton(p.src), socket.inet_aton(p.dst), p.length & 0xFFFF,
                       p.sport, p.dport, FLAG_OUTGOING if p.outgoing else 0, min(255, p.hdr_len))


def load(path: Path | str) -> list[Packet]:
    data = Path(path).read_bytes()
    if not data.startswith(MAGIC):
        raise ValueError(f"{path}: not a capture file (no {MAGIC!r})")
    body = memoryview(data)[len(MAGIC):]
    n = len(body) // RECORD.size  # a record cut short by a kill is left out
    out = []
    for t, src, dst, length, sport, dport, flags, hdr in RECORD.iter_unpack(body[:n * RECORD.size]):
        out.append(Packet(t, socket.inet_ntoa(src), socket.inet_ntoa(dst), length, sport, dport,
                          bool(flags & FLAG_OUTGOING), hdr))
    return out


def parse_frame(frame: bytes) -> tuple[str, str, int, int, int, int] | None:
    """Ethernet frame head -> (src, dst, IP total length, sport, dport, header bytes), or None
    if it is not IPv4/TCP."""
    if len(frame) < ETH_HEADER + 20 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP:
        return None
    ip = ETH_HEADER
    ihl = (frame[ip] & 0x0F) * 4
    if frame[ip + 9] != socket.IPPROTO_TCP or len(frame) < ip + ihl + 14:
        return None
    tot_len = struct.unpack_from("!H", frame, ip + 2)[0]
    sport, dport = struct.unpack_from("!HH", frame, ip + ihl)
    doff = (frame[ip + ihl + 12] >> 4) * 4
    return (socket.inet_ntoa(frame[ip + 12:ip + 16]), socket.inet_ntoa(frame[ip + 16:ip + 20]),
            tot_len, sport, dport, ihl + doff)


def frame_bytes(p: Packet, mss: int = MSS) -> int:
    """Link-layer bytes of p as HTB counts them: a super-packet is charged as the segments it
    becomes (each with its own headers and Ethernet header)."""
    payload = max(0, p.length - p.hdr_len)
    segs = max(1, math.ceil(payload / mss))
    return p.length + ETH_HEADER + (segs - 1) * (p.hdr_len + ETH_HEADER)


# ---- capture --------------------------------------------------------------------------------
def capture(iface: str, out: Path, seconds: float | None, snaplen: int = 128,
            rcvbuf: int = 32 << 20, on_ready=None, should_stop=lambda: False,
            min_length: int = 0) -> dict[str, Any]:
    # scapy's conf.L2listen on Linux (set only once scapy.all is imported, which is slow)
    logging.getLogger("scapy.runtime").setLevel(logging.ERROR)  # "Unable to guess type": we parse
    from scapy.arch.linux import L2ListenSocket  # noqa: PLC0415
    bpf = "ip and tcp" + (f" and ip[2:2] >= {int(min_length)}" if min_length > 0 else "")
    sock = L2ListenSocket(iface=iface, filter=bpf)
    raw: socket.socket = sock.ins
    try:
        raw.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, rcvbuf)
    except OSError:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    raw.setblocking(False)
    ancsize = socket.CMSG_SPACE(16) + socket.CMSG_SPACE(64)
    npkts = nbytes = skipped = 0
    t_end = time.monotonic() + seconds if seconds else None
    buf: list[bytes] = []
    with open(out, "wb") as f:
        f.write(MAGIC)
        f.flush()
        if on_ready is not None:
            on_ready()
        while not should_stop():
            left = None if t_end is None else t_end - time.monotonic()
            if left is not None and left <= 0:
                break
            r, _, _ = select.select([raw], [], [], 0.2 if left is None else min(0.2, left))
            if not r:
                if buf:
                    f.write(b"".join(buf))
                    buf.clear()
                continue
            for _ in range(256):  # drain what is queued
                try:
                    frame, anc, _flags, addr = raw.recvmsg(snaplen, ancsize)
                except (BlockingIOError, InterruptedError):
                    break
                t_ns = None
                for level, kind, data in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
                        sec, nsec = struct.unpack_from("qq", data)
                        t_ns = sec * 1_000_000_000 + nsec
                parsed = parse_frame(frame)
                if parsed is None:
                    skipped += 1
                    continue
                src, dst, length, sport, dport, hdr = parsed
                p = Packet(t_ns if t_ns is not None else time.time_ns(), src, dst, length, sport,
                           dport, addr[2] == PACKET_OUTGOING, hdr)
                buf.append(pack(p))
                npkts += 1
                nbytes += length
            if len(buf) >= 4096:
                f.write(b"".join(buf))
                buf.clear()
        f.write(b"".join(buf))
    stats = raw.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
    tp_packets, tp_drops = struct.unpack("II", stats)
    sock.close()
    return {"iface": iface, "out": str(out), "packets": npkts, "ip_bytes": nbytes, "skipped": skipped,
            "kernel_packets_since_last": tp_packets, "kernel_drops": tp_drops}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="headers-only TCP/IP capture (scapy)")
    parser.add_argument("--iface", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--snaplen", type=int, default=128)
    parser.add_argument("--min-length", type=int, default=0,
                        help=f"only packets of at least this IP length (e.g. {DATA_MIN_LENGTH}: "
                             "data, not ACKs); default all")
    args = parser.parse_args(argv)
    stop = {"now": False}

    def on_stop(signum, frame):  # noqa: ARG001
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    try:
        summary = capture(args.iface, Path(args.out), args.seconds, args.snaplen,
                          on_ready=lambda: print("ready", flush=True),
                          should_stop=lambda: stop["now"], min_length=args.min_length)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        print(f"capture: {exc}", file=sys.stderr, flush=True)
        return 1
    print(json.dumps(summary), flush=True)
    return 0


# ---- analysis (pure) ------------------------------------------------------------------------
def _get(slot: Any, key: str):
    return slot[key] if isinstance(slot, Mapping) else getattr(slot, key)


def _intervals(slots: Iterable[Any]) -> dict[int, tuple[list[int], list[int]]]:
    """pipeline -> (sorted t_grant, matching t_end) of its slots."""
    per: dict[int, list[tuple[int, int]]] = {}
    for s in slots:
        per.setdefault(int(_get(s, "pipeline")), []).append((int(_get(s, "t_grant")), int(_get(s, "t_end"))))
    out = {}
    for d, iv in per.items():
        iv.sort()
        out[d] = ([a for a, _ in iv], [b for _, b in iv])
    return out


def _inside(t: int, starts: list[int], ends: list[int]) -> bool:
    k = bisect_right(starts, t) - 1
    # slots of one pipeline on one link never overlap; check the latest start <= t (and, should
    # they overlap anyway, an earlier one that lasts longer)
    while k >= 0:
        if t <= ends[k]:
            return True
        if k == 0 or ends[k - 1] < starts[k]:
            return False
        k -= 1
    return False


def slot_adherence(packets: Iterable[Packet], slots: Iterable[Any], pipelines_by_ip: Mapping[str, int],
                   *, min_length: int = DATA_MIN_LENGTH) -> dict[int, float]:
    """{d: share of pipeline d's data bytes (packets from its hosts with IP length >= min_length)
    captured inside d's own slots [t_grant, t_end]}. slots: the arbiter's slot records (dicts
    with pipeline, t_grant, t_end) of the one link the packets were captured on. Pipelines with
    no data bytes are left out."""
    iv = _intervals(slots)
    inside: dict[int, int] = {}
    total: dict[int, int] = {}
    for p in packets:
        d = pipelines_by_ip.get(p.src)
        if d is None or p.length < min_length:
            continue
        total[d] = total.get(d, 0) + p.length
        starts, ends = iv.get(d, ([], []))
        if starts and _inside(p.t_ns, starts, ends):
            inside[d] = inside.get(d, 0) + p.length
    return {d: inside.get(d, 0) / n for d, n in sorted(total.items()) if n > 0}


def switch_errors_ms(packets: Iterable[Packet], slots: Iterable[Any], pipelines_by_ip: Mapping[str, int],
                     *, min_length: int = DATA_MIN_LENGTH, max_lead_ms: float = 100.0) -> dict[str, Any]:
    """Per slot (one link's, ordered by grant): |first data packet of the slot's pipeline - t_grant|
    in ms. The packet is looked for from the previous slot's end (at most max_lead_ms before
    the grant: data that left before its grant counts as an error too) to the slot's end.
    Returns {n, missing (slots without a data packet), median_ms, p90_ms, max_ms,
    signed_median_ms, errors_ms: [...]} (None figures when n is 0)."""
    by_pipe: dict[int, list[int]] = {}
    for p in packets:
        d = pipelines_by_ip.get(p.src)
        if d is not None and p.length >= min_length:
            by_pipe.setdefault(d, []).append(p.t_ns)
    for ts in by_pipe.values():
        ts.sort()
    ordered = sorted(slots, key=lambda s: int(_get(s, "t_grant")))
    signed: list[float] = []
    missing = 0
    prev_end = None
    lead_ns = int(max_lead_ms * 1e6)
    for s in ordered:
        d, tg, te = int(_get(s, "pipeline")), int(_get(s, "t_grant")), int(_get(s, "t_end"))
        lo = tg - lead_ns if prev_end is None else max(prev_end, tg - lead_ns)
        prev_end = te if prev_end is None else max(prev_end, te)
        ts = by_pipe.get(d, [])
        k = bisect_right(ts, lo - 1)  # first t >= lo
        if k < len(ts) and ts[k] <= te:
            signed.append((ts[k] - tg) / 1e6)
        else:
            missing += 1
    errors = sorted(abs(e) for e in signed)
    out: dict[str, Any] = {"n": len(errors), "missing": missing, "errors_ms": [abs(e) for e in signed]}
    if errors:
        out.update(median_ms=statistics.median(errors), p90_ms=_quantile(errors, 0.9), max_ms=errors[-1],
                   signed_median_ms=statistics.median(signed))
    else:
        out.update(median_ms=None, p90_ms=None, max_ms=None, signed_median_ms=None)
    return out


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of sorted values."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


if __name__ == "__main__":
    sys.exit(main())
