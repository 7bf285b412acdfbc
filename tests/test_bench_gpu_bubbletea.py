"""bench/bench_gpu_bubbletea.py in --smoke mode on the CPU: the two processes (training stage and
prefill server) run the three phases and write a JSON whose numbers are finite, with no prefill
beside a training op under the GPU lock and a busier device with BubbleTea than training alone.
The real-GPU run (default sizes) is for a machine with CUDA; this only checks that the script works.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.loopback

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "bench" / "bench_gpu_bubbletea.py"


def _numbers(node, path="$"):
    """Every number in a JSON tree, with its path."""
    if isinstance(node, bool) or node is None or isinstance(node, str):
        return
    if isinstance(node, (int, float)):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _numbers(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numbers(v, f"{path}[{i}]")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bubbletea_gpu.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--device", "cpu",
                           "--iterations", "6", "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "results:" in proc.stdout
    return json.loads(out.read_text())


def test_phases_present(result):
    assert set(result["phases"]) == {"train_alone", "bubbletea", "naive"}
    for name, phase in result["phases"].items():
        assert phase["iterations"] >= 1, name
        assert phase["iteration_ms_mean"] > 0, name
    assert result["phases"]["train_alone"]["prefills"] == 0
    assert result["phases"]["bubbletea"]["prefills"] > 0
    assert result["phases"]["naive"]["prefills"] > 0
    assert result["device"] == "cpu" and result["smoke"] is True


def test_no_overlap_under_the_lock(result):
    bt = result["phases"]["bubbletea"]
    assert bt["overlaps"] == 0
    assert result["summary"]["bubbletea_overlaps"] == 0
    # without overlap the merged busy time is the plain sum
    assert bt["util_span"] == pytest.approx(bt["util_span_sum"], rel=1e-9, abs=1e-12)


def test_bubbletea_fills_bubbles(result):
    ph = result["phases"]
    assert ph["bubbletea"]["util_span"] > ph["train_alone"]["util_span"]
    for name, phase in ph.items():
        assert 0 < phase["util_span"] <= 1 + 1e-9, name


def test_numbers_finite(result):
    found = list(_numbers(result))
    assert found
    bad = [(p, v) for p, v in found if not math.isfinite(v)]
    assert not bad, bad
