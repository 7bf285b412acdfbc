"""The one simulator: a discrete-event model of pipeline-parallel training over a WAN, several
iterations of P stages x D replicas x M micro-batches, op by op. Pure: no kernel, no root, no
torch. `compute_only` is its simplest case (one pipeline, one iteration, a fixed delay per
message): the compute-only timeline that the slot planner and metrics.json's `compute_only` use.

One job: given the per-op compute times, where each stage replica sits, how long each message
takes alone (testbed.predict.transfer) and how the WAN links are shared, say when every op starts and
ends. testbed.predict.predict builds the inputs from a scenario and a system and reads figures off the
result.

Rules, the workers' (trainer/worker.py):
- Each worker (s, r) runs its schedule row (testbed.rules.schedule: gpipe or 1f1b) in order, then,
  with D > 1, the stage's gradient all-reduce (it starts when all D replicas have finished their
  row and lasts `allreduce_ms[s]`), then the optimizer step, then the next iteration's row.
- F(s, r, m) needs the activation of F(s-1, r, m); B(s, r, m) the gradient of B(s+1, r, m)
  (the last stage's B its own F). A message is sent when the op that makes it ends.
- A message inside a DC takes its route's `solo_ms`; over the WAN, where its route has a
  `channel`, its solo time is that channel's (testbed.rules.tcpchannel: the route's K
  connections persist across its messages, one channel per (kind, boundary, replica), so a
  message waits for the windows its predecessors hold, idle restarts halve the windows, and
  random loss shrinks them and adds resends); without one, `solo_ms`, or `solo_idle_ms` (slow
  start) when the route's previous message left more than `rto_ms` before. A folded train's
  middle members (below) hold links for `solo_ms` or `solo_idle_ms`, not their own channels'
  times, except under temporal slots: there each member's connections are its head's as they
  were before the head's message, idle since the member's own previous message
  (testbed.rules.serial_links.MemberHolds); where a member then waits for its own
  acknowledgements unlike its head, which ones wait depends on their order in the train, which
  the fold does not know, so the result says so (`trains_unalike`) and testbed.predict.predict
  refines the fold until two in turn agree. A message over the WAN moves its wire bytes over every link of its routed path, then
  arrives one way later:
  - "concurrent" sharing (TCP's fair share): all messages on a link share it max-min fairly
    (progressive filling over the path's links), each at most at its own cap, the rate at which
    it would take solo_ms alone (so a lone message takes exactly testbed.predict.transfer's time). But a
    link whose every route is a `burst` (the whole message leaves in its first round trip: each
    stripe fits its connection's window) serves its messages first come, first served: the
    bursts queue at the bottleneck in the order they were sent and nothing is left for a
    second round to interleave. Each holds the link for its wire bytes at the link's rate and
    arrives one way later, or no earlier than its solo time after it was sent (a message in
    slow start after idle leaves in several rounds; the link is not held during their round
    trips). Measured: sweep_delay's multitcp at 20 and 40 ms ran as fast as atlas, where
    fair sharing predicted +17% and +13%;
  - "temporal" sharing (Atlas): the message's first link is held by one message at a time, in
    the order they became ready (ties: the order given), each for its solo data time, its
    channel timed from the slot's start (its connections send when the slot begins, so a
    message sent right after its predecessor waits in its slot for that one's
    acknowledgements, as the emulation's slot holder does).
  - A link's queue (`link_queue_bytes`, the scenario's `queue`) holds what it can: a burst (a
    message's first round trip over its connections, `burst_bytes`) arriving behind the
    link's backlog loses what does not fit (tail drop). First come, first served, the burst
    is what the message's connections send at once (their windows' room, with a channel),
    the backlog counts only bytes that have reached the queue (not a message's later rounds,
    which acknowledgements clock out as the link serves it), the lost bytes leave the link's
    time and enter it again a round trip after they were sent (fast retransmit), behind what
    came meanwhile, and the connections the drop falls on cut their windows
    (testbed.rules.tcpchannel.Channel.congest); under temporal slots only the slot's own burst
    is queued, and its slot lasts through the resend. A folded train's middle members meet the
    queue too (testbed.rules.serial_links): their bursts, drops and resends on FIFO trains (no
    window of their own: a member's burst is between its head's and its tail's last), the
    resend inside each slot. Not modelled: a slot's window
    reduction, timeouts, and queues on fair-shared links (messages of several rounds).
Structure: `Simulation` is one pass (the workers, the event loop, the messages leaving); each WAN
link direction's messages go to one link discipline (`link_disciplines`): the fair share
(testbed.rules.wanlinks, rates from testbed.rules.fairshare over the links that can fill), FIFO trains
or temporal slots (testbed.rules.serial_links; a link that serves one message at a time keeps a
clock: when it is next free, every message sent so far served in the order sent). Plain heap
(heapq, wanlinks.EventQueue): the event count is a few per op, an event wakes only the workers it
concerns, and each touches at most the messages on the WAN at that moment. Alike replicas (same
DCs, so same routes) may be folded (testbed.predict.predict does): a replica with a weight stands for
the members behind the one before it (its head: `heads`; testbed.rules.trains), a chain of such parts
for a group. On fair-shared links the weight's messages are weight flows at the rate each gets. On
a link serving one at a time, the head's message registers the part's middle members (a train),
sent after it at even spacing and served in the order sent among the other messages (one train's
members a_i ... a_j from a link free at W leave it free at max(W + m d, a_i + m d, a_j + d);
members of trains that interleave are served one by one); the part's last member's own message
follows the rest of its train. The spacing is the gap between head and last member at the latest op
both started in a first pass, then what the last pass found (`simulate`). A weight without a head:
its messages hold the link weight times in turn, arriving with the last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Callable, NamedTuple, Sequence

from testbed.rules.schedule import format_table, parse_action
from testbed.rules.serial_links import FifoTrains, TemporalSlots
from testbed.rules.tcpchannel import Channel
from testbed.rules.trains import Trains
from testbed.rules.wanlinks import EPS, EventQueue, FairShare, LinkDiscipline, MessageKey, Route
from testbed.spec.links import LinkDir

__all__ = ["Op", "PipelineModel", "Route", "SimResult", "Simulation", "Timeline", "TimelineOp",
           "compute_only", "simulate"]


@dataclass(frozen=True, kw_only=True)
class PipelineModel:
    table: Sequence[Sequence[str]]          # schedule rows, one per stage
    replicas: int
    forward_ms: Sequence[float]             # per stage
    backward_ms: Sequence[float]
    opt_ms: Sequence[float]
    allreduce_ms: Sequence[float]           # per stage (of all its replicas); 0 without any
    forward_routes: dict[tuple[int, int], Route]    # (boundary s, replica r): s -> s+1
    backward_routes: dict[tuple[int, int], Route]   # (boundary s, replica r): s+1 -> s
    link_rate_mbit: dict[LinkDir, float] = field(default_factory=dict)  # WAN link directions
    link_queue_bytes: dict[LinkDir, float] = field(default_factory=dict)  # their queues
    sharing: str = "concurrent"             # "concurrent" | "temporal"
    # replica r stands for weights[r] alike replicas (same DCs, same routes: they behave the
    # same), default 1 each: its WAN messages count that many times on their links
    weights: Sequence[int] | None = None
    # heads[r]: the replica that is the first of r's alike ones when r stands for the others
    # (a train behind it on a link that serves one message at a time), else None
    heads: Sequence[int | None] | None = None
    # wire bits each iteration's all-reduces put on WAN link directions (counted, not timed:
    # all-reduces do not contend with the pipeline's messages in this model)
    allreduce_link_bits: dict[LinkDir, float] = field(default_factory=dict)
    # time added to single ops, (stage, replica, iteration, action: "F0", "B3", "OPT") -> ms:
    # what BubbleTea's prefills cost training (testbed.predict.bubbletea: a wait for the GPU
    # behind a prefill that overran its bubble, the slower op after a prefill on an H200)
    op_extra_ms: dict[tuple[int, int, int, str], float] = field(default_factory=dict)


class Op(NamedTuple):
    """One op a worker ran (a named tuple: the simulator makes millions)."""
    stage: int
    replica: int
    iteration: int
    name: str            # F | B | ALLREDUCE | OPT
    microbatch: int | None
    start_ms: float
    end_ms: float



@dataclass
class SimResult:
    ops: list[Op]
    link_bits: dict[LinkDir, dict[int, float]]   # link direction -> iteration -> wire bits sent
    # link direction -> iteration -> wire bytes its queue dropped (and were sent again)
    link_drops: dict[LinkDir, dict[int, float]] = field(default_factory=dict)
    # a train head's message key -> how far apart its members sent theirs (ms): the tail's send
    # time less the head's, over the members behind the head
    train_gaps: dict[tuple, float] = field(default_factory=dict)
    # how far the last member of a train moved between the spacing the pass assumed and the one
    # it found (ms, the most over trains): 0 when the pass agrees with itself
    train_shift_ms: float = 0.0
    # under temporal slots a folded train's member waited for its own acknowledgements unlike
    # its head (which members wait depends on their order, which the fold does not know): the
    # caller folds in more parts
    trains_unalike: bool = False


_op = tuple.__new__        # _op(Op, fields): an Op without the named tuple's __new__ (a lambda)

TRAIN_PASSES = 8           # at most, until the trains' spacing settles
TRAIN_SETTLED = 1e-4       # a train's last member moving less, relative to the run, is settled


def simulate(m: PipelineModel, iterations: int) -> SimResult:
    """Run `iterations` iterations back to back from time 0 (module docstring).

    With trains (folded alike replicas behind a head on links serving one message at a time),
    the members' send times are known only once the part's last member has sent: a first pass
    spaces them as head and last member were at the latest op both started, and each further
    pass as the last pass found them, until that moves the last member less than TRAIN_SETTLED
    of the run (a fixed point: members evenly spaced between the two simulated replicas)."""
    res = Simulation(m, iterations).run()
    for _ in range(TRAIN_PASSES - 1):
        end = max((o.end_ms for o in res.ops), default=0.0)
        if res.train_shift_ms <= TRAIN_SETTLED * max(1.0, end):
            break
        res = Simulation(m, iterations, res.train_gaps).run()
    return res


def link_disciplines(m: PipelineModel, events: EventQueue, deliver: Callable[..., object],
                     trains: Trains) -> dict[LinkDir, LinkDiscipline]:
    """The discipline that serves the messages whose route starts on each WAN link direction:
    temporal sharing, slots on every link; concurrent sharing, FIFO trains on a link whose
    every route is a `burst`, the fair share on the others."""
    routes = [*m.forward_routes.values(), *m.backward_routes.values()]
    links = dict.fromkeys(l for r in routes for l in r.links)
    if m.sharing == "temporal":
        slots = TemporalSlots(events, deliver, m.link_rate_mbit, m.link_queue_bytes, trains)
        return {l: slots for l in links}
    fifo = FifoTrains(events, deliver, m.link_rate_mbit, m.link_queue_bytes, trains)
    fair = FairShare(events, deliver, m.link_rate_mbit)
    return {l: fifo if all(x.burst for x in routes if l in x.links) else fair for l in links}


class Simulation:
    """One pass of `simulate`: the workers' state, the event loop, and the WAN links'
    disciplines (testbed.rules.wanlinks, testbed.rules.serial_links) the messages go through.
    `gaps`: the trains' spacing the last pass found (None: the first pass). Each event is a
    handler of this class or of a discipline; a handler returns the workers it concerns (their
    next op may start now), or None."""

    def __init__(self, m: PipelineModel, iterations: int,
                 gaps: dict[tuple, float] | None = None) -> None:
        self.m, self.iterations = m, iterations
        P, D = self.P, self.D = len(m.table), m.replicas
        self.weight = list(m.weights) if m.weights is not None else [1] * D
        self.trains = Trains(list(m.heads) if m.heads is not None else [None] * D,
                             self.weight, gaps)
        self.rows = [list(row) for row in m.table]
        self.parsed = [[parse_action(a) for a in row] for row in self.rows]  # (kind, mb) each
        self.action = {a: parse_action(a) for row in self.rows for a in row}
        self.everyone = [(s, r) for s in range(P) for r in range(D)]
        self.ops: list[Op] = []
        self.link_bits: dict[LinkDir, dict[int, float]] = {}
        self.arrived: dict[tuple, float] = {}      # (kind, s, r, it, mb) -> arrival time
        self.f_end: dict[tuple, float] = {}        # (s, r, it, mb) -> end of that F
        self.pos = dict.fromkeys(self.everyone, 0)         # index in row + [AR, OPT]
        self.it_of = dict.fromkeys(self.everyone, 0)
        self.free = dict.fromkeys(self.everyone, 0.0)
        self.running: set[tuple[int, int]] = set()   # workers whose op has not ended yet
        self.done_rows: dict[tuple[int, int], list[float]] = {}   # (stage, it) -> row ends
        self.last_sent: dict[int, float] = {}        # id(route) -> its last message's send
        self.channels: dict[tuple, Channel] = {}     # (kind, s, r): that route's connections
        self.events = EventQueue()
        self.push = self.events.push
        self.heap, self.ticket = self.events.heap, self.events.ticket   # (try_start pushes)
        self.on_op_end = self.op_end       # bound once: pushed at every op
        self.links = link_disciplines(m, self.events, self.arrive, self.trains)

    def run(self) -> SimResult:
        """Every event in time order from the first tick; ValueError if a worker never
        finishes."""
        heap, try_start = self.events.heap, self.try_start
        self.events.push(0.0, self.tick, ())
        while heap:
            now, _, handler, data = heappop(heap)
            touched = handler(now, *data)
            if touched:
                try_start(now, touched)
        left = {w: it for w, it in self.it_of.items() if it < self.iterations}
        if left:
            raise ValueError(f"model deadlocked: workers {left} did not finish")
        train_gaps, shift = self.trains.found()
        drops: dict[LinkDir, dict[int, float]] = {}
        for d in dict.fromkeys(self.links.values()):
            drops.update(d.drops)
        unalike = any(d.trains_unalike for d in self.links.values())
        return SimResult(ops=self.ops, link_bits=self.link_bits, link_drops=drops,
                         train_gaps=train_gaps, train_shift_ms=shift, trains_unalike=unalike)

    # ---- events --------------------------------------------------------------------------------
    def tick(self, now: float) -> list[tuple[int, int]]:
        return self.everyone

    def arrive(self, now: float, key: MessageKey) -> list[tuple[int, int]]:
        self.arrived[key] = now
        return [(key[1], key[2])]

    def op_end(self, now: float, s: int, r: int, it: int, name: str) -> list[tuple[int, int]]:
        """Worker (s, r)'s op ends: it moves on, sends what the op made, and the stage's
        all-reduce barrier opens when its last replica finishes its row."""
        w = (s, r)
        self.running.discard(w)
        touched = [w]
        pos = self.pos
        if name == "ALLREDUCE":
            pos[w] += 1
        elif name == "OPT":
            pos[w] = 0
            self.it_of[w] += 1
            if w == (0, 0):           # once per iteration
                for link, bits in self.m.allreduce_link_bits.items():
                    per_it = self.link_bits.setdefault(link, {})
                    per_it[it] = per_it.get(it, 0.0) + bits
        else:
            pos[w] += 1
            k, mb = self.action[name]
            m = self.m
            if k == "F":
                self.f_end[(s, r, it, mb)] = now
            if k == "F" and s < self.P - 1:
                self.send(now, ("F", s + 1, r, it, mb), m.forward_routes[(s, r)], it, s)
            if k == "B" and s > 0:
                self.send(now, ("B", s - 1, r, it, mb), m.backward_routes[(s - 1, r)], it, s)
            if pos[w] == len(self.rows[s]):
                ends = self.done_rows.setdefault((s, it), [])
                ends.append(now)
                if len(ends) == self.D:                      # the all-reduce's barrier
                    touched = [(s, x) for x in range(self.D)]
        return touched

    # ---- messages ------------------------------------------------------------------------------
    def send(self, now: float, key: MessageKey, route: Route, it: int, sender: int) -> None:
        """A message leaves now: key = (kind, s, r, it, mb) of the op that needs it; inside a
        DC it arrives its solo time later, over the WAN its first link's discipline serves it."""
        if self.trains.on:
            self.trains.sent_at[key] = now
        w = self.weight[key[2]]
        warm_ms = route.solo_ms
        link = self.links[route.links[0]] if route.links else None
        channel = None
        if route.channel is not None:       # its connections, as earlier messages left them
            channel = self.channels.get(key[:3])
            if channel is None:
                channel = self.channels[key[:3]] = Channel(route.channel, loss_events=True)
            if link is not None and link.times_channels:
                solo = route.solo_ms        # the link times the channel from the slot
            else:
                solo = channel.send(now, route.payload_bytes)
        else:
            solo = route.solo(now - self.last_sent.get(id(route), float("-inf")))
            self.last_sent[id(route)] = now
        if solo != route.solo_ms:
            route = route.timed(solo)
        for l in route.links:
            per_it = self.link_bits.get(l)
            if per_it is None:
                per_it = self.link_bits[l] = {}
            per_it[it] = per_it.get(it, 0.0) + route.wire_bytes * 8 * w
        if link is None:
            self.push(now + route.solo_ms, self.arrive, (key,))
        else:
            link.send(now, key, route, w, sender, warm_ms, channel)

    # ---- workers -------------------------------------------------------------------------------
    def ready(self, w: tuple[int, int]) -> tuple[str, float] | None:
        """The next op of worker w = (s, r) and the earliest time its input allows it."""
        s, r = w
        it, k = self.it_of[w], self.pos[w]
        row = self.rows[s]
        if k < len(row):
            kind, mb = self.parsed[s][k]
            if kind == "F":
                if s == 0:
                    return row[k], 0.0
                t = self.arrived.get(("F", s, r, it, mb))
            elif s == self.P - 1:
                t = self.f_end.get((s, r, it, mb))
            else:
                t = self.arrived.get(("B", s, r, it, mb))
            return (row[k], t) if t is not None else None
        if k == len(row):
            if self.D == 1:
                return "ALLREDUCE", self.free[w]
            ends = self.done_rows.get((s, it), ())
            return ("ALLREDUCE", max(ends)) if len(ends) == self.D else None
        return "OPT", self.free[w]

    def try_start(self, now: float, workers: list[tuple[int, int]]) -> None:
        """Start the next op of each of `workers` (those the event concerns) if it can."""
        m, it_of, pos, running, trains = self.m, self.it_of, self.pos, self.running, self.trains
        iterations, ready, heap, ticket = self.iterations, self.ready, self.heap, self.ticket
        for w in workers:
            it = it_of[w]
            if it >= iterations or w in running:
                continue
            nxt = ready(w)
            if nxt is None or nxt[1] > now + EPS:
                continue
            s, r = w
            name = nxt[0]
            if name in ("ALLREDUCE", "OPT"):
                dur = m.allreduce_ms[s] if name == "ALLREDUCE" else m.opt_ms[s]
                if m.op_extra_ms and name == "OPT":
                    dur += m.op_extra_ms.get((s, r, it, name), 0.0)
                op = _op(Op, (s, r, it, name, None, now, now + dur))
            else:
                kind, mb = self.action[name]
                dur = m.forward_ms[s] if kind == "F" else m.backward_ms[s]
                if m.op_extra_ms:
                    dur += m.op_extra_ms.get((s, r, it, name), 0.0)
                op = _op(Op, (s, r, it, kind, mb, now, now + dur))
            if dur > 0 or name != "ALLREDUCE":
                self.ops.append(op)
            end = op.end_ms
            self.free[w] = end
            running.add(w)
            if trains.on:
                trains.started[(s, r, it, pos[w])] = now
                trains.latest[w] = (it, pos[w])
            heappush(heap, (end, ticket(), self.on_op_end, (s, r, it, name)))  # events.push


