"""The TCP service loop shared by the prefill server and the decode server.

One job: listen on (ip, port), run a handler in its own thread for every accepted connection,
and stop cleanly on SIGTERM or SIGINT. It knows nothing about messages (prefill/wire.py) or what
a server does with them (prefill/server.py, prefill/decode_server.py).

A handler gets the connected socket (TCP_NODELAY set) and the peer's "ip:port"; when it returns
or raises, the connection is closed; an exception other than OSError is printed to stderr as
one line and ends only that connection. Stopping: the accept loop ends, the listener closes, the
read side of every open connection is shut down (a handler waiting for its next message sees a
clean EOF, one in the middle of a request still sends its reply), and the handler threads get
`grace_s` to return.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

Handler = Callable[[socket.socket, str], None]
LISTEN_BACKLOG = 64
ACCEPT_POLL_S = 0.2          # how soon the accept loop notices a stop
DRAIN_S = 1.0                # close_gently: how long to read what the peer still sends


class Service:
    def __init__(self, name: str, ip: str, port: int, handler: Handler) -> None:
        self.name = name
        self.handler = handler
        self.stop_event = threading.Event()
        self._conns: dict[int, socket.socket] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.listener.bind((ip, port))
        except OSError as exc:
            self.listener.close()
            raise OSError(f"{name}: cannot bind {ip}:{port}: {exc}") from exc
        self.listener.listen(LISTEN_BACKLOG)
        self.listener.settimeout(ACCEPT_POLL_S)
        self.address = f"{ip}:{self.listener.getsockname()[1]}"

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT end serve_forever (main thread only)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop_event.set())

    def serve_forever(self) -> None:
        while not self.stop_event.is_set():
            try:
                conn, addr = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self.stop_event.is_set():
                    break
                raise
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._run, args=(conn, f"{addr[0]}:{addr[1]}"),
                                 name=f"{self.name}-conn", daemon=True)
            with self._lock:
                self._conns[id(conn)] = conn
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _run(self, conn: socket.socket, peer: str) -> None:
        try:
            self.handler(conn, peer)
        except OSError:
            pass               # the peer reset or timed out: only this connection ends
        except Exception as exc:  # noqa: BLE001 - a bug in one request must not stop the server
            print(f"{self.name}: connection {peer} ended by {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
        finally:
            with self._lock:
                self._conns.pop(id(conn), None)
            conn.close()

    def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end every connection's reading, wait up to grace_s for handlers."""
        self.stop_event.set()
        self.listener.close()
        with self._lock:
            conns, threads = list(self._conns.values()), list(self._threads)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RD)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


def close_gently(sock: socket.socket) -> None:
    """End a connection after a final reply without losing the reply: stop writing, then read
    (and drop) what the peer still sends for up to DRAIN_S, so closing with unread data does not
    reset the connection before the peer has read the reply."""
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(DRAIN_S)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline and sock.recv(65536):
            pass
    except OSError:
        pass


def serve_main(argv: list[str] | None, description: str, label: str, spec_type: Any,
               server_type: Any, grace_s: float) -> int:
    """A server process's main: read `--spec` (spec_type.load: host, ip, port), build
    server_type(spec) (handle, close), listen and say so ("<label> <host>: listening on
    ip:port"), serve until SIGTERM/SIGINT, then give the handlers and the server's close
    grace_s in all. Exit code: 2 for a bad spec, 1 if it cannot listen, else 0."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, help=f"{spec_type.__name__} JSON file")
    args = parser.parse_args(argv)
    try:
        spec = spec_type.load(Path(args.spec))
    except (OSError, ValueError, TypeError) as exc:
        print(f"{label}: bad spec {args.spec}: {exc}", file=sys.stderr, flush=True)
        return 2
    server = server_type(spec)
    name = f"{label} {spec.host}"
    try:
        service = Service(name, spec.ip, spec.port, server.handle)
    except OSError as exc:
        print(exc, file=sys.stderr, flush=True)
        server.close(0.0)
        return 1
    service.stop_on_signals()
    print(f"{name}: listening on {service.address}", flush=True)
    try:
        service.serve_forever()
    finally:
        deadline = time.monotonic() + grace_s
        service.close(grace_s / 2)
        server.close(max(0.0, deadline - time.monotonic()))
    return 0
