"""Point-to-point tensor transport between neighbouring pipeline stages over plain TCP.

One job: move activations (forward) and their gradients (backward) between stage s replica d
and stage s+1 replica d, without blocking compute. It does not know about schedules, models or
timing policy (trainer/worker.py decides what to send when).

- One `Channel` per neighbour: K >= 1 TCP connections to that peer (K=1 by default), used in
  both directions. Stage s+1 listens (`Listener`, bound to its own IP and port); stage s
  connects (`connect`, retrying until a deadline because the peer may start later) and opens
  all K. TCP_NODELAY and the congestion control on every socket. A hello frame on each
  connection names the connecting worker, the connection's index and K; the listener checks
  the name, index < K, no index twice and the same K on all, and returns one Channel per peer.
  It reads pending hellos side by side, each whole within HELLO_TIMEOUT_S and its name within
  MAX_HELLO_NAME bytes, so a connection that trickles or stalls its hello delays no other.
- Striping: each message (payload, then zero padding: the virtual byte range [0, payload + pad))
  is cut into n contiguous stripes, stripe i written on connection i:
      n = min(K, max(1, (payload + pad) // MIN_STRIPE_BYTES))
  (testbed/rules/stripes.py, with why MIN_STRIPE_BYTES is 4 KiB); the bytes are split evenly (the
  first (payload + pad) % n stripes one byte longer). A zero-byte message is one empty stripe.
- Sending never blocks the caller: `send()` enqueues; the channel's sender thread (connection
  0's writer) takes one message at a time, in order, hands stripes 1..n-1 to the writer threads
  of their connections and writes stripe 0 itself, so a message's stripes go out in parallel,
  and the next message starts only when every stripe of this one is in the kernel. `gate`
  (optional): `with gate(wire_bytes):` is held around writing all stripes of a message
  (wire_bytes = its frame headers + payload + pad), so a WAN-slot arbiter can hold a message
  until its slot and learns when the last byte went to the kernel. `on_sent` gets one
  SendRecord per message (first stripe write start, last stripe's sendall returned).
- Shutdown: `close(timeout_s)` drains the queue, half-closes, waits for the peer's half-closes
  and closes. A message not wholly in the kernel at the deadline (the peer stopped reading) is
  never cut silently: the sockets are shut down under it (which unblocks its writers) and closed,
  and close() raises ConnectionError naming the peer, the message, its wire bytes written of its
  total and the queued messages never sent.
- Receiving: one reader thread per connection reads frames; stripes are reassembled per
  (kind, iteration, mb) in any order, from any connection: the message buffer is mapped once,
  at its first stripe (anonymous private memory: a page costs memory only once a byte lands in
  it, so a message holds no more than has arrived), each stripe's part overlapping [0, payload)
  is read straight into it and padding is read into a scratch buffer and dropped. The message
  is complete when all its stripes are in; `recv()` waits for it with a deadline. Every header
  is validated before anything is mapped (FrameError): on its own, against what the channel
  expects (`Expect`, from the worker's spec: each kind's dtype, shape and padded bytes, the
  iterations and micro-batches; a channel without one takes any tensor within the frame
  limits) and against the cap on messages held (begun or complete, not yet taken: count and
  payload bytes). An error on any connection (reset, EOF inside a frame, a bad header) makes
  recv() raise ConnectionError naming the peer and the connection at once.
  `arrival(kind, iteration, mb)` says whether a message has begun to arrive (its first stripe's
  header, when, and the message's bytes), and `on_arrival` (settable, None by default) is called
  from the reader thread, outside the channel's lock, when a message's first stripe header
  arrives: `on_arrival(Arrival)` (BubbleTea: the wire time still ahead bounds a bubble's end).
  It must not raise: an exception fails the channel like a receive error. `arrival()` is None
  both before a message's first byte and after recv() took it.
  A connection i that ends cleanly between frames ends only its own reader, unless a message
  still lacks its stripe i (an error, as above); once all K have ended, recv() reports the
  peer closed.
- Framing, per stripe: fixed header, then the stripe's bytes. Header (network order): magic
  'TBT2', kind, dtype code, ndim, reserved, iteration (u32), micro-batch (u32), message payload
  bytes (u64), message pad bytes (u64), shape (4 x u64), stripe offset (u64), stripe length
  (u64), stripe index (u16), stripe count (u16). Padding (zeros) makes a message as large as the
  target model's activation (profile mode), so the WAN sees the right number of bytes.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import queue
import selectors
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Sequence

import torch

from testbed.host.realtime import set_fifo
from testbed.rules.stripes import MIN_STRIPE_BYTES, stripe_plan  # noqa: F401 - re-exported
from testbed.host.tcpcc import set_congestion_control

KIND_ACT = 1    # forward activation, stage s -> s+1
KIND_GRAD = 2   # gradient of that activation, stage s+1 -> s
KIND_NAMES = {KIND_ACT: "F", KIND_GRAD: "B"}

MAGIC = b"TBT2"
MAX_DIMS = 4
HEADER = struct.Struct("!4sBBBBIIQQ" + "Q" * MAX_DIMS + "QQHH")
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_PAD_CHUNK_BYTES = 1 << 20
_ZEROS = bytes(_PAD_CHUNK_BYTES)
MAX_CONNECTIONS = 64           # K per channel
CLOSE_GRACE_S = 1.0            # close(): how long a cut sender gets to see its sockets shut down
MAX_PAYLOAD_BYTES = 1 << 34    # a header claiming a larger tensor is refused (16 GiB)
MAX_HELD_MESSAGES = 64         # messages begun or unread at once, on a channel without Expect
MAX_HELD_BYTES = 1 << 30       # their payload bytes, on a channel without Expect
LISTEN_BACKLOG = 64

Gate = Callable[[int], ContextManager[None]]


@dataclass(frozen=True, slots=True)
class SendRecord:
    """What the sender did with one message (times on time.time_ns())."""

    kind: int
    iteration: int
    microbatch: int
    payload_bytes: int
    pad_bytes: int
    t_enqueue_ns: int
    t_start_ns: int        # the first stripe's write began
    t_end_ns: int          # the last stripe's sendall returned: the kernel took the last byte
    stripes: int = 1


@dataclass(frozen=True, slots=True)
class Received:
    tensor: torch.Tensor
    payload_bytes: int
    pad_bytes: int
    t_first_ns: int        # the first stripe's header arrived
    t_last_ns: int         # the last byte of the last stripe arrived
    stripes: int = 1


@dataclass(frozen=True, slots=True)
class Arrival:
    """A message that has begun to arrive: its first stripe's header came at t_first_ns; it has
    payload + pad bytes in all; complete once every stripe is in."""

    kind: int
    iteration: int
    microbatch: int
    t_first_ns: int
    total_bytes: int
    complete: bool = False


@dataclass(frozen=True, slots=True)
class Expected:
    """One kind of message a channel receives: its dtype, its shape and its bytes on the wire
    (payload plus the sender's padding: max(payload, the sender's pad_to_bytes))."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    total_bytes: int

    @property
    def payload_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


