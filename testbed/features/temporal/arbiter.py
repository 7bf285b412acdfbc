"""Per-link arbiter of Atlas's temporal WAN sharing: one pipeline's transfer owns a link direction
at a time; the arbiter grants the turns and switches the HTB tree (testbed.emulation.wanshare) to match.

One job: who sends next on each link direction, and when its turn ends. It runs as its own
process inside a gateway's namespace (`python -m testbed.features.temporal.arbiter --spec FILE [--no-realtime]`),
one per gateway, serving every link direction whose egress interface is on that gateway. At
start it builds the wanshare tree on each of those interfaces, prints
`READY rt=<status> links=<ids> listen=<ip>:<port>` (the delay line's form, so
testbed.emulation.network._wait_ready reads it) and serves clients (trainer.slotclient) until SIGTERM or
SIGINT; then it puts the plain testbed.emulation.shaping tree back (unless the spec says not to).

Spec (JSON; ArbiterSpec.to_json / from_json):
    {"listen_ip": "10.1.0.254", "port": 7700, "log_path": ".../sa-gw-arbiter.jsonl",
     "stall_s": 2.0, "restore_on_exit": true,
     "links": [{"link": "sa->sb", "intf": "sa-gw-eth1", "rate_mbit": 100, "queue_bytes": 250000,
                "pipelines": {"0": ["10.1.0.1"], "1": ["10.1.0.2"]},   # sending hosts per pipeline
                "order": [0, 1]}]}                                      # planned order, one round
Protocol: TCP, ASCII lines ending in "\\n", at most 200 bytes (a longer line is an error):
    client -> arbiter   REQ <link> <pipeline> <wire_bytes>   link: its id ("sa->sb") or its
                                                             egress interface; wire_bytes: the
                                                             TCP payload the transfer will send
    arbiter -> client   GRANT <slot> <t_grant_ns>            the link is this transfer's now
    client -> arbiter   DONE <slot>                          its last byte went to the kernel
    arbiter -> client   ERR <reason>                         then the arbiter closes the socket
A connection has at most one request in flight (REQ .. DONE); after DONE it may send the next
REQ at once. A client that closes its socket gives up its place, or its slot.

Grant rule, per link direction: one slot at a time. Among the waiting requests the next pipeline
of the planned order is preferred; if it has not asked yet, the earliest waiting request is
granted (a transfer that is not ready yields its turn rather than idling the link), and the
granted pipeline's next place in the coming round is used up (the skipped one stays next).
No order: first come, first served. At each grant the HTB tree is switched (wanshare.activate)
*before* GRANT is sent: two change-class messages encoded when the tree was built, sent over
testbed.emulation.nlbatch's raw netlink socket (about 0.01 ms; through pyroute2's encoder a switch took
1.2-1.5 ms here, with the link idle meanwhile).

Slot end (work-conserving, workload-aware): the slot lasts until the granted bytes have left the
egress. HTB counts link-layer bytes, so the granted payload is converted
(wanshare.link_layer_bytes: 1514 per 1448). The arbiter reads the pipeline class's counters
(wanshare.class_stats over testbed.emulation.tcstats' raw netlink socket: about 0.03 ms of CPU a read where
pyroute2's parse took 0.9), first at grant + bytes / rate, then at the predicted remaining time
(at least 0.5 ms apart; at the rate the class is seen to send, at most 5 ms apart; doubling up
to 5 ms while nothing moves), and ends the slot when the
class has sent the granted bytes since the grant, or when DONE has come, the class's backlog is 0
and it has sent at least 99% of them; also when the client disconnects, and (logged as
"stalled") when DONE has come, the backlog is 0 and nothing moved for stall_s. At its
deadline (grant + the granted bytes at the link's rate x SLOT_MARGIN + stall_s) a slot whose
class has queued nothing and sent nothing for stall_s ends ("deadline"; the client gets ERR and
is closed), so a client that is granted and then neither sends nor closes holds the link no
longer; one still sending (a slow or faulted link, a lossy TCP) keeps it, checked again every
stall_s.

Who may ask: a connection from an address that is no sending host of the arbiter's pipelines
(the spec's `pipelines` IPs) is refused at once (ERR, closed, logged), as is a REQ for a
pipeline the asking host is not a sending host of, and connections past MAX_CONNS unless one of
the open ones has sat idle (no request in flight, no partial line) for EVICT_IDLE_S: the idlest
is then closed for the new one, so connections that send nothing cannot keep a real client
out (the slot client reconnects when its idle connection was closed). The loop
uses `selectors` (epoll), so file descriptors past 1024 are served like the rest.

Log (JSON lines, log_path): {"kind": "start"|"slot"|"cancel"|"error"|"stop", ...}; a slot line
has link, intf, pipeline, wire_bytes, expected_bytes, class_bytes, t_request, t_grant, t_done,
t_end (time.time_ns(): every namespace shares the clock), activate_ms, reason, preferred,
waiting (pipelines waiting at the grant), slot, polls. read_log() reads it back.

Real time: like the delay line (SCHED_FIFO 50, timer slack 1 us, a selector-based loop), so the
CPU-bound trainers cannot hold a switch or a grant back; where refused it runs on normally and
READY says why. A bad request closes that client with a logged reason; nothing a client sends
ends the arbiter.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from testbed.spec.links import LinkDir

MAX_LINE = 200
MAX_WIRE_BYTES = 1 << 40
MIN_POLL_S = 0.0005
MAX_POLL_S = 0.005
DONE_SHARE = 0.99
DEFAULT_PORT = 7700
SLOT_MARGIN = 4.0          # a slot lasts at most granted bytes / rate x this + stall_s
MAX_CONNS = 256            # open client connections (one more evicts the idlest, or is refused)
EVICT_IDLE_S = 5.0         # at the cap, a connection idle this long gives way to a new one


# ---- spec ---------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class LinkSpec:
    link: str                          # "sa->sb"
    intf: str                          # egress interface, e.g. "sa-gw-eth1"
    rate_mbit: float
    queue_bytes: int
    pipelines: dict[int, list[str]]    # pipeline -> IPs of its hosts that send out of intf
    order: list[int] = field(default_factory=list)   # planned order of one round
    peers: dict[int, list[str]] = field(default_factory=dict)  # pipeline -> its IPs beyond the
    #   link; given: only traffic to them is the pipeline's (testbed.emulation.wanshare), else by source

    def validate(self) -> None:
        if not self.pipelines:
            raise ValueError(f"link {self.link}: no pipelines")
        if self.rate_mbit <= 0 or self.queue_bytes <= 0:
            raise ValueError(f"link {self.link}: rate_mbit and queue_bytes must be > 0")
        unknown = sorted(set(self.order) - set(self.pipelines))
        if unknown:
            raise ValueError(f"link {self.link}: order names pipelines {unknown} that have no "
                             f"hosts on it (has {sorted(self.pipelines)})")


@dataclass(kw_only=True, slots=True)
class ArbiterSpec:
    listen_ip: str
    port: int
    log_path: str
    links: list[LinkSpec]
    stall_s: float = 2.0
    restore_on_exit: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ArbiterSpec":
        raw = json.loads(text)
        links = [LinkSpec(link=str(x["link"]), intf=str(x["intf"]), rate_mbit=float(x["rate_mbit"]),
                          queue_bytes=int(x["queue_bytes"]),
                          pipelines={int(d): [str(ip) for ip in ips] for d, ips in x["pipelines"].items()},
                          order=[int(d) for d in x.get("order", [])],
                          peers={int(d): [str(ip) for ip in ips]
                                 for d, ips in x.get("peers", {}).items()})
                 for x in raw["links"]]
        spec = cls(listen_ip=str(raw["listen_ip"]), port=int(raw["port"]), log_path=str(raw["log_path"]),
                   links=links, stall_s=float(raw.get("stall_s", 2.0)),
                   restore_on_exit=bool(raw.get("restore_on_exit", True)))
        spec.validate()
        return spec

    def validate(self) -> None:
        if not self.links:
            raise ValueError("no links")
        names = [x.link for x in self.links] + [x.intf for x in self.links]
        if len(set(names)) != len(names):
            raise ValueError(f"link ids and interfaces must be unique: {names}")
        for x in self.links:
            x.validate()


def specs_for_network(plan, pipelines: dict[int, Sequence[str]],
                      order: Sequence[int] | dict[str, Sequence[int]] = (), *,
                      port: int = DEFAULT_PORT, log_dir: Path | str = ".") -> dict[str, ArbiterSpec]:
    """One ArbiterSpec per gateway of a testbed.plans.topo.Plan. pipelines: pipeline -> host names;
    order: one planned round for every link, or {link id: round}. A link direction gets the
    pipelines with a host in its sending DC (transit traffic of other DCs is not classified:
    it goes to the control class)."""
    dc_of_host = {h.name: h.dc for h in plan.hosts}
    out: dict[str, ArbiterSpec] = {}
    for w in plan.wan:
        for src, dst in ((w.end_a, w.end_b), (w.end_b, w.end_a)):
            src_dc = next(dc for dc, gw in plan.gateways.items() if gw == src.gateway)
            dst_dc = next(dc for dc, gw in plan.gateways.items() if gw == dst.gateway)
            link_id = str(LinkDir(src_dc, dst_dc))
            pipes = {int(d): [plan.host(h).ip for h in hosts if dc_of_host[h] == src_dc]
                     for d, hosts in pipelines.items()}
            pipes = {d: ips for d, ips in pipes.items() if ips}
            # the pipeline's own hosts beyond this link: its transfers go to them
            peers = {int(d): [plan.host(h).ip for h in hosts if dc_of_host[h] != src_dc]
                     for d, hosts in pipelines.items() if int(d) in pipes}
            if not pipes:
                continue
            rnd = order.get(link_id, []) if isinstance(order, dict) else order
            spec = out.setdefault(src.gateway, ArbiterSpec(
                listen_ip=plan.gateway_ips[src_dc], port=port,
                log_path=str(Path(log_dir) / f"{src.gateway}-arbiter.jsonl"), links=[]))
            spec.links.append(LinkSpec(link=link_id, intf=src.intf, rate_mbit=w.link.rate_mbit,
                                       queue_bytes=w.link.queue_bytes, pipelines=pipes,
                                       order=[int(d) for d in rnd if int(d) in pipes],
                                       peers=peers))
    return out


def start_arbiters(net, specs: dict[str, ArbiterSpec], *, realtime: bool = True,
                   timeout_s: float = 10.0) -> dict[str, Any]:
    """Start one arbiter per gateway in a running testbed.emulation.network.Network (its processes, so
    net.stop() ends them); returns {gateway: HostProcess} once each printed READY."""
    from testbed.emulation.network import REPO_ROOT, _wait_ready  # noqa: PLC0415 - needs root's stack
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    procs = {}
    for gw, spec in specs.items():
        path = net.run_dir / "logs" / f"{gw}-arbiter-spec.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(spec.to_json())
        argv = [sys.executable, "-m", "testbed.features.temporal.arbiter", "--spec", str(path)]
        if not realtime:
            argv.append("--no-realtime")
        procs[gw] = net.spawn(gw, argv, net.run_dir / "logs" / f"{gw}-arbiter.log", env=env)
    for proc in procs.values():
        _wait_ready(proc, timeout_s)
    return procs


def read_log(path: Path | str, kind: str | None = "slot") -> list[dict]:
    """The arbiter's JSON lines (only those of `kind`; None: all)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if kind is None or rec.get("kind") == kind:
            out.append(rec)
    return out


