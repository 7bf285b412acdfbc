"""Timed bursts over TCP: send N messages of B bytes, an idle gap apart, over K connections.

One job: a sender/receiver pair that times each message end to end, as a pipeline stage sends an
activation. Each message is striped evenly over the K connections (chunk k gets B // K bytes, the
first B % K chunks one more), all written at once from one non-blocking loop. Every chunk starts
with a header (magic, message index, connection index, chunk bytes, the sender's send-start
CLOCK_REALTIME in ns), so the receiver, which writes one JSON line per message, knows when the
message's first byte was sent. Both ends are namespaces of one machine sharing CLOCK_REALTIME, so

    transfer_ms = (last byte of the message received) - (first byte of the message sent)

Gap: when the whole message has arrived, the receiver sends a 4-byte acknowledgement on
connection 0; the sender waits for it, then stays idle for gap_s before the next message. So
gap_s is the time the connections sit idle between messages (what a pipeline's gap between two
activations is), whatever the transfer time; TCP's own idle rules (cwnd restart after an RTO of
idle, slow start) then act as they would.

    python -m traffic.burst recv --bind 10.2.0.1 --port 7000 --connections 4 --messages 8 \
        --bytes 33554432 --out R.jsonl
    python -m traffic.burst send --host 10.2.0.1 --port 7000 --connections 4 --messages 8 \
        --bytes 33554432 --gap-s 1 --cc cubic

The receiver prints `READY <port>` once it listens and exits 0 after N messages; the sender
prints one JSON line per message (its own send start, bytes handed to the kernel, ack seen).
TCP_NODELAY on both ends (as trainer.transport); `--cc` sets TCP_CONGESTION per socket (the
sender's choice governs the data direction; each end records the one its sockets ran).
`--port 0` picks a free port (printed in the READY line). The receiver listens only on `--bind`
(required: the address its sender uses), never on every interface.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from testbed.host import tcpcc

MAGIC = b"BRST"
HEADER = struct.Struct("!4sIIQQ")     # magic, message, connection, chunk bytes, send_start_ns
ACK = struct.Struct("!I")             # message index
RECV_BUFFER_BYTES = 4 << 20
SEND_SLICE_BYTES = 4 << 20            # at most this much per send() call


class BurstError(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class MessageRecord:
    """One message as the receiver saw it (a JSON line of the receiver's output)."""

    msg: int
    bytes: int
    connections: int
    send_start_ns: int           # sender's CLOCK_REALTIME just before its first byte was written
    first_byte_ns: int           # receiver: first byte of the message read
    recv_end_ns: int             # receiver: last byte of the message read
    transfer_ms: float           # recv_end_ns - send_start_ns
    chunk_bytes: tuple[int, ...]     # payload bytes received per connection index
    chunk_end_ns: tuple[int, ...]    # per connection index: its chunk's last byte read
    verified: bool | None        # payload pattern checked (--verify) and right; None: not checked
    recv_cc: str                 # congestion control of the receiving sockets (the
                                 # sender's, which governs the data, is in its own lines)


def chunk_sizes(total_bytes: int, connections: int) -> list[int]:
    """Message bytes striped evenly over connections (the first total % k get one more)."""
    base, extra = divmod(total_bytes, connections)
    return [base + (1 if k < extra else 0) for k in range(connections)]


def pattern_byte(msg: int, conn: int) -> int:
    """The byte every payload byte of (message, connection) holds with --verify."""
    return (msg * 7 + conn * 31 + 1) % 251


def set_congestion_control(sock: socket.socket, cc: str | None) -> str:
    """Set TCP_CONGESTION if cc is given (testbed.host.tcpcc); return the one the socket runs."""
    try:
        tcpcc.set_congestion_control(sock, cc)
    except OSError as exc:
        raise BurstError(f"cannot set congestion control {cc!r} on a socket: "
                         f"{os.strerror(exc.errno)} (needs root unless it is in "
                         "tcp_allowed_congestion_control)") from None
    return tcpcc.congestion_control_of(sock)


# ---- receiver --------------------------------------------------------------------------------
@dataclass
class _Conn:
    sock: socket.socket
    index: int = -1               # connection index, from the first header
    header: bytearray = field(default_factory=bytearray)
    msg: int = -1
    left: int = 0                 # payload bytes still to read of the current chunk
    got: int = 0
    ok: bool = True               # payload pattern right so far


def receive(port: int, connections: int, messages: int, total_bytes: int, out: Path,
            bind: str, cc: str | None = None, verify: bool = False,
            timeout_s: float = 600.0, ready=print) -> list[MessageRecord]:
    """Accept `connections` connections, read `messages` messages, write one JSON line per
    message to out (appended as each completes), acknowledge each on connection 0."""
    want = chunk_sizes(total_bytes, connections)
    deadline = time.monotonic() + timeout_s
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bind, port))
    listener.listen(connections)
    ready(f"READY {listener.getsockname()[1]}", flush=True)
    conns: list[_Conn] = []
    try:
        listener.settimeout(max(0.1, deadline - time.monotonic()))
        while len(conns) < connections:
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                raise BurstError(f"only {len(conns)} of {connections} connections after "
                                 f"{timeout_s:g} s") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            set_congestion_control(sock, cc)
            sock.setblocking(False)
            conns.append(_Conn(sock=sock))
        return _receive_loop(conns, want, messages, total_bytes, out, verify, deadline)
    finally:
        listener.close()
        for c in conns:
            c.sock.close()


