"""bench/bench_packet_level.py --remodel: the table of the ns-3 cross-check redrawn from its JSON
against the current model, without ns-3 (the ns-3 runs themselves are a benchmark, not a test).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "bench" / "bench_packet_level.py"
DOC = REPO_ROOT / "docs" / "packet_level.json"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_packet_level", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(flows, loss, cc, seed, goodput):
    return {"flows": flows, "loss": loss, "cc": cc, "seed": seed, "sim_s": 2.0, "warm_s": 0.667,
            "goodput_mbit": goodput, "wall_s": 10.0}


def test_remodel_prints_one_row_per_point_with_spread(tmp_path):
    runs = [_run(16, 1e-3, "cubic", 1, 400.0), _run(16, 1e-3, "cubic", 2, 420.0),
            _run(1024, 1e-2, "reno", 1, 7000.0)]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"meta": {}, "runs": runs}))
    rows = _bench().remodel(path)
    assert len(rows) == 2 + 2                       # header, rule, two points
    assert "| 16 | 0.1% | cubic |" in rows[2] and "400..420 | 2 |" in rows[2]
    assert rows[3].startswith("| 1024 | 1% | reno |")


@pytest.mark.skipif(not DOC.exists(), reason="no docs/packet_level.json yet")
def test_remodel_of_the_recorded_runs():
    data = json.loads(DOC.read_text())
    points = {(r["flows"], r["loss"], r["cc"]) for r in data["runs"]}
    rows = _bench().remodel(DOC)
    assert len(rows) == 2 + len(points)
    assert all(row.count("|") == 11 for row in rows)