@dataclass(frozen=True, slots=True)
class Expect:
    """What a channel accepts from its peer: the kinds it receives (anything else is refused),
    iteration < iterations and micro-batch < micro_batches. At most held() messages are begun
    or unread at once: the sender cannot run more than one iteration's micro-batches ahead of
    this side (its optimizer step waits for messages this side sends after taking them), so a
    peer with more is refused."""

    kinds: dict[int, Expected]
    iterations: int
    micro_batches: int

    def held(self) -> int:
        return 2 * self.micro_batches + 2

    def held_bytes(self) -> int:
        return self.held() * max(e.payload_bytes for e in self.kinds.values())

    def check(self, kind: int, code: int, shape: tuple[int, ...], payload: int, pad: int,
              iteration: int, mb: int) -> None:
        """FrameError unless the message is one of those expected."""
        want = self.kinds.get(kind)
        name = KIND_NAMES.get(kind, str(kind))
        if want is None:
            raise FrameError(f"message kind {name} not expected (this channel receives "
                             f"{'/'.join(KIND_NAMES[k] for k in sorted(self.kinds))})")
        got = (_DTYPES[code], shape, payload + pad)
        if got != (want.dtype, want.shape, want.total_bytes):
            raise FrameError(f"message {name} of {_DTYPES[code]} {list(shape)}, "
                             f"{payload + pad} bytes; expected {want.dtype} {list(want.shape)}, "
                             f"{want.total_bytes} bytes")
        if iteration >= self.iterations or mb >= self.micro_batches:
            raise FrameError(f"message {name} of iteration {iteration}, micro-batch {mb}; "
                             f"expected iteration < {self.iterations}, micro-batch < "
                             f"{self.micro_batches}")


@dataclass(frozen=True, slots=True)
class _Outgoing:
    kind: int
    iteration: int
    microbatch: int
    tensor: torch.Tensor
    pad_bytes: int
    t_enqueue_ns: int


@dataclass(slots=True)
class _StripeJob:
    header: bytes
    data: memoryview       # the whole message's payload bytes
    offset: int            # in the virtual range [0, payload + pad)
    length: int
    done: threading.Event = field(default_factory=threading.Event)
    sent: int = 0          # wire bytes (header included) the kernel has taken so far
    t_start_ns: int = 0
    t_end_ns: int = 0
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class _InFlight:
    """The message the sender is on (its stripes' byte counters say how far it got)."""

    msg: _Outgoing
    jobs: list[_StripeJob]
    wire_bytes: int

    def sent(self) -> int:
        return sum(job.sent for job in self.jobs)


@dataclass(slots=True)
class _Assembly:
    """A message whose stripes are still arriving."""

    code: int
    ndim: int
    shape: tuple[int, ...]
    payload: int
    pad: int
    count: int
    body: mmap.mmap | bytearray
    t_first_ns: int
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # index -> (offset, len)
    done: int = 0          # stripes fully read


