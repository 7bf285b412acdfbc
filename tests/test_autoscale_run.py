"""time_scale: auto on a real run (issue 25 part 1): an 8-worker, 2-DC scenario whose profile
holds the small model overruns at T=1 on this machine; auto picks T > 1 and the run's compute
overruns stay under the bound (2% of compute); both are recorded in metrics.json and env.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.predict.autoscale import OVERRUN_BOUND

pytestmark = pytest.mark.network
REPO = Path(__file__).resolve().parents[1]


def overloaded(tmp_path: Path) -> Path:
    doc = {"name": "auto_small", "scale": 100, "time_scale": "auto",
           "dcs": [{"name": "a", "hosts": 4, "rate_mbit": 1000},
                   {"name": "b", "hosts": 4, "rate_mbit": 1000}],
           "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100}],
           "systems": ["baseline"],
           "training": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16,
                                  "vocab_size": 64},
                        "stages": 2, "replicas": 4, "micro_batches": 4, "micro_batch_size": 2,
                        "schedule": "1f1b", "iterations": 3, "seed": 0, "compute": "profile",
                        "profile": {"file": "h200-transformer.json", "width": 2048,
                                    "seq": 2048, "micro_batch": 2, "n_layer": 8}}}
    path = tmp_path / "auto_small.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_auto_picks_more_than_one_and_the_overruns_stay_under_the_bound(tmp_path: Path):
    proc = subprocess.run([sys.executable, "run_testbed.py", "run", str(overloaded(tmp_path)),
                           "--out", str(tmp_path / "results")], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    doc = json.loads((Path(last.removeprefix("results: ")) / "metrics.json").read_text())
    auto = doc["time_scale_auto"]
    assert doc["time_scale"] == auto["time_scale"] > 1.0 and auto["held"], auto
    m = doc["systems"]["baseline"]["time_scale_auto"]
    assert m["measured_overrun_fraction"] <= OVERRUN_BOUND, (m, proc.stdout[-2000:])
    env = json.loads((Path(doc["run_dir"]) / "env.json").read_text())
    assert env["time_scale_auto"]["time_scale"] == auto["time_scale"]
    assert "time_scale auto: T=" in proc.stdout
