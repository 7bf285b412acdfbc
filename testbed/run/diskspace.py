"""Room for a run's results, checked before anything is built.

One job: estimate what a run writes under --out and refuse, as bad input, a folder whose
filesystem has less free than that. What a run writes grows with its spans: every worker
records each op, send and receive of every iteration, and a run keeps them three times (the
worker's own file, the merged trainer_spans.jsonl, the trace.json timeline); a BubbleTea
system's request records are not counted. SPAN_BYTES, SPANS_PER_MICRO_BATCH and FIXED_BYTES are what two_dc's
runs wrote here (docs/reliability.md); the estimate takes MARGIN times them.
"""

from __future__ import annotations

import os
from pathlib import Path

from testbed.spec.errors import ScenarioError
from testbed.spec.training import TrainConfig

SPAN_BYTES = 200              # one span's line, JSON, in each of its copies
COPIES = 3                    # the worker's spans, the merged spans, trace.json
SPANS_PER_MICRO_BATCH = 4     # per worker and iteration: F and B, a send and a receive each
SPANS_PER_ITERATION = 8       # per worker: the optimizer step, all-reduce, waits, loss
FIXED_BYTES = 256 << 10       # per system: metrics, env, plans, logs, tables
MARGIN = 2.0


def estimate_bytes(cfg: TrainConfig, systems: int) -> int:
    """What a run of cfg's training, once per system, writes (with MARGIN)."""
    spans = cfg.stages * cfg.replicas * cfg.iterations * (
        SPANS_PER_MICRO_BATCH * cfg.micro_batches + SPANS_PER_ITERATION)
    per_system = FIXED_BYTES + spans * SPAN_BYTES * COPIES
    return int(MARGIN * systems * per_system)


def free_bytes(folder: Path) -> tuple[Path, int]:
    """(the folder or its nearest existing parent, the bytes free to us on its filesystem)."""
    path = folder.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return path, st.f_bavail * st.f_frsize


def check_room(out_dir: Path, need: int) -> None:
    """ScenarioError naming --out and the path if its filesystem has less than need free."""
    where, free = free_bytes(out_dir)
    if free < need:
        raise ScenarioError("--out", f"{where} has {_size(free)} free; this run writes about "
                            f"{_size(need)}", "free space there or give --out a folder with room")


def _size(n: float) -> str:
    if n < 1024:
        return f"{n:,.0f} bytes"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:,.1f} {unit}"