def _receive_loop(conns: list[_Conn], want: list[int], messages: int, total_bytes: int,
                  out: Path, verify: bool, deadline: float) -> list[MessageRecord]:
    k = len(conns)
    buf = bytearray(RECV_BUFFER_BYTES)
    view = memoryview(buf)
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    by_index: dict[int, _Conn] = {}
    # per message in progress: send_start, first byte, per-connection bytes / end / ok
    pending: dict[int, dict] = {}
    records: list[MessageRecord] = []
    cc = set_congestion_control(conns[0].sock, None)
    with open(out, "a") as f:
        while len(records) < messages:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                raise BurstError(f"{len(records)} of {messages} messages after the timeout")
            events = sel.select(timeout=min(timeout, 1.0))
            for key, _ in events:
                c: _Conn = key.data
                try:
                    n = c.sock.recv_into(view)
                except BlockingIOError:
                    continue
                now = time.time_ns()
                if n == 0:
                    raise BurstError(f"connection {c.index} closed after {len(records)} messages")
                pos = 0
                while pos < n:
                    if c.left == 0:  # reading a header
                        take = min(HEADER.size - len(c.header), n - pos)
                        c.header += view[pos:pos + take]
                        pos += take
                        if len(c.header) < HEADER.size:
                            continue
                        magic, msg, index, size, start_ns = HEADER.unpack(bytes(c.header))
                        c.header.clear()
                        if magic != MAGIC or index >= k or msg >= messages:
                            raise BurstError(f"bad chunk header {magic!r} msg {msg} conn {index}")
                        if c.index == -1:
                            if index in by_index:
                                raise BurstError(f"two connections call themselves {index}")
                            c.index = index
                            by_index[index] = c
                        elif c.index != index:
                            raise BurstError(f"connection {c.index} sent a chunk of {index}")
                        if size != want[index]:
                            raise BurstError(f"chunk of {size} bytes on connection {index}, "
                                             f"expected {want[index]}")
                        p = pending.setdefault(msg, {"start": start_ns, "first": now,
                                                     "bytes": [0] * k, "end": [0] * k,
                                                     "ok": [True] * k, "done": 0})
                        if start_ns != p["start"]:
                            raise BurstError(f"message {msg}: chunks disagree on send start")
                        c.msg, c.left, c.got, c.ok = msg, size, 0, True
                        if size == 0:
                            _chunk_done(c, p, now)
                    else:
                        take = min(c.left, n - pos)
                        want_byte = pattern_byte(c.msg, c.index)
                        if verify and buf.count(want_byte, pos, pos + take) != take:
                            c.ok = False
                        pos += take
                        c.left -= take
                        c.got += take
                        p = pending[c.msg]
                        if c.left == 0:
                            _chunk_done(c, p, now)
                # a finished message: record, write, acknowledge
                for msg in [m for m, p in pending.items() if p["done"] == k]:
                    p = pending.pop(msg)
                    end = max(p["end"])
                    rec = MessageRecord(
                        msg=msg, bytes=sum(p["bytes"]), connections=k, send_start_ns=p["start"],
                        first_byte_ns=p["first"], recv_end_ns=end,
                        transfer_ms=round((end - p["start"]) / 1e6, 3),
                        chunk_bytes=tuple(p["bytes"]), chunk_end_ns=tuple(p["end"]),
                        verified=all(p["ok"]) if verify else None, recv_cc=cc)
                    records.append(rec)
                    f.write(json.dumps(asdict(rec)) + "\n")
                    f.flush()
                    ack = by_index[0].sock
                    ack.setblocking(True)
                    ack.sendall(ACK.pack(msg))
                    ack.setblocking(False)
    return records


