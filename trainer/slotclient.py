"""Client of the per-link WAN arbiter (testbed.features.temporal.arbiter): wait for this pipeline's turn on a link,
send, say when done.

One job: the client side of the arbiter's line protocol (see testbed.features.temporal.arbiter's docstring):

    client = SlotClient("10.1.0.254", 7700, link="sa->sb", pipeline=0, timeout_s=30)
    with client.gate(wire_bytes):      # REQ ... blocks until GRANT (TimeoutError after timeout_s)
        sock.sendall(payload)          # the link direction is this transfer's alone
                                       # DONE on exit, also when the body raised

`gate` has the signature trainer.transport.Channel expects of its gate hook
(gate(wire_bytes: int) -> ContextManager[None]). wire_bytes is the TCP payload the transfer
hands to the kernel (the arbiter converts it to the link-layer bytes HTB counts). A client is
thread-safe: one request in flight at a time, other threads wait for it (within timeout_s).
One TCP connection per client, opened at the first gate and reopened after an error, or when
the arbiter closed it while idle (the REQ is sent again once on a new one); closing it
(close(), or the process ending) gives up a waiting request or a held slot.

Also a small load generator for tests and measurements (`python -m trainer.slotclient`):
    sink --ip IP --port P                           accept TCP connections on IP (this host's
                                                    address the senders use), discard what comes
    send --arbiter IP --port P --link L --pipeline D --dst IP:PORT
         (--sizes N,N,.. | --random COUNT:MIN:MAX [--seed S]) [--gap-ms G] [--threads T]
         [--abort-after-grant]                      gated transfers; prints one JSON summary
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Iterator

MAX_LINE = 200


@dataclass(frozen=True, slots=True)
class Grant:
    slot: int
    wire_bytes: int
    t_request_ns: int
    t_grant_ns: int        # the arbiter's time of the grant (time.time_ns(), shared clock)
    t_granted_ns: int      # when this client read the GRANT
    t_done_ns: int         # when it sent DONE


class SlotClient:
    def __init__(self, arbiter_ip: str, port: int, link: str, pipeline: int,
                 timeout_s: float = 60.0, connect_timeout_s: float = 5.0) -> None:
        self.addr = (arbiter_ip, int(port))
        self.link = str(link)
        self.pipeline = int(pipeline)
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.grants: list[Grant] = []
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buf = bytearray()

    # ---- public ----------------------------------------------------------------------------
    @contextmanager
    def gate(self, wire_bytes: int) -> Iterator[None]:
        """Hold the link for a transfer of wire_bytes of TCP payload (see the module docstring)."""
        wire_bytes = int(wire_bytes)
        if wire_bytes <= 0:
            yield
            return
        t_req = time.time_ns()
        if not self._lock.acquire(timeout=self.timeout_s):
            raise TimeoutError(f"link {self.link}: pipeline {self.pipeline} waited {self.timeout_s:g} s "
                               f"for its own previous transfer")
        try:
            slot, t_grant = self._request(wire_bytes)
            t_granted = time.time_ns()
            try:
                yield
            finally:
                self._done(slot)
                self.grants.append(Grant(slot=slot, wire_bytes=wire_bytes, t_request_ns=t_req,
                                         t_grant_ns=t_grant, t_granted_ns=t_granted,
                                         t_done_ns=time.time_ns()))
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._disconnect()

    def __enter__(self) -> "SlotClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- protocol --------------------------------------------------------------------------
    def _request(self, wire_bytes: int) -> tuple[int, int]:
        deadline = time.monotonic() + self.timeout_s
        reused = self._sock is not None
        sock = self._connect()
        try:
            try:
                sock.sendall(f"REQ {self.link} {self.pipeline} {wire_bytes}\n".encode())
                line = self._readline(deadline)
            except (ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                # the arbiter closed the idle connection (it evicts the idlest at its cap)
                # before reading this REQ: once more on a new one
                self._disconnect()
                sock = self._connect()
                sock.sendall(f"REQ {self.link} {self.pipeline} {wire_bytes}\n".encode())
                line = self._readline(deadline)
        except TimeoutError:
            self._disconnect()  # the arbiter drops the waiting request with the connection
            raise TimeoutError(f"link {self.link}: no grant for pipeline {self.pipeline} "
                               f"({wire_bytes} bytes) within {self.timeout_s:g} s") from None
        except OSError as exc:
            self._disconnect()
            raise ConnectionError(f"link {self.link}: arbiter {self.addr[0]}:{self.addr[1]}: {exc}") from None
        parts = line.split()
        if len(parts) == 3 and parts[0] == "GRANT":
            return int(parts[1]), int(parts[2])
        self._disconnect()
        raise ConnectionError(f"link {self.link}: arbiter refused pipeline {self.pipeline}: {line}")

    def _done(self, slot: int) -> None:
        if self._sock is None:
            return
        try:
            self._sock.sendall(f"DONE {slot}\n".encode())
        except OSError:
            self._disconnect()  # the arbiter ends the slot on the disconnect

    def _connect(self) -> socket.socket:
        if self._sock is None:
            try:
                sock = socket.create_connection(self.addr, timeout=self.connect_timeout_s)
            except OSError as exc:
                raise ConnectionError(f"link {self.link}: cannot reach the arbiter at "
                                      f"{self.addr[0]}:{self.addr[1]}: {exc}") from None
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
            self._buf.clear()
        return self._sock

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
            self._buf.clear()

    def _readline(self, deadline: float) -> str:
        assert self._sock is not None
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self._sock.settimeout(left)
            try:
                data = self._sock.recv(512)
            except socket.timeout:
                raise TimeoutError from None
            if not data:
                raise ConnectionResetError("arbiter closed the connection")
            self._buf += data
            if len(self._buf) > MAX_LINE and b"\n" not in self._buf:
                raise ConnectionError("arbiter sent an over-long line")
        nl = self._buf.index(b"\n")
        line = bytes(self._buf[:nl]).decode("ascii", errors="replace").strip()
        del self._buf[:nl + 1]
        return line


# ---- load generator ------------------------------------------------------------------------
_ZEROS = bytes(1 << 20)


def _sendall_zeros(sock: socket.socket, n: int) -> None:
    view = memoryview(_ZEROS)
    while n > 0:
        k = min(n, len(_ZEROS))
        sock.sendall(view[:k])
        n -= k


def _sink(ip: str, port: int) -> int:
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip, port))
    srv.listen(64)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def drain(conn: socket.socket) -> None:
        with conn:
            while conn.recv(1 << 20):
                pass

    print("ready", flush=True)
    srv.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        except OSError:
            if stop.is_set():
                break
            raise
        threading.Thread(target=drain, args=(conn,), daemon=True).start()
    return 0


def _send(args) -> int:
    host, port = args.dst.rsplit(":", 1)
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",") if x]
    else:
        count, lo, hi = (int(x) for x in args.random.split(":"))
        rng = random.Random(args.seed)
        sizes = [rng.randint(lo, hi) for _ in range(count)]
    results: list[dict] = []
    errors: list[str] = []

    def worker(k: int) -> None:
        client = SlotClient(args.arbiter, args.port, args.link, args.pipeline, timeout_s=args.timeout)
        rng = random.Random(args.seed * 1000 + k)
        try:
            with socket.create_connection((host, int(port)), timeout=10) as data:
                data.settimeout(None)
                for n in sizes:
                    if args.abort_after_grant:
                        # Hold the slot, send part of the bytes and vanish without DONE.
                        with client._lock:
                            slot, t_grant = client._request(n)
                            print(json.dumps({"granted": slot, "t_grant": t_grant}), flush=True)
                            _sendall_zeros(data, n // 4)
                            time.sleep(args.gap_ms / 1e3)
                            print(json.dumps({"aborted": slot, "t_abort": time.time_ns()}), flush=True)
                            client._disconnect()
                        return
                    with client.gate(n):
                        _sendall_zeros(data, n)
                    if args.gap_ms:
                        time.sleep(rng.uniform(0, args.gap_ms) / 1e3)
        except Exception as exc:  # noqa: BLE001 - reported in the summary
            errors.append(f"thread {k}: {exc!r}")
        finally:
            results.extend(asdict(g) for g in client.grants)
            client.close()

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"link": args.link, "pipeline": args.pipeline, "requests": len(sizes) * args.threads,
                      "grants": results, "errors": errors}), flush=True)
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="load generator for the WAN arbiter")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("sink")
    p.add_argument("--ip", required=True, help="the address to listen on (this host's)")
    p.add_argument("--port", type=int, required=True)
    p = sub.add_parser("send")
    p.add_argument("--arbiter", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--link", required=True)
    p.add_argument("--pipeline", type=int, required=True)
    p.add_argument("--dst", required=True, help="IP:PORT of a sink")
    p.add_argument("--sizes", help="comma-separated payload sizes")
    p.add_argument("--random", help="COUNT:MIN:MAX random payload sizes")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gap-ms", type=float, default=0.0, help="random pause (0..G ms) between transfers")
    p.add_argument("--threads", type=int, default=1, help="clients (each its own connections)")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--abort-after-grant", action="store_true",
                   help="take the first grant, send a quarter, then disconnect without DONE")
    args = parser.parse_args(argv)
    if args.cmd == "sink":
        return _sink(args.ip, args.port)
    if not args.sizes and not args.random:
        parser.error("send needs --sizes or --random")
    return _send(args)


if __name__ == "__main__":
    sys.exit(main())
