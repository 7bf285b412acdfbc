"""The model's prediction for one scenario and one system: iteration time, bubbles, GPU and WAN
utilization. Pure: no kernel, no root, no torch (testbed.spec.training and testbed.spec.profiles are plain
Python).

One job: build testbed.rules.pipeline's inputs from what the testbed would run, simulate, and read the
figures off with the same definitions the emulated run's metrics use (testbed.rules.figures: the
simulated ops become spans, so iteration walls, utilization and bubbles are computed by the
same code). Configured, real-time values throughout (time_scale does not enter).

Inputs, each from the module that decides it in a run:
- placement: testbed.plans.placement (the system's policy); schedule rows: testbed.rules.schedule;
- compute: the profile's forward/backward per stage (testbed.spec.profiles.stage_costs) and the
  estimated optimizer step (testbed.spec.profiles.optimizer_ms); profile mode only;
- a message: the profile's activation bytes / scale (testbed.features.temporal.plan.message_payload_bytes);
  inside a DC, its wire bytes at the DC's host-link rate (no time if the links are unshaped);
  over the WAN, its route's channel (`channel_spec`, testbed.rules.tcpchannel): the K
  connections (testbed.plans.systems.connections_for) over the routed path (testbed.plans.routing)
  at the lower of the path's rate and the sending DC's host-link rate, window =
  testbed.plans.systems.window_bytes(scale), persistent across the route's messages (a message
  waits for the windows its predecessors hold; after an idle gap past the RTO, RTT + Linux's
  200 ms minimum, the windows halve per RTO as Linux's tcp_cwnd_restart, unless the scenario
  sets tcp_slow_start_after_idle: false, as WAN-tuned hosts do), and the path's loss_pct as
  random loss (the congestion control's loss response, the expected resend time:
  testbed.rules.tcploss); under temporal slots the channel is timed from the slot's start;
- the all-reduce: a ring (reduce-scatter, all-gather), 2 (D-1) steps of a 1/D chunk to the next replica, each step
  as long as its slowest hop: inside a DC the chunk's wire bytes at the host-link rate; between
  DCs testbed.predict.transfer over one connection (gloo's pair), in slow start for the first step (the
  connection sat idle since the last iteration's all-reduce), with the path's loss as above;
  a hierarchical all-reduce (testbed.plans.allreduce) is each DC's ring inside it, then the
  leaders' ring across (2 (G-1) steps of a 1/G chunk, each hop over the plan's K connections),
  then the broadcast inside (ceil(log2 n) rounds of the whole buffer at the host-link rate);
- WAN sharing: the system's (concurrent: fair, or first come, first served on a link where every
  message is one round trip's burst, testbed.rules.pipeline; temporal: one message at a time per link). The
  stages' all-reduces over the WAN share their links too, as a bound: a stage's all-reduce lasts
  at least all stages' all-reduce bits over the busiest WAN link its ring uses / that link's
  rate (as if all ran at once: in 1F1B the stages finish their backward passes close together,
  the first stage last). They do not contend with the pipeline's messages.
- WAN queues: where the scenario sets a link's `queue`, a burst past it drops and is sent
  again a round trip later (testbed.rules.pipeline); the default queue (2 x BDP) is taken to hold
  every burst. Folded, a train's members meet the queue as simulated messages do
  (testbed.rules.serial_links): on FIFO trains each member's burst (between its head's and its
  tail's last, by its place) behind the backlog loses what does not fit and resends it a
  round trip later; under temporal slots each member's slot resends what its one burst lost,
  as its head's does. Checked against every replica simulated (tests/test_folding.py, queues
  of 0.01-2x the summed burst): of 260 generated predictions 257 within 2%, the worst
  +6.7% (an atlas scenario at 0.3x) and -2.8%, but hypothesis found an atlas one at +13.5%;
  so where a folded prediction drops, up to UNFOLD_DROPS_UP_TO replicas every replica is
  simulated instead (every paper scenario: exact), and above it `predict` says the fold is
  approximate. gpt7b_2dc's multitcp with
  its 2 x BDP queue set 7.14 s folded against 7.03 s unfolded (+1.6%; before the members met
  the queue 8.33 s against 7.16 s, +16.3%), and `predict` says so where a folded prediction
  drops. A loss under a byte is none (`SerialLinks.overflow`): with millions of drops an
  iteration, rounding alone moved the unfolded figure 2% (7.16 s or 7.01 s by the order of
  one sum).
Above FOLD_ABOVE_REPLICAS replicas, each group of replicas whose stages sit in the same DCs is
folded (testbed.rules.pipeline's trains, `simulated_for`): on fair-shared links as its first
replica and one with a weight for the rest (exact); where its messages meet links that serve one
message at a time, as its first replica and the ends of TRAIN_SEGMENTS even parts of the rest,
the members between two of them spaced evenly. Against every replica simulated
(tests/test_folding.py, bench/bench_folding.py, generated scenarios of 9-64 replicas): within
1.2% with WAN-tuned hosts (about 400 predictions), within 6.1% with slow start after idle (each
member's slots warm or slow as its own idle time says, its spread between the simulated ones
taken as even); gpt160b_5dc's atlas (then 500 replicas of one GPU) 69.168 s folded, 69.157 s
unfolded. Under temporal
slots, where members wait for their own acknowledgements unlike their head (the simulation
says so, `trains_unalike`), the fold is refined, twice the parts each time, until two in turn
agree within FOLD_AGREE, at most every replica simulated (gpt160b_5dc's temporal: 16 parts,
30,046 s against 30,019 s unfolded, 12 s against 90 s).
Past SIMULATE_ALL_UP_TO iterations, a steady state stands for the rest (testbed.predict.steady).
Not modelled (testbed.predict.unmodelled names what a scenario sets of them): CPU contention of
the emulation, the delay line's own lateness, a queue on fair-shared links and the window
reduction inside a temporal slot, jitter, the temporal arbiter's grant latency, faults, cross
traffic, prefill (BubbleTea) traffic slowing training's messages on the host links (its KV transfers are
timed on their own: testbed.predict.bubbletea).
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from testbed.rules.pipeline import PipelineModel, Route, SimResult
from testbed.predict.steady import Steady, simulate_steady
from testbed.predict.transfer import PathSpec, one_round, transfer_ms
from testbed.plans.allreduce import Hierarchy, broadcast_rounds, hierarchy
from testbed.plans.placement import place_for_system
from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE, message_payload_bytes
from testbed.plans.systems import connections_for, path_between, path_rate_mbit, path_rtt_ms, \
    window_bytes
from testbed.rules.schedule import schedule_table
from testbed.rules.stripes import stripe_count
from testbed.rules.tcpchannel import Channel, ChannelSpec
from testbed.rules.tcploss import RTO_MIN_MS, path_loss
from testbed.spec.links import LinkDir, hops

if TYPE_CHECKING:
    from testbed.plans.placement import Placement
    from testbed.spec.scenario import Scenario
    from testbed.spec.systems import System
    from testbed.spec.training import TrainConfig

FOLD_ABOVE_REPLICAS = 8     # more replicas than this: alike ones are folded
TRAIN_SEGMENTS = 4          # a folded train: its first replica and the ends of this many parts
FOLD_AGREE = 0.005          # where trains are unalike: refined until two folds agree this well
UNFOLD_DROPS_UP_TO = 256    # a folded prediction whose queues drop: every replica up to this
WIRE_PACKET_BYTES = 1514     # a full-size packet on the wire (1448 payload + headers)


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    system: str
    iteration_time_s: float
    bubble_fraction: float
    gpu_utilization: float
    pipeline_bubble_fraction: float
    per_stage_bubble: list[float]
    wan_utilization: dict[str, float]         # "a->b" (str(LinkDir)) -> busy share (training bytes)
    allreduce_ms: list[float]
    iterations: int
    # "a->b" -> full-size packets its queue drops per iteration (bursts past the queue; each
    # sent again a round trip later); links that drop none are left out
    wan_drop_packets: dict[str, float] = field(default_factory=dict)
    simulated_replicas: int = 0     # replicas simulated (fewer: alike ones folded)
    simulated_iterations: int = 0   # iterations simulated (fewer: a steady state repeats)
    steady: str | None = None       # how the iterations not simulated were taken (or None)
    bubbletea: dict[str, Any] | None = None   # +bubbletea systems: testbed.predict.bubbletea's figures

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def channel_spec(scenario: "Scenario", src: str, dst: str, connections: int) -> ChannelSpec:
    """The `connections` of a transfer src -> dst between DCs (testbed.rules.tcpchannel): the
    path's bottleneck (at most the sending DC's host link), delay, loss over its links, the
    hosts' window and TCP settings."""
    path = path_between(scenario, src, dst)
    rate = path_rate_mbit(scenario, src, dst)
    host_rate = {dc.name: dc.rate_mbit for dc in scenario.dcs}
    if host_rate[src] is not None:
        rate = min(rate, host_rate[src])
    loss_pct = {d: w.loss_pct for w in scenario.wan for d in w.directions}
    rtt = path_rtt_ms(scenario, src, dst)
    return ChannelSpec(
        rate_mbit=rate, one_way_ms=path.delay_ms, rtt_ms=rtt,
        window_bytes=window_bytes(scenario.scale),
        connections=connections,
        loss=path_loss([loss_pct[d] for d in hops(path.dcs)]),
        congestion_control=scenario.congestion_control,
        slow_start_after_idle=scenario.tcp_slow_start_after_idle, rto_ms=rtt + RTO_MIN_MS)


