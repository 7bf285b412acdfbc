"""A userspace WAN delay line for kernels without netem: NFQUEUE in a gateway's FORWARD chain.

One job: hold each packet that the kernel queues to us for the link's delay (plus jitter, minus
loss), hand it back, and count what happened. It runs inside a gateway's network namespace as its
own process (`python -m testbed.emulation.delayline --queue NUM:DELAY_MS:JITTER_MS:LOSS_PCT:MAXLEN[:nogso]
... [--stats PATH] [--control PATH] [--no-realtime]`), prints `READY rt=<status> <queues>` once
every queue is bound, and exits on SIGTERM. SIGUSR2 applies new figures from the control file
(faults mid-run: testbed.features.faults.run; see DelayLine.control). `testbed.emulation.network` starts and supervises it and installs the iptables rules
(`-i <wan-if> -j NFQUEUE --queue-num NUM`) only after READY; HTB on the sending gateway sets the
rate (`testbed.emulation.shaping`). The scheduling itself (due times, loss, which ids to release, the
wake-up lead, the counters) is `testbed.emulation.delaysched`; this module is the netlink I/O around it.

Why it is cheap enough (see shared notes, emulation-facts): it speaks nfnetlink directly on raw
AF_NETLINK sockets (one per queue), asks for packet metadata and 1 byte of payload (COPY_PACKET
with a copy range of 1: with COPY_META the kernel leaves out the packet's length), lets GSO
super-packets through whole (NFQA_CFG_F_GSO), and releases every due packet of a queue with one
batch verdict. Packets are timed from the kernel's arrival stamp
(NFQA_TIMESTAMP), and the loop's own wake-up latency is measured as it runs and taken off each
deadline, so the added delay has no constant bias. With loss configured, GSO is left off for
that queue so a lost packet is one segment, not a 64 KB burst.

Jitter: each packet's delay is delay_ms + uniform(-jitter_ms, +jitter_ms), but release times
never go backwards within a queue, so packets leave in the order they came (as netem with a
rate; netem's jitter without a rate reorders instead) and a batch verdict up to id N is exact.
The cost of keeping order: when packets come closer together than the jitter, a packet waits
for the one before it, so under load the delay leans towards delay_ms + jitter_ms.

Real-time priority: at start every thread goes to SCHED_FIFO 50 (unless --no-realtime), so busy
CPUs (the trainer's processes) cannot hold a release back; READY says `rt=fifo:50`, or
`rt=refused:<errno name>` when the kernel refuses (no CAP_SYS_NICE, a container's RT budget of 0)
and it carries on at normal priority. The loop always blocks in poll() or sleep() when there is
nothing to do; the kernel's RT throttling (sched_rt_runtime_us, 950000 of 1000000 us by default;
if it is off we refuse RT) and RLIMIT_RTTIME (testbed.host.realtime.set_fifo) bound what a bug could take.

Accounting (`--stats PATH`): SIGUSR1 asks for a report. The handler only sets a flag (the loop
writes the report at its next turn; a wake-up pipe ends the poll at once), so the per-packet path
is unchanged but for a few counter increments. The report is a JSON document, written atomically
(PATH.tmp, then rename), with the counters since the previous report, which are then reset:
    {"seq": N, "final": false, "pid": ..., "rt": "fifo:50", "start": t0, "end": t1,
     "interval_s": ..., "queues": {"<num>": {packets, bytes, dropped_loss, dropped_queue_full,
     dropped_user, id_gaps, enobufs, verdict_errors, released, late_packets,
     lateness_ms: {p50, p99, max}, arrival_lag_ms: {p50, p99, max}, pending}}}
- packets, bytes: kept and delayed (a GSO super-packet counts once); bytes are IP bytes: the
  length the kernel reports in NFQA_CAP_LEN (attribute 13, big-endian u32), which it sends only
  in COPY_PACKET mode and only for packets longer than the copy range (a 1-byte packet counts
  its NFQA_PAYLOAD length). With COPY_META there is no length at all: it would count 0 bytes.
- dropped_loss: our configured loss. dropped_queue_full, dropped_user: the kernel's own drops,
  from this namespace's /proc/net/netfilter/nfnetlink_queue (queue_dropped: the queue held
  maxlen packets; user_dropped: the message could not be put on our socket), null if unreadable.
- id_gaps: ids we never saw (each is one of the kernel's user_dropped); enobufs: messages the
  kernel could not queue to our socket (sk_drops in /proc/net/netlink, plus any ENOBUFS that
  recv() raised); verdict_errors: verdicts the kernel refused (the packet was gone).
- arrival_lag_ms: from the kernel's arrival stamp to our read (time spent in the kernel first).
- released, late_packets, lateness_ms: packets released in the interval and how late (verdict
  time minus due time; see testbed.emulation.delaysched). pending: held at the time of the report.
A final report (`"final": true`) is written on exit, before the queues are unbound.

Kept without pyroute2: pyroute2 has the constants but no nfqueue client.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import gc
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.emulation.results import write_bytes
from testbed.host.realtime import PRIORITY, RT_SOFT_S, process_threads, set_fifo, set_normal
from testbed.emulation.delaysched import ID_MASK, RELEASE_GRACE_S, LeadControl, QueueSchedule, next_deadline

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
NFQA_PAYLOAD = 10
NFQA_CAP_LEN = 13  # the packet's length (enum nfqnl_attr_type: ..., CT 11, CT_INFO 12, CAP_LEN 13)
SO_TIMESTAMPNS = 35
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_PACKET = 2
COPY_RANGE_BYTES = 1  # copy 1 byte of each packet: the least that makes the kernel send CAP_LEN
NFQA_CFG_F_GSO = 4
NF_DROP = 0
NF_ACCEPT = 1
PACKET_MSG_TYPE = (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET
PR_SET_TIMERSLACK = 29
NFQUEUE_PROC = "/proc/net/netfilter/nfnetlink_queue"   # this network namespace's queues
NETLINK_PROC = "/proc/net/netlink"

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
    gso: bool = True     # take GSO packets whole (only while loss_pct is 0)

    @classmethod
    def parse(cls, text: str) -> "QueueSpec":
        parts = text.split(":")
        if len(parts) not in (5, 6) or (len(parts) == 6 and parts[5] != "nogso"):
            raise ValueError(f"--queue {text!r}: expected "
                             "NUM:DELAY_MS:JITTER_MS:LOSS_PCT:MAXLEN[:nogso]")
        return cls(num=int(parts[0]), delay_ms=float(parts[1]), jitter_ms=float(parts[2]),
                   loss_pct=float(parts[3]), maxlen=int(parts[4]), gso=len(parts) == 5)

    def format(self) -> str:
        return (f"{self.num}:{self.delay_ms:g}:{self.jitter_ms:g}:{self.loss_pct:g}:{self.maxlen}"
                + ("" if self.gso else ":nogso"))


def _attr(kind: int, payload: bytes) -> bytes:
    length = _NLATTR.size + len(payload)
    return _NLATTR.pack(length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(msg_type: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST, seq: int = 0) -> bytes:
    body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type,
                          flags, seq, 0) + body


def parse_nfqueue_proc(text: str) -> dict[int, tuple[int, int, int]]:
    """/proc/net/netfilter/nfnetlink_queue (this namespace's queues) -> {queue: (queue_dropped,
    user_dropped, id_sequence)}. Columns: queue_number peer_portid queue_total copy_mode
    copy_range queue_dropped user_dropped id_sequence 1."""
    out = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 8 and cols[0].isdigit():
            out[int(cols[0])] = (int(cols[5]), int(cols[6]), int(cols[7]))
    return out


def parse_netlink_drops(text: str) -> dict[int, int]:
    """/proc/net/netlink -> {socket inode: sk_drops} (messages the kernel could not queue to it).
    Columns: sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode."""
    out = {}
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 10 and cols[9].isdigit():
            out[int(cols[9])] = int(cols[8])
    return out


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class DelayLine:
    """One netlink socket per queue (so drops are per link direction) and its QueueSchedule."""

    def __init__(self, specs: list[QueueSpec], seed: int = 1, stats_path: str | None = None,
                 control_path: str | None = None) -> None:
        self.specs = {s.num: s for s in specs}
        rng = random.Random(seed)
        self.scheds = {s.num: QueueSchedule(s.delay_ms, s.jitter_ms, s.loss_pct, rng) for s in specs}
        self.socks = {s.num: _open_socket() for s in specs}
        self.queue_of_fd = {sock.fileno(): num for num, sock in self.socks.items()}
        self.inode = {num: os.fstat(sock.fileno()).st_ino for num, sock in self.socks.items()}
        self.lead = LeadControl()
        self.buf = bytearray(1 << 20)
        self.seq = 0
        # Any socket asking for receive timestamps makes the kernel stamp every packet as it
        # arrives (a global switch); NFQUEUE then hands us that arrival time (NFQA_TIMESTAMP),
        # so our own wake-up latency on arrival does not add to the delay.
        self.stamp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.stamp_sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.wake_fd: int | None = None   # the read end of signal.set_wakeup_fd's pipe
        self.stop = False                  # set by SIGTERM/SIGINT
        self.report_wanted = False         # set by SIGUSR1
        self.control_wanted = False        # set by SIGUSR2: read control_path (control())
        self.control_path = control_path
        self.changes: list[dict] = []      # each control applied: seq, applied, first packets
        self.watch_first: dict[int, dict] = {}   # queue -> its change awaiting a first packet
        self.stats_path = stats_path
        self.rt_status = "off"
        self.report_seq = 0
        self.interval_start = time.time()
        self.enobufs = {num: 0 for num in self.specs}  # ENOBUFS from recv (NO_ENOBUFS: none)
        self.kernel_base: dict[int, tuple[int, int]] = {}  # kernel counters at the last report
        self.drops_base: dict[int, int] = {}

    def bind(self) -> None:
        for num, spec in self.specs.items():
            sock = self.socks[num]
            self._config(sock, num, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)))
            self._config(sock, num, _attr(NFQA_CFG_PARAMS, struct.pack("!IB", COPY_RANGE_BYTES,
                                                                        NFQNL_COPY_PACKET)))
            self._config(sock, num, _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", spec.maxlen)))
            if spec.loss_pct == 0 and spec.gso:
                flags = struct.pack("!I", NFQA_CFG_F_GSO)
                self._config(sock, num, _attr(NFQA_CFG_FLAGS, flags) + _attr(NFQA_CFG_MASK, flags))
        self._kernel_counters()  # the baseline of the first report
        self.interval_start = time.time()

    def unbind(self) -> None:
        for num, sock in self.socks.items():
            try:
                sock.send(_message(NFQNL_MSG_CONFIG, num, _attr(
                    NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, 0))))
            except OSError:
                pass

    def _config(self, sock: socket.socket, queue: int, attrs: bytes) -> None:
        """Send one config request and wait for its ack; raise OSError with the kernel's errno."""
        self.seq += 1
        sock.send(_message(NFQNL_MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK, self.seq))
        while True:
            n = sock.recv_into(self.buf)
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

    def _on_packet(self, num: int, payload: memoryview, now: float) -> None:
        off = _NFGENMSG.size
        packet_id = None
        arrival = now
        nbytes = 0
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
            elif kind == NFQA_CAP_LEN:
                nbytes = struct.unpack_from("!I", payload, off + _NLATTR.size)[0]
            elif kind == NFQA_PAYLOAD and not nbytes:  # the whole packet fitted in the copy
                nbytes = alen - _NLATTR.size
            off += (alen + 3) & ~3
        if packet_id is None:
            return
        if self.watch_first and num in self.watch_first:   # the first packet since a change
            change = self.watch_first[num]
            if arrival >= change["applied"]:   # not one queued in the kernel before it
                del self.watch_first[num]
                change["first_packet"][str(num)] = arrival
        if not self.scheds[num].on_packet(packet_id, arrival, nbytes, now):
            self._verdict(num, NFQNL_MSG_VERDICT, NF_DROP, packet_id)

    def _verdict(self, queue: int, msg_type: int, verdict: int, packet_id: int) -> None:
        msg = _message(msg_type, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, packet_id)))
        self.socks[queue].send(msg)

    def _read(self, num: int) -> None:
        sock = self.socks[num]
        while True:
            try:
                n = sock.recv_into(self.buf, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.enobufs[num] += 1
                    continue
                raise
            now = time.time()  # per read: a kernel stamp is never judged against a stale clock
            for msg_type, _seq, payload in self._messages(n):
                if msg_type == PACKET_MSG_TYPE:
                    self._on_packet(num, payload, now)
                elif msg_type == NLMSG_ERROR:  # verdicts carry no ACK flag: only errors come back
                    self.scheds[num].counters.verdict_errors += 1

    def _drain_wakeup(self) -> None:
        try:
            while os.read(self.wake_fd, 512):
                pass
        except BlockingIOError:
            pass

    def _release_due(self, now: float) -> float | None:
        """Accept every due packet (one batch verdict per queue); return the next deadline."""
        horizon = now + RELEASE_GRACE_S
        for num, sched in self.scheds.items():
            count, last_id = sched.due_batch(horizon)
            if count:
                self._verdict(num, NFQNL_MSG_VERDICT_BATCH, NF_ACCEPT, last_id)
                sched.released(count, time.time())
        return next_deadline(self.scheds.values())

    def run(self) -> None:
        """Until self.stop: sleep until the next deadline or a packet, read, release. Never
        busy-waits (it runs at real-time priority): every turn blocks in poll() or sleep()
        unless a packet or a signal is waiting, or a deadline has passed and is served."""
        poller = select.poll()
        for fd in self.queue_of_fd:
            poller.register(fd, select.POLLIN)
        if self.wake_fd is not None:
            poller.register(self.wake_fd, select.POLLIN)
        queue_of_fd = self.queue_of_fd
        next_due: float | None = None
        while not self.stop:
            if self.report_wanted:
                self.report_wanted = False
                self.write_report()
            if self.control_wanted:
                self.control_wanted = False
                self.control()
            woke_by_timer = False
            if next_due is None:
                events = poller.poll(200)
            else:
                wait_s = next_due - self.lead.lead_s - time.time()
                # poll() takes whole ms (rounded down here); the sub-ms rest is slept precisely.
                events = poller.poll(int(wait_s * 1e3)) if wait_s >= 0.001 else poller.poll(0)
                if not events:
                    rest = next_due - self.lead.lead_s - time.time()
                    if rest > 0:
                        time.sleep(rest)
                    woke_by_timer = True
            for fd, _event in events:
                num = queue_of_fd.get(fd)
                if num is None:
                    self._drain_wakeup()  # a signal arrived; its handler has set a flag
                else:
                    self._read(num)
            aimed_at = next_due
            next_due = self._release_due(time.time())
            if woke_by_timer and aimed_at is not None:
                # The lead is learnt on the deadline this sleep aimed at, measured once its
                # verdict is sent (see delaysched.LeadControl).
                self.lead.update(time.time() - aimed_at)

    # ---- control ---------------------------------------------------------------------------------
    def control(self) -> None:
        """Apply the control file (SIGUSR2): {"seq": N, "queues": {"<num>": {delay_ms,
        jitter_ms, loss_pct}}} (each figure optional). A packet that arrives from now on gets
        the new figures (so may one that arrived just before and was still in the kernel);
        packets already held keep their due times, and due times still never go backwards (a lower delay lets packets through only as the ones before them leave).
        Acknowledged in <control>.ack: {"seq": N, "applied": time}; the arrival stamp of each
        queue's first packet since is in every report's "changes"."""
        if not self.control_path:
            return
        try:
            with open(self.control_path) as f:
                doc = json.load(f)
            change = {"seq": int(doc["seq"]), "applied": time.time(), "queues": {},
                      "first_packet": {}}
            for key, figures in doc["queues"].items():
                num = int(key)
                sched = self.scheds[num]
                if "delay_ms" in figures:
                    sched.delay_s = float(figures["delay_ms"]) / 1e3
                if "jitter_ms" in figures:
                    sched.jitter_s = float(figures["jitter_ms"]) / 1e3
                if "loss_pct" in figures:
                    sched.loss_pct = float(figures["loss_pct"])
                change["queues"][key] = {"delay_ms": sched.delay_s * 1e3,
                                         "jitter_ms": sched.jitter_s * 1e3,
                                         "loss_pct": sched.loss_pct}
                self.watch_first[num] = change
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"delayline: control file {self.control_path}: {exc!r}; ignored",
                  file=sys.stderr, flush=True)
            return
        self.changes.append(change)
        write_bytes(Path(f"{self.control_path}.ack"), json.dumps(
            {"seq": change["seq"], "applied": change["applied"]}).encode(), sync=False)

    # ---- accounting ----------------------------------------------------------------------------
    def _kernel_counters(self) -> dict[int, tuple[int, int, int] | None]:
        """Per queue, the kernel's (queue_dropped, user_dropped, socket drops) since the last
        call (None where /proc did not say), and move the baseline on."""
        nfq = parse_nfqueue_proc(_read_text(NFQUEUE_PROC))
        drops = parse_netlink_drops(_read_text(NETLINK_PROC))
        out: dict[int, tuple[int, int, int] | None] = {}
        for num in self.specs:
            if num not in nfq or self.inode[num] not in drops:
                out[num] = None
                continue
            queue_dropped, user_dropped, _id_sequence = nfq[num]
            sk_drops = drops[self.inode[num]]
            base_q, base_u = self.kernel_base.get(num, (0, 0))
            base_d = self.drops_base.get(num, 0)
            out[num] = ((queue_dropped - base_q) & ID_MASK, (user_dropped - base_u) & ID_MASK,
                        (sk_drops - base_d) & ID_MASK)
            self.kernel_base[num] = (queue_dropped, user_dropped)
            self.drops_base[num] = sk_drops
        return out

    def report(self, final: bool = False) -> dict:
        """The counters since the last report, per queue; resets them."""
        now = time.time()
        kernel = self._kernel_counters()
        queues = {}
        for num, sched in self.scheds.items():
            q = sched.counters.report()
            sched.counters.reset()
            k = kernel[num]
            q["dropped_queue_full"] = k[0] if k else None
            q["dropped_user"] = k[1] if k else None
            q["enobufs"] = (k[2] if k else 0) + self.enobufs[num]
            self.enobufs[num] = 0
            q["pending"] = len(sched.pending)
            queues[str(num)] = q
        self.report_seq += 1
        doc = {"seq": self.report_seq, "final": final, "pid": os.getpid(), "rt": self.rt_status,
               "start": self.interval_start, "end": now,
               "interval_s": round(now - self.interval_start, 6), "queues": queues,
               "changes": self.changes}
        self.interval_start = now
        return doc

    def write_report(self, final: bool = False) -> None:
        """Write report() to --stats PATH atomically (tmp file, then rename)."""
        if not self.stats_path:
            return
        doc = self.report(final)
        write_bytes(Path(self.stats_path), json.dumps(doc).encode(), sync=False)


