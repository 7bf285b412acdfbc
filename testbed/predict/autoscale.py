"""`time_scale: auto`: the smallest time dilation T this machine keeps on time (issue 25, part 1).

Pure: given what the run layer measured here at start-up (testbed.run.autoscale: the small model's
CPU time per op and stage, the machine's cores) and what the plan says (each op's profile hold on
the target GPU, the workers, the delay lines' packets per second, the prefill side's CPU per
second), choose T and say why.

The model. At T every hold lasts hold * T on the wall clock and the delay lines' and prefill's
CPU per second falls by T (rates / T, bytes kept). The machine's CPU load at T is

    rho(T) = (sum over workers of their CPU per iteration / (iteration_s * T)
              + delay-line packets/s * cost per packet / T + prefill CPU per s / T) / cores

and an op of CPU time c takes c * k on the wall clock (`stretch`): the D replicas of a stage start
each op together, so they share the cores at once, the other workers add their average duty, and
the delay lines' and prefill's share of the cores is taken off. With a safety factor S on every
measured cost:

- compute overruns: sum over ops of max(0, S*c*k - hold*T), as a fraction of the dilated
  compute sum(hold*T), must stay under OVERRUN_BOUND (2%);
- an optimizer step runs right after its stage's all-reduce, while the stages that finished
  their backward later are still in theirs; gloo's threads run at SCHED_FIFO (the emulated
  communication is not slowed by compute, as on GPUs), so their CPU preempts the step rather
  than adding average load. Each such all-reduce takes S * its CPU / (its time * T) of the cores
  while it runs (its CPU: the bytes it moves x the measured CPU per byte, fixed; its time: the
  model's, dilated), and the step gets what is left: k / (1 - that share), no CPU at all when
  the share reaches 1. Which all-reduces overlap which step is read off the compute-only
  timeline (each stage's last backward, then its all-reduce), whose stages finish closer
  together than with the WAN messages between them: more overlap, an upper bound. Measured on
  scale64 (64 workers, 2 cores, 2026-12-05): at T=2.75, 105 of the 114 optimizer steps that took
  over 50 ms (for 0.5-0.7 ms of CPU) overlapped another stage's all-reduce; the average-load
  model had predicted 1.7% overruns, 32.5% were measured;
- delay-line release lateness p99 under LATENESS_BOUND_MS (0.5 ms): held while rho stays under
  RHO_MAX (measured: the delay lines' release p99 stayed well under 0.5 ms below about 70% CPU
  and went to several ms on a busy 2-core machine, docs/ and testbed.emulation.wanstats).

Fitted, before the optimizer steps' term above, to the runs of docs/model.md
(bench/bench_model_vs_emulation.py, this 2-core machine, P=4 chains of D = 4, 8, 16): with every
worker counted as contending (`lockstep` = all workers: in 1F1B's steady state every stage has an
op ready at once) and S = 2, the model picked T = 6, 11, 21 where those runs needed 6, 12 and 20;
two_dc picks 1. The optimizer steps' term only raises T. With it, scale64 (64 workers) picks T=8
here, where 1.24% overruns were measured (docs/scenarios.md, `time_scale`).

T is the smallest of 1, 1.25, 1.5, ..., then whole numbers up to MAX_TIME_SCALE that holds both;
where none does, MAX_TIME_SCALE with a reason saying the bound is not met.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.spec.timescale import MAX_TIME_SCALE

OVERRUN_BOUND = 0.02          # compute overruns as a fraction of compute
LATENESS_BOUND_MS = 0.5       # delay-line release lateness p99
RHO_MAX = 0.7                 # CPU load under which the lateness bound held (module docstring)
SAFETY = 2.0                  # on every measured CPU cost (module docstring: fitted)
DELAY_LINE_US_PER_PACKET = 2.0   # measured: a delay line's CPU per packet (testbed.emulation.delayline)


@dataclass(frozen=True, slots=True)
class Op:
    """One kind of op of one stage: its CPU time measured here, its hold on the target GPU, and
    how many of it the whole run does per iteration (all workers of the stage)."""
    stage: int
    kind: str                 # F, B or OPT
    cpu_ms: float
    hold_ms: float
    per_iteration: int


@dataclass(frozen=True, slots=True)
class Load:
    ops: tuple[Op, ...]
    cores: int
    iteration_s: float                  # the model's iteration time at T = 1 (configured)
    workers: int
    delay_line_pps: float = 0.0         # at T = 1, all delay lines together
    prefill_cpu_per_s: float = 0.0      # CPU seconds per second of the prefill side at T = 1
    us_per_packet: float = DELAY_LINE_US_PER_PACKET
    lockstep: int = 1                   # workers that start each op together (D: the replicas)
    bytes_per_iteration: float = 0.0    # every message and all-reduce byte the workers move
    ns_per_byte: float = 0.0            # CPU to send and receive one byte on the emulated path
    # per stage, at T = 1: its all-reduce's time (the model's, ms) and its D workers' CPU for it
    # (ms, fixed: bytes x ns_per_byte), and the all-reduces each stage's optimizer step overlaps
    allreduce_ms: tuple[float, ...] = ()
    allreduce_cpu_ms: tuple[float, ...] = ()
    overlapped_by: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class Choice:
    time_scale: float
    rho: float
    overrun_fraction: float
    held: bool
    reasons: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"time_scale": self.time_scale, "cpu_load": round(self.rho, 4),
                "overrun_fraction": round(self.overrun_fraction, 5), "held": self.held,
                "reasons": list(self.reasons), "safety_factor": SAFETY,
                "overrun_bound": OVERRUN_BOUND, "lateness_bound_ms": LATENESS_BOUND_MS,
                "cpu_load_bound": RHO_MAX}


def candidates() -> list[float]:
    fine = [1.0 + 0.25 * i for i in range(12)]            # 1 .. 3.75
    return fine + [float(t) for t in range(4, int(MAX_TIME_SCALE) + 1)]


def cpu_load(load: Load, t: float, safety: float = SAFETY) -> float:
    compute_s = sum(op.cpu_ms * op.per_iteration for op in load.ops) * safety / 1000.0
    per_s = (compute_s / (load.iteration_s * t)
             + load.delay_line_pps * load.us_per_packet * 1e-6 * safety / t
             + load.prefill_cpu_per_s * safety / t
             + load.bytes_per_iteration * load.ns_per_byte * 1e-9 * safety / (load.iteration_s * t))
    return per_s / max(1, load.cores)


def stretch(load: Load, op: Op, t: float, safety: float = SAFETY) -> float:
    """How many times its CPU time an op takes on the wall clock at T: the replicas of its
    stage start it together (the same schedule, the same holds), so `lockstep` workers contend
    for the cores at once, and the other workers add their average duty; the delay lines' and
    prefill's share of the cores is taken off first."""
    rho = cpu_load(load, t, safety)
    background = (load.delay_line_pps * load.us_per_packet * 1e-6 + load.prefill_cpu_per_s
                  + load.bytes_per_iteration * load.ns_per_byte * 1e-9 / load.iteration_s) \
        * safety / t
    cores = load.cores - background
    if rho >= 1.0 or cores <= 0:
        return float("inf")
    duty = min(1.0, rho * load.cores / max(1, load.workers))     # per worker
    concurrent = load.lockstep + (load.workers - load.lockstep) * duty
    return max(1.0, concurrent / cores)