# ---- grant order (pure) -------------------------------------------------------------------
class PlanCursor:
    """The planned order of a link, round after round, and which pipeline is due next."""

    def __init__(self, order: Sequence[int]) -> None:
        self.order = [int(d) for d in order]
        self.upcoming: deque[int] = deque()
        self._refill()

    def _refill(self) -> None:
        while self.order and len(self.upcoming) < len(self.order):
            self.upcoming.extend(self.order)

    def preferred(self) -> int | None:
        return self.upcoming[0] if self.upcoming else None

    def choose(self, waiting: Sequence[int]) -> int:
        """Index into waiting (pipelines of the waiting requests, earliest first) of the one to
        grant, and advance the plan."""
        if not waiting:
            raise ValueError("nothing waiting")
        if not self.order:
            return 0
        due = self.upcoming[0]
        if due in waiting:
            self.upcoming.popleft()
            self._refill()
            return list(waiting).index(due)
        q = waiting[0]
        window = list(self.upcoming)[:len(self.order)]
        if q in window:  # its place in the coming round is used now
            del self.upcoming[window.index(q)]
        self._refill()
        return 0


# ---- state --------------------------------------------------------------------------------
@dataclass(eq=False, slots=True)
class Request:
    conn: "Conn"
    link: "LinkState"
    pipeline: int
    wire_bytes: int
    t_request: int
    slot: int = 0
    t_grant: int | None = None
    t_done: int | None = None
    t_end: int | None = None
    granted: bool = False
    done: bool = False
    ended: bool = False
    expected: int = 0
    bytes0: int = 0
    last_bytes: int = 0
    last_progress: float = 0.0
    backlog: int = 0             # the class's queue at the last poll
    last_poll: float = 0.0
    next_poll: float = 0.0
    deadline: float = 0.0        # time.monotonic() the slot ends by, whatever happens
    poll_gap: float = MIN_POLL_S
    polls: int = 0
    activate_ms: float = 0.0
    preferred: int | None = None
    waiting: list[int] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class LinkState:
    spec: LinkSpec
    layout: Any
    cursor: PlanCursor
    waiting: list[Request] = field(default_factory=list)
    current: Request | None = None

    @property
    def rate_bps(self) -> float:
        return self.spec.rate_mbit * 1e6