def _message_buffer(payload: int) -> mmap.mmap | bytearray:
    """A zeroed buffer of payload bytes that takes memory page by page as it is written (an
    anonymous private mapping), not all at once as a bytearray would."""
    return mmap.mmap(-1, payload, flags=mmap.MAP_PRIVATE) if payload else bytearray()


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())


def _send_counted(sock: socket.socket, view: memoryview, job: _StripeJob) -> None:
    """sendall(view), adding to job.sent what each send() handed to the kernel. On a blocking
    socket a send() is one syscall for the whole rest unless cut short (a signal, or a shutdown:
    then it returns what it wrote), so this costs no more than sendall and counts exactly."""
    done = 0
    while done < len(view):
        n = sock.send(view[done:])
        done += n
        job.sent += n


def _recv_exact(sock: socket.socket, buf: memoryview) -> bool:
    """Fill buf; False on a clean EOF before the first byte."""
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError(f"peer closed mid-frame ({got}/{len(buf)} bytes)")
        got += n
    return True


class FrameError(ValueError):
    """A received frame header that this side cannot decode or accept."""


def _check_header(magic: bytes, kind: int, code: int, ndim: int, iteration: int, mb: int,
                  payload: int, pad: int, shape: list[int], offset: int, length: int,
                  index: int, count: int, connections: int) -> None:
    """Everything one header can be checked for on its own (before anything is allocated)."""
    what = (f"header kind={kind} dtype={code} ndim={ndim} iteration={iteration} mb={mb} "
            f"payload={payload} pad={pad} shape={shape} stripe {index}/{count} "
            f"offset={offset} length={length}")
    if magic != MAGIC:
        raise FrameError(f"bad frame magic {magic!r} ({what})")
    if kind not in KIND_NAMES:
        raise FrameError(f"unknown message kind {kind} ({what})")
    if code >= len(_DTYPES):
        raise FrameError(f"unknown dtype code {code} (known 0..{len(_DTYPES) - 1}; {what})")
    if ndim > MAX_DIMS:
        raise FrameError(f"{ndim} dims, at most {MAX_DIMS} ({what})")
    if math.prod(shape[:ndim]) * _DTYPES[code].itemsize != payload:
        raise FrameError(f"payload does not match shape and dtype ({what})")
    if payload > MAX_PAYLOAD_BYTES:
        raise FrameError(f"payload over {MAX_PAYLOAD_BYTES} bytes ({what})")
    if not 1 <= count <= connections:
        raise FrameError(f"stripe count {count} outside 1..{connections} (this channel has "
                         f"{connections} connections; {what})")
    if index >= count:
        raise FrameError(f"stripe index {index} not below the count {count} ({what})")
    if offset + length > payload + pad:
        raise FrameError(f"stripe ends at {offset + length}, beyond the message's "
                         f"{payload + pad} bytes ({what})")