def _route(scenario: "Scenario", system: "System", src: str, dst: str, payload: int) -> Route:
    wire = payload * WIRE_BYTES_PER_PAYLOAD_BYTE
    host_rate = {dc.name: dc.rate_mbit for dc in scenario.dcs}
    if src == dst:
        rate = host_rate[src]
        return Route(links=(), solo_ms=0.0 if rate is None else wire * 8 / (rate * 1e3),
                     wire_bytes=wire)
    ch = channel_spec(scenario, src, dst, connections_for(scenario, system, src, dst))
    window = min(ch.window_bytes, ch.loss_window_bytes)
    spec = PathSpec(rate_mbit=ch.rate_mbit, one_way_ms=ch.one_way_ms, rtt_ms=ch.rtt_ms,
                    window_bytes=window, connections=ch.connections)
    k = stripe_count(payload, spec.connections) if payload > 0 else 1
    return Route(links=tuple(hops(path_between(scenario, src, dst).dcs)),
                 solo_ms=Channel(ch).send(0.0, payload) if ch.loss else transfer_ms(payload, spec),
                 one_way_ms=ch.one_way_ms, wire_bytes=wire,
                 solo_idle_ms=(Channel(ch, warm=False).send(0.0, payload) if ch.loss
                               else transfer_ms(payload, spec, slow_start=True))
                 if scenario.tcp_slow_start_after_idle else None,
                 rto_ms=ch.rto_ms, burst=one_round(payload, spec),
                 burst_bytes=k * min(payload / k, window) * WIRE_BYTES_PER_PAYLOAD_BYTE,
                 rtt_ms=ch.rtt_ms, payload_bytes=payload, channel=ch)


