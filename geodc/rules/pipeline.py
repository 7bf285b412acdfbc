"""The one simulator: a discrete-event model of pipeline-parallel training over a WAN, several
iterations of P stages x D replicas x M micro-batches, op by op. Pure: no kernel, no root, no
torch. `compute_only` is its simplest case (one pipeline, one iteration, a fixed delay per
message): the compute-only timeline that the slot planner and metrics.json's `compute_only` use.

One job: given the per-op compute times, where each stage replica sits, how long each message
takes alone (geodc.predict.transfer) and how the WAN links are shared, say when every op starts and
ends. geodc.predict.predict builds the inputs from a scenario and a system and reads figures off the
result.

Rules, the workers' (geodc/hostproc/trainer/worker.py):
- Each worker (s, r) runs its schedule row (geodc.rules.schedule: gpipe or 1f1b) in order, then,
  with D > 1, the stage's gradient all-reduce (it starts when all D replicas have finished their
  row and lasts `allreduce_ms[s]`), then the optimizer step, then the next iteration's row.
- F(s, r, m) needs the activation of F(s-1, r, m); B(s, r, m) the gradient of B(s+1, r, m)
  (the last stage's B its own F). A message is sent when the op that makes it ends.
- A message inside a DC takes its route's `solo_ms`; over the WAN, its solo time is `solo_ms`,
  or `solo_idle_ms` (slow start) when the route's previous message left more than `rto_ms`
  before (the connections went idle). A message over the WAN moves its wire bytes over
  every link of its routed path, then arrives one way later:
  - "concurrent" sharing (TCP's fair share): all messages on a link share it max-min fairly
    (progressive filling over the path's links), each at most at its own cap, the rate at which
    it would take solo_ms alone (so a lone message takes exactly geodc.predict.transfer's time). But a
    link whose every route is a `burst` (the whole message leaves in its first round trip: each
    stripe fits its connection's window) serves its messages first come, first served: the
    bursts queue at the bottleneck in the order they were sent and nothing is left for a
    second round to interleave. Each holds the link for its wire bytes at the link's rate and
    arrives one way later, or no earlier than its solo time after it was sent (a message in
    slow start after idle leaves in several rounds; the link is not held during their round
    trips). Measured: sweep_delay's multitcp at 20 and 40 ms ran as fast as atlas, where
    fair sharing predicted +17% and +13%;
  - "temporal" sharing (Atlas): the message's first link is held by one message at a time, in
    the order they became ready (ties: the order given), each for its solo data time.
  - A link's queue (`link_queue_bytes`, the scenario's `queue`) holds what it can: a burst (a
    message's first round trip over its connections, `burst_bytes`) arriving behind the
    link's backlog loses what does not fit (tail drop). First come, first served, the lost
    bytes leave the link's time and enter it again a round trip after they were sent (fast
    retransmit), behind what came meanwhile; under temporal slots only the slot's own burst is
    queued, and its slot lasts through the resend. Not modelled: the sender's window
    reduction after a loss, timeouts.
Plain heap (heapq): the event count is a few per op, an event wakes only the workers it concerns,
and each touches at most the messages on the WAN at that moment. A link that serves one message
at a time keeps a clock (when it is next free, every message sent so far served in the order
sent). Fair shares: geodc.rules.fairshare, over the links that can fill. Alike replicas (same
DCs, so same routes) may be folded (geodc.predict.predict does): a replica with a weight stands
for the members behind the one before it (its head: `heads`), a chain of such parts for a group.
On fair-shared links the weight's messages are weight flows at the rate each gets. On a link
serving one at a time, the head's message registers the part's middle members (a train), sent
after it at even spacing and served in the order sent among the other messages (one train's
members a_i ... a_j from a link free at W leave it free at max(W + m d, a_i + m d, a_j + d);
members of trains that interleave are served one by one); the part's last member's own message
follows the rest of its train. The spacing is the gap between head and last member at the
latest op both started in a first pass, then what the last pass found (`simulate`). A weight
without a head: its messages hold the link weight times in turn, arriving with the last.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from geodc.rules.fairshare import max_min_rates
from geodc.rules.schedule import format_table, parse_action
from geodc.rules.tcpchannel import Channel, ChannelSpec
from geodc.spec.links import LinkDir

EPS = 1e-9


@dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """How one stage boundary's messages travel in one pipeline and one direction."""
    links: tuple[LinkDir, ...]  # link directions of the WAN path; () inside a DC
    solo_ms: float              # one message's time alone, first byte sent to last arrived
    one_way_ms: float = 0.0     # the path's delay (inside solo_ms)
    wire_bytes: float = 0.0     # per message
    solo_idle_ms: float | None = None   # alone, after its connections sat idle > rto_ms
    rto_ms: float = float("inf")
    burst: bool = False         # the whole message leaves in one round trip (steady windows)
    burst_bytes: float | None = None    # wire bytes entering the bottleneck at once (one round
                                        # of every connection); None: the whole message
    rtt_ms: float = 0.0         # the path's round trip (a lost byte is resent one later)
    # the connections that carry its messages, persistent across them (geodc.rules.tcpchannel):
    # given, each message's solo time is its channel's, and solo_ms / solo_idle_ms are what a
    # fresh channel gives (warm / restarting slow start)
    channel: ChannelSpec | None = None
    payload_bytes: float = 0.0  # per message, with a channel

    def solo(self, idle_ms: float) -> float:
        """Alone, after idle_ms since this route's last message left."""
        if self.solo_idle_ms is not None and idle_ms > self.rto_ms:
            return self.solo_idle_ms
        return self.solo_ms


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


