"""`time_scale: auto`, the measuring half (issue 25 part 1): the small model's CPU time per op
and stage measured here at start-up, the machine's cores, the plan's delay-line packets per second,
given to the pure chooser (testbed.predict.autoscale) for T; and after the run, the check of the
measured overruns against the bound, with the T that would have held.

Measured: each stage's forward, backward and optimizer step of the small model, one thread (as
every worker runs, trainer.worker), CPU time (thread_time), the largest of a few
after warm-up, and TCP's CPU per byte on loopback, the largest of a few (the median varied
twofold between runs on one machine: an optimizer step 0.66 ms on 2026-12-05 against 1.43 ms on
2026-12-03; CPU per byte 0.43 to 0.65 ns within an hour on 2026-12-06; the largest errs towards
a larger T).
BubbleTea scenarios: the prefill side's CPU per request, measured the same way (the small
inference model's prefill of a whole context and the decode of decode_tokens_max tokens after
it: an upper bound, every request at the longest the model takes), times the load's offered
requests per second (testbed.features.bubbletea.plan), is the prefill CPU per second.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Callable

from testbed.predict.autoscale import (LATENESS_BOUND_MS, OVERRUN_BOUND, Choice, Load, Op, choose,
                                     overlaps, would_hold)
from testbed.spec.timescale import MAX_TIME_SCALE, TimeScale
from testbed.rules.costs import stage_costs
from testbed.rules.pipeline import compute_only
from testbed.rules.schedule import schedule_table
from testbed.spec.errors import ScenarioError
from testbed.spec.scenario import MTU_BYTES, Scenario
from testbed.spec.training import TrainConfig

REPS, WARMUP = 5, 2
# The workers' bytes cross veths, a bridge and HTB, not loopback: the whole machine's CPU per
# byte over a veth pair between two namespaces with HTB on the sender, over loopback's, measured
# by bench/bench_path_cost.py (2.2 and 2.5 here on 2026-12-06: 1.155 and 1.192 ns against 0.466
# and 0.540). Loopback is what start-up measures (no root, no namespaces needed).
PATH_COST_FACTOR = 2.3


@contextmanager
def _one_torch_thread():
    """torch on one thread, as every worker and prefill server runs; restored after."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def measure_op_cpu_ms(cfg: TrainConfig) -> list[dict[str, float]]:
    """Per stage: {"F", "B", "OPT"} CPU ms of one micro-batch of the small model, here (the
    largest of REPS after WARMUP)."""
    import torch

    from testbed.host.gpt import GPTConfig
    from trainer.data import MarkovTokens
    from trainer.stage import build_stage
    from trainer.worker import make_optimizer
    from testbed.rules.stages import plan_stages

    with _one_torch_thread():
        out = []
        data = MarkovTokens(cfg.model.vocab_size, cfg.seed)
        x_ids, y = data.micro_batch(0, 0, cfg.micro_batch_size, cfg.model.seq_len)
        for plan in plan_stages(cfg.model.n_layer, cfg.stages):
            module = build_stage(GPTConfig.of(cfg.model), plan, cfg.seed)
            opt = make_optimizer(cfg, list(module.parameters()))
            f, b, o = [], [], []
            for i in range(WARMUP + REPS):
                x = x_ids if plan.first else torch.randn(
                    cfg.micro_batch_size, cfg.model.seq_len, cfg.model.n_embd, requires_grad=True)
                t0 = time.thread_time_ns()
                out_t = module(x, y if plan.last else None)
                t1 = time.thread_time_ns()
                if plan.last:
                    out_t.backward()
                else:
                    out_t.backward(torch.ones_like(out_t))
                t2 = time.thread_time_ns()
                opt.step()
                opt.zero_grad(set_to_none=True)
                t3 = time.thread_time_ns()
                if i >= WARMUP:
                    f.append((t1 - t0) / 1e6)
                    b.append((t2 - t1) / 1e6)
                    o.append((t3 - t2) / 1e6)
            out.append({"F": max(f), "B": max(b), "OPT": max(o)})
        return out