def allreduce_ms(buffer_bytes: int, dcs: tuple[str, ...], scenario: "Scenario",
                 hier: Hierarchy | None = None) -> float:
    """The all-reduce of buffer_bytes over replicas in dcs (module docstring): one ring, or
    hier's hierarchical plan."""
    if hier is not None:
        return _hierarchical_ms(buffer_bytes, hier, scenario)
    return _ring_ms(buffer_bytes, dcs, scenario)


def _hierarchical_ms(buffer_bytes: int, hier: Hierarchy, scenario: "Scenario") -> float:
    """Each DC's ring, the leaders' ring across over hier.connections, each DC's broadcast."""
    host_rate = {dc.name: dc.rate_mbit for dc in scenario.dcs}
    inside = max((_ring_ms(buffer_bytes, (dc,) * len(g), scenario)
                  for dc, g in zip(hier.dcs, hier.groups)), default=0.0)
    across = _ring_ms(buffer_bytes, hier.dcs, scenario, hier.connections)
    bcast = max((broadcast_rounds(len(g)) * buffer_bytes * WIRE_BYTES_PER_PAYLOAD_BYTE * 8
                 / (host_rate[dc] * 1e3) for dc, g in zip(hier.dcs, hier.groups)
                 if host_rate[dc] is not None), default=0.0)
    return inside + across + bcast


