"""Span records as JSON lines: one writer per worker process, merged after the run.

One job: write and read span files. Each worker owns its file (no shared writer, torchtitan's
"never block training" rule: records go to a buffered file under a lock that both the training
thread and the transport's sender thread take for microseconds). Times are `time.time_ns()`, one
clock for all processes on one machine (Mininet hosts are namespaces of the same kernel).

Record: {"name": "F"|"B"|"SEND_F"|"RECV_F"|"SEND_B"|"RECV_B"|"ALLREDUCE"|"OPT"|"SETUP"
                 |"GPU_WAIT"|"IDLE" (BubbleTea: waited for the host's GPU lock; a bubble
                 announced to the controller, t_end_ns = its predicted end),
         "stage", "replica", "host", "dc", "iteration", "microbatch" (or null),
         "t_start_ns", "t_end_ns", "bytes" (communication only), ...extra}
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterable



class SpanLog:
    """Append-only JSONL writer for one worker; `base` fields go into every record."""

    def __init__(self, path: Path, base: dict[str, Any]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "w", buffering=1 << 16)
        self._base = dict(base)
        self._lock = threading.Lock()

    def span(self, name: str, t_start_ns: int, t_end_ns: int, iteration: int | None,
             microbatch: int | None = None, **extra: Any) -> None:
        rec = {"name": name, **self._base, "iteration": iteration, "microbatch": microbatch,
               "t_start_ns": t_start_ns, "t_end_ns": t_end_ns, **extra}
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self._lock:
            self._f.write(line)

    def flush(self) -> None:
        with self._lock:
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def merge_jsonl(paths: Iterable[Path], out_path: Path, sort_key: str = "t_start_ns") -> int:
    """Merge per-worker JSONL files into one, sorted by sort_key; returns the record count."""
    records: list[dict] = []
    for path in paths:
        records.extend(read_jsonl(path))
    records.sort(key=lambda r: (r.get(sort_key, 0), r.get("stage", 0), r.get("replica", 0)))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with open(out_path, "w") as f:
        for rec in records:
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    return len(records)
