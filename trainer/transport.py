"""Point-to-point tensor transport between neighbouring pipeline stages over plain TCP.

One job: move activations (forward) and their gradients (backward) between stage s replica d
and stage s+1 replica d, without blocking compute. It does not know about schedules, models or
timing policy (trainer/worker.py decides what to send when).

- One `Channel` per neighbour: one TCP connection, used in both directions. Stage s+1 listens
  (`Listener`, bound to its own IP and port); stage s connects (`connect`, retrying until a
  deadline because the peer may start later). TCP_NODELAY on both ends. A hello frame names the
  connecting worker, and the listener checks it.
- Sending never blocks the caller: `send()` enqueues, a sender thread per channel writes.
- Receiving: a receiver thread per channel reads frames and fills per-(kind, iteration, mb)
  slots; `recv()` waits on its slot with a deadline.
- Framing: fixed header, then payload, then padding. Header (network order): magic 'TBT1', kind,
  dtype code, ndim, reserved, iteration (u32), micro-batch (u32), payload bytes (u64),
  pad bytes (u64), shape (4 x u64). Padding (zeros) makes a message as large as the target
  model's activation (profile mode), so the WAN sees the right number of bytes.

A later extension (several TCP connections per peer, timed sending) replaces the inside of
`Channel` and keeps this API.
"""

from __future__ import annotations

import queue
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from traffic.tcpcc import set_congestion_control

KIND_ACT = 1    # forward activation, stage s -> s+1
KIND_GRAD = 2   # gradient of that activation, stage s+1 -> s
KIND_NAMES = {KIND_ACT: "F", KIND_GRAD: "B"}

MAGIC = b"TBT1"
MAX_DIMS = 4
HEADER = struct.Struct("!4sBBBBIIQQ" + "Q" * MAX_DIMS)
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64]
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}
_PAD_CHUNK_BYTES = 1 << 20
_ZEROS = bytes(_PAD_CHUNK_BYTES)


@dataclass(frozen=True, slots=True)
class SendRecord:
    """What the sender thread did with one message (times on time.time_ns())."""

    kind: int
    iteration: int
    microbatch: int
    payload_bytes: int
    pad_bytes: int
    t_enqueue_ns: int
    t_start_ns: int
    t_end_ns: int          # sendall returned: the kernel took the last byte


@dataclass(frozen=True, slots=True)
class Received:
    tensor: torch.Tensor
    payload_bytes: int
    pad_bytes: int
    t_first_ns: int        # header arrived
    t_last_ns: int         # last byte arrived


@dataclass(frozen=True, slots=True)
class _Outgoing:
    kind: int
    iteration: int
    microbatch: int
    tensor: torch.Tensor
    pad_bytes: int
    t_enqueue_ns: int


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())


def _recv_exact(sock: socket.socket, buf: memoryview) -> bool:
    """Fill buf; False on a clean EOF before the first byte."""
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError(f"peer closed mid-message ({got}/{len(buf)} bytes)")
        got += n
    return True


class FrameError(ValueError):
    """A received frame header that this side cannot decode."""


def _check_header(magic: bytes, kind: int, code: int, ndim: int, iteration: int, mb: int,
                  payload: int, shape: list[int]) -> None:
    what = (f"header kind={kind} dtype={code} ndim={ndim} iteration={iteration} mb={mb} "
            f"payload={payload} shape={shape}")
    if magic != MAGIC:
        raise FrameError(f"bad frame magic {magic!r} ({what})")
    if kind not in KIND_NAMES:
        raise FrameError(f"unknown message kind {kind} ({what})")
    if code >= len(_DTYPES):
        raise FrameError(f"unknown dtype code {code} (known 0..{len(_DTYPES) - 1}; {what})")
    if ndim > MAX_DIMS:
        raise FrameError(f"{ndim} dims, at most {MAX_DIMS} ({what})")
    numel = 1
    for n in shape[:ndim]:
        numel *= n
    if numel * _DTYPES[code].itemsize != payload:
        raise FrameError(f"payload does not match shape and dtype ({what})")