@dataclass(eq=False, slots=True)
class Conn:
    sock: socket.socket
    peer: str
    buf: bytearray = field(default_factory=bytearray)
    req: Request | None = None    # in flight: waiting, or granted and not DONE yet
    closed: bool = False
    last_byte: float = field(default_factory=time.monotonic)   # connect, or the last byte in

    def idle_s(self, now: float) -> float | None:
        """How long the connection has sat with nothing in flight and no partial line; None
        while it has either."""
        return None if self.req is not None or self.buf else now - self.last_byte


class BadRequest(Exception):
    pass


class Arbiter:
    def __init__(self, spec: ArbiterSpec, ipr, log) -> None:
        from testbed.emulation import wanshare  # noqa: PLC0415
        self.wanshare = wanshare
        self.spec = spec
        self.ipr = ipr
        self.log = log
        self.links: dict[str, LinkState] = {}
        self.by_name: dict[str, LinkState] = {}
        self.conns: dict[int, Conn] = {}
        self.listener: socket.socket | None = None
        self.stop = False
        self.wake_fd: int | None = None
        self.selector = selectors.DefaultSelector()
        self.senders = {ip for ls in spec.links for ips in ls.pipelines.values() for ip in ips}
        self.next_slot = 1
        self.rt_status = "off"
        self.counters = None     # testbed.emulation.tcstats.ClassCounters, made by build()
        self.batch = None        # testbed.emulation.nlbatch.RequestBatch (the switches), made by build()

    # -- setup / teardown
    def build(self) -> None:
        from testbed.emulation.nlbatch import RequestBatch  # noqa: PLC0415
        from testbed.emulation.tcstats import ClassCounters  # noqa: PLC0415
        self.counters = ClassCounters()
        self.batch = RequestBatch()
        for ls in self.spec.links:
            first = ls.order[0] if ls.order else None
            layout = self.wanshare.apply_temporal(self.ipr, ls.intf, ls.rate_mbit, ls.queue_bytes,
                                                  ls.pipelines, active=first, peers=ls.peers)
            state = LinkState(spec=ls, layout=layout, cursor=PlanCursor(ls.order))
            self.links[ls.link] = state
            self.by_name[ls.link] = state
            self.by_name[ls.intf] = state

    def listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.spec.listen_ip, self.spec.port))
        sock.listen(128)
        sock.setblocking(False)
        self.listener = sock

    def restore(self) -> None:
        from testbed.emulation import shaping  # noqa: PLC0415
        for state in self.links.values():
            ls = state.spec
            try:
                self.wanshare.remove_root(self.ipr, ls.intf)
                self.wanshare.forget(ls.intf)
                shaping.apply(self.ipr, shaping.plan_link(ls.intf, ls.rate_mbit, ls.queue_bytes))
            except Exception as exc:  # noqa: BLE001 - the namespace may be going away
                self.record({"kind": "error", "reason": f"restoring {ls.intf}: {exc}"})

    # -- logging
    def record(self, rec: dict) -> None:
        rec.setdefault("t", time.time_ns())
        try:
            self.log.write(json.dumps(rec) + "\n")
            self.log.flush()
        except (OSError, ValueError):
            pass

    # -- loop
    def run(self) -> None:
        assert self.listener is not None
        self.selector.register(self.listener, selectors.EVENT_READ)
        if self.wake_fd is not None:
            self.selector.register(self.wake_fd, selectors.EVENT_READ)
        while not self.stop:
            now = time.monotonic()
            due = [min(r.next_poll, r.deadline) for s in self.links.values()
                   if (r := s.current) is not None]
            timeout = max(0.0, min(due) - now) if due else None
            try:
                events = self.selector.select(timeout)
            except InterruptedError:
                continue
            for key, _ in events:
                fd = key.fd
                if fd == self.wake_fd:
                    try:
                        os.read(fd, 512)
                    except OSError:
                        pass
                elif fd == self.listener.fileno():
                    self._accept()
                elif fd in self.conns:
                    self._read(self.conns[fd])
            self._poll_due()

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.record({"kind": "error", "reason": f"accept: {exc}"})
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock=sock, peer=f"{addr[0]}:{addr[1]}")
            if addr[0] not in self.senders:
                self._refuse(conn, f"{addr[0]} is no sending host of this arbiter's pipelines")
            elif len(self.conns) >= MAX_CONNS and not self._evict_idlest():
                self._refuse(conn, f"{MAX_CONNS} connections open, the arbiter's cap")
            else:
                self.conns[sock.fileno()] = conn
                self.selector.register(sock, selectors.EVENT_READ)

    def _evict_idlest(self) -> bool:
        """At the cap: close the connection idle longest, if idle EVICT_IDLE_S or more (a client
        reconnects for its next request), so connections that send nothing cannot keep a real
        client out. False if none is idle that long."""
        now = time.monotonic()
        idle = [(c.idle_s(now), c) for c in self.conns.values()]
        idle = [(s, c) for s, c in idle if s is not None and s >= EVICT_IDLE_S]
        if not idle:
            return False
        secs, victim = max(idle, key=lambda x: x[0])
        self._close(victim, f"evicted: idle {secs:.1f} s with {MAX_CONNS} connections open")
        return True

    def _refuse(self, conn: Conn, reason: str) -> None:
        """ERR to a connection that is not served, then closed and logged."""
        self._send(conn, f"ERR {reason}")
        self._close(conn, f"refused: {reason}")

    def _read(self, conn: Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(conn, f"recv: {exc}", error=False)
            return
        if not data:
            self._close(conn, "disconnected", error=False)
            return
        conn.last_byte = time.monotonic()
        conn.buf += data
        try:
            while not conn.closed:
                nl = conn.buf.find(b"\n")
                if nl < 0:
                    if len(conn.buf) > MAX_LINE:
                        raise BadRequest(f"line longer than {MAX_LINE} bytes")
                    return
                if nl > MAX_LINE:
                    raise BadRequest(f"line longer than {MAX_LINE} bytes")
                line = bytes(conn.buf[:nl]).decode("ascii", errors="replace").strip()
                del conn.buf[:nl + 1]
                self._handle(conn, line)
        except BadRequest as exc:
            self._send(conn, f"ERR {exc}")
            self._close(conn, str(exc))
        except Exception as exc:  # noqa: BLE001 - never crash on a client's account
            self._close(conn, f"internal error: {exc!r}: {traceback.format_exc(limit=3)}")

    def _handle(self, conn: Conn, line: str) -> None:
        parts = line.split()
        if not parts:
            raise BadRequest("empty line")
        verb = parts[0]
        if verb == "REQ":
            if len(parts) != 4:
                raise BadRequest(f"REQ takes <link> <pipeline> <wire_bytes>: {line[:80]!r}")
            if conn.req is not None:
                raise BadRequest("REQ while another request of this connection is in flight")
            state = self.by_name.get(parts[1])
            if state is None:
                raise BadRequest(f"unknown link {parts[1]!r} (have {sorted(self.links)})")
            try:
                d, nbytes = int(parts[2]), int(parts[3])
            except ValueError:
                raise BadRequest(f"pipeline and wire_bytes must be integers: {line[:80]!r}") from None
            if d not in state.spec.pipelines:
                raise BadRequest(f"link {state.spec.link} has no pipeline {d} "
                                 f"(has {sorted(state.spec.pipelines)})")
            host = conn.peer.rpartition(":")[0]
            if host not in state.spec.pipelines[d]:
                raise BadRequest(f"{host} is no sending host of pipeline {d} on link "
                                 f"{state.spec.link}")
            if not 0 < nbytes <= MAX_WIRE_BYTES:
                raise BadRequest(f"wire_bytes {nbytes} out of range")
            req = Request(conn=conn, link=state, pipeline=d, wire_bytes=nbytes, t_request=time.time_ns())
            conn.req = req
            state.waiting.append(req)
            self._grant_next(state)
        elif verb == "DONE":
            req = conn.req
            if len(parts) != 2 or req is None or not req.granted or str(req.slot) != parts[1]:
                raise BadRequest(f"DONE without a matching grant: {line[:80]!r}")
            req.t_done = time.time_ns()
            req.done = True
            conn.req = None
            if not req.ended:  # look at the counters now: the bytes may have left already
                req.next_poll = min(req.next_poll, time.monotonic())
        else:
            raise BadRequest(f"unknown message {verb[:20]!r}")

    def _send(self, conn: Conn, text: str) -> bool:
        if conn.closed:
            return False
        try:
            conn.sock.send((text + "\n").encode())
            return True
        except OSError as exc:
            self._close(conn, f"send: {exc}", error=False)
            return False

    def _close(self, conn: Conn, reason: str, *, error: bool = True) -> None:
        if conn.closed:
            return
        conn.closed = True
        if self.conns.pop(conn.sock.fileno(), None) is not None:
            self.selector.unregister(conn.sock)
        try:
            conn.sock.close()
        except OSError:
            pass
        if error:
            self.record({"kind": "error", "peer": conn.peer, "reason": reason})
        req, conn.req = conn.req, None
        if req is None:
            return
        state = req.link
        if not req.granted:
            if req in state.waiting:
                state.waiting.remove(req)
            self.record({"kind": "cancel", "link": state.spec.link, "pipeline": req.pipeline,
                         "wire_bytes": req.wire_bytes, "t_request": req.t_request, "peer": conn.peer})
        elif state.current is req and not req.ended:
            self._end(req, "disconnect")

    # -- granting and slot ends
    def _grant_next(self, state: LinkState, stats: dict | None = None) -> None:
        """Grant the next waiting request, if the link is free. stats: the class counters the
        previous slot's last poll read (its byte count stands in for the new slot's start:
        saves a netlink dump while the link idles; the new owner was inactive meanwhile)."""
        while state.current is None and state.waiting:
            waiting = [r.pipeline for r in state.waiting]
            preferred = state.cursor.preferred()
            req = state.waiting.pop(state.cursor.choose(waiting))
            req.preferred, req.waiting = preferred, waiting
            try:
                req.activate_ms = self.wanshare.activate(self.ipr, state.spec.intf, req.pipeline,
                                                         layout=state.layout,
                                                         batch=self.batch) * 1e3
            except Exception as exc:  # noqa: BLE001 - grant anyway; the link must go on
                self.record({"kind": "error", "link": state.spec.link,
                             "reason": f"activate({req.pipeline}): {exc}"})
            try:
                if stats is None or req.pipeline not in stats:
                    stats = self._class_stats(state)
                b0 = stats[req.pipeline][0]
            except Exception as exc:  # noqa: BLE001
                self.record({"kind": "error", "link": state.spec.link, "reason": f"class_stats: {exc}"})
                b0 = 0
            stats = None
            req.slot = self.next_slot
            self.next_slot += 1
            req.expected = self.wanshare.link_layer_bytes(req.wire_bytes)
            req.bytes0 = req.last_bytes = b0
            now = time.monotonic()
            req.last_progress = req.last_poll = now
            req.next_poll = now + max(MIN_POLL_S, req.expected * 8 / state.rate_bps)
            req.deadline = now + req.expected * 8 / state.rate_bps * SLOT_MARGIN \
                + self.spec.stall_s
            req.granted = True
            state.current = req
            req.t_grant = time.time_ns()
            if not self._send(req.conn, f"GRANT {req.slot} {req.t_grant}"):
                continue  # _close ended the slot; the loop grants the next one

    def _class_stats(self, state: LinkState) -> dict[int, tuple[int, int, int]]:
        """The link's pipeline classes' counters (wanshare.class_stats over the raw socket)."""
        return self.wanshare.class_stats(self.ipr, state.spec.intf, index=state.layout.ifindex,
                                         counters=self.counters)

    def _poll_due(self) -> None:
        now = time.monotonic()
        for state in self.links.values():
            req = state.current
            if req is not None and req.deadline <= now:
                self._poll_or_record(state, req)   # fresh counters decide (module docstring)
                if state.current is req:
                    if time.monotonic() - req.last_progress < self.spec.stall_s or req.backlog:
                        req.deadline = time.monotonic() + self.spec.stall_s   # still sending
                    else:
                        self._over_deadline(req)
                continue
            if req is not None and req.next_poll <= now:
                self._poll_or_record(state, req)

    def _poll_or_record(self, state: LinkState, req: Request) -> None:
        try:
            self._poll(state, req)
        except Exception as exc:  # noqa: BLE001 - try again a little later
            self.record({"kind": "error", "link": state.spec.link, "reason": f"poll: {exc!r}"})
            req.next_poll = time.monotonic() + MAX_POLL_S

    def _poll(self, state: LinkState, req: Request) -> None:
        stats = self._class_stats(state)
        nbytes, _pkts, backlog = stats[req.pipeline]
        req.backlog = backlog
        req.polls += 1
        now = time.monotonic()
        sent = nbytes - req.bytes0
        moved = nbytes - req.last_bytes
        since, req.last_poll = now - req.last_poll, now
        if moved:
            req.last_bytes = nbytes
            req.last_progress = now
        if sent >= req.expected:
            self._end(req, "bytes", sent, stats)
            return
        if req.done and backlog == 0:
            if sent >= DONE_SHARE * req.expected:
                self._end(req, "drained", sent, stats)
                return
            if now - req.last_progress >= self.spec.stall_s:
                self._end(req, "stalled", sent, stats)
                return
        left = req.expected - sent
        predicted = left * 8 / state.rate_bps          # at the link's rate: the earliest end
        if moved > 0 and since > 0:
            # slower than the link (window-limited, or sharing it): at the rate seen, up to 5 ms
            req.poll_gap = min(MAX_POLL_S, max(MIN_POLL_S, left / (moved / since)))
        else:
            req.poll_gap = min(MAX_POLL_S, req.poll_gap * 2)
        req.next_poll = now + max(predicted, req.poll_gap)

    def _over_deadline(self, req: Request) -> None:
        """The slot's time is up (module docstring): it ends; a client still holding it gets
        ERR and is closed."""
        conn = req.conn
        if conn.req is req:          # not DONE yet: the client is told, then dropped
            conn.req = None
            self._send(conn, f"ERR slot {req.slot} passed its deadline")
            self._close(conn, f"slot {req.slot} passed its deadline")
        self._end(req, "deadline")

    def _end(self, req: Request, reason: str, sent: int | None = None, stats: dict | None = None) -> None:
        state = req.link
        req.ended = True
        req.t_end = time.time_ns()
        if sent is None:
            try:
                stats = self._class_stats(state)
                sent = stats[req.pipeline][0] - req.bytes0
            except Exception:  # noqa: BLE001
                sent, stats = None, None
        state.current = None
        self.record({"kind": "slot", "slot": req.slot, "link": state.spec.link, "intf": state.spec.intf,
                     "pipeline": req.pipeline, "wire_bytes": req.wire_bytes,
                     "expected_bytes": req.expected, "class_bytes": sent,
                     "t_request": req.t_request, "t_grant": req.t_grant, "t_done": req.t_done,
                     "t_end": req.t_end, "activate_ms": round(req.activate_ms, 3), "reason": reason,
                     "preferred": req.preferred, "waiting": req.waiting, "polls": req.polls,
                     "peer": req.conn.peer})
        self._grant_next(state, stats)


# ---- process ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="ArbiterSpec JSON file")
    parser.add_argument("--no-realtime", action="store_true",
                        help="stay at normal priority (default: SCHED_FIFO 50)")
    args = parser.parse_args(argv)
    from pyroute2 import IPRoute  # noqa: PLC0415

    from testbed.host.realtime import (  # noqa: PLC0415
        PRIORITY, RT_SOFT_S, process_threads, set_fifo, set_normal)
    from testbed.emulation.delayline import _set_timer_slack_ns  # noqa: PLC0415
    try:
        spec = ArbiterSpec.from_json(Path(args.spec).read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"arbiter: bad spec {args.spec}: {exc}", file=sys.stderr, flush=True)
        return 2
    Path(spec.log_path).parent.mkdir(parents=True, exist_ok=True)
    log = open(spec.log_path, "a", buffering=1)
    ipr = IPRoute()
    arb = Arbiter(spec, ipr, log)

    def on_stop(signum, frame):  # noqa: ARG001
        arb.stop = True

    def on_rttime(signum, frame):  # noqa: ARG001
        set_normal(process_threads())
        arb.rt_status = "demoted:rttime"
        print(f"arbiter: ran {RT_SOFT_S:g} s at real-time priority without blocking; back to "
              f"normal priority", file=sys.stderr, flush=True)

    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    arb.wake_fd = wake_r
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGXCPU, on_rttime)
    try:
        arb.build()
        arb.listen()
    except Exception as exc:  # noqa: BLE001
        print(f"arbiter: could not start: {exc}", file=sys.stderr, flush=True)
        arb.record({"kind": "error", "reason": f"start: {exc}"})
        if spec.restore_on_exit:
            arb.restore()
        return 1
    _set_timer_slack_ns(1000)
    arb.rt_status = ("off" if args.no_realtime
                     else set_fifo(PRIORITY["arbiter"], process_threads()))
    arb.record({"kind": "start", "pid": os.getpid(), "rt": arb.rt_status,
                "listen": f"{spec.listen_ip}:{spec.port}", "links": [asdict(x) for x in spec.links]})
    print(f"READY rt={arb.rt_status} links={','.join(arb.links)} listen={spec.listen_ip}:{spec.port}",
          flush=True)
    try:
        arb.run()
    finally:
        for state in arb.links.values():
            state.waiting.clear()
            if state.current is not None and not state.current.ended:
                state.current.conn.req = None
                arb._end(state.current, "arbiter-stop")
        for conn in list(arb.conns.values()):
            arb._close(conn, "arbiter stopping", error=False)
        if spec.restore_on_exit:
            arb.restore()
        arb.record({"kind": "stop"})
        arb.selector.close()
        log.close()
        ipr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