def measure_prefill_cpu_ms(model: dict, decode_tokens: int) -> float:
    """CPU ms of one request at the inference model's whole context: its prefill, and the
    decode of decode_tokens tokens after it (on a decode server), one thread, here."""
    import dataclasses

    from prefill.decoder import (InferenceConfig, build_model,
                                                generate_from_cache, prefill)
    names = {f.name for f in dataclasses.fields(InferenceConfig)}
    cfg = InferenceConfig(**{k: v for k, v in model.items() if k in names})
    net = build_model(cfg)
    decode = max(1, decode_tokens)
    prompt = [i % cfg.vocab_size for i in range(max(1, cfg.context - decode + 1))]
    with _one_torch_thread():
        took = []
        for i in range(WARMUP + REPS):
            t0 = time.thread_time_ns()
            kv, first = prefill(net, prompt)
            generate_from_cache(net, kv, first, decode)
            if i >= WARMUP:
                took.append((time.thread_time_ns() - t0) / 1e6)
        return max(took)


def offered_requests_per_s(scenario: Scenario, cfg: TrainConfig) -> float:
    """The BubbleTea load's requests per second at T = 1 (after its context rule)."""
    from testbed.features.bubbletea.plan import make_requests
    return float(make_requests(scenario.bubbletea, cfg.compute, {"all": 1})["offered_per_s"])


def measure_ns_per_byte(total: int = 64 << 20, chunk: int = 1 << 20) -> float:
    """CPU (both ends) to move one byte through a TCP connection on loopback, here (the
    workers' messages and all-reduce go over TCP; veths and shaping add more: PATH_COST_FACTOR)."""
    import socket
    import threading
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    srv.close()
    buf = bytes(chunk)

    def sink() -> None:
        got = 0
        while got < total:
            got += len(b.recv(chunk))

    t = threading.Thread(target=sink)
    c0 = time.process_time_ns()
    t.start()
    for _ in range(total // chunk):
        a.sendall(buf)
    t.join()
    c1 = time.process_time_ns()
    a.close()
    b.close()
    return (c1 - c0) / total


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))


def model_iteration(scenario: Scenario, cfg: TrainConfig) -> tuple[float, list[float]]:
    """The model's iteration time (testbed.predict.predict) of the fastest of the scenario's
    systems, at T = 1 (the busiest the machine will be), and that system's all-reduce ms per
    stage."""
    from testbed.spec.systems import get_system
    from testbed.predict.predict import predict
    fastest = min((predict(scenario, cfg, get_system(s)) for s in scenario.systems),
                  key=lambda p: p.iteration_time_s)
    return fastest.iteration_time_s, list(fastest.allreduce_ms)