def _ring_ms(buffer_bytes: int, dcs: tuple[str, ...], scenario: "Scenario",
             connections: int = 1) -> float:
    """The ring all-reduce of buffer_bytes over ranks in dcs, `connections` a hop between DCs
    (module docstring)."""
    D = len(dcs)
    if D < 2:
        return 0.0
    chunk = -(-buffer_bytes // D)
    host_rate = {dc.name: dc.rate_mbit for dc in scenario.dcs}

    def hop_ms(a: str, b: str, first: bool) -> float:
        if a == b:
            rate = host_rate[a]
            return 0.0 if rate is None else chunk * WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / (rate * 1e3)
        ch = channel_spec(scenario, a, b, connections=connections)
        if ch.loss:             # gloo's connections, losing packets
            return Channel(ch, warm=not first).send(0.0, chunk)
        spec = PathSpec(rate_mbit=ch.rate_mbit, one_way_ms=ch.one_way_ms, rtt_ms=ch.rtt_ms,
                        window_bytes=ch.window_bytes, connections=connections)
        return transfer_ms(chunk, spec, slow_start=first)

    ring = {(dcs[r], dcs[(r + 1) % D]) for r in range(D)}      # every step: the same hops
    first = max(hop_ms(a, b, scenario.tcp_slow_start_after_idle) for a, b in ring)
    later = max(hop_ms(a, b, False) for a, b in ring)
    return first + (2 * (D - 1) - 1) * later


def replica_classes(stage_dcs: tuple[tuple[str, ...], ...]) -> list[tuple[int, int]]:
    """(first replica, how many) of each group of replicas whose stages sit in the same DCs
    (so their messages take the same routes and they behave alike), in replica order."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for r in range(len(stage_dcs[0])):
        groups.setdefault(tuple(row[r] for row in stage_dcs), []).append(r)
    return [(rs[0], len(rs)) for rs in groups.values()]


class Simulated(NamedTuple):
    """One replica the model simulates: replicas first .. first + n - 1 (alike ones); head: the
    simulated replica standing for the group's first when this one stands for the rest."""
    first: int
    n: int
    head: int | None = None


def simulated_replicas(placement: "Placement", segments: int = 1) -> list[Simulated]:
    """The replicas the model simulates: above FOLD_ABOVE_REPLICAS each group of alike ones as
    its first and, behind it, the ends of `segments` even parts of the rest (each standing for
    its part: module docstring), else every one alone."""
    if placement.replicas <= FOLD_ABOVE_REPLICAS:
        return [Simulated(r, 1) for r in range(placement.replicas)]
    out: list[Simulated] = []
    for first, n in replica_classes(placement.stage_dcs):
        out.append(Simulated(first, 1))
        at = 0                                  # the last simulated member's place in the group
        for end in _segment_ends(n, segments):
            out.append(Simulated(first + at + 1, end - at, head=len(out) - 1))
            at = end
    return out


def simulated_for(scenario: "Scenario", cfg: "TrainConfig", system: "System",
                  placement: "Placement") -> list[Simulated]:
    """simulated_replicas for this system: a group whose messages meet links serving one
    message at a time (temporal sharing, or bursts of one round trip) is a train there, its
    members spaced unevenly, so it is simulated in TRAIN_SEGMENTS parts; on fair-shared links
    a weight is exact, so head and one more suffice."""
    classes = simulated_replicas(placement)
    if len(classes) == placement.replicas:
        return classes
    if system.wan_sharing == "temporal":
        return simulated_replicas(placement, TRAIN_SEGMENTS)
    payloads = message_payload_bytes(cfg, scenario.scale)
    for s in range(cfg.stages - 1):
        for first, _, _ in classes:
            a, b = placement.stage_dcs[s][first], placement.stage_dcs[s + 1][first]
            if a != b and (_route(scenario, system, a, b, payloads[s]).burst
                           or _route(scenario, system, b, a, payloads[s]).burst):
                return simulated_replicas(placement, TRAIN_SEGMENTS)
    return classes


def _segment_ends(n: int, segments: int) -> list[int]:
    """The places (1 .. n - 1) in a group of n alike replicas that are simulated after its
    first: the ends of up to `segments` even parts."""
    k = min(segments, n - 1)
    return sorted({round(j * (n - 1) / k) for j in range(1, k + 1)}) if k > 0 else []


def build(scenario: "Scenario", cfg: "TrainConfig", system: "System",
          placement: "Placement | None" = None,
          classes: list[Simulated] | None = None) -> PipelineModel:
    """testbed.rules.pipeline's inputs for `system` running cfg on scenario (module docstring);
    placement: the system's (testbed.plans.placement), classes: its simulated replicas
    (`simulated_for`), each computed here when not given."""
    from testbed.rules.costs import stage_costs
    if cfg.compute != "profile" or cfg.profile is None:
        raise ValueError("the model needs compute: profile (measured op times are not known "
                         "before a run)")
    if placement is None:
        placement = place_for_system(scenario, cfg, system)
    P = cfg.stages
    costs = stage_costs(cfg.profile, P, cfg.tp)
    buffers = [int(c.rail_gradient_bytes / scenario.scale) for c in costs]   # one rail each
    payloads = message_payload_bytes(cfg, scenario.scale)
    if classes is None:
        classes = simulated_for(scenario, cfg, system, placement)
    fwd, bwd = {}, {}
    for s in range(P - 1):
        for c, (r, _, _) in enumerate(classes):
            a, b = placement.stage_dcs[s][r], placement.stage_dcs[s + 1][r]
            fwd[(s, c)] = _route(scenario, system, a, b, payloads[s])
            bwd[(s, c)] = _route(scenario, system, b, a, payloads[s])
    rates = {d: w.rate_mbit for w in scenario.wan for d in w.directions}
    queues = {d: float(w.queue_bytes) for w in scenario.wan for d in w.directions
              if w.queue_given}
    hier = [hierarchy(row, lambda a, b: connections_for(scenario, system, a, b))
            if system.allreduce == "hierarchical" else None for row in placement.stage_dcs]
    stage_bits = _allreduce_wan_bits(scenario, placement, [b * cfg.tp for b in buffers], hier)
    link_bits: dict[LinkDir, float] = {}
    for bits in stage_bits:
        for link, b in bits.items():
            link_bits[link] = link_bits.get(link, 0.0) + b
    # the stages' WAN all-reduces share their links: each lasts at least as long as all of
    # them take over the busiest link it uses (module docstring)
    allreduce = [max(allreduce_ms(buffers[s], placement.stage_dcs[s], scenario, hier[s]),
                     max((link_bits[k] / (rates[k] * 1e3) for k in stage_bits[s]), default=0.0))
                 for s in range(P)]
    return PipelineModel(table=schedule_table(cfg.schedule, P, cfg.micro_batches),
                         replicas=len(classes), weights=[c.n for c in classes],
                         heads=[c.head for c in classes],
                         forward_ms=[c.forward_ms for c in costs],
                         backward_ms=[c.backward_ms for c in costs],
                         opt_ms=[c.optimizer_ms for c in costs], allreduce_ms=allreduce,
                         forward_routes=fwd, backward_routes=bwd, link_rate_mbit=rates,
                         link_queue_bytes=queues,
                         sharing=system.wan_sharing,
                         allreduce_link_bits=link_bits)


def _allreduce_wan_bits(scenario: "Scenario", placement: "Placement", buffers: list[int],
                        hier: list[Hierarchy | None]) -> list[dict[LinkDir, float]]:
    """Per stage, the wire bits per iteration its all-reduce puts on each WAN link direction:
    a ring's 2 (D-1)/D of the buffer from each replica to the next, where they differ in DC; a
    hierarchical one's 2 (G-1)/G from each DC's leader to the next DC's (as
    testbed.analysis.linkuse counts a run's)."""
    stages: list[dict[LinkDir, float]] = []
    for s, buffer in enumerate(buffers):
        out: dict[LinkDir, float] = {}
        stages.append(out)
        dcs = placement.stage_dcs[s] if hier[s] is None else hier[s].dcs
        D = len(dcs)
        for r in range(D):
            a, b = dcs[r], dcs[(r + 1) % D]
            if D < 2 or a == b:
                continue
            for key in hops(path_between(scenario, a, b).dcs):
                out[key] = out.get(key, 0.0) + (buffer * 2 * (D - 1) / D
                                                * WIRE_BYTES_PER_PAYLOAD_BYTE * 8)
    return stages


def _ms_per_iteration(result: SimResult, steady: Steady) -> float:
    """The simulated run's length over the iterations it simulated."""
    return max((o.end_ms for o in result.ops), default=0.0) / max(1, steady.simulated)


def as_spans(result: SimResult) -> list[dict]:
    """The simulated ops as the workers' span records (times in ns)."""
    return [{"name": o.name, "stage": o.stage, "replica": o.replica, "host": f"s{o.stage}r"
             f"{o.replica}", "dc": "", "iteration": o.iteration, "microbatch": o.microbatch,
             "t_start_ns": round(o.start_ms * 1e6), "t_end_ns": round(o.end_ms * 1e6)}
            for o in result.ops if o.name != "ALLREDUCE"]


def predict(scenario: "Scenario", cfg: "TrainConfig", system: "System",
            iterations: int | None = None,
            progress: Callable[[str], None] | None = None,
            simulated: dict[bytes, tuple[SimResult, Steady]] | None = None) -> Prediction:
    """Simulate `iterations` (default: the run's; past a steady state, testbed.predict.steady)
    and read the figures as a run's metrics; progress(text): told what is being simulated.
    simulated: the simulations already made, by model (`simulate_once`), shared by the caller's
    predictions (whatif's request-rate rows change BubbleTea's requests, not the training)."""
    from testbed.rules.figures import metrics_from_records
    from testbed.rules.bubbles import MIN_HISTORY, WARMUP_ITERATIONS
    n = max(3, iterations or cfg.iterations)
    if system.fill_bubbles:   # BubbleTea's window: from its first notices, two iterations or more
        n = max(n, WARMUP_ITERATIONS + MIN_HISTORY + 2)
    placement = place_for_system(scenario, cfg, system)
    classes = simulated_for(scenario, cfg, system, placement)
    model = build(scenario, cfg, system, placement, classes)
    result, steady = simulate_once(model, n, progress, simulated)
    segments = TRAIN_SEGMENTS
    while result.trains_unalike and model.replicas < placement.replicas:
        # members wait unlike their head (testbed.rules.pipeline): the fold in twice the parts,
        # until two in turn agree within FOLD_AGREE (or every replica is simulated)
        segments *= 2
        finer = build(scenario, cfg, system, placement,
                      simulated_replicas(placement, segments))
        finer_result, finer_steady = simulate_once(finer, n, progress, simulated)
        agree = math.isclose(_ms_per_iteration(finer_result, finer_steady),
                             _ms_per_iteration(result, steady), rel_tol=FOLD_AGREE)
        model, result, steady = finer, finer_result, finer_steady
        if agree:
            break
    if (model.replicas < placement.replicas <= UNFOLD_DROPS_UP_TO
            and any(sum(d.values()) > 0 for d in result.link_drops.values())):
        # queues drop: the fold is approximate there (module docstring), so every replica
        classes = [Simulated(r, 1) for r in range(placement.replicas)]
        model = build(scenario, cfg, system, placement, classes)
        result, steady = simulate_once(model, n, progress, simulated)
    plan = {"config": dict(cfg.to_dict(), replicas=model.replicas), "workers": [
        {"stage": s, "replica": r, "host": f"s{s}r{r}", "dc": ""}
        for s in range(cfg.stages) for r in range(model.replicas)]}
    weights = steady.weights or None
    m = metrics_from_records(as_spans(result), [], plan, weights)
    replica_weights = list(model.weights or [1] * model.replicas)
    total = sum(replica_weights)
    util = {(st["stage"], st["replica"]): st["gpu_utilization"] for st in m["stages"]}
    per_stage_util = [sum(replica_weights[c] * util[(s, c)] for c in range(model.replicas))
                      / total for s in range(cfg.stages)]
    gpu_util = sum(per_stage_util) / cfg.stages
    used = m["iterations_averaged"]
    counted = {i: (weights or {}).get(i, 1.0) for i in used}   # iterations each stands for
    n_used = sum(counted.values())
    window_ms = m["iteration_time_s"] * 1e3 * n_used

    def per_iteration(by_it: dict[int, float]) -> float:
        return sum(w * by_it.get(i, 0.0) for i, w in counted.items())

    wan = {str(link): per_iteration(b) / (model.link_rate_mbit[link] * 1e3 * window_ms)
           for link, b in sorted(result.link_bits.items())}
    drops = {str(link): per_iteration(d) / n_used / WIRE_PACKET_BYTES
             for link, d in sorted(result.link_drops.items()) if per_iteration(d) > 0}
    return Prediction(system=system.name, iteration_time_s=m["iteration_time_s"],
                      bubble_fraction=1.0 - gpu_util, gpu_utilization=gpu_util,
                      pipeline_bubble_fraction=m["pipeline_bubble_fraction"],
                      per_stage_bubble=[1.0 - u for u in per_stage_util],
                      wan_utilization=wan, allreduce_ms=list(model.allreduce_ms),
                      iterations=n, wan_drop_packets=drops,
                      simulated_replicas=model.replicas,
                      simulated_iterations=steady.simulated, steady=steady.line(),
                      bubbletea=_bubbletea(scenario, cfg, system, placement, classes, result,
                                           model, steady.simulated)
                      if system.fill_bubbles else None)


SIMULATED_KEPT = 8      # simulations a `simulated` cache keeps (the latest)


def simulate_once(model: PipelineModel, n: int, progress: Callable[[str], None] | None,
                  simulated: dict[bytes, tuple[SimResult, Steady]] | None
                  ) -> tuple[SimResult, Steady]:
    """simulate_steady(model, n), or what it gave for an equal model before (the simulation
    is a pure function of the model: the same figures, not recomputed). The cache is keyed by
    the pickled model and n, so only an equal model hits; the caller's results are read, never
    changed."""
    if simulated is None:
        return simulate_steady(model, n, progress)
    key = pickle.dumps((model, n))
    if key not in simulated:
        while len(simulated) >= SIMULATED_KEPT:
            del simulated[next(iter(simulated))]        # the oldest
        simulated[key] = simulate_steady(model, n, progress)
    return simulated[key]


def group_of(classes: list[Simulated], c: int) -> int:
    """How many replicas simulated replica c and those before it in its group stand for."""
    n = 0
    while c is not None:
        n += classes[c].n
        c = classes[c].head
    return n


def _bubbletea(scenario: "Scenario", cfg: "TrainConfig", system: "System",
               placement: "Placement", classes: list[Simulated],
               result: SimResult, model: PipelineModel, simulated: int) -> dict[str, Any]:
    """testbed.predict.bubbletea's figures for the simulated run under the load a run would replay (same
    requests, same DC split), with the KV messages to each DC's decode hosts and training's
    slowdown (the run simulated again with the prefills' cost to its ops: `_slowdown`).
    Unfolded, every GPU is its own host; folded (above FOLD_ABOVE_REPLICAS), each group's last
    simulated replica stands for its alike GPUs with their share of the load
    (testbed.predict.bubbletea.thin_load), and its figures count that many times; its DC's decode
    hosts are cut to the same share (at least one), so that each sees a real one's load."""
    from testbed.predict.bubbletea import (AFTER_PREFILL_MS, KvLinks, predict_bubbletea,
                                         thin_load, unthin)
    from testbed.features.bubbletea.plan import check, hosts_by_dc
    bt = check(scenario, placement, system.name)
    folded = any(c.n > 1 for c in classes)
    # folded, a group's last replica stands for all of it (its first is one GPU of hundreds;
    # the others are the last's timeline at a spacing)
    heads = {c.head for c in classes if c.head is not None}
    group = [group_of(classes, c) for c in range(len(classes))]
    spans, host_dc, weight = [], {}, {}
    for span in as_spans(result):
        s, c = span["stage"], span["replica"]
        if folded and c in heads:
            continue
        first = classes[c].first
        host = f"s{s}r{c}"
        spans.append(dict(span, host=host))
        host_dc[host] = placement.stage_dcs[s][first]
        weight[host] = group[c] if folded else 1
    gpus = {dc: len(hs) for dc, hs in hosts_by_dc(placement).items()}
    load, share = thin_load(bt, cfg.compute, host_dc, gpus)
    rows = schedule_table(cfg.schedule, cfg.stages, cfg.micro_batches)
    decode = {dc: scenario.decode_host_names(dc) for dc in gpus}
    decode = {dc: hs[:max(1, round(len(hs) * share))] for dc, hs in decode.items()}
    kv = KvLinks(decode=decode, rate_mbit={d.name: d.rate_mbit for d in scenario.dcs},
                 scale=scenario.scale)
    m, cost = predict_bubbletea(spans, host_dc, rows, placement.replicas > 1, bt, load, cfg.tp,
                                kv)
    m = unthin(m, weight, share)
    base = _window_wall_ms(as_spans(result))
    waits = {_op_key(k): ms for k, ms in cost.waits_ms.items()}
    after = dict(waits)
    for k in cost.after_prefill:
        after[_op_key(k)] = after.get(_op_key(k), 0.0) + AFTER_PREFILL_MS
    m["training_slowdown"] = _slowdown(model, simulated, waits, base)
    m["training_slowdown_h200"] = _slowdown(model, simulated, after, base)
    keep = ("gpu_utilization", "training_only", "prefill_share", "per_stage", "window_s",
            "iterations", "iteration_time_s", "training_slowdown", "training_slowdown_h200",
            "gpu_wait", "prefill", "kv", "unused_bubble", "load", "simulated")
    return {k: m[k] for k in keep}


def _op_key(k: tuple[str, int, str]) -> tuple[int, int, int, str]:
    """("s{stage}r{replica}", iteration, action) -> testbed.rules.pipeline's op_extra_ms key."""
    stage, replica = k[0][1:].split("r")
    return int(stage), int(replica), k[1], k[2]


def _window_wall_ms(spans: list[dict]) -> float:
    """The mean iteration wall (ms) over BubbleTea's window (testbed.rules.bubbletea_figures)."""
    from testbed.rules.bubbletea_figures import measured_window
    walls = measured_window(spans)[3]
    return sum(walls) / len(walls) / 1e6


def _slowdown(model: PipelineModel, iterations: int,
              extra: dict[tuple[int, int, int, str], float], base_ms: float) -> float:
    """Training's slowdown with `extra` ms on those ops (testbed.rules.pipeline's op_extra_ms):
    the mean iteration wall over BubbleTea's window, simulated again, against base_ms (the run
    without prefill; testbed.run.jobs' training_slowdown)."""
    if not extra:
        return 0.0
    from dataclasses import replace
    from testbed.rules.pipeline import simulate
    res = simulate(replace(model, op_extra_ms=extra), iterations)
    return _window_wall_ms(as_spans(res)) / base_ms - 1.0
