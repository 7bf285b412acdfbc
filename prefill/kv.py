"""KV-cache hand-off from a prefill server to one decode server.

One job: send queued KV messages (prefill/wire.py framing: header, the cache as payload, zero
padding) to one decode address, in order, over one persistent TCP connection, wait for each
message's ack, and record each as KV_SEND. What goes in a message and how much padding it gets is
the prefill server's business (prefill/server.py); the receiving end is prefill/decode_server.py.

Connection: opened at the first message (connect_timeout_s), kept for the next ones, dropped on
any error and opened again for the next message. A message that fails on a reused connection is
tried once more on a fresh one (the decode server may have restarted since); a failure on a fresh
connection is final. Failures are records (KV_SEND with `error`), never exceptions: a dead
decode server, or one answering garbage, must not stop the prefill server (the sender thread
is prefill/service.py's start_thread: should it die anyway, the server fails visibly).

Record: KV_SEND {id, t_enqueue_ns (the prefill ended and queued it), t_start_ns (this attempt
began; a connect included when `connected`), t_end_ns (the ack was read, or the failure), bytes
(payload + padding), payload_bytes, pad_bytes, wire_bytes (with the framing; null on failure),
decode_host (the ack's host; null on failure), decode_addr ("ip:port"), connected (this attempt
opened the connection), attempt (1, or 2 after a stale connection), error (null, or one
line)}.
"""

from __future__ import annotations

import queue
import socket
import time
from dataclasses import dataclass
from typing import Any

from testbed.host.records import RecordLog
from prefill.service import start_thread
from prefill.wire import PeerClosed, WireError, recv_msg, send_msg


@dataclass(frozen=True, kw_only=True, slots=True)
class KvJob:
    header: dict[str, Any]
    payload: memoryview
    pad_bytes: int
    t_enqueue_ns: int


class KvSender:
    """One decode address: a thread sending queued KV messages in order over one persistent
    connection, each followed by its ack, and recording each as KV_SEND."""

    def __init__(self, ip: str, port: int, records: RecordLog, connect_timeout_s: float,
                 ack_timeout_s: float) -> None:
        self.ip, self.port = ip, port
        self.addr = f"{ip}:{port}"
        self.records = records
        self.connect_timeout_s, self.ack_timeout_s = connect_timeout_s, ack_timeout_s
        self._q: queue.Queue[KvJob | None] = queue.Queue()
        self._sock: socket.socket | None = None
        self._thread = start_thread(f"kv-{self.addr}", self._run)

    def put(self, job: KvJob) -> None:
        self._q.put(job)

    def close(self, timeout_s: float) -> None:
        """Send what is queued (up to timeout_s), then close the connection."""
        self._q.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while (job := self._q.get()) is not None:
                self._send(job)
        finally:
            self._drop_connection()

    def _drop_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.ip, self.port), timeout=self.connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.ack_timeout_s)
        return sock

    def _send(self, job: KvJob) -> None:
        h = job.header
        rec = {"id": h["id"], "t_enqueue_ns": job.t_enqueue_ns,
               "bytes": len(job.payload) + job.pad_bytes, "payload_bytes": len(job.payload),
               "pad_bytes": job.pad_bytes, "decode_addr": self.addr}
        for attempt in (1, 2):
            fresh = self._sock is None
            t_start_ns = time.time_ns()
            try:
                if fresh:
                    self._sock = self._connect()
                wire_bytes = send_msg(self._sock, h, job.payload, job.pad_bytes)
                ack = recv_msg(self._sock, max_payload_bytes=0, max_pad_bytes=0)
                if ack is None:
                    raise PeerClosed("decode server closed the connection before its ack")
            except (OSError, WireError) as exc:
                self._drop_connection()
                if fresh or attempt == 2:
                    self.records.write("KV_SEND", **rec, t_start_ns=t_start_ns,
                                       t_end_ns=time.time_ns(), wire_bytes=None,
                                       decode_host=None, connected=fresh, attempt=attempt,
                                       error=f"{type(exc).__name__}: {exc}")
                    return
                continue   # a reused connection may be stale (decode server restarted)
            a = ack.header
            error = None if a.get("ok") is True else f"decode server refused: {a.get('error')}"
            self.records.write("KV_SEND", **rec, t_start_ns=t_start_ns, t_end_ns=ack.t_last_ns,
                               wire_bytes=wire_bytes, decode_host=a.get("host"),
                               connected=fresh, attempt=attempt, error=error)
            return