class Channel:
    """A bidirectional tensor link to one peer over K connected sockets (connection i = socks[i]).
    Thread-safe send/recv; close() when done. expect: what it accepts from the peer (None: any
    tensor within the frame limits, at most MAX_HELD_MESSAGES / MAX_HELD_BYTES held)."""

    def __init__(self, socks: socket.socket | Sequence[socket.socket], peer: str,
                 on_sent: Callable[[SendRecord], None] | None = None,
                 gate: Gate | None = None, io_priority: int | None = None,
                 expect: Expect | None = None) -> None:
        self.socks = [socks] if isinstance(socks, socket.socket) else list(socks)
        self._io_priority = io_priority
        self.io_realtime = "off"        # what the I/O threads got (io_priority; set by them)
        if not 1 <= len(self.socks) <= MAX_CONNECTIONS:
            raise ValueError(f"{len(self.socks)} connections (1..{MAX_CONNECTIONS})")
        for sock in self.socks:
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self.socks[0]       # connection 0 (what callers of one connection used)
        self.connections = len(self.socks)
        self.peer = peer
        self._on_sent = on_sent
        self._gate = gate
        self._outq: queue.Queue[_Outgoing | None] = queue.Queue()
        self._slots: dict[tuple[int, int, int], Received] = {}
        self._partial: dict[tuple[int, int, int], _Assembly] = {}
        self._expect = expect
        self._max_held = MAX_HELD_MESSAGES if expect is None else expect.held()
        self._max_held_bytes = MAX_HELD_BYTES if expect is None else expect.held_bytes()
        self._held_bytes = 0    # payload bytes of the messages in _partial and _slots
        self._cond = threading.Condition()
        self._rx_error: BaseException | None = None
        self._rx_open = self.connections    # readers still running
        self._tx_error: BaseException | None = None
        self._inflight: _InFlight | None = None   # the sender's message until it is all sent
        self._unsent = 0        # messages the sender dropped (after an error, or cut by close)
        self._cut = False       # close() passed its deadline: the sender starts nothing more
        self._closed = False
        self.on_arrival: Callable[[Arrival], None] | None = None
        k = self.connections
        self._stripe_qs: list[queue.Queue[_StripeJob | None]] = [queue.Queue() for _ in range(k)]
        self._sender = threading.Thread(target=self._io, args=(self._send_loop,),
                                        name=f"tx-{peer}-0", daemon=True)
        self._writers = [threading.Thread(target=self._io, args=(self._write_loop, i),
                                          name=f"tx-{peer}-{i}", daemon=True)
                         for i in range(1, k)]
        self._readers = [threading.Thread(target=self._io, args=(self._recv_loop, i),
                                          name=f"rx-{peer}-{i}", daemon=True) for i in range(k)]
        for t in (self._sender, *self._writers, *self._readers):
            t.start()

    def _io(self, loop: Callable[..., None], *args: int) -> None:
        """An I/O thread: at SCHED_FIFO io_priority when asked (this thread alone; testbed.host.realtime
        with its guards), so a thread that waits for a grant or for bytes runs as soon as they
        come instead of after the CPU-bound compute of 2-core neighbours; it blocks on its
        socket or queue otherwise. Refused: it runs on at normal priority."""
        if self._io_priority is not None:
            self.io_realtime = set_fifo(self._io_priority)
        loop(*args)

    def _conn(self, i: int) -> str:
        return f"connection {i} of {self.connections} to {self.peer}"

    # -- sending --------------------------------------------------------------------------
    def send(self, kind: int, iteration: int, microbatch: int, tensor: torch.Tensor,
             pad_to_bytes: int = 0) -> None:
        """Queue a tensor; returns at once. The message is padded with zeros to pad_to_bytes
        when that is larger than the tensor."""
        if self._tx_error is not None:
            raise ConnectionError(f"sending to {self.peer} failed earlier: "
                                  f"{self._tx_error}") from self._tx_error
        if tensor.dim() > MAX_DIMS:
            raise ValueError(f"tensor of {tensor.dim()} dims (max {MAX_DIMS})")
        if tensor.dtype not in _DTYPE_CODE:
            raise ValueError(f"dtype {tensor.dtype} not supported")
        payload = tensor.numel() * tensor.element_size()
        self._outq.put(_Outgoing(kind, iteration, microbatch, tensor.detach(),
                                 max(0, pad_to_bytes - payload), time.time_ns()))

    def _send_loop(self) -> None:
        try:
            while True:
                msg = self._outq.get()
                try:
                    if msg is None:
                        return
                    if self._tx_error is None and not self._cut:
                        self._send_message(msg)
                    else:
                        self._unsent += 1
                except Exception as exc:  # noqa: BLE001 - a socket or gate failure ends sending
                    if self._tx_error is None:
                        self._tx_error = exc
                        self._fail_fast(exc)
                finally:
                    self._outq.task_done()
        finally:
            for q in self._stripe_qs[1:]:
                q.put(None)

    def _fail_fast(self, exc: BaseException) -> None:
        """Sending failed: say so at once on both sides instead of leaving them to their
        timeouts. This side's recv() raises (naming the peer and the cause), and the sockets are
        shut down, so the peer's readers see the connection end and its recv() raises too."""
        with self._cond:
            if self._rx_error is None:
                self._rx_error = ConnectionError(f"sending to {self.peer} failed: "
                                                 f"{type(exc).__name__}: {exc}")
                self._rx_error.__cause__ = exc
            self._cond.notify_all()
        for sock in self.socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _send_message(self, msg: _Outgoing) -> None:
        data = _tensor_bytes(msg.tensor)
        payload = len(data)
        tensor = msg.tensor
        shape = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
        plan = stripe_plan(payload + msg.pad_bytes, self.connections)
        jobs = [_StripeJob(HEADER.pack(MAGIC, msg.kind, _DTYPE_CODE[tensor.dtype], tensor.dim(),
                                       0, msg.iteration, msg.microbatch, payload, msg.pad_bytes,
                                       *shape, offset, length, i, len(plan)),
                           data, offset, length) for i, (offset, length) in enumerate(plan)]
        wire_bytes = len(jobs) * HEADER.size + payload + msg.pad_bytes
        self._inflight = _InFlight(msg, jobs, wire_bytes)   # kept if it fails: close() says so
        with (self._gate(wire_bytes) if self._gate is not None else contextlib.nullcontext()):
            for i, job in enumerate(jobs[1:], start=1):
                self._stripe_qs[i].put(job)
            self._write_job(0, jobs[0])
            for job in jobs:
                job.done.wait()
            failed = [(i, j.error) for i, j in enumerate(jobs) if j.error is not None]
            if failed:
                i, err = failed[0]
                raise ConnectionError(f"{self._conn(i)}: {err}") from err
        self._inflight = None
        if self._on_sent is not None:
            self._on_sent(SendRecord(msg.kind, msg.iteration, msg.microbatch, payload,
                                     msg.pad_bytes, msg.t_enqueue_ns,
                                     min(j.t_start_ns for j in jobs),
                                     max(j.t_end_ns for j in jobs), len(jobs)))

    def _write_loop(self, i: int) -> None:
        while True:
            job = self._stripe_qs[i].get()
            if job is None:
                return
            self._write_job(i, job)

    def _write_job(self, i: int, job: _StripeJob) -> None:
        """Write one stripe frame on connection i; never raises (the error goes in the job)."""
        sock = self.socks[i]
        try:
            job.t_start_ns = time.time_ns()
            _send_counted(sock, memoryview(job.header), job)
            end = job.offset + job.length
            payload = len(job.data)
            if job.offset < payload:
                _send_counted(sock, job.data[job.offset:min(end, payload)], job)
            left = end - max(job.offset, payload)
            while left > 0:
                n = min(left, _PAD_CHUNK_BYTES)
                _send_counted(sock, memoryview(_ZEROS)[:n], job)
                left -= n
            job.t_end_ns = time.time_ns()
        except BaseException as exc:  # noqa: BLE001 - reported by the sender thread
            job.error = exc
        finally:
            job.done.set()

    # -- receiving ------------------------------------------------------------------------
    def recv(self, kind: int, iteration: int, microbatch: int, timeout_s: float) -> Received:
        """Block until that message has arrived (or raise TimeoutError / ConnectionError)."""
        key = (kind, iteration, microbatch)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while key not in self._slots:
                if self._rx_error is not None:
                    raise ConnectionError(f"receiving from {self.peer} failed: "
                                          f"{self._rx_error}") from self._rx_error
                if self._rx_open == 0:
                    raise ConnectionError(f"{self.peer} closed before sending "
                                          f"{KIND_NAMES.get(kind, kind)}{microbatch} of "
                                          f"iteration {iteration}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {KIND_NAMES.get(kind, kind)}{microbatch} of iteration "
                                       f"{iteration} from {self.peer} after {timeout_s:.0f} s")
                self._cond.wait(left)
            got = self._slots.pop(key)
            self._held_bytes -= got.payload_bytes
            return got

    def arrival(self, kind: int, iteration: int, microbatch: int) -> Arrival | None:
        """That message's arrival so far (None: no stripe of it yet, or already taken)."""
        key = (kind, iteration, microbatch)
        with self._cond:
            if key in self._slots:
                got = self._slots[key]
                return Arrival(kind, iteration, microbatch, got.t_first_ns,
                               got.payload_bytes + got.pad_bytes, complete=True)
            asm = self._partial.get(key)
            if asm is None:
                return None
            return Arrival(kind, iteration, microbatch, asm.t_first_ns, asm.payload + asm.pad)

    def _recv_loop(self, i: int) -> None:
        sock = self.socks[i]
        hbuf = bytearray(HEADER.size)
        scratch = bytearray(_PAD_CHUNK_BYTES)
        try:
            while True:
                if not _recv_exact(sock, memoryview(hbuf)):
                    break
                t_first = time.time_ns()
                (magic, kind, code, ndim, _, iteration, mb, payload, pad, *rest) = \
                    HEADER.unpack(hbuf)
                shape, (offset, length, index, count) = rest[:MAX_DIMS], rest[MAX_DIMS:]
                _check_header(magic, kind, code, ndim, iteration, mb, payload, pad, shape,
                              offset, length, index, count, self.connections)
                if self._expect is not None:
                    self._expect.check(kind, code, tuple(shape[:ndim]), payload, pad,
                                       iteration, mb)
                key = (kind, iteration, mb)
                asm, new = self._claim_stripe(key, code, ndim, tuple(shape[:ndim]), payload,
                                              pad, offset, length, index, count, t_first)
                hook = self.on_arrival
                if new and hook is not None:
                    hook(Arrival(kind, iteration, mb, t_first, payload + pad))
                end = offset + length
                if offset < payload:   # the part in [0, payload): straight into the message
                    body = memoryview(asm.body)[offset:min(end, payload)]
                    if not _recv_exact(sock, body):
                        raise ConnectionError("peer closed mid-stripe")
                left = end - max(offset, payload)   # the padding: read and dropped
                while left > 0:
                    n = sock.recv_into(scratch, min(left, len(scratch)))
                    if n == 0:
                        raise ConnectionError("peer closed mid-padding")
                    left -= n
                self._stripe_done(key, asm)
        except Exception as exc:  # noqa: BLE001 - any failure must reach recv(), not kill silently
            with self._cond:
                if self._rx_error is None:
                    err = ConnectionError if isinstance(exc, OSError) else FrameError
                    self._rx_error = err(f"{self._conn(i)}: {exc}")
                    self._rx_error.__cause__ = exc
                self._cond.notify_all()
        finally:
            with self._cond:
                self._rx_open -= 1
                if self._rx_error is None:
                    # A clean end between frames. Stripe i travels on connection i, so a
                    # message still missing stripe i, or anything missing once all have
                    # ended, will never complete.
                    for key, asm in self._partial.items():
                        if (i < asm.count and i not in asm.ranges) or self._rx_open == 0:
                            self._rx_error = ConnectionError(
                                f"{self._conn(i)}: closed with message {key} incomplete "
                                f"(stripes {sorted(asm.ranges)} of {asm.count} in)")
                            break
                self._cond.notify_all()

    def _claim_stripe(self, key: tuple[int, int, int], code: int, ndim: int,
                      shape: tuple[int, ...], payload: int, pad: int, offset: int, length: int,
                      index: int, count: int, t_first: int) -> tuple[_Assembly, bool]:
        """Register a stripe with its message (allocating the message's buffer at its first
        stripe), after checking it against the stripes already seen; (the message, whether
        this was its first stripe). Raises FrameError."""
        with self._cond:
            asm = self._partial.get(key)
            new = asm is None
            if asm is None:
                if key in self._slots:
                    raise FrameError(f"stripe {index}/{count} of message {key}, which is "
                                     f"complete and not yet taken (duplicate)")
                held = len(self._partial) + len(self._slots)
                if held >= self._max_held or self._held_bytes + payload > self._max_held_bytes:
                    raise FrameError(f"message {key} of {payload} bytes would make {held + 1} "
                                     f"messages of {self._held_bytes + payload} bytes begun or "
                                     f"unread, over this channel's cap of {self._max_held} "
                                     f"and {self._max_held_bytes} bytes")
                asm = _Assembly(code, ndim, shape, payload, pad, count, _message_buffer(payload),
                                t_first)
                self._partial[key] = asm
                self._held_bytes += payload
            else:
                mine = (code, ndim, shape, payload, pad, count)
                first = (asm.code, asm.ndim, asm.shape, asm.payload, asm.pad, asm.count)
                if mine != first:
                    raise FrameError(f"stripe {index} of message {key} disagrees with its "
                                     f"first stripe: (dtype, ndim, shape, payload, pad, count) "
                                     f"{mine} vs {first}")
                if index in asm.ranges:
                    raise FrameError(f"duplicate stripe {index}/{count} of message {key}")
                for o, n in asm.ranges.values():
                    if offset < o + n and o < offset + length:
                        raise FrameError(f"stripe {index} [{offset}, {offset + length}) of "
                                         f"message {key} overlaps [{o}, {o + n})")
            asm.ranges[index] = (offset, length)
            if len(asm.ranges) == count:
                covered = sum(n for _, n in asm.ranges.values())
                if covered != payload + pad:
                    raise FrameError(f"the {count} stripes of message {key} cover {covered} "
                                     f"of its {payload + pad} bytes")
            return asm, new

    def _stripe_done(self, key: tuple[int, int, int], asm: _Assembly) -> None:
        with self._cond:
            asm.done += 1
            if asm.done < asm.count:
                return
            del self._partial[key]
            dtype = _DTYPES[asm.code]
            if asm.payload:
                tensor = torch.frombuffer(asm.body, dtype=torch.uint8).view(dtype)
            else:
                tensor = torch.empty(0, dtype=dtype)
            self._slots[key] = Received(tensor.reshape(asm.shape), asm.payload, asm.pad,
                                        asm.t_first_ns, time.time_ns(), asm.count)
            self._cond.notify_all()

    # -- shutdown -------------------------------------------------------------------------
    def close(self, timeout_s: float = 10.0) -> None:
        """Drain sends, half-close every connection, wait for the peer's half-closes, then close
        the sockets. A second call does nothing. Raises ConnectionError when sending failed, or
        when at the deadline a message was not wholly in the kernel (the peer stopped reading):
        the sockets are then shut down under it and closed, and the error names the message,
        its wire bytes written of its total and the queued messages never sent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        cut: str | None = None
        try:
            self._outq.put(None)
            self._sender.join(timeout_s)
            if self._sender.is_alive() and self._tx_error is None:
                cut = self._cut_sender(timeout_s)
            else:
                self._finish_close(deadline)
        finally:
            for sock in self.socks:
                sock.close()
        if cut is not None:
            raise ConnectionError(cut) from self._tx_error
        if self._tx_error is not None:
            raise ConnectionError(f"sending to {self.peer} failed: "
                                  f"{self._tx_error}") from self._tx_error

    def _finish_close(self, deadline: float) -> None:
        """Every message is in the kernel: half-close, and wait for the peer's half-closes."""
        for t in self._writers:
            t.join(max(0.0, deadline - time.monotonic()))
        # After a receive error the other readers may wait forever for their peer's data.
        how = socket.SHUT_RDWR if self._rx_error is not None else socket.SHUT_WR
        for sock in self.socks:
            try:
                sock.shutdown(how)
            except OSError:
                pass
        for t in self._readers:
            t.join(max(0.0, deadline - time.monotonic()))

    def _cut_sender(self, timeout_s: float) -> str | None:
        """The deadline passed with the sender still busy: stop it from starting another
        message, shut the sockets down (a blocked send() returns what it wrote, then fails),
        give the I/O threads CLOSE_GRACE_S to end, and say what was not sent (None: nothing)."""
        self._cut = True
        for sock in self.socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        grace = time.monotonic() + CLOSE_GRACE_S
        for t in (self._sender, *self._writers):
            t.join(max(0.0, grace - time.monotonic()))
        inflight = self._inflight
        unsent = self._unsent
        if self._sender.is_alive():    # stuck (in its gate, say): what it has not taken yet
            unsent += max(0, self._outq.qsize() - 1)    # less the None close() queued
        if inflight is None and unsent == 0:
            return None
        what = f"close({timeout_s:g} s) cut sending to {self.peer}: "
        if inflight is not None:
            msg = inflight.msg
            done = sum(job.done.is_set() and job.error is None for job in inflight.jobs)
            what += (f"message {KIND_NAMES.get(msg.kind, msg.kind)}{msg.microbatch} of "
                     f"iteration {msg.iteration} (micro-batch {msg.microbatch}) had "
                     f"{inflight.sent()} of its {inflight.wire_bytes} wire bytes written "
                     f"({done} of {len(inflight.jobs)} stripes whole); ")
        else:
            what += "no message half-sent; "
        return what + f"{unsent} queued message{'s' * (unsent != 1)} never sent"


