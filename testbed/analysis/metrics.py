"""A training run's figures from its record files (testbed.rules.figures computes them from the
records; this module reads the files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.host.spans import read_jsonl
from testbed.rules.figures import metrics_from_records


def congestion_control_in_use(spans_path: Path) -> list[str]:
    """Every TCP congestion control the workers' stage-to-stage sockets ran (their SETUP)."""
    return sorted({cc for r in read_jsonl(spans_path) if r["name"] == "SETUP"
                   for cc in (r.get("congestion_control") or {}).values()})


def compute_metrics(run_dir: Path) -> dict[str, Any]:
    """Metrics of the run in run_dir (the folder given to testbed.run.launch.launch)."""
    run_dir = Path(run_dir)
    plan = json.loads((run_dir / "trainer_plan.json").read_text())
    return metrics_from_records(read_jsonl(run_dir / "trainer_spans.jsonl"),
                                read_jsonl(run_dir / "trainer_loss.jsonl"), plan)