def _chunk_done(c: _Conn, p: dict, now: int) -> None:
    p["bytes"][c.index] = c.got
    p["end"][c.index] = now
    p["ok"][c.index] = c.ok
    p["done"] += 1


# ---- sender ----------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class SendRecord:
    msg: int
    send_start_ns: int       # CLOCK_REALTIME just before the first byte was written
    written_ns: int          # every byte handed to the kernel
    ack_ns: int              # the receiver's acknowledgement read
    cc: str


def send(host: str, port: int, connections: int, messages: int, total_bytes: int, gap_s: float,
         cc: str | None = None, verify: bool = False, timeout_s: float = 600.0,
         connect_timeout_s: float = 10.0, report=print) -> list[SendRecord]:
    """Connect `connections` sockets to host:port and send the messages, an idle gap_s apart
    (counted from the receiver's acknowledgement of the previous message)."""
    sizes = chunk_sizes(total_bytes, connections)
    socks: list[socket.socket] = []
    deadline = time.monotonic() + timeout_s
    try:
        for _ in range(connections):
            socks.append(_connect(host, port, cc, connect_timeout_s))
        used = {set_congestion_control(s, None) for s in socks}
        if cc and used != {cc}:
            raise BurstError(f"asked for congestion control {cc}, the sockets run {sorted(used)}")
        used_cc = used.pop()
        # header and payload in one buffer per connection, so the header never leaves as a
        # small segment of its own (with TCP_NODELAY it would, and take a slot of the window)
        frames = [bytearray(HEADER.size + s) for s in sizes]
        records = []
        for msg in range(messages):
            if verify:
                for k, frame in enumerate(frames):
                    frame[HEADER.size:] = bytes([pattern_byte(msg, k)]) * sizes[k]
            start_ns = time.time_ns()
            for k, frame in enumerate(frames):
                HEADER.pack_into(frame, 0, MAGIC, msg, k, sizes[k], start_ns)
            _write_all(socks, frames, deadline)
            written_ns = time.time_ns()
            _read_ack(socks[0], msg, deadline)
            rec = SendRecord(msg=msg, send_start_ns=start_ns, written_ns=written_ns,
                             ack_ns=time.time_ns(), cc=used_cc)
            records.append(rec)
            report(json.dumps(asdict(rec)), flush=True)
            if msg < messages - 1 and gap_s > 0:
                time.sleep(gap_s)
        return records
    finally:
        for s in socks:
            s.close()


