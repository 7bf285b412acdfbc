"""Message framing of BubbleTea's TCP connections (client -> prefill server -> decode server).

One job: put one message on a stream socket and take one off, checking every size before
anything is allocated. It knows nothing about what the messages mean (prefill/server.py and
prefill/decode_server.py validate their fields).

A message, in this order:
    prefix   10 bytes, network order: magic b"BTW1", version (u16), header length (u32)
    header   a JSON object (UTF-8), at most MAX_HEADER_BYTES; it always carries
             "payload_bytes" and "pad_bytes" (non-negative integers; send_msg sets them)
    payload  payload_bytes raw bytes (a KV cache, say)
    padding  pad_bytes zero bytes: makes the message as large as the target model's, so the
             WAN carries the right number of bytes; sent from one shared zero buffer and read
             into a small per-thread scratch buffer, in chunks, and dropped

recv_msg checks, before reading what follows: the magic and version, the header length against
MAX_HEADER_BYTES, then (header read) payload_bytes and pad_bytes against the caller's limits;
`header_deadline_s`, where given, bounds the time from the first byte until the header is in (a
peer trickling a header holds its reader no longer); `check(header)` lets the caller refuse a
message by its header before its payload is read: the payload and padding are then read and
dropped (in chunks), so the stream stays usable.
Errors: WireError (a ValueError, one line) for malformed input or a limit exceeded; its
`in_sync` says whether the whole message was consumed (the connection can go on) or not (close
it). EOF before a message's first byte is a clean close (recv_msg returns None); EOF inside a
message raises PeerClosed (a ConnectionError). Socket timeouts propagate as they are (the stream
is then out of sync: close it).
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from testbed.spec.errors import shown

MAGIC = b"BTW1"
VERSION = 1
PREFIX = struct.Struct("!4sHI")          # magic, version, header length
MAX_HEADER_BYTES = 64 * 1024
HEADER_DEADLINE_S = 5.0                  # the servers' header_deadline_s
_CHUNK_BYTES = 1 << 20                   # padding is sent and dropped in pieces of this size
_ZEROS = bytes(_CHUNK_BYTES)             # shared, read-only: every sender's padding
_SMALL_BYTES = 64 * 1024                 # a message up to this size goes out in one sendall
_scratch = threading.local()             # per-thread buffer for dropped bytes


class WireError(ValueError):
    """A message this side cannot decode or accept. in_sync: the whole message was consumed,
    so the connection can carry on; otherwise the caller should close it. header: the parsed
    header when the message got that far (a reply can then name the request's id)."""

    def __init__(self, message: str, *, in_sync: bool = False,
                 header: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.in_sync = in_sync
        self.header = header


class PeerClosed(ConnectionError):
    """The peer closed the connection in the middle of a message."""


@dataclass(frozen=True, slots=True)
class Message:
    header: dict[str, Any]   # the JSON object, "payload_bytes" and "pad_bytes" included
    payload: bytearray       # payload_bytes raw bytes (writable: torch.frombuffer wraps it as is)
    pad_bytes: int
    t_first_ns: int          # time.time_ns() when the first byte was read
    t_last_ns: int           # ... and the last


def send_msg(sock: socket.socket, header: dict[str, Any],
             payload: bytes | bytearray | memoryview = b"", pad_bytes: int = 0) -> int:
    """Send one message; returns the bytes sent (prefix + header + payload + padding).
    "payload_bytes" and "pad_bytes" are set in the header (a caller's differing value is a
    ValueError)."""
    data = memoryview(payload).cast("B")
    if isinstance(pad_bytes, bool) or not isinstance(pad_bytes, int) or pad_bytes < 0:
        raise ValueError(f"pad_bytes: {pad_bytes!r} is not an integer >= 0")
    head = dict(header)
    for key, value in (("payload_bytes", len(data)), ("pad_bytes", pad_bytes)):
        if head.setdefault(key, value) != value:
            raise ValueError(f"header {key} is {head[key]!r}, the message has {value}")
    body = json.dumps(head, separators=(",", ":")).encode()
    if len(body) > MAX_HEADER_BYTES:
        raise WireError(f"header of {len(body)} bytes is over {MAX_HEADER_BYTES}")
    first = PREFIX.pack(MAGIC, VERSION, len(body)) + body
    total = len(first) + len(data) + pad_bytes
    if total <= _SMALL_BYTES:          # one write: no small-segment delays
        sock.sendall(first + bytes(data) + _ZEROS[:pad_bytes])
        return total
    sock.sendall(first)
    if len(data):
        sock.sendall(data)
    left = pad_bytes
    while left > 0:
        n = min(left, _CHUNK_BYTES)
        sock.sendall(_ZEROS[:n] if n < _CHUNK_BYTES else _ZEROS)
        left -= n
    return total


def _read_into(sock: socket.socket, buf: memoryview, what: str,
               deadline: float | None = None) -> None:
    """Fill buf; with a deadline (time.monotonic()), WireError once it passes."""
    got = 0
    while got < len(buf):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WireError(f"the header deadline passed with {got} of the {len(buf)} "
                                f"bytes still due of the {what} in; send a header at once")
            sock.settimeout(left)
            try:
                n = sock.recv_into(buf[got:])
            except socket.timeout:
                continue
        else:
            n = sock.recv_into(buf[got:])
        if n == 0:
            raise PeerClosed(f"peer closed inside the {what} ({got} of {len(buf)} bytes)")
        got += n


def _drop(sock: socket.socket, nbytes: int, what: str) -> None:
    """Read nbytes and discard them, through a per-thread scratch buffer."""
    buf = getattr(_scratch, "buf", None)
    if buf is None:
        buf = _scratch.buf = memoryview(bytearray(_CHUNK_BYTES))
    left = nbytes
    while left > 0:
        n = sock.recv_into(buf[:min(left, _CHUNK_BYTES)])
        if n == 0:
            raise PeerClosed(f"peer closed inside the {what} ({nbytes - left} of {nbytes} "
                             f"bytes)")
        left -= n


def _size(header: dict, key: str) -> int:
    value = header.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise WireError(f"header {key} is {shown(value)}, not an integer >= 0")
    return value


def recv_msg(sock: socket.socket, *, max_payload_bytes: int, max_pad_bytes: int,
             check: Callable[[dict[str, Any]], None] | None = None,
             header_deadline_s: float | None = None,
             on_first_byte: Callable[[], None] | None = None) -> Message | None:
    """Read one message; None if the peer closed cleanly before its first byte. check(header),
    if given, may raise ValueError to refuse the message before its payload is read (it then
    comes back as WireError with in_sync=True, the message consumed). header_deadline_s: the
    prefix and header must be in this long after the first byte (else WireError, out of
    sync); the socket's timeout is put back after the header. on_first_byte() is called as the
    message's first byte is in (a service marks the connection busy)."""
    prefix = bytearray(PREFIX.size)
    view = memoryview(prefix)
    n = sock.recv_into(view)
    if n == 0:
        return None
    t_first_ns = time.time_ns()
    if on_first_byte is not None:
        on_first_byte()
    timeout = sock.gettimeout()
    deadline = None if header_deadline_s is None else time.monotonic() + header_deadline_s
    try:
        header = _read_header(sock, view, n, deadline)
    finally:
        if deadline is not None:
            sock.settimeout(timeout)
    payload_bytes, pad_bytes = header["payload_bytes"], header["pad_bytes"]
    if payload_bytes > max_payload_bytes:
        raise WireError(f"payload of {payload_bytes} bytes is over this side's limit "
                        f"{max_payload_bytes}", header=header)
    if pad_bytes > max_pad_bytes:
        raise WireError(f"padding of {pad_bytes} bytes is over this side's limit "
                        f"{max_pad_bytes}", header=header)
    if check is not None:
        try:
            check(header)
        except ValueError as exc:
            _drop(sock, payload_bytes, "payload")
            _drop(sock, pad_bytes, "padding")
            raise WireError(str(exc), in_sync=True, header=header) from None
    payload = bytearray(payload_bytes)
    _read_into(sock, memoryview(payload), "payload")
    _drop(sock, pad_bytes, "padding")
    return Message(header=header, payload=payload, pad_bytes=pad_bytes, t_first_ns=t_first_ns,
                   t_last_ns=time.time_ns())


def _read_header(sock: socket.socket, view: memoryview, got: int,
                 deadline: float | None) -> dict[str, Any]:
    """The rest of the prefix (got bytes of it are in view), then the header, checked."""
    _read_into(sock, view[got:], "message prefix", deadline)
    magic, version, header_len = PREFIX.unpack(view)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise WireError(f"wire version {version}, this side speaks {VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise WireError(f"header of {header_len} bytes is over {MAX_HEADER_BYTES}")
    body = bytearray(header_len)
    _read_into(sock, memoryview(body), "header", deadline)
    try:
        header = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"header is not JSON: {exc}") from None
    except RecursionError:
        raise WireError("header is not JSON: nested too deeply") from None
    except ValueError as exc:    # an integer past sys.get_int_max_str_digits
        raise WireError(f"header is not JSON: {str(exc)[:120]}") from None
    if not isinstance(header, dict):
        raise WireError(f"header is a JSON {type(header).__name__}, not an object")
    header["payload_bytes"] = _size(header, "payload_bytes")
    header["pad_bytes"] = _size(header, "pad_bytes")
    return header
