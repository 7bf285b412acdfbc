"""testbed.results: every run gets a folder of its own; files are replaced whole."""

from __future__ import annotations

import json

from testbed.results import new_run_dir, write_json


def test_two_runs_in_the_same_second_get_two_folders(tmp_path):
    out = tmp_path / "results"
    first = new_run_dir(out, "cal_small")
    write_json(first / "calibration.json", {"run": 1})
    before = (first / "calibration.json").read_bytes()
    second = new_run_dir(out, "cal_small")
    third = new_run_dir(out, "cal_small")
    assert len({first, second, third}) == 3 and all(p.parent == out for p in (second, third))
    assert (first / "calibration.json").read_bytes() == before
    assert list(second.iterdir()) == []


def test_write_json_leaves_no_partial_file(tmp_path):
    path = write_json(tmp_path / "metrics.json", {"a": 1})
    write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
