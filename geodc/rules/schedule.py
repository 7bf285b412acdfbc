"""Pipeline schedules as data, the textbook bubble, and a timeline simulator.

One job: what each stage does in which order, and when it would happen. A schedule is a table
`list[list[str]]`: for each stage the ordered actions of one iteration, written as in
torch.distributed.pipelining's `_Action` ("F0" = forward of micro-batch 0, "B3" = backward of
micro-batch 3). The worker executes exactly this table; the simulator predicts its timeline from
per-operation durations; the bubble formula is the closed form both are checked against.

- gpipe: all M forwards, then all M backwards (in micro-batch order, as torch's ScheduleGPipe).
- 1f1b:  PipeDream-flush: stage s runs min(P-1-s, M) warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards. Same bubble as GPipe, but at
  most P-s activations alive per stage instead of M.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from geodc.spec.names import SCHEDULES



def parse_action(action: str) -> tuple[str, int]:
    """'F3' -> ('F', 3)."""
    kind, mb = action[0], action[1:]
    if kind not in "FB" or not mb.isdigit():
        raise ValueError(f"bad action {action!r} (expected F<mb> or B<mb>)")
    return kind, int(mb)


def gpipe_table(n_stages: int, n_micro: int) -> list[list[str]]:
    row = [f"F{m}" for m in range(n_micro)] + [f"B{m}" for m in range(n_micro)]
    return [list(row) for _ in range(n_stages)]


def one_f_one_b_table(n_stages: int, n_micro: int) -> list[list[str]]:
    table = []
    for s in range(n_stages):
        warmup = min(n_stages - 1 - s, n_micro)
        row = [f"F{m}" for m in range(warmup)]
        next_f, next_b = warmup, 0
        while next_f < n_micro:              # steady state: one forward, one backward
            row += [f"F{next_f}", f"B{next_b}"]
            next_f, next_b = next_f + 1, next_b + 1
        row += [f"B{m}" for m in range(next_b, n_micro)]  # cool-down
        table.append(row)
    return table


def schedule_table(name: str, n_stages: int, n_micro: int) -> list[list[str]]:
    if n_stages < 1 or n_micro < 1:
        raise ValueError(f"need stages >= 1 and micro-batches >= 1, got {n_stages}, {n_micro}")
    if name == "gpipe":
        return gpipe_table(n_stages, n_micro)
    if name == "1f1b":
        return one_f_one_b_table(n_stages, n_micro)
    raise ValueError(f"unknown schedule {name!r}; use one of {', '.join(SCHEDULES)}")


def bubble_fraction(n_stages: int, n_micro: int) -> float:
    """Textbook idle share of a stage for GPipe and 1F1B with uniform ops: (P-1)/(M+P-1)."""
    return (n_stages - 1) / (n_micro + n_stages - 1)


def format_table(table: Sequence[Sequence[str]]) -> str:
    """One line per stage, e.g. 'stage 1: F0 F1 B0 F2 B1 ...'."""
    return "\n".join(f"stage {s}: " + " ".join(row) for s, row in enumerate(table))


# ---------------------------------------------------------------------------------------------
# simulator

@dataclass(frozen=True, slots=True)
class SimOp:
    stage: int
    action: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True, slots=True)
class SimResult:
    ops: list[SimOp]
    window_ms: float                 # first compute start to last compute end
    compute_ms: list[float]          # per stage
    bubble: list[float]              # per stage: 1 - compute/window

    @property
    def mean_bubble(self) -> float:
        return sum(self.bubble) / len(self.bubble)


DurationFn = Callable[[int], float]   # stage -> ms; which argument it is says F, B or OPT
Durations = float | Sequence[float] | DurationFn


def _as_fn(value: Durations) -> DurationFn:
    if callable(value):
        return lambda s: float(value(s))
    if isinstance(value, (int, float)):
        return lambda s: float(value)
    seq = list(value)
    return lambda s: float(seq[s])


def simulate(table: Sequence[Sequence[str]], forward_ms: Durations, backward_ms: Durations,
             comm_ms: float = 0.0, opt_ms: Durations = 0.0) -> SimResult:
    """Predict one iteration: each stage runs its row in order; an op starts when its stage is
    free and its input has arrived (F(s,m) needs F(s-1,m) + comm_ms; B(s,m) needs B(s+1,m) +
    comm_ms; the last stage's B(m) needs its own F(m)). Durations are per stage: a number (all
    stages), a sequence indexed by stage, or a function stage -> ms. Optimizer step of opt_ms
    ends each row."""
    n_stages = len(table)
    f_ms, b_ms, o_ms = _as_fn(forward_ms), _as_fn(backward_ms), _as_fn(opt_ms)
    done: dict[tuple[str, int, int], float] = {}       # (kind, stage, mb) -> end ms
    free = [0.0] * n_stages
    pos = [0] * n_stages
    ops: list[SimOp] = []
    total = sum(len(row) for row in table)
    while len(ops) < total:
        progressed = False
        for s in range(n_stages):
            while pos[s] < len(table[s]):
                kind, mb = parse_action(table[s][pos[s]])
                if kind == "F":
                    dep = done.get(("F", s - 1, mb)) if s > 0 else 0.0
                    delay = comm_ms if s > 0 else 0.0
                    dur = f_ms(s)
                else:
                    if s < n_stages - 1:
                        dep, delay = done.get(("B", s + 1, mb)), comm_ms
                    else:
                        dep, delay = done.get(("F", s, mb)), 0.0
                    dur = b_ms(s)
                if dep is None:
                    break
                start = max(free[s], dep + delay)
                free[s] = start + dur
                done[(kind, s, mb)] = free[s]
                ops.append(SimOp(s, table[s][pos[s]], start, free[s]))
                pos[s] += 1
                progressed = True
        if not progressed:
            stuck = {s: table[s][pos[s]] for s in range(n_stages) if pos[s] < len(table[s])}
            raise ValueError(f"schedule deadlocks: next actions {stuck}\n{format_table(table)}")
    compute = [0.0] * n_stages
    for s in range(n_stages):
        if o_ms(s) > 0:
            ops.append(SimOp(s, "OPT", free[s], free[s] + o_ms(s)))
    for op in ops:
        compute[op.stage] += op.end_ms - op.start_ms
    window = max(op.end_ms for op in ops) - min(op.start_ms for op in ops)
    return SimResult(ops=ops, window_ms=window, compute_ms=compute,
                     bubble=[1.0 - c / window for c in compute])
