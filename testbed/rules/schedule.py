"""Pipeline schedules as data and the textbook bubble.

One job: what each stage does in which order, and when it would happen. A schedule is a table
`list[list[str]]`: for each stage the ordered actions of one iteration, written as in
torch.distributed.pipelining's `_Action` ("F0" = forward of micro-batch 0, "B3" = backward of
micro-batch 3). The worker executes exactly this table; testbed.rules.pipeline predicts its timeline from
per-operation durations; the bubble formula is the closed form both are checked against.

- gpipe: all M forwards, then all M backwards (in micro-batch order, as torch's ScheduleGPipe).
- 1f1b:  PipeDream-flush: stage s runs min(P-1-s, M) warm-up forwards, then alternates one
  forward and one backward, then drains the remaining backwards. Same bubble as GPipe, but at
  most P-s activations alive per stage instead of M.
"""

from __future__ import annotations

from typing import Sequence

from testbed.spec.names import SCHEDULES



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