class Channel:
    """A bidirectional tensor link to one peer. Thread-safe send/recv; close() when done."""

    def __init__(self, sock: socket.socket, peer: str,
                 on_sent: Callable[[SendRecord], None] | None = None) -> None:
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.peer = peer
        self._on_sent = on_sent
        self._outq: queue.Queue[_Outgoing | None] = queue.Queue()
        self._slots: dict[tuple[int, int, int], Received] = {}
        self._cond = threading.Condition()
        self._rx_error: BaseException | None = None
        self._rx_closed = False
        self._tx_error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_loop, name=f"tx-{peer}", daemon=True)
        self._receiver = threading.Thread(target=self._recv_loop, name=f"rx-{peer}", daemon=True)
        self._sender.start()
        self._receiver.start()

    # -- sending --------------------------------------------------------------------------
    def send(self, kind: int, iteration: int, microbatch: int, tensor: torch.Tensor,
             pad_to_bytes: int = 0) -> None:
        """Queue a tensor; returns at once. The message is padded with zeros to pad_to_bytes
        when that is larger than the tensor."""
        if self._tx_error is not None:
            raise ConnectionError(f"sending to {self.peer} failed earlier") from self._tx_error
        if tensor.dim() > MAX_DIMS:
            raise ValueError(f"tensor of {tensor.dim()} dims (max {MAX_DIMS})")
        if tensor.dtype not in _DTYPE_CODE:
            raise ValueError(f"dtype {tensor.dtype} not supported")
        payload = tensor.numel() * tensor.element_size()
        self._outq.put(_Outgoing(kind, iteration, microbatch, tensor.detach(),
                                 max(0, pad_to_bytes - payload), time.time_ns()))

    def _send_loop(self) -> None:
        while True:
            msg = self._outq.get()
            try:
                if msg is None:
                    return
                if self._tx_error is None:
                    self._write(msg)
            except OSError as exc:
                self._tx_error = exc
            finally:
                self._outq.task_done()

    def _write(self, msg: _Outgoing) -> None:
        data = _tensor_bytes(msg.tensor)
        shape = list(msg.tensor.shape) + [0] * (MAX_DIMS - msg.tensor.dim())
        header = HEADER.pack(MAGIC, msg.kind, _DTYPE_CODE[msg.tensor.dtype], msg.tensor.dim(), 0,
                             msg.iteration, msg.microbatch, len(data), msg.pad_bytes, *shape)
        t_start = time.time_ns()
        self.sock.sendall(header)
        self.sock.sendall(data)
        left = msg.pad_bytes
        while left > 0:
            n = min(left, _PAD_CHUNK_BYTES)
            self.sock.sendall(memoryview(_ZEROS)[:n])
            left -= n
        if self._on_sent is not None:
            self._on_sent(SendRecord(msg.kind, msg.iteration, msg.microbatch, len(data),
                                     msg.pad_bytes, msg.t_enqueue_ns, t_start, time.time_ns()))

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
                if self._rx_closed:
                    raise ConnectionError(f"{self.peer} closed before sending "
                                          f"{KIND_NAMES.get(kind, kind)}{microbatch} of "
                                          f"iteration {iteration}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {KIND_NAMES.get(kind, kind)}{microbatch} of iteration "
                                       f"{iteration} from {self.peer} after {timeout_s:.0f} s")
                self._cond.wait(left)
            return self._slots.pop(key)

    def _recv_loop(self) -> None:
        hbuf = bytearray(HEADER.size)
        scratch = bytearray(_PAD_CHUNK_BYTES)
        try:
            while True:
                if not _recv_exact(self.sock, memoryview(hbuf)):
                    break
                t_first = time.time_ns()
                (magic, kind, code, ndim, _, iteration, mb, payload, pad,
                 *shape) = HEADER.unpack(hbuf)
                _check_header(magic, kind, code, ndim, iteration, mb, payload, shape)
                body = bytearray(payload)
                if payload and not _recv_exact(self.sock, memoryview(body)):
                    raise ConnectionError(f"{self.peer} closed mid-message")
                left = pad
                while left > 0:
                    n = self.sock.recv_into(scratch, min(left, len(scratch)))
                    if n == 0:
                        raise ConnectionError(f"{self.peer} closed mid-padding")
                    left -= n
                dtype = _DTYPES[code]
                if payload:
                    tensor = torch.frombuffer(body, dtype=torch.uint8).view(dtype)
                else:
                    tensor = torch.empty(0, dtype=dtype)
                tensor = tensor.reshape(shape[:ndim])
                with self._cond:
                    self._slots[(kind, iteration, mb)] = Received(tensor, payload, pad, t_first,
                                                                  time.time_ns())
                    self._cond.notify_all()
        except Exception as exc:  # noqa: BLE001 - any failure must reach recv(), not kill silently
            with self._cond:
                self._rx_error = exc
                self._cond.notify_all()
        finally:
            with self._cond:
                self._rx_closed = True
                self._cond.notify_all()

    # -- shutdown -------------------------------------------------------------------------
    def close(self, timeout_s: float = 10.0) -> None:
        """Drain sends, half-close, wait for the peer's half-close, then close the socket."""
        try:
            self._outq.put(None)
            self._sender.join(timeout_s)
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self._receiver.join(timeout_s)
        finally:
            self.sock.close()
        if self._tx_error is not None:
            raise ConnectionError(f"sending to {self.peer} failed") from self._tx_error