def preempted_share(load: Load, op: Op, t: float, safety: float = SAFETY) -> float:
    """The share of the cores the SCHED_FIFO all-reduces running beside op take at T (module
    docstring): only an optimizer step overlaps other stages' all-reduces."""
    if op.kind != "OPT" or op.stage >= len(load.overlapped_by):
        return 0.0
    share = 0.0
    for s in load.overlapped_by[op.stage]:
        if load.allreduce_ms[s] > 0:
            share += safety * load.allreduce_cpu_ms[s] / (load.allreduce_ms[s] * t)
    return share / max(1, load.cores)


def overrun_fraction(load: Load, t: float, safety: float = SAFETY) -> float:
    total = sum(op.hold_ms * t * op.per_iteration for op in load.ops)
    if total <= 0:
        return 0.0
    over = 0.0
    for op in load.ops:
        k = stretch(load, op, t, safety)
        left = 1.0 - preempted_share(load, op, t, safety)
        if k == float("inf") or left <= 0.0:
            return float("inf")
        over += max(0.0, safety * op.cpu_ms * k / left - op.hold_ms * t) * op.per_iteration
    return over / total


def overlaps(last_backward_end_ms: list[float], allreduce_ms: list[float],
             opt_ms: list[float]) -> tuple[tuple[int, ...], ...]:
    """Per stage, the other stages whose all-reduce is running while its optimizer step does:
    stage s's all-reduce runs from the end of its last backward for allreduce_ms[s], then its
    step for opt_ms[s] (T-free: every one of these times dilates alike)."""
    n = len(last_backward_end_ms)
    out = []
    for s in range(n):
        start = last_backward_end_ms[s] + allreduce_ms[s]
        end = start + opt_ms[s]
        out.append(tuple(o for o in range(n) if o != s and allreduce_ms[o] > 0
                         and last_backward_end_ms[o] < end
                         and start < last_backward_end_ms[o] + allreduce_ms[o]))
    return tuple(out)


