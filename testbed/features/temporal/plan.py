"""The workload-aware WAN sharing plan of one system on one scenario and training config (pure).

One job: for each WAN link direction, which pipeline transfers use it, how long each holds it,
and (for systems with temporal WAN sharing) the order of the slots they take.

- A transfer between DCs X and Y is gated on the FIRST link of its routed path
  (testbed.plans.routing.dc_paths): X's gateway egress towards the next DC. That is where a temporal
  scheduler holds it back; later hops of a multi-hop path are not planned here.
- Stage boundary s -> s+1 of pipeline r with stage s in DC a and stage s+1 in DC b sends one
  activation per micro-batch forward on a -> b and one gradient backward on b -> a.
- Message bytes per transfer: in profile mode the profile's activation_bytes / scale
  (testbed.spec.profiles.stage_costs, what the workers pad to); in measured mode the real activation,
  micro_batch_size x seq_len x n_embd x 4 bytes (float32). Wire bytes add TCP/IP/Ethernet
  headers (WIRE_BYTES_PER_PAYLOAD_BYTE).
- Slot length: slot_ms = wire_bytes x 8 / min(rate, K x window / RTT), rate = the lowest
  configured rate over the path's links, RTT = the path there plus back, window = the receive
  window one connection advertises (testbed.plans.systems.window_bytes), K = the system's connections
  for that DC pair (testbed.plans.systems.connections_for). The window limit is K x window payload
  bytes per RTT, counted here in wire bytes like the rate; `window_limited` says which one binds.
  Configured values: with time_scale, every figure is real time.
- Per iteration a crossing takes (its pipelines) x M slots. Temporal order: micro-batch by
  micro-batch in the order the schedule produces the messages (testbed.rules.pipeline.compute_only on the
  profile holds; unit forward 1 / backward 2 in measured mode), within a message round-robin over
  the pipelines; pipeline d of a crossing starts d x slot_ms after pipeline 0 (its stagger).
- Busy fraction: the slots' total per iteration against the compute-only iteration time (the
  profile's simulated iteration, as testbed.plans.workers.compute_only_timeline; unknown in measured mode).

Concurrent systems get the same per-link list with sharing "concurrent" and no slot order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from testbed.plans.routing import dc_paths
from testbed.spec.scenario import ETH_FRAME_BYTES, TCP_MSS_BYTES
from testbed.plans.systems import connections_for, path_rate_mbit, path_rtt_ms, window_bytes
from testbed.rules.pipeline import compute_only
from testbed.rules.schedule import schedule_table
from testbed.rules.stripes import stripe_count
from testbed.spec.links import LinkDir
from testbed.spec.ranges import number_ranges

if TYPE_CHECKING:
    from testbed.plans.placement import Placement
    from testbed.spec.scenario import Scenario
    from testbed.spec.systems import System
    from testbed.spec.training import TrainConfig

# Bytes on the wire per payload byte of full-size TCP segments (1514-byte frames carrying 1448
# bytes of payload, testbed.spec.scenario), which is what HTB counts against a link's rate.
WIRE_BYTES_PER_PAYLOAD_BYTE = ETH_FRAME_BYTES / TCP_MSS_BYTES
FLOAT32_BYTES = 4
MEASURED_FORWARD_UNITS, MEASURED_BACKWARD_UNITS = 1.0, 2.0   # order only, in measured mode
MAX_ORDER_SHOWN = 12


@dataclass(frozen=True, kw_only=True, slots=True)
class Crossing:
    """One stage boundary's messages in one direction, from one DC pair, over a link."""

    boundary: int                  # s: the boundary stage s -> s+1
    kind: str                      # "activation" (forward, s -> s+1) | "gradient" (backward)
    src_dc: str
    dst_dc: str
    path: tuple[str, ...]          # routed DCs, src_dc ... dst_dc
    pipelines: tuple[int, ...]     # replica indices whose boundary s crosses here
    connections: int               # connections a message uses: min(K, testbed.rules.stripes' count)
    payload_bytes: int             # per message
    wire_bytes: int
    rtt_ms: float
    path_rate_mbit: float
    window_limit_mbit: float       # K x window / RTT, in wire terms
    slot_ms: float
    window_limited: bool
    slots_per_iteration: int       # len(pipelines) x M
    stagger_ms: tuple[float, ...]  # per pipeline (same order): d x slot_ms

    def to_dict(self) -> dict:
        return {"boundary": self.boundary, "kind": self.kind, "src_dc": self.src_dc,
                "dst_dc": self.dst_dc, "path": list(self.path), "pipelines": list(self.pipelines),
                "connections": self.connections, "payload_bytes": self.payload_bytes,
                "wire_bytes": self.wire_bytes, "rtt_ms": self.rtt_ms,
                "path_rate_mbit": self.path_rate_mbit,
                "window_limit_mbit": self.window_limit_mbit, "slot_ms": self.slot_ms,
                "window_limited": self.window_limited,
                "slots_per_iteration": self.slots_per_iteration,
                "stagger_ms": list(self.stagger_ms)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Slot:
    boundary: int
    kind: str
    micro_batch: int
    pipeline: int
    slot_ms: float

    @property
    def label(self) -> str:
        return f"{'A' if self.kind == 'activation' else 'G'}{self.boundary}.m{self.micro_batch}" \
               f".p{self.pipeline}"

    def to_dict(self) -> dict:
        return {"boundary": self.boundary, "kind": self.kind, "micro_batch": self.micro_batch,
                "pipeline": self.pipeline, "slot_ms": self.slot_ms}


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkPlan:
    """One WAN link direction: src DC's gateway egress towards dst."""

    src_dc: str
    dst_dc: str
    rate_mbit: float
    delay_ms: float
    sharing: str                         # "temporal" | "concurrent"
    crossings: tuple[Crossing, ...]
    # temporal: the messages of one iteration in order, (crossing index, micro-batch); each
    # takes one slot per pipeline of its crossing, round-robin (`order` lists those slots)
    messages: tuple[tuple[int, int], ...]
    slots_per_iteration: int
    busy_ms: float                       # sum of the slots of one iteration
    busy_fraction: float | None          # busy_ms / compute-only iteration (None: unknown)

    @property
    def direction(self) -> LinkDir:
        return LinkDir(self.src_dc, self.dst_dc)

    @property
    def order(self) -> tuple[Slot, ...]:
        """Temporal: the slots of one iteration, in order (the messages, each expanded)."""
        out = []
        for i, m in self.messages:
            c = self.crossings[i]
            out += [Slot(boundary=c.boundary, kind=c.kind, micro_batch=m, pipeline=p,
                         slot_ms=c.slot_ms) for p in c.pipelines]
        return tuple(out)

    def to_dict(self, order: bool = True) -> dict:
        """With order=False the slot-by-slot `order` is left out (`messages` holds it)."""
        slots = {"order": [s.to_dict() for s in self.order]} if order else {}
        return {"link": str(self.direction), "src_dc": self.src_dc,
                "dst_dc": self.dst_dc, "rate_mbit": self.rate_mbit, "delay_ms": self.delay_ms,
                "sharing": self.sharing, "crossings": [c.to_dict() for c in self.crossings],
                "messages": [{"crossing": i, "boundary": self.crossings[i].boundary,
                              "kind": self.crossings[i].kind, "micro_batch": m}
                             for i, m in self.messages],
                **slots, "slots_per_iteration": self.slots_per_iteration, "busy_ms": self.busy_ms,
                "busy_fraction": self.busy_fraction}


@dataclass(frozen=True, kw_only=True, slots=True)
class SlotPlan:
    system: str
    sharing: str
    compute: str                         # "profile" | "measured"
    micro_batches: int
    window_bytes: float
    iteration_ms: float | None           # compute-only iteration (profile holds); None: measured
    links: tuple[LinkPlan, ...]          # every WAN link direction, scenario order

    def used_links(self) -> tuple[LinkPlan, ...]:
        return tuple(link for link in self.links if link.crossings)

    def to_dict(self, order: bool = True) -> dict:
        return {"system": self.system, "sharing": self.sharing, "compute": self.compute,
                "micro_batches": self.micro_batches, "window_bytes": self.window_bytes,
                "iteration_ms": self.iteration_ms,
                "links": [lk.to_dict(order) for lk in self.links]}

    def summary_lines(self, full: bool = True) -> list[str]:
        """What `plan` prints; full=False writes pipelines as ranges and long staggers by their
        ends and step (testbed.spec.ranges)."""
        it = (f"compute-only iteration {self.iteration_ms:.1f} ms" if self.iteration_ms
              is not None else "iteration time unknown (measured mode)")
        out = [f"WAN sharing: {self.sharing} ({it}; window {self.window_bytes / 1e3:.1f} KB per "
               "connection)"]
        used = self.used_links()
        if not used:
            out.append("  no stage boundary crosses the WAN")
        temporal = self.sharing == "temporal"
        for link in used:
            busy = "" if link.busy_fraction is None else f", {link.busy_fraction:.0%} of the iteration"
            what = (f"busy {link.busy_ms:.1f} ms{busy}" if temporal else
                    f"concurrent, no slots (one at a time would take {link.busy_ms:.1f} ms{busy})")
            out.append(f"  {link.direction} ({link.rate_mbit:g} Mbit/s, "
                       f"{link.delay_ms:g} ms): {link.slots_per_iteration} transfers/iteration, "
                       + what)
            for c in link.crossings:
                limit = "window-limited" if c.window_limited else "rate-limited"
                via = "" if len(c.path) == 2 else f" via {', '.join(c.path[1:-1])}"
                stages = (f"s{c.boundary}->s{c.boundary + 1}" if c.kind == "activation"
                          else f"s{c.boundary + 1}->s{c.boundary}")
                pipes = ",".join(map(str, c.pipelines)) if full else number_ranges(c.pipelines)
                line = (f"    {c.kind} {stages} {LinkDir(c.src_dc, c.dst_dc)}{via}, pipelines "
                        f"{pipes}: {c.payload_bytes} B "
                        f"({c.wire_bytes} B on the wire), K={c.connections}, ")
                if temporal:
                    line += (f"slot {c.slot_ms:.2f} ms ({limit}: {c.window_limit_mbit:.1f} "
                             f"Mbit/s window vs {c.path_rate_mbit:g} Mbit/s), "
                             f"{c.slots_per_iteration} slots, stagger {_stagger(c, full)}")
                else:
                    line += (f"{c.slot_ms:.2f} ms alone ({limit}: {c.window_limit_mbit:.1f} "
                             f"Mbit/s window vs {c.path_rate_mbit:g} Mbit/s), "
                             f"{c.slots_per_iteration} transfers")
                out.append(line)
            if link.messages:
                first = _first_slots(link, MAX_ORDER_SHOWN)
                shown = " ".join(s.label for s in first)
                more = (f" ... (+{link.slots_per_iteration - len(first)})"
                        if link.slots_per_iteration > len(first) else "")
                out.append(f"    order: {shown}{more}")
        return out


def _stagger(c: Crossing, full: bool) -> str:
    """A crossing's staggers: every one, or (full=False, over 4) the first, last and step."""
    if full or len(c.stagger_ms) <= 4:
        return ", ".join(f"{x:.2f}" for x in c.stagger_ms) + " ms"
    return (f"{c.stagger_ms[0]:.2f}-{c.stagger_ms[-1]:.2f} ms, {c.slot_ms:.2f} ms apart "
            f"({len(c.stagger_ms)} pipelines)")


def _first_slots(link: LinkPlan, n: int) -> list[Slot]:
    """The first n slots of link's order, without expanding the rest."""
    out: list[Slot] = []
    for i, m in link.messages:
        c = link.crossings[i]
        out += [Slot(boundary=c.boundary, kind=c.kind, micro_batch=m, pipeline=p,
                     slot_ms=c.slot_ms) for p in c.pipelines[:n - len(out)]]
        if len(out) >= n:
            break
    return out


def message_payload_bytes(cfg: "TrainConfig", scale: float) -> list[int]:
    """Per stage boundary s -> s+1: bytes of one activation (and of its gradient)."""
    if cfg.compute == "profile" and cfg.profile is not None:
        from testbed.rules.costs import stage_costs
        costs = stage_costs(cfg.profile, cfg.stages, cfg.tp)
        return [int(costs[s].activation_bytes / scale) for s in range(cfg.stages - 1)]
    m = cfg.model
    return [cfg.micro_batch_size * m.seq_len * m.n_embd * FLOAT32_BYTES] * (cfg.stages - 1)


def wire_bytes(payload_bytes: int) -> int:
    return round(payload_bytes * WIRE_BYTES_PER_PAYLOAD_BYTE)


def slot_ms(wire: int, rate_mbit: float, connections: int, window: float,
            rtt_ms: float) -> tuple[float, float, bool]:
    """(slot_ms, window limit in wire Mbit/s, window_limited) for one transfer of `wire` bytes."""
    window_mbit = (connections * window * WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / (rtt_ms / 1e3) / 1e6
                   if rtt_ms > 0 else float("inf"))
    limited = window_mbit < rate_mbit
    return wire * 8 / (min(rate_mbit, window_mbit) * 1e3), window_mbit, limited


def _compute_timeline(cfg: "TrainConfig") -> tuple[dict[tuple[str, int, int], float],
                                                    float | None]:
    """(end time of each (F|B, stage, mb) in the compute-only iteration, iteration ms or None)."""
    table = schedule_table(cfg.schedule, cfg.stages, cfg.micro_batches)
    if cfg.compute == "profile" and cfg.profile is not None:
        from testbed.rules.costs import stage_costs
        costs = stage_costs(cfg.profile, cfg.stages, cfg.tp)
        sim = compute_only(table, [c.forward_ms for c in costs], [c.backward_ms for c in costs])
        iteration: float | None = sim.window_ms
    else:
        sim = compute_only(table, MEASURED_FORWARD_UNITS, MEASURED_BACKWARD_UNITS)
        iteration = None
    ends = {}
    for op in sim.ops:
        if op.action != "OPT":
            ends[(op.action[0], op.stage, int(op.action[1:]))] = op.end_ms
    return ends, iteration


@dataclass(frozen=True, kw_only=True, slots=True)
class TemporalPlan:
    """The feature's plan (testbed.features.temporal.feature): a temporal system's slot plan."""

    name: ClassVar[str] = "temporal"
    slots: SlotPlan

    def to_dict(self) -> dict:
        return self.slots.to_dict()


def plan_slots(scenario: "Scenario", cfg: "TrainConfig", placement: "Placement",
               system: "System") -> SlotPlan:
    """The per-link plan (module docstring) of `system` running cfg with `placement`."""
    paths = {(p.src, p.dst): p for p in dc_paths(scenario)}
    window = window_bytes(scenario.scale)
    payloads = message_payload_bytes(cfg, scenario.scale)
    ends, iteration = _compute_timeline(cfg)
    M = cfg.micro_batches
    # (first link, boundary, kind, src, dst) -> pipelines
    groups: dict[tuple[tuple[str, str], int, str, str, str], list[int]] = {}
    for s, row in enumerate(placement.boundaries()):
        for r, (a, b) in enumerate(row):
            if a == b:
                continue
            for kind, src, dst in (("activation", a, b), ("gradient", b, a)):
                dcs = paths[(src, dst)].dcs
                groups.setdefault(((dcs[0], dcs[1]), s, kind, src, dst), []).append(r)
    links = []
    for wl in scenario.wan:
        for src_l, dst_l in ((wl.a, wl.b), (wl.b, wl.a)):
            crossings = []
            for (first, s, kind, src, dst), pipes in sorted(
                    groups.items(), key=lambda kv: (kv[0][1], kv[0][2] != "activation",
                                                    kv[0][3], kv[0][4])):
                if first != (src_l, dst_l):
                    continue
                # K configured, but a message uses only as many stripes as testbed.rules.stripes cuts
                k = stripe_count(payloads[s], connections_for(scenario, system, src, dst))
                rtt = path_rtt_ms(scenario, src, dst)
                rate = path_rate_mbit(scenario, src, dst)
                wire = wire_bytes(payloads[s])
                ms, window_mbit, limited = slot_ms(wire, rate, k, window, rtt)
                crossings.append(Crossing(
                    boundary=s, kind=kind, src_dc=src, dst_dc=dst, path=paths[(src, dst)].dcs,
                    pipelines=tuple(pipes), connections=k, payload_bytes=payloads[s],
                    wire_bytes=wire, rtt_ms=rtt, path_rate_mbit=rate,
                    window_limit_mbit=window_mbit, slot_ms=ms, window_limited=limited,
                    slots_per_iteration=len(pipes) * M,
                    stagger_ms=tuple(d * ms for d in range(len(pipes)))))
            messages = _messages(crossings, ends, M) if system.temporal else ()
            n_slots = sum(c.slots_per_iteration for c in crossings)
            busy = sum(c.slot_ms * c.slots_per_iteration for c in crossings)
            links.append(LinkPlan(
                src_dc=src_l, dst_dc=dst_l, rate_mbit=wl.rate_mbit, delay_ms=wl.delay_ms,
                sharing=system.wan_sharing, crossings=tuple(crossings), messages=messages,
                slots_per_iteration=n_slots, busy_ms=busy,
                busy_fraction=None if not iteration else busy / iteration))
    return SlotPlan(system=system.name, sharing=system.wan_sharing, compute=cfg.compute,
                    micro_batches=M, window_bytes=window, iteration_ms=iteration,
                    links=tuple(links))


def _messages(crossings: list[Crossing], ends: dict[tuple[str, int, int], float],
              micro_batches: int) -> tuple[tuple[int, int], ...]:
    """(crossing index, micro-batch) of every message, in the order the schedule produces them
    (an activation of boundary s when F(s, m) ends, a gradient when B(s+1, m) ends; ties:
    boundary, activations first). LinkPlan.order expands each round-robin over its pipelines."""
    events = []
    for i, c in enumerate(crossings):
        for m in range(micro_batches):
            ready = (ends[("F", c.boundary, m)] if c.kind == "activation"
                     else ends[("B", c.boundary + 1, m)])
            events.append((ready, c.boundary, c.kind != "activation", m, i))
    return tuple((i, m) for _, _, _, m, i in sorted(events))