@dataclass(frozen=True, slots=True)
class Op:
    stage: int
    replica: int
    iteration: int
    name: str            # F | B | ALLREDUCE | OPT
    microbatch: int | None
    start_ms: float
    end_ms: float


@dataclass
class _Flow:
    key: tuple
    links: tuple[LinkDir, ...]
    left_bits: float
    cap_mbit: float
    one_way_ms: float
    weight: int = 1           # alike messages it stands for, each at rate_mbit
    rate_mbit: float = 0.0
    n: int = 0                # order of arrival
    ver: int = 0              # its end event's, bumped at every new rate


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


TRAIN_PASSES = 8           # at most, until the trains' spacing settles
TRAIN_SETTLED = 1e-4       # a train's last member moving less, relative to the run, is settled


def simulate(m: PipelineModel, iterations: int) -> SimResult:
    """Run `iterations` iterations back to back from time 0 (module docstring).

    With trains (folded alike replicas behind a head on links serving one message at a time),
    the members' send times are known only once the part's last member has sent: a first pass
    spaces them as head and last member were at the latest op both started, and each further
    pass as the last pass found them, until that moves the last member less than TRAIN_SETTLED
    of the run (a fixed point: members evenly spaced between the two simulated replicas)."""
    res = _simulate(m, iterations, None)
    for _ in range(TRAIN_PASSES - 1):
        end = max((o.end_ms for o in res.ops), default=0.0)
        if res.train_shift_ms <= TRAIN_SETTLED * max(1.0, end):
            break
        res = _simulate(m, iterations, res.train_gaps)
    return res