# ---------------------------------------------------------------------------------------------
# connection setup

_HELLO = struct.Struct("!4sH")
HELLO_TIMEOUT_S = 5.0   # a connection must send its hello this soon


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
        self.sock.listen(4)

    def accept(self, expect_hello: str, timeout_s: float,
               on_sent: Callable[[SendRecord], None] | None = None) -> Channel:
        """Accept the peer whose hello is expect_hello; raise TimeoutError naming it. Any other
        connection (a wrong or missing hello) is closed and accepting goes on until the
        deadline."""
        deadline = time.monotonic() + timeout_s
        rejected: list[str] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"; rejected: {', '.join(rejected[-3:])}" if rejected else ""
                raise TimeoutError(f"{expect_hello} did not connect to {self.ip}:{self.port} "
                                   f"within {timeout_s:.0f} s{why}")
            self.sock.settimeout(left)
            try:
                conn, addr = self.sock.accept()
            except socket.timeout:
                continue
            # a real peer sends its hello right after connecting: a silent one is not it
            conn.settimeout(max(0.1, min(HELLO_TIMEOUT_S, deadline - time.monotonic())))
            try:
                hello = _read_hello(conn)
            except (OSError, ValueError) as exc:   # ConnectionError is an OSError
                conn.close()
                rejected.append(f"{addr[0]}:{addr[1]} ({exc})")
                continue
            if hello != expect_hello:
                conn.close()
                rejected.append(f"{addr[0]}:{addr[1]} (hello {hello!r})")
                continue
            set_congestion_control(conn, self.congestion_control)
            return Channel(conn, expect_hello, on_sent)

    def close(self) -> None:
        self.sock.close()


def _read_hello(conn: socket.socket) -> str:
    head = bytearray(_HELLO.size)
    if not _recv_exact(conn, memoryview(head)):
        raise ConnectionError("closed before hello")
    magic, n = _HELLO.unpack(head)
    if magic != MAGIC:
        raise ConnectionError(f"bad hello magic {magic!r}")
    body = bytearray(n)
    if n and not _recv_exact(conn, memoryview(body)):
        raise ConnectionError("closed inside hello")
    return body.decode()    # UnicodeDecodeError is a ValueError


def connect(ip: str, port: int, hello: str, peer: str, timeout_s: float,
            bind_ip: str | None = None, retry_s: float = 0.05,
            on_sent: Callable[[SendRecord], None] | None = None,
            congestion_control: str | None = None) -> Channel:
    """Connect to a Listener at ip:port, retrying refused/unreachable attempts until timeout_s
    (the peer may not have started yet); send hello (this side's name). congestion_control is
    set on the socket before it connects."""
    deadline = time.monotonic() + timeout_s
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
            data = hello.encode()
            sock.sendall(_HELLO.pack(MAGIC, len(data)) + data)
            return Channel(sock, peer, on_sent)
        except OSError as exc:   # refused, unreachable, timed out: the peer is not up yet
            sock.close()
            last = exc
            time.sleep(retry_s)
    raise TimeoutError(f"could not connect to {peer} at {ip}:{port} within {timeout_s:.0f} s "
                       f"(last error: {last})")