def _open_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, 16 * 1024 * 1024)  # SO_RCVBUFFORCE
    # With NO_ENOBUFS an overrun of our socket is not reported to recv() and, above all, does
    # not mark the socket congested (which would drop every packet of the queue until we had
    # drained it). The kernel still counts each message it could not deliver: sk_drops in
    # /proc/net/netlink (reported as enobufs) and user_dropped in nfnetlink_queue.
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
    sock.bind((0, 0))
    return sock


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
    parser.add_argument("--stats", metavar="PATH", help="on SIGUSR1 and at exit, write the "
                        "counters since the last report to PATH (JSON)")
    parser.add_argument("--no-realtime", action="store_true",
                        help="stay at normal priority (default: SCHED_FIFO 50)")
    parser.add_argument("--control", metavar="PATH", help="on SIGUSR2, apply the new figures "
                        "in PATH (JSON; DelayLine.control) and acknowledge in PATH.ack")
    args = parser.parse_args(argv)
    line = DelayLine(args.queue, seed=args.seed, stats_path=args.stats,
                     control_path=args.control)

    def on_stop(signum, frame):  # noqa: ARG001
        line.stop = True

    def on_report(signum, frame):  # noqa: ARG001
        line.report_wanted = True

    def on_control(signum, frame):  # noqa: ARG001
        line.control_wanted = True

    def on_rttime(signum, frame):  # noqa: ARG001 - RLIMIT_RTTIME's soft limit: never block again?
        set_normal(process_threads())
        line.rt_status = "demoted:rttime"
        print(f"delayline: ran {RT_SOFT_S:g} s at real-time priority without blocking; "
              f"back to normal priority", file=sys.stderr, flush=True)

    # Handlers only set flags; the wake-up pipe makes poll() return at once for them (Python
    # would otherwise resume the poll after the handler, up to its timeout).
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    line.wake_fd = wake_r
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGUSR1, on_report)
    signal.signal(signal.SIGUSR2, on_control)
    signal.signal(signal.SIGXCPU, on_rttime)
    _set_timer_slack_ns(1000)
    line.rt_status = ("off" if args.no_realtime
                      else set_fifo(PRIORITY["delayline"], process_threads()))
    try:
        line.bind()
    except OSError as exc:
        print(f"delayline: {exc}", file=sys.stderr, flush=True)
        return 1
    # What exists now lives as long as we do: move it out of the collector's sight, so a full
    # collection in the loop scans only what the loop made (~0.1 ms, not ~3 ms of a late packet).
    gc.collect()
    gc.freeze()
    print(f"READY rt={line.rt_status} " + " ".join(s.format() for s in args.queue), flush=True)
    try:
        line.run()
    finally:
        try:
            line.write_report(final=True)  # before unbind: the kernel's counters go with the queue
        finally:
            line.unbind()
    return 0


if __name__ == "__main__":
    sys.exit(main())