# ---- the compute-only case ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TimelineOp:
    stage: int
    action: str          # "F3", "B0", "OPT"
    start_ms: float
    end_ms: float


@dataclass(frozen=True, slots=True)
class Timeline:
    ops: list[TimelineOp]            # per stage in row order (stages in turn)
    window_ms: float                 # first compute start to last compute end
    compute_ms: list[float]          # per stage
    bubble: list[float]              # per stage: 1 - compute/window

    @property
    def mean_bubble(self) -> float:
        return sum(self.bubble) / len(self.bubble)


Durations = float | Sequence[float] | Callable[[int], float]   # all stages, per stage, or s -> ms


def _per_stage(value: Durations, n: int) -> list[float]:
    if callable(value):
        return [float(value(s)) for s in range(n)]
    if isinstance(value, (int, float)):
        return [float(value)] * n
    return [float(v) for v in value]


def compute_only(table: Sequence[Sequence[str]], forward_ms: Durations, backward_ms: Durations,
                 comm_ms: float = 0.0, opt_ms: Durations = 0.0) -> Timeline:
    """One iteration of one pipeline running `table`: each stage runs its row in order; an op
    starts when its stage is free and its input has arrived (F(s,m) needs F(s-1,m) + comm_ms;
    B(s,m) needs B(s+1,m) + comm_ms; the last stage's B(m) needs its own F(m)); the optimizer
    step of opt_ms ends each row. `simulate` with D = 1 and every message `comm_ms` alone, so
    the planner's timeline and the model's are one computation. ValueError if it deadlocks."""
    n = len(table)
    f, b, o = _per_stage(forward_ms, n), _per_stage(backward_ms, n), _per_stage(opt_ms, n)
    hop = Route(links=(), solo_ms=float(comm_ms))
    model = PipelineModel(table=table, replicas=1, forward_ms=f, backward_ms=b, opt_ms=o,
                          allreduce_ms=[0.0] * n,
                          forward_routes={(s, 0): hop for s in range(n - 1)},
                          backward_routes={(s, 0): hop for s in range(n - 1)})
    try:
        result = simulate(model, 1)
    except ValueError:
        raise ValueError(f"schedule deadlocks:\n{format_table(table)}") from None
    ops = [TimelineOp(op.stage, op.name if op.microbatch is None else f"{op.name}{op.microbatch}",
                      op.start_ms, op.end_ms)
           for op in sorted(result.ops, key=lambda op: op.stage)        # stable: row order kept
           if op.name != "OPT" or op.end_ms > op.start_ms]
    compute = [0.0] * n
    for op in ops:
        compute[op.stage] += op.end_ms - op.start_ms
    window = max(op.end_ms for op in ops) - min(op.start_ms for op in ops)
    return Timeline(ops=ops, window_ms=window, compute_ms=compute,
                    bubble=[1.0 - c / window for c in compute])