def choose(load: Load, safety: float = SAFETY) -> Choice:
    """The smallest T that holds both bounds (module docstring), with its reasons."""
    rho1, over1 = cpu_load(load, 1.0, safety), overrun_fraction(load, 1.0, safety)
    for t in candidates():
        rho, over = cpu_load(load, t, safety), overrun_fraction(load, t, safety)
        if rho <= RHO_MAX and over <= OVERRUN_BOUND:
            return Choice(t, rho, over, True, _reasons(load, t, rho, over, rho1, over1, safety))
    t = MAX_TIME_SCALE
    rho, over = cpu_load(load, t, safety), overrun_fraction(load, t, safety)
    return Choice(t, rho, over, False, _reasons(load, t, rho, over, rho1, over1, safety) + (
        f"no T up to {MAX_TIME_SCALE:g} holds the bounds: the run will not be faithful",))


def _reasons(load: Load, t: float, rho: float, over: float, rho1: float, over1: float,
             safety: float) -> tuple[str, ...]:
    worst = max(load.ops, key=lambda op: op.cpu_ms / op.hold_ms if op.hold_ms else 0.0,
                default=None)
    out = [f"{load.workers} workers on {load.cores} cores; delay lines "
           f"{load.delay_line_pps:,.0f} packets/s at T=1 x {load.us_per_packet:g} us; workers "
           f"move {load.bytes_per_iteration / 1e6:,.0f} MB per iteration x "
           f"{load.ns_per_byte:.2f} ns/byte (TCP over veths and HTB); "
           f"safety factor {safety:g} on every measured CPU cost",
           f"at T=1: CPU load {rho1:.0%} (bound {RHO_MAX:.0%}, for release lateness p99 under "
           f"{LATENESS_BOUND_MS:g} ms), overruns {over1:.1%} of compute (bound "
           f"{OVERRUN_BOUND:.0%})",
           f"at T={t:g}: CPU load {rho:.0%}, overruns {over:.1%} of compute"]
    if load.prefill_cpu_per_s:
        out.append(f"prefill side (BubbleTea): {load.prefill_cpu_per_s:.3f} s of CPU per second "
                   f"at T=1, {load.prefill_cpu_per_s / t:.3f} at T={t:g}")
    if worst is not None:
        out.append(f"tightest op: stage {worst.stage} {worst.kind}, CPU {worst.cpu_ms:.2f} ms vs "
                   f"hold {worst.hold_ms:.2f} ms")
    steps = [op for op in load.ops if op.kind == "OPT" and preempted_share(load, op, t, safety)]
    if steps:
        op = max(steps, key=lambda o: preempted_share(load, o, t, safety))
        overlapped = load.overlapped_by[op.stage]
        out.append(f"optimizer steps overlap other stages' SCHED_FIFO all-reduces (each "
                   f"{max(load.allreduce_cpu_ms[s] for s in overlapped) / 1e3:.3f} s of CPU over "
                   f"{max(load.allreduce_ms[s] for s in overlapped) / 1e3:.3f} s x T): at "
                   f"T={t:g} stage {op.stage}'s step shares the cores with "
                   f"{len(overlapped)} of them, which take "
                   f"{preempted_share(load, op, t, safety):.0%}")
    return tuple(out)


def would_hold(load: Load, measured_overrun_fraction: float, measured_t: float) -> float:
    """After a run at measured_t whose overruns were measured_overrun_fraction of compute: the T
    that would have held, scaling the model's cost estimate so it reproduces the measurement."""
    lo, hi = 0.25, 64.0
    for _ in range(40):                      # the safety factor that explains the measurement
        mid = (lo * hi) ** 0.5
        if overrun_fraction(load, measured_t, mid) < measured_overrun_fraction:
            lo = mid
        else:
            hi = mid
    return choose(load, safety=max(hi, SAFETY)).time_scale