# ---------------------------------------------------------------------------------------------
# connection setup

_HELLO = struct.Struct("!4sHHH")   # magic, connection index, connections (K), name length
HELLO_TIMEOUT_S = 5.0     # a connection must send its whole hello this soon after it is accepted
MAX_PENDING_HELLOS = 64   # hellos still coming; beyond, the one that sent least is closed
MAX_HELLO_NAME = 64       # bytes of a hello's name (or the expected name's, when longer)


def _check_connections(k: int) -> None:
    if not isinstance(k, int) or not 1 <= k <= MAX_CONNECTIONS:
        raise ValueError(f"connections must be an integer in 1..{MAX_CONNECTIONS}, got {k!r}")


def parse_hello(data: bytes, max_name: int) -> tuple[str, int, int] | None:
    """(name, connection index, K) of the hello that data holds, None while it is incomplete;
    FrameError when it is not a hello or its name is over max_name bytes (refused from its
    head, before the name is read)."""
    if data[:len(MAGIC)] != MAGIC[:len(data)]:
        raise FrameError(f"bad hello magic {bytes(data[:len(MAGIC)])!r}")
    if len(data) < _HELLO.size:
        return None
    _, index, k, n = _HELLO.unpack_from(data)
    if n > max_name:
        raise FrameError(f"hello name of {n} bytes, at most {max_name}")
    if len(data) < _HELLO.size + n:
        return None
    try:
        return bytes(data[_HELLO.size:_HELLO.size + n]).decode(), index, k
    except UnicodeDecodeError as exc:
        raise FrameError(f"hello name not UTF-8 ({exc})") from None