def plan_load(scenario: Scenario, cfg: TrainConfig, cpu: list[dict[str, float]],
              cores: int, iteration_s: float | None = None, ns_per_byte: float = 0.0,
              allreduce_ms: list[float] | None = None) -> Load:
    """The chooser's input from the plan (configured values, T = 1) and the measured costs;
    allreduce_ms: the model's per stage (testbed.predict.predict), else none is counted."""
    if cfg.compute != "profile" or cfg.profile is None:
        raise ScenarioError("time_scale", "auto needs training.compute: profile (holds to keep)",
                            "set compute: profile, or give time_scale a number 1..100")
    P, D, M = cfg.stages, cfg.replicas, cfg.micro_batches
    costs = stage_costs(cfg.profile, P, cfg.tp)
    ops = []
    for s in range(P):
        ops += [Op(s, "F", cpu[s]["F"], costs[s].forward_ms, D * M),
                Op(s, "B", cpu[s]["B"], costs[s].backward_ms, D * M),
                Op(s, "OPT", cpu[s]["OPT"], costs[s].optimizer_ms, D)]
    sim = compute_only(schedule_table(cfg.schedule, P, M), [c.forward_ms for c in costs],
                       [c.backward_ms for c in costs], opt_ms=[c.optimizer_ms for c in costs])
    # iteration_s: the model's (else the compute-only lower bound, which overstates the load)
    iteration_s = max(1e-6, iteration_s or sim.window_ms / 1e3)
    # Packets through the delay lines (on the WAN links) per iteration: every activation and
    # gradient message between stages, each counted as crossing a WAN (an upper bound: stages
    # in one DC cross none), plus one ACK per two. The all-reduce stays inside a DC.
    wire = sum(2 * D * M * c.activation_bytes for c in costs[:-1])
    packets = wire / max(1.0, scenario.scale) / MTU_BYTES * 1.5
    pps = packets / iteration_s if scenario.wan else 0.0
    # lockstep: every worker contends (testbed.predict.autoscale's docstring: fitted).
    # Bytes the workers move: those messages, and each worker's ring all-reduce (2 (D-1)/D of
    # its stage's gradient bytes), all divided by the run's scale as the workers pad them.
    ar_bytes = [D * 2 * (D - 1) / D * c.gradient_bytes / max(1.0, scenario.scale)
                for c in costs]
    moved = wire / max(1.0, scenario.scale) + sum(ar_bytes)
    # The all-reduces beside each optimizer step (testbed.predict.autoscale.overlaps): each
    # stage's from the end of its last backward in the compute-only timeline.
    ar_ms = list(allreduce_ms or [0.0] * P)
    last_b = [max(op.end_ms for op in sim.ops if op.stage == s and op.action.startswith("B"))
              for s in range(P)]
    return Load(ops=tuple(ops), cores=cores, iteration_s=iteration_s, workers=P * D,
                delay_line_pps=pps, lockstep=P * D, bytes_per_iteration=moved,
                ns_per_byte=ns_per_byte, allreduce_ms=tuple(ar_ms),
                allreduce_cpu_ms=tuple(b * ns_per_byte * 1e-6 for b in ar_bytes),
                overlapped_by=overlaps(last_b, ar_ms, [c.optimizer_ms for c in costs]))


def resolve(scenario: Scenario, cfg: TrainConfig | None,
            say: Callable[[str], None] = print) -> tuple[Scenario, dict[str, Any] | None]:
    """scenario with T chosen when it says `time_scale: auto` (else as it is), and the record
    of the choice (env.json and metrics.json's `time_scale_auto`), or None."""
    if not scenario.time_scale_auto:
        return scenario, None
    if cfg is None:
        raise ScenarioError("time_scale", "auto needs a training section (it sizes T from the "
                            "workers' load)", "give time_scale a number 1..100")
    t0 = time.monotonic()
    cpu = measure_op_cpu_ms(cfg)
    model_s, ar_ms = model_iteration(scenario, cfg)
    loopback = max(measure_ns_per_byte() for _ in range(REPS))   # the largest, as the ops
    nspb = loopback * PATH_COST_FACTOR
    load = plan_load(scenario, cfg, cpu, machine_cores(), model_s, nspb, ar_ms)
    prefill: dict[str, Any] | str = "no prefill"
    if scenario.bubbletea:
        bt = scenario.bubbletea
        per_request = measure_prefill_cpu_ms(bt.model, bt.decode_tokens_max)
        per_s = offered_requests_per_s(scenario, cfg)
        load = replace(load, prefill_cpu_per_s=per_request * per_s / 1e3)
        prefill = {"per_request_ms": round(per_request, 4), "offered_per_s": round(per_s, 3),
                   "cpu_per_s": round(load.prefill_cpu_per_s, 5)}
    choice = choose(load)
    record = dict(choice.to_dict(), measured_cpu_ms=[{k: round(v, 4) for k, v in s.items()}
                                                      for s in cpu],
                  cores=load.cores, workers=load.workers, ns_per_byte=round(nspb, 4),
                  ns_per_byte_loopback=round(loopback, 4), path_cost_factor=PATH_COST_FACTOR,
                  bytes_per_iteration=round(load.bytes_per_iteration),
                  delay_line_packets_per_s=round(load.delay_line_pps, 1),
                  model_iteration_s=round(load.iteration_s, 4),
                  model_allreduce_ms=[round(v, 3) for v in ar_ms],
                  prefill_cpu=prefill,
                  wall_clock_s=round(wall_clock_s(load.iteration_s, cfg, choice.time_scale,
                                                  len(scenario.systems)), 1),
                  measure_s=round(time.monotonic() - t0, 2))
    say(f"time_scale auto: T={choice.time_scale:g} ({'; '.join(choice.reasons)})")
    return replace(scenario, time_scale=choice.time_scale), record