def _connect(host: str, port: int, cc: str | None, timeout_s: float) -> socket.socket:
    """Connect, retrying while the receiver is not listening yet (up to timeout_s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        set_congestion_control(sock, cc)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            sock.connect((host, port))
            # again once connected: a route's congctl replaces the socket's choice at connect
            set_congestion_control(sock, cc)
            return sock
        except (ConnectionRefusedError, socket.timeout) as exc:
            sock.close()
            if time.monotonic() > deadline:
                raise BurstError(f"cannot connect to {host}:{port}: {exc}") from None
            time.sleep(0.05)


def _write_all(socks: Sequence[socket.socket], frames: list[bytearray], deadline: float) -> None:
    """Write every socket's frame at once (one non-blocking loop)."""
    sel = selectors.DefaultSelector()
    todo = {}
    for s, frame in zip(socks, frames):
        s.setblocking(False)
        todo[s] = memoryview(frame)
        sel.register(s, selectors.EVENT_WRITE)
    try:
        # a first write right away on every socket (no select round trip before the first byte)
        ready = list(socks)
        while todo:
            for s in ready:
                rest = todo.get(s)
                if rest is None:
                    continue
                while len(rest):
                    try:
                        n = s.send(rest[:SEND_SLICE_BYTES])
                    except BlockingIOError:
                        break
                    rest = rest[n:]
                todo[s] = rest
                if not len(rest):
                    del todo[s]
                    sel.unregister(s)
            if not todo:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise BurstError("send timed out")
            ready = [key.fileobj for key, _ in sel.select(timeout=min(left, 1.0))]
    finally:
        sel.close()
        for s in socks:
            s.setblocking(True)


def _read_ack(sock: socket.socket, msg: int, deadline: float) -> None:
    data = b""
    while len(data) < ACK.size:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(ACK.size - len(data))
        except socket.timeout:
            raise BurstError(f"no acknowledgement of message {msg}") from None
        if not chunk:
            raise BurstError(f"receiver closed before acknowledging message {msg}")
        data += chunk
    (got,) = ACK.unpack(data)
    if got != msg:
        raise BurstError(f"acknowledgement of message {got}, expected {msg}")


# ---- records ---------------------------------------------------------------------------------
def read_records(path: Path) -> list[MessageRecord]:
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            d = json.loads(line)
            d["chunk_bytes"] = tuple(d["chunk_bytes"])
            d["chunk_end_ns"] = tuple(d["chunk_end_ns"])
            out.append(MessageRecord(**d))
    return out


def parse_send_records(text: str) -> list[SendRecord]:
    """The sender's JSON lines (its stdout), skipping anything else it printed."""
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(SendRecord(**json.loads(line)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traffic.burst",
                                 description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="role", required=True)
    for role in ("send", "recv"):
        p = sub.add_parser(role)
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--connections", type=int, default=1, help="K: each message striped over K")
        p.add_argument("--messages", type=int, required=True)
        p.add_argument("--bytes", type=int, required=True, help="message size")
        p.add_argument("--cc", default=None, help="TCP_CONGESTION per socket (cubic, bbr, reno)")
        p.add_argument("--verify", action="store_true", help="fill/check a payload pattern")
        p.add_argument("--timeout-s", type=float, default=600.0)
        if role == "send":
            p.add_argument("--host", required=True)
            p.add_argument("--gap-s", type=float, default=1.0,
                           help="idle time between an acknowledged message and the next")
        else:
            p.add_argument("--bind", required=True,
                           help="the address the sender connects to (this host's own)")
            p.add_argument("--out", required=True, help="JSON lines, one per message")
    args = ap.parse_args(argv)
    if args.connections < 1 or args.messages < 1 or args.bytes < 0:
        ap.error("--connections and --messages must be >= 1, --bytes >= 0")
    try:
        if args.role == "recv":
            receive(args.port, args.connections, args.messages, args.bytes, Path(args.out),
                    bind=args.bind, cc=args.cc, verify=args.verify, timeout_s=args.timeout_s)
        else:
            send(args.host, args.port, args.connections, args.messages, args.bytes, args.gap_s,
                 cc=args.cc, verify=args.verify, timeout_s=args.timeout_s)
    except (BurstError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