@dataclass(slots=True)
class _PendingHello:
    addr: str
    deadline: float
    data: bytearray = field(default_factory=bytearray)


class Listener:
    """A listening socket bound to (ip, port) for one expected peer."""

    def __init__(self, ip: str, port: int, congestion_control: str | None = None) -> None:
        self.ip, self.port = ip, port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.congestion_control = congestion_control
        try:
            set_congestion_control(self.sock, congestion_control)  # accepted sockets inherit it
        except OSError:
            self.sock.close()
            raise
        try:
            self.sock.bind((ip, port))
        except OSError as exc:
            self.sock.close()
            raise OSError(f"cannot bind {ip}:{port}: {exc}") from exc
        self.sock.listen(LISTEN_BACKLOG)

    def accept(self, expect_hello: str, timeout_s: float,
               on_sent: Callable[[SendRecord], None] | None = None, connections: int = 1,
               gate: Gate | None = None, io_priority: int | None = None,
               expect: Expect | None = None) -> Channel:
        """Accept the `connections` connections of the peer whose hello is expect_hello (each
        with its index, all saying K = connections) and return them as one Channel; raise
        TimeoutError naming the peer. Hellos are read side by side (one selector for the
        listening socket and every connection whose hello is still coming), each within
        HELLO_TIMEOUT_S of its accept, so a connection that trickles its hello holds up no
        other. Any other connection (a wrong, slow or missing hello, another K, an index out of
        range or seen before; of more than MAX_PENDING_HELLOS pending, the one that sent least)
        is closed and accepting goes on until the deadline."""
        _check_connections(connections)
        deadline = time.monotonic() + timeout_s
        max_name = max(MAX_HELLO_NAME, len(expect_hello.encode()))
        rejected: deque[str] = deque(maxlen=3)     # the last few, for the timeout's message
        got: dict[int, socket.socket] = {}
        pending: dict[socket.socket, _PendingHello] = {}
        sel = selectors.DefaultSelector()

        def drop(conn: socket.socket, why: str) -> None:
            sel.unregister(conn)
            conn.close()
            rejected.append(f"{pending.pop(conn).addr} ({why})")

        def read(conn: socket.socket) -> None:
            p = pending[conn]
            whole = (_HELLO.size if len(p.data) < _HELLO.size
                     else _HELLO.size + _HELLO.unpack_from(p.data)[3])
            want = whole - len(p.data)
            try:
                chunk = conn.recv(want)
            except BlockingIOError:
                return
            except OSError as exc:
                drop(conn, str(exc))
                return
            if not chunk:
                drop(conn, "closed before hello" if not p.data else "closed inside hello")
                return
            p.data += chunk
            try:
                hello = parse_hello(p.data, max_name)
            except FrameError as exc:
                drop(conn, str(exc))
                return
            if hello is None:
                return
            name, index, k = hello
            problem = ""
            if name != expect_hello:
                problem = f"hello {name!r}"
            elif k != connections:
                problem = f"hello {name!r} with K={k}, expected K={connections}"
            elif index >= k:
                problem = f"hello {name!r} with connection index {index}, K={k}"
            elif index in got:
                problem = f"hello {name!r}: connection index {index} twice"
            if problem:
                drop(conn, problem)
                return
            sel.unregister(conn)
            del pending[conn]
            got[index] = conn
            set_congestion_control(conn, self.congestion_control)

        def accept_waiting() -> None:
            while True:
                try:
                    conn, addr = self.sock.accept()
                except BlockingIOError:
                    return
                conn.setblocking(False)
                pending[conn] = _PendingHello(f"{addr[0]}:{addr[1]}",
                                              time.monotonic() + HELLO_TIMEOUT_S)
                sel.register(conn, selectors.EVENT_READ)
                read(conn)   # a real peer's hello is there already: taken in accept order
                if len(pending) > MAX_PENDING_HELLOS:   # the one that sent least, oldest first
                    drop(min(pending, key=lambda c: len(pending[c].data)),
                         f"over {MAX_PENDING_HELLOS} hellos pending")

        self.sock.setblocking(False)
        sel.register(self.sock, selectors.EVENT_READ)
        try:
            while len(got) < connections:
                now = time.monotonic()
                for conn, p in list(pending.items()):
                    if p.deadline <= now:
                        drop(conn, f"{len(p.data)} bytes of hello in {HELLO_TIMEOUT_S:g} s")
                if now >= deadline:
                    why = f"; rejected: {', '.join(rejected)}" if rejected else ""
                    have = (f" ({len(got)} of its {connections} connections came)"
                            if got else "")
                    raise TimeoutError(f"{expect_hello} did not connect to {self.ip}:{self.port} "
                                       f"within {timeout_s:.0f} s{have}{why}")
                wake = min([deadline, *(p.deadline for p in pending.values())])
                for key, _ in sel.select(max(0.0, wake - now)):
                    if key.fileobj is self.sock:
                        accept_waiting()
                    elif key.fileobj in pending:
                        read(key.fileobj)
                    if len(got) == connections:
                        break
        except BaseException:
            for conn in got.values():
                conn.close()
            raise
        finally:
            for conn in pending:
                conn.close()
            sel.close()
            if self.sock.fileno() != -1:     # not closed under it
                self.sock.setblocking(True)
        return Channel([got[i] for i in range(connections)], expect_hello, on_sent, gate,
                       io_priority, expect)

    def close(self) -> None:
        self.sock.close()


