"""Records of the BubbleTea processes (prefill and decode servers) as JSON lines.

One job: append one JSON object per line to one process's file, flushed at once, so a record is
on disk as soon as it is written (the tests and the controller read the files while the servers
run, and a killed server loses nothing it had recorded). Each process owns its file; several
threads of it write under one lock. Times in the records are time.time_ns(): one clock for every
process on the machine (testbed/host/spans.py, whose reader `read_jsonl` reads these files too).

Record: {"name": "PREFILL" | "KV_SEND" | "REJECT" | "DECODE", **base (host, dc), **fields}.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


class RecordLog:
    """Append-only, line-flushed JSONL writer; `base` fields go into every record."""

    def __init__(self, path: str | Path, base: dict[str, Any]) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(path, "a", buffering=1 << 16)
        self._base = dict(base)
        self._lock = threading.Lock()

    def write(self, name: str, **fields: Any) -> None:
        line = json.dumps({"name": name, **self._base, **fields}, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._f.closed:
                self._f.write(line)
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()