def wall_clock_s(iteration_s: float, cfg: TrainConfig, t: float, systems: int) -> float:
    """Training's wall-clock time at T (each system's iterations, T times slower), without the
    networks' build and teardown."""
    return TimeScale(t).emulated_span(iteration_s * cfg.iterations * systems)


def check_after(record: dict | None, scenario: Scenario, cfg: TrainConfig,
                metrics: dict) -> str | None:
    """After one system's run: the measured compute overruns (as a fraction of compute) and the
    delay lines' release lateness p99 into the record; one line when either passed its bound,
    naming the T that would have held; None when both stayed under."""
    if record is None:
        return None
    over = metrics.get("compute_overruns") or {}
    frac = overrun_fraction_measured(over, cfg, scenario.time_scale) if over else 0.0
    p99 = max([float((v.get("lateness_ms") or {}).get("p99") or 0.0)
               for v in (metrics.get("wan_links") or {}).values()] or [0.0])
    record.update(measured_overrun_fraction=round(frac, 5), measured_lateness_p99_ms=round(p99, 4))
    if frac <= OVERRUN_BOUND and p99 <= LATENESS_BOUND_MS:
        return None
    load = plan_load(scenario, cfg, record["measured_cpu_ms"], record["cores"],
                     record["model_iteration_s"], record["ns_per_byte"],
                     record.get("model_allreduce_ms"))
    t = would_hold(load, max(frac, OVERRUN_BOUND * 1.01), scenario.time_scale)
    if p99 > LATENESS_BOUND_MS:     # lateness grows with the load, which falls as 1/T
        t = min(MAX_TIME_SCALE, max(t, scenario.dilation.emulated_span(p99 / LATENESS_BOUND_MS)))
    t = float(round(t, 2))
    record["would_hold_time_scale"] = t
    return (f"warning: time_scale auto chose {scenario.time_scale:g} but compute overruns were "
            f"{frac:.1%} of compute (bound {OVERRUN_BOUND:.0%}) and delay-line release lateness "
            f"p99 {p99:.3f} ms (bound {LATENESS_BOUND_MS:g} ms); time_scale {t:g} would have held")


def overrun_fraction_measured(overruns: dict, cfg: TrainConfig, t: float) -> float:
    """Measured overrun ms (real time, metrics' compute_overruns) over the dilated compute."""
    costs = stage_costs(cfg.profile, cfg.stages, cfg.tp)
    per_it = sum(cfg.replicas * (cfg.micro_batches * (c.forward_ms + c.backward_ms)
                                 + c.optimizer_ms) for c in costs)
    ops_per_it = cfg.stages * cfg.replicas * (2 * cfg.micro_batches + 1)
    its = max(1.0, overruns.get("ops", 0) / ops_per_it)     # the iterations counted
    return overruns.get("total_ms", 0.0) / (per_it * its)


__all__ = ["Choice", "resolve", "check_after", "plan_load", "measure_op_cpu_ms"]
