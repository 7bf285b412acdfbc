"""A userspace WAN delay line for kernels without netem: NFQUEUE in a gateway's FORWARD chain.

One job: hold each packet that the kernel queues to us for the link's delay (plus jitter, minus
loss) and then hand it back. It runs inside a gateway's network namespace as its own process
(`python -m testbed.delayline --queue NUM:DELAY_MS:JITTER_MS:LOSS_PCT:MAXLEN ...`), prints
`READY` once every queue is bound, and exits on SIGTERM. `testbed.network` starts and supervises
it and installs the iptables rules (`-i <wan-if> -j NFQUEUE --queue-num NUM`) only after READY;
HTB on the sending gateway sets the rate (`testbed.shaping`).

Why it is cheap enough (see shared notes, emulation-facts): it speaks nfnetlink directly on a raw
AF_NETLINK socket, asks only for packet metadata (COPY_META: no payload crosses to userspace),
lets GSO super-packets through whole (NFQA_CFG_F_GSO), and releases every due packet of a queue
with one batch verdict. Packets are timed from the kernel's arrival stamp (NFQA_TIMESTAMP), and
the loop's own wake-up latency is measured as it runs and taken off each deadline, so the added
delay has no constant bias. With loss configured, GSO is left off for that queue so a lost
packet is one segment, not a 64 KB burst.

Jitter: each packet's delay is delay_ms + uniform(-jitter_ms, +jitter_ms), but release times
never go backwards within a queue, so packets leave in the order they came (as netem with a
rate; netem's jitter without a rate reorders instead) and a batch verdict up to id N is exact.
The cost of keeping order: when packets come closer together than the jitter, a packet waits
for the one before it, so under load the delay leans towards delay_ms + jitter_ms.

Kept without pyroute2: pyroute2 has the constants but no nfqueue client.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_TIMESTAMP = 4
SO_TIMESTAMPNS = 35
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NFQA_CFG_F_GSO = 4
NF_DROP = 0
NF_ACCEPT = 1
PR_SET_TIMERSLACK = 29
RELEASE_GRACE_S = 50e-6  # release what is due this close, rather than sleep again

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("!BBH")  # family, version, res_id (queue number, big endian)
_NLATTR = struct.Struct("=HH")


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueSpec:
    num: int
    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    maxlen: int = 4096

    @classmethod
    def parse(cls, text: str) -> "QueueSpec":
        parts = text.split(":")
        if len(parts) != 5:
            raise ValueError(f"--queue {text!r}: expected NUM:DELAY_MS:JITTER_MS:LOSS_PCT:MAXLEN")
        return cls(num=int(parts[0]), delay_ms=float(parts[1]), jitter_ms=float(parts[2]),
                   loss_pct=float(parts[3]), maxlen=int(parts[4]))

    def format(self) -> str:
        return f"{self.num}:{self.delay_ms:g}:{self.jitter_ms:g}:{self.loss_pct:g}:{self.maxlen}"


def _attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type,
                          flags, seq, 0) + body


class DelayLine:
    """Owns the netlink socket and one FIFO of (release time, packet id) per queue."""

    def __init__(self, specs: list[QueueSpec], seed: int = 1) -> None:
        self.specs = {s.num: s for s in specs}
        self.pending: dict[int, collections.deque[tuple[float, int]]] = {
            s.num: collections.deque() for s in specs}
        self.last_release = {s.num: 0.0 for s in specs}
        self.rng = random.Random(seed)
        self.lead_s = 0.0  # how early the loop sets off for a deadline (its wake-up latency)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, 33, 16 * 1024 * 1024)  # SO_RCVBUFFORCE
        self.sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
        self.sock.bind((0, 0))
        self.buf = bytearray(1 << 20)
        self.seq = 0
        # Any socket asking for receive timestamps makes the kernel stamp every packet as it
        # arrives (a global switch); NFQUEUE then hands us that arrival time (NFQA_TIMESTAMP),
        # so our own wake-up latency on arrival does not add to the delay.
        self.stamp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.stamp_sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)

    def bind(self) -> None:
        for spec in self.specs.values():
            self._config(spec.num, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)))
            self._config(spec.num, _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)))
            self._config(spec.num, _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", spec.maxlen)))
            if spec.loss_pct == 0:
                flags = struct.pack("!I", NFQA_CFG_F_GSO)
                self._config(spec.num, _attr(NFQA_CFG_FLAGS, flags) + _attr(NFQA_CFG_MASK, flags))

    def unbind(self) -> None:
        for num in self.specs:
            try:
                self.sock.send(_message(NFQNL_MSG_CONFIG, num, _attr(
                    NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, 0))))
            except OSError:
                pass

    def _config(self, queue: int, attrs: bytes) -> None:
        """Send one config request and wait for its ack; raise OSError with the kernel's errno."""
        self.seq += 1
        self.sock.send(_message(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK, self.seq))
        while True:
            n = self.sock.recv_into(self.buf)
            for msg_type, seq, payload in self._messages(n):
                if msg_type == NLMSG_ERROR and seq == self.seq:
                    code = struct.unpack_from("=i", payload, 0)[0]
                    if code:
                        raise OSError(-code, f"nfqueue config of queue {queue}: {os.strerror(-code)}")
                    return

    def _messages(self, n: int):
        off = 0
        view = memoryview(self.buf)
        while off + _NLMSGHDR.size <= n:
            length, msg_type, _flags, seq, _pid = _NLMSGHDR.unpack_from(self.buf, off)
            if length < _NLMSGHDR.size:
                break
            yield msg_type, seq, view[off + _NLMSGHDR.size: off + length]
            off += (length + 3) & ~3

    def _on_packet(self, payload: memoryview, now: float) -> None:
        queue = struct.unpack_from("!H", payload, 2)[0]
        spec = self.specs.get(queue)
        off = _NFGENMSG.size
        packet_id = None
        arrival = now
        while off + _NLATTR.size <= len(payload):
            alen, akind = _NLATTR.unpack_from(payload, off)
            if alen < _NLATTR.size:
                break
            kind = akind & 0x7FFF
            if kind == NFQA_PACKET_HDR:
                packet_id = struct.unpack_from("!I", payload, off + _NLATTR.size)[0]
            elif kind == NFQA_TIMESTAMP:
                sec, usec = struct.unpack_from("!QQ", payload, off + _NLATTR.size)
                stamp = sec + usec / 1e6
                if now - 1.0 < stamp <= now:  # the kernel's arrival time, if it is sane
                    arrival = stamp
            off += (alen + 3) & ~3
        if spec is None or packet_id is None:
            return
        if spec.loss_pct and self.rng.random() * 100.0 < spec.loss_pct:
            self._verdict(NFQNL_MSG_VERDICT, queue, NF_DROP, packet_id)
            return
        delay_s = spec.delay_ms / 1e3
        if spec.jitter_ms:
            delay_s += self.rng.uniform(-spec.jitter_ms, spec.jitter_ms) / 1e3
        release = max(arrival + delay_s, self.last_release[queue])
        self.last_release[queue] = release
        self.pending[queue].append((release, packet_id))

    def _verdict(self, msg_type: int, queue: int, verdict: int, packet_id: int) -> None:
        msg = _message(msg_type, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id)))
        self.sock.send(msg)

    def _read_all(self) -> None:
        while True:
            try:
                n = self.sock.recv_into(self.buf, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    continue
                raise
            now = time.time()  # per read: a kernel stamp is never judged against a stale clock
            for msg_type, _seq, payload in self._messages(n):
                if msg_type == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    self._on_packet(payload, now)

    def _release_due(self, now: float) -> float | None:
        """Accept every due packet (one batch verdict per queue); return the next deadline."""
        next_due = None
        horizon = now + RELEASE_GRACE_S
        for queue, fifo in self.pending.items():
            last_id = None
            while fifo and fifo[0][0] <= horizon:
                _due, last_id = fifo.popleft()
            if last_id is not None:
                self._verdict(NFQNL_MSG_VERDICT_BATCH, queue, NF_ACCEPT, last_id)
            if fifo and (next_due is None or fifo[0][0] < next_due):
                next_due = fifo[0][0]
        return next_due

    def run(self, stop: list[bool]) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        next_due: float | None = None
        while not stop[0]:
            woke_by_timer = False
            if next_due is None:
                poller.poll(200)
            else:
                wait_s = next_due - self.lead_s - time.time()
                # poll() takes whole ms (rounded down here); the sub-ms rest is slept precisely.
                events = poller.poll(int(wait_s * 1e3)) if wait_s >= 0.001 else poller.poll(0)
                if not events:
                    rest = next_due - self.lead_s - time.time()
                    if rest > 0:
                        time.sleep(rest)
                    woke_by_timer = True
            self._read_all()
            aimed_at = next_due
            next_due = self._release_due(time.time())
            if woke_by_timer and aimed_at is not None:
                # Integral control of the wake-up lead on the deadline this sleep aimed at, as
                # measured once its verdict is sent: it converges to the loop's own latency
                # (wake-up plus reading plus the verdict), clamped to 0..2 ms.
                late_s = time.time() - aimed_at
                self.lead_s = min(max(self.lead_s + 0.2 * late_s, 0.0), 0.002)


def _set_timer_slack_ns(ns: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", action="append", required=True, type=QueueSpec.parse,
                        help="NUM:DELAY_MS:JITTER_MS:LOSS_PCT:MAXLEN (repeatable)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    _set_timer_slack_ns(1000)
    stop = [False]

    def on_signal(signum, frame):  # noqa: ARG001
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    line = DelayLine(args.queue, seed=args.seed)
    try:
        line.bind()
    except OSError as exc:
        print(f"delayline: {exc}", file=sys.stderr, flush=True)
        return 1
    print("READY " + " ".join(s.format() for s in args.queue), flush=True)
    try:
        line.run(stop)
    finally:
        line.unbind()
    return 0


if __name__ == "__main__":
    sys.exit(main())
