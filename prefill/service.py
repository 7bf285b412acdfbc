"""The TCP service loop shared by the prefill server and the decode server.

One job: listen on (ip, port), run a handler in its own thread for every accepted connection,
and stop cleanly on SIGTERM or SIGINT. It knows nothing about messages (prefill/wire.py) or what
a server does with them (prefill/server.py, prefill/decode_server.py).

A handler gets the connected socket (TCP_NODELAY set), the peer's "ip:port" and the connection's
Activity (busy() at a message's first byte, idle() once its reply is sent); when it returns
or raises, the connection is closed; an exception other than OSError is printed to stderr as
one line and ends only that connection. Stopping: the accept loop ends, the listener closes, the
read side of every open connection is shut down (a handler waiting for its next message sees a
clean EOF, one in the middle of a request still sends its reply), and the handler threads get
`grace_s` to return.

Limits on what a peer can hold: at most `max_connections` open connections. One more closes the
connection that has sat idle (between messages) longest, if for `evict_idle_s` or more, so
connections that send nothing cannot keep a real client out (the clients reconnect: the KV
sender and the controller resend a request their idle connection lost); else it is answered
by `refuse(conn, why)`, if given, and closed. The handlers read each message with
wire.HEADER_DEADLINE_S, so a trickled header holds its thread no longer). Threads that must not end
(a KV sender, the decode server's generator) are started with `start_thread`: one that ends by
an exception prints one line, and the process's service stops and serve_main exits 1, so the
run sees a failed server instead of one that accepts work it can no longer finish.
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

Handler = Callable[[socket.socket, str, "Activity"], None]
LISTEN_BACKLOG = 64
MAX_CONNECTIONS = 64         # open connections a service serves at once
EVICT_IDLE_S = 10.0          # at the cap, a connection idle this long gives way to a new one
ACCEPT_POLL_S = 0.2          # how soon the accept loop notices a stop
DRAIN_S = 1.0                # close_gently: how long to read what the peer still sends
REFUSE_TIMEOUT_S = 0.5       # sending the refusal to a connection over the cap

_failed: list[str] = []      # threads of this process that died (start_thread)
_failed_event = threading.Event()


def start_thread(name: str, target: Callable[..., None], *args: Any) -> threading.Thread:
    """A daemon thread running target(*args); if it raises, one line goes to stderr and the
    process fails (module docstring)."""

    def run() -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - reported, and it fails the process
            line = f"thread {name} died: {type(exc).__name__}: {str(exc)[:200]}"
            _failed.append(line)
            _failed_event.set()
            print(line, file=sys.stderr, flush=True)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def failures() -> list[str]:
    """The lines of the threads of this process that died (start_thread)."""
    return list(_failed)


class Activity:
    """Whether a connection is inside a message (busy) or between messages (idle, since when)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.idle_since: float | None = time.monotonic()

    def busy(self) -> None:
        with self._lock:
            self.idle_since = None

    def idle(self) -> None:
        with self._lock:
            self.idle_since = time.monotonic()


class Service:
    def __init__(self, name: str, ip: str, port: int, handler: Handler, *,
                 max_connections: int = MAX_CONNECTIONS, evict_idle_s: float = EVICT_IDLE_S,
                 refuse: Callable[[socket.socket, str], None] | None = None) -> None:
        self.name = name
        self.handler = handler
        self.max_connections = max_connections
        self.evict_idle_s = evict_idle_s
        self.evicted = 0
        self.refuse = refuse
        self.refused = 0
        self.stop_event = threading.Event()
        self._conns: dict[int, tuple[socket.socket, Activity]] = {}
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
        """Accept until stopped, or until a thread of this process died (start_thread)."""
        while not self.stop_event.is_set() and not _failed_event.is_set():
            try:
                conn, addr = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                if self.stop_event.is_set():
                    break
                raise
            peer = f"{addr[0]}:{addr[1]}"
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                full = len(self._conns) >= self.max_connections and not self._evict_idlest()
            if full:
                self._refuse(conn, peer)
                continue
            conn.settimeout(None)
            activity = Activity(self._lock)
            t = threading.Thread(target=self._run, args=(conn, peer, activity),
                                 name=f"{self.name}-conn", daemon=True)
            with self._lock:
                self._conns[id(conn)] = (conn, activity)
                self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def _evict_idlest(self) -> bool:
        """(Under self._lock.) Shut down the connection idle longest, if idle evict_idle_s or
        more; its handler sees the end of the stream and returns. False if none is."""
        now = time.monotonic()
        idle = [(now - a.idle_since, key, c) for key, (c, a) in self._conns.items()
                if a.idle_since is not None and now - a.idle_since >= self.evict_idle_s]
        if not idle:
            return False
        secs, key, victim = max(idle, key=lambda x: x[0])
        del self._conns[key]
        self.evicted += 1
        if self.evicted == 1:
            print(f"{self.name}: closed a connection idle {secs:.0f} s for a new one "
                  f"({self.max_connections} open, the cap); further ones are not printed",
                  file=sys.stderr, flush=True)
        try:
            victim.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        return True

    def _refuse(self, conn: socket.socket, peer: str) -> None:
        """A connection over the cap: the refusal (if any), then closed; the first one of a
        run is printed."""
        self.refused += 1
        if self.refused == 1:
            print(f"{self.name}: refused {peer}: {self.max_connections} connections open (the "
                  f"cap); further refusals are not printed", file=sys.stderr, flush=True)
        try:
            conn.settimeout(REFUSE_TIMEOUT_S)
            if self.refuse is not None:
                self.refuse(conn, f"{self.max_connections} connections open, the server's "
                                  f"cap; try again later")
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        conn.close()

    def _run(self, conn: socket.socket, peer: str, activity: Activity) -> None:
        try:
            self.handler(conn, peer, activity)
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
            conns = [c for c, _ in self._conns.values()]
            threads = list(self._threads)
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
    server_type(spec) (handle, close, refuse), listen and say so ("<label> <host>: listening
    on ip:port"), serve until SIGTERM/SIGINT, then give the handlers and the server's close
    grace_s in all. Exit code: 2 for a bad spec, 1 if it cannot listen or a thread of it died
    (start_thread), else 0."""
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
        service = Service(name, spec.ip, spec.port, server.handle, refuse=server.refuse)
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
    if _failed:
        print(f"{name}: failed: {_failed[0]}", file=sys.stderr, flush=True)
        return 1
    return 0