def _simulate(m: PipelineModel, iterations: int, gaps: dict[tuple, float] | None) -> SimResult:
    P, D = len(m.table), m.replicas
    weight = list(m.weights) if m.weights is not None else [1] * D
    heads = list(m.heads) if m.heads is not None else [None] * D
    tail_of = {h: (r, weight[r]) for r, h in enumerate(heads) if h is not None}
    rows = [list(row) for row in m.table]
    ops: list[Op] = []
    link_bits: dict[LinkDir, dict[int, float]] = {}
    arrived: dict[tuple, float] = {}          # (kind, s, r, it, mb) -> arrival time
    f_end: dict[tuple, float] = {}            # (s, r, it, mb) -> end of that F
    pos = {(s, r): 0 for s in range(P) for r in range(D)}      # index in row + [AR, OPT]
    it_of = {(s, r): 0 for s in range(P) for r in range(D)}
    free = {(s, r): 0.0 for s in range(P) for r in range(D)}
    running: set[tuple[int, int]] = set()     # workers whose op has not ended yet
    done_rows: dict[tuple[int, int], list[float]] = {}         # (stage, it) -> row ends
    events: list[tuple[float, int, str, tuple]] = []
    seq = [0]

    def push(t: float, kind: str, data: tuple) -> None:
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], kind, data))

    # WAN state
    flows: dict[tuple, _Flow] = {}
    all_routes = [*m.forward_routes.values(), *m.backward_routes.values()]
    fifo_links = {l for r in all_routes for l in r.links
                  if all(x.burst for x in all_routes if l in x.links)}
    last_update = [0.0]
    # links serving one message at a time, in the order sent: when each is next free, and the
    # trains' members still to be served ([next member, members, first sent, spacing, ms each])
    clock: dict[LinkDir, float] = {}
    middles: dict[LinkDir, dict[tuple, list]] = {}
    # a head's channel (kind, s, r) -> its last train's (first sent, spacing): when each member
    # sent its previous message, so how long its connections sat idle
    last_train: dict[tuple, tuple[float, float]] = {}
    started: dict[tuple, float] = {}          # (s, r, it, pos) -> when that op started
    latest: dict[tuple[int, int], tuple[int, int]] = {}    # (s, r) -> (it, pos) last started

    def serve_middles(link: LinkDir, t: float) -> None:
        """Serve, in the order sent, every train member sent by t (before a message sent at t).
        One train's members a_i ... a_j, spaced alike and served alike, from a link free at W,
        leave it free at max(W + m d, a_i + m d, a_j + d); members of several trains interleave,
        and members in slow start after idle take longer, so those are served one by one in the
        order sent."""
        trains = middles.get(link)
        if not trains:
            return
        due: list[tuple[list, int, int]] = []        # (train, first member, last member)
        for k in list(trains):
            b = trains[k]
            i, n, t0, gap = b[:4]
            if t0 + i * gap > t + EPS:
                continue
            j = n - 1 if gap <= 0 else min(n - 1, int((t - t0) / gap + EPS))
            due.append((b, i, j))
            b[0] = j + 1
            if b[0] >= n:
                del trains[k]
        W = clock.get(link, 0.0)
        if len(due) == 1 and member_ms(due[0][0], due[0][1]) == member_ms(due[0][0], due[0][2]):
            b, i, j = due[0]
            count, d = j - i + 1, member_ms(b, i)
            W = max(W + count * d, b[2] + i * b[3] + count * d, b[2] + j * b[3] + d)
        elif due:
            for a, d in sorted((b[2] + x * b[3], member_ms(b, x)) for b, i, j in due
                               for x in range(i, j + 1)):
                W = max(W, a) + d
        clock[link] = W

    def member_ms(b: list, x: int) -> float:
        """How long train member x holds the link: slow start after idle where its connections
        sat idle past the RTO since its previous message (idle = the head's + x times the change
        of spacing), else as the head's warm ones."""
        _, _, _, _, d, d_idle, idle0, slope, rto = b
        return d_idle if idle0 + x * slope > rto else d

    def spacing(s: int, head: int, tail: int, n: int) -> float:
        """How far apart a train's members are now: the gap between its head and its last
        member at the latest op both started, over the members behind the head."""
        if (s, tail) not in latest:
            return 0.0
        it, k = latest[(s, tail)]
        h = started.get((s, head, it, k))
        return 0.0 if h is None else max(0.0, (started[(s, tail, it, k)] - h) / n)

    def send_one_at_a_time(now: float, key: tuple, route: Route, w: int, sender: int,
                           warm_ms: float) -> None:
        """A message on a link serving one at a time, in the order sent (module docstring);
        warm_ms: its solo time with its connections warm."""
        link = route.links[0]
        one_ms = (route.solo_ms - route.one_way_ms if m.sharing == "temporal"
                  else route.wire_bytes * 8 / (m.link_rate_mbit[link] * 1e3))
        serve_middles(link, now)
        r = key[2]
        hold = w
        if heads[r] is not None:        # the train's last: its middle is through first
            mid = middles.get(link, {}).pop((*key[:2], heads[r], *key[3:]), None)
            if mid is not None:
                clock[link] = max(clock[link], now) + sum(member_ms(mid, x)
                                                          for x in range(mid[0], mid[1]))
            hold = 1
        start = max(now, clock.get(link, 0.0))
        clock[link] = start + hold * one_ms
        if r in tail_of and tail_of[r][1] > 1:  # a train's head: its middle follows it
            tail, n = tail_of[r]
            gap = gaps.get(key) if gaps is not None else None
            if gap is None:
                gap = spacing(sender, r, tail, n)
            used_gaps[key] = gap
            d, d_idle, idle0, slope = one_ms, one_ms, 0.0, 0.0
            if m.sharing == "temporal" and route.solo_idle_ms is not None:
                d, d_idle = warm_ms - route.one_way_ms, route.solo_idle_ms - route.one_way_ms
                prev = last_train.get(key[:3])
                idle0, slope = ((float("inf"), 0.0) if prev is None
                                else (now - prev[0], gap - prev[1]))
            last_train[key[:3]] = (now, gap)
            middles.setdefault(link, {})[key] = [1, n, now, gap, d, d_idle, idle0, slope,
                                                 route.rto_ms]
        if m.sharing == "temporal":
            arrive = clock[link] + route.one_way_ms            # the last of them
        else:                           # never before its solo time
            arrive = max(clock[link] + route.one_way_ms, now + route.solo_ms)
        burst = route.burst_bytes if route.burst_bytes is not None else route.wire_bytes
        if m.sharing == "temporal":     # slots: one message's burst in the queue at a time
            lost = overflow(link, 0.0, burst)
        else:                           # what waits ahead of it, then its (alike) bursts
            lost = overflow(link, start - now, burst * hold, hold * route.wire_bytes)
        if lost <= 0:
            push(arrive, "arrive", (key,))
            return
        add_drops(link, key[3], lost * (w if m.sharing == "temporal" else 1))
        if m.sharing == "temporal":     # the slot lasts through the resend, a round trip on
            extra = route.rtt_ms + lost / (m.link_rate_mbit[link] * 125.0)
            clock[link] += extra * hold
            push(arrive + extra * hold, "arrive", (key,))
        else:                           # the lost bytes leave the link's time, come back later
            clock[link] -= lost / (m.link_rate_mbit[link] * 125.0)
            push(now + route.rtt_ms, "resend", (key, route, lost, arrive))

    def add_drops(link: LinkDir, it: int, lost: float) -> None:
        per_it = result_drops.setdefault(link, {})
        per_it[it] = per_it.get(it, 0.0) + lost

    def overflow(link: LinkDir, wait_ms: float, burst: float, most: float | None = None
                 ) -> float:
        """Wire bytes a burst loses at the link's queue, with wait_ms of the link's time queued
        ahead of it (tail drop: what does not fit)."""
        q = m.link_queue_bytes.get(link)
        if q is None:
            return 0.0
        ahead = max(0.0, wait_ms) * m.link_rate_mbit[link] * 125.0     # Mbit/s x ms -> bytes
        return min(burst if most is None else most, max(0.0, ahead + burst - q))

    def resend(now: float, key: tuple, route: Route, lost: float, arrive: float) -> None:
        """Bytes lost a round trip ago enter the link again, in the order sent."""
        link = route.links[0]
        serve_middles(link, now)
        start = max(now, clock.get(link, 0.0))
        again = overflow(link, start - now, lost)
        clock[link] = start + (lost - again) / (m.link_rate_mbit[link] * 125.0)
        arrive = max(arrive, clock[link] + route.one_way_ms)
        if again > 0:
            add_drops(link, key[3], again)
            push(now + route.rtt_ms, "resend", (key, route, again, arrive))
        else:
            push(arrive, "arrive", (key,))

    def progress(now: float) -> None:
        dt = now - last_update[0]
        if dt > 0:
            for f in flows.values():
                f.left_bits -= f.rate_mbit * 1e3 * dt      # Mbit/s x ms = 1e3 bits
        last_update[0] = now

    link_flows: dict[LinkDir, dict[tuple, _Flow]] = {}
    result_drops: dict[LinkDir, dict[int, float]] = {}

    pending: set[LinkDir] = set()       # links whose flows changed since the last reshare
    # A link whose flows' caps sum to no more than its rate never fills (each flow gets at
    # most its cap): it constrains nobody, so the fair share skips it and flows joined only
    # through such links are reshared apart.
    cap_sum: dict[LinkDir, float] = {}
    tight: set[LinkDir] = set()         # the links that can fill
    loosened: set[LinkDir] = set()      # no longer tight since the last reshare
    fresh: list[_Flow] = []             # started since the last reshare

    def recap(link: LinkDir, total: float) -> None:
        cap_sum[link] = total
        if total > m.link_rate_mbit.get(link, float("inf")) * (1 - 1e-9):
            tight.add(link)
        elif link in tight:
            tight.discard(link)
            loosened.add(link)

    def join(f: _Flow) -> None:
        for link in dict.fromkeys(f.links):
            link_flows.setdefault(link, {})[f.key] = f
            recap(link, cap_sum.get(link, 0.0) + f.weight * f.cap_mbit)

    def leave(f: _Flow) -> None:
        for link in dict.fromkeys(f.links):
            on = link_flows[link]
            on.pop(f.key, None)
            recap(link, cap_sum[link] - f.weight * f.cap_mbit if on else 0.0)

    def reshare_soon(now: float, links) -> None:
        """Reshare once after every event at this time (no time passes between them)."""
        if not pending:
            push(now, "reshare", ())
        pending.update(links)

    def reshare(now: float, seeds) -> None:
        """Max-min fair rates with caps of the flows whose rates the changes since the last
        reshare can move (the others' cannot change), then schedule their next ends."""
        # What can change: the flows just started, and every flow joined to them or to a seed
        # link that is (or just stopped being) tight through tight links. A flow that meets the
        # change only on a link that stays slack keeps its rate.
        comp = {f.key: f for f in fresh if f.key in flows}
        stack = [l for l in seeds if l in tight or l in loosened]
        for f in comp.values():
            stack.extend(l for l in f.links if l in tight)
        fresh.clear()
        loosened.clear()
        seen: set[LinkDir] = set()
        while stack:
            link = stack.pop()
            if link in seen:
                continue
            seen.add(link)
            for k, f in link_flows.get(link, {}).items():
                if k not in comp:
                    comp[k] = f
                    stack.extend(l for l in f.links if l in tight)
        active = sorted((f for f in comp.values() if f.left_bits > EPS), key=lambda f: f.n)
        if not active:
            return
        before = [f.rate_mbit for f in active]
        max_min_rates(active, m.link_rate_mbit, tight)
        for f, rate in zip(active, before):
            if f.rate_mbit != rate or not f.ver:       # else its end is as scheduled
                f.ver += 1
                push(now + f.left_bits / (f.rate_mbit * 1e3), "flow_end", (f.key, f.ver))

    last_sent: dict[int, float] = {}
    channels: dict[tuple, Channel] = {}       # (kind, s, r): that route's connections
    sent_at: dict[tuple, float] = {}          # with trains: when each message was sent
    used_gaps: dict[tuple, float] = {}        # the spacing each train was served at

    def send(now: float, key: tuple, route: Route, it: int, sender: int) -> None:
        """A message leaves now: key = (kind, s, r, it, mb) of the op that needs it."""
        if tail_of:
            sent_at[key] = now
        w = weight[key[2]]
        warm_ms = route.solo_ms
        if route.channel is not None:       # its connections, as earlier messages left them
            channel = channels.get(key[:3])
            if channel is None:
                channel = channels[key[:3]] = Channel(route.channel)
            solo = channel.send(now, route.payload_bytes)
        else:
            solo = route.solo(now - last_sent.get(id(route), float("-inf")))
            last_sent[id(route)] = now
        if solo != route.solo_ms:
            route = replace(route, solo_ms=solo)
        for l in route.links:
            link_bits.setdefault(l, {}).setdefault(it, 0.0)
            link_bits[l][it] += route.wire_bytes * 8 * w
        if not route.links:
            push(now + route.solo_ms, "arrive", (key,))
        elif m.sharing == "temporal" or route.links[0] in fifo_links:
            send_one_at_a_time(now, key, route, w, sender, warm_ms)
        else:
            progress(now)
            data_ms = max(EPS, route.solo_ms - route.one_way_ms)
            f = flows[key] = _Flow(key=key, links=route.links, left_bits=route.wire_bytes * 8,
                                   cap_mbit=route.wire_bytes * 8 / data_ms / 1e3,
                                   one_way_ms=route.one_way_ms, weight=w, n=seq[0])
            seq[0] += 1
            join(f)
            fresh.append(f)
            reshare_soon(now, route.links)

    parsed = [[parse_action(a) for a in row] for row in rows]   # (kind, mb) per action
    action = {a: parse_action(a) for row in rows for a in row}

    def ready(s: int, r: int) -> tuple[str, float] | None:
        """The next op of worker (s, r) and the earliest time its input allows it."""
        it, k = it_of[(s, r)], pos[(s, r)]
        row = rows[s]
        if k < len(row):
            kind, mb = parsed[s][k]
            if kind == "F":
                if s == 0:
                    return row[k], 0.0
                t = arrived.get(("F", s, r, it, mb))
            elif s == P - 1:
                t = f_end.get((s, r, it, mb))
            else:
                t = arrived.get(("B", s, r, it, mb))
            return (row[k], t) if t is not None else None
        if k == len(row):
            if D == 1:
                return "ALLREDUCE", free[(s, r)]
            ends = done_rows.get((s, it), ())
            return ("ALLREDUCE", max(ends)) if len(ends) == D else None
        return "OPT", free[(s, r)]

    everyone = [(s, r) for s in range(P) for r in range(D)]

    def try_start(now: float, workers: list[tuple[int, int]]) -> None:
        """Start the next op of each of `workers` (those the event concerns) if it can."""
        for w in workers:
            s, r = w
            if it_of[w] >= iterations or w in running:
                continue
            nxt = ready(s, r)
            if nxt is None or nxt[1] > now + EPS:
                continue
            name, _ = nxt
            it = it_of[w]
            if name in ("ALLREDUCE", "OPT"):
                dur = m.allreduce_ms[s] if name == "ALLREDUCE" else m.opt_ms[s]
                op = Op(s, r, it, name, None, now, now + dur)
            else:
                kind, mb = action[name]
                dur = m.forward_ms[s] if kind == "F" else m.backward_ms[s]
                op = Op(s, r, it, kind, mb, now, now + dur)
            if dur > 0 or name not in ("ALLREDUCE",):
                ops.append(op)
            free[w] = op.end_ms
            running.add(w)
            if tail_of:
                started[(s, r, it, pos[w])] = now
                latest[w] = (it, pos[w])
            push(op.end_ms, "op_end", (s, r, it, name))

    push(0.0, "tick", ())
    while events:
        now, _, kind, data = heapq.heappop(events)
        touched: list[tuple[int, int]] = []
        if kind == "tick":
            touched = everyone
        if kind == "op_end":
            s, r, it, name = data
            w = (s, r)
            running.discard(w)
            touched = [w]
            if name == "ALLREDUCE":
                pos[w] += 1
            elif name == "OPT":
                pos[w] = 0
                it_of[w] += 1
                if (s, r) == (0, 0):      # once per iteration
                    for link, bits in m.allreduce_link_bits.items():
                        per_it = link_bits.setdefault(link, {})
                        per_it[it] = per_it.get(it, 0.0) + bits
            else:
                pos[w] += 1
                k, mb = action[name]
                if k == "F":
                    f_end[(s, r, it, mb)] = now
                if k == "F" and s < P - 1:
                    send(now, ("F", s + 1, r, it, mb), m.forward_routes[(s, r)], it, s)
                if k == "B" and s > 0:
                    send(now, ("B", s - 1, r, it, mb), m.backward_routes[(s - 1, r)], it, s)
                if pos[w] == len(rows[s]):
                    ends = done_rows.setdefault((s, it), [])
                    ends.append(now)
                    if len(ends) == D:                      # the all-reduce's barrier
                        touched = [(s, x) for x in range(D)]
        elif kind == "arrive":
            arrived[data[0]] = now
            touched = [(data[0][1], data[0][2])]
        elif kind == "reshare":
            seeds = list(pending)
            pending.clear()
            reshare(now, seeds)
        elif kind == "resend":
            resend(now, *data)
        elif kind == "flow_end":
            key, ver = data
            f = flows.get(key)
            if f is None or f.ver != ver:
                continue          # superseded by a later reshare
            progress(now)
            # every message whose data is through (several may end at once)
            freed: set[LinkDir] = set()
            for k in [k for k, g in flows.items() if g.left_bits <= 1.0]:   # bits: float noise
                g = flows.pop(k)
                leave(g)
                freed.update(g.links)
                push(now + g.one_way_ms, "arrive", (k,))
            reshare_soon(now, freed)
        try_start(now, touched)
    left = {w: it_of[w] for w in it_of if it_of[w] < iterations}
    if left:
        raise ValueError(f"model deadlocked: workers {left} did not finish")
    train_gaps, shift = {}, 0.0
    for key, t in sent_at.items():
        r = key[2]
        if r in tail_of and tail_of[r][1] > 1:
            tail, n = tail_of[r]
            t_tail = sent_at.get((*key[:2], tail, *key[3:]))
            if t_tail is not None:
                train_gaps[key] = max(0.0, (t_tail - t) / n)
                if key in used_gaps:
                    shift = max(shift, abs(train_gaps[key] - used_gaps[key]) * n)
    return SimResult(ops=ops, link_bits=link_bits, link_drops=result_drops,
                     train_gaps=train_gaps, train_shift_ms=shift)


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