def hello_frame(hello: str, index: int = 0, connections: int = 1) -> bytes:
    """The hello a connecting side sends on connection `index` of `connections`."""
    data = hello.encode()
    return _HELLO.pack(MAGIC, index, connections, len(data)) + data


def connect(ip: str, port: int, hello: str, peer: str, timeout_s: float,
            bind_ip: str | None = None, retry_s: float = 0.05,
            on_sent: Callable[[SendRecord], None] | None = None,
            congestion_control: str | None = None, connections: int = 1,
            gate: Gate | None = None, io_priority: int | None = None,
            expect: Expect | None = None) -> Channel:
    """Open `connections` connections to a Listener at ip:port, each retrying refused or
    unreachable attempts until timeout_s (the peer may not have started yet), and send on each
    its hello (this side's name, its index, K). congestion_control is set on every socket before
    it connects and again after."""
    _check_connections(connections)
    deadline = time.monotonic() + timeout_s
    socks: list[socket.socket] = []
    try:
        for index in range(connections):
            socks.append(_connect_one(ip, port, hello_frame(hello, index, connections), peer,
                                      timeout_s, deadline, bind_ip, retry_s, congestion_control))
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return Channel(socks, peer, on_sent, gate, io_priority, expect)


def _connect_one(ip: str, port: int, hello: bytes, peer: str, timeout_s: float,
                 deadline: float, bind_ip: str | None, retry_s: float,
                 congestion_control: str | None) -> socket.socket:
    last: OSError | None = None
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            set_congestion_control(sock, congestion_control)
        except OSError:
            sock.close()
            raise
        try:
            if bind_ip:
                sock.bind((bind_ip, 0))
            sock.settimeout(max(0.1, min(5.0, deadline - time.monotonic())))
            sock.connect((ip, port))
            # again once connected: a route's congctl replaces the socket's choice at connect
            set_congestion_control(sock, congestion_control)
            sock.sendall(hello)
            return sock
        except OSError as exc:   # refused, unreachable, timed out: the peer is not up yet
            sock.close()
            last = exc
            time.sleep(retry_s)
    raise TimeoutError(f"could not connect to {peer} at {ip}:{port} within {timeout_s:.0f} s "
                       f"(last error: {last})")
