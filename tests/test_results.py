"""testbed.emulation.results: every run gets a folder of its own; files are replaced whole."""

from __future__ import annotations

import json
import os
import stat
import threading
from types import SimpleNamespace

import pytest

from testbed.emulation.results import new_run_dir, write_bytes, write_json, write_text


@pytest.mark.loopback
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


@pytest.mark.unit
def test_write_json_leaves_no_partial_file(tmp_path):
    path = write_json(tmp_path / "metrics.json", {"a": 1})
    write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


@pytest.mark.unit
def test_a_link_at_the_old_fixed_temp_name_is_not_followed(tmp_path):
    """Someone who can write the folder plants .metrics.json.tmp -> a file of their choosing
    (here a temporary target): root's write must not go there, nor make metrics.json a link."""
    target = tmp_path / "target"
    target.write_text("keep\n")
    (tmp_path / ".metrics.json.tmp").symlink_to(target)
    path = write_json(tmp_path / "metrics.json", {"a": 1})
    assert target.read_text() == "keep\n"
    assert not path.is_symlink() and json.loads(path.read_text()) == {"a": 1}


@pytest.mark.unit
def test_concurrent_writes_to_one_path_never_share_a_temp_file(tmp_path):
    path = tmp_path / "index.json"
    docs = [{"writer": w, "pad": "x" * (1000 * (w + 1))} for w in range(2)]
    errors: list[BaseException] = []

    def writer(doc: dict) -> None:
        try:
            for _ in range(100):
                write_json(path, doc)
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(d,)) for d in docs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert json.loads(path.read_text()) in docs                      # one writer's, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]   # no temp file left


@pytest.mark.unit
def test_written_files_get_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_text(tmp_path / "summary.txt", "ok\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.unit
def test_timeline_figures_draw_through_no_fixed_temp_name(tmp_path):
    """reproduce's timelines drew to out/.<run>-<system>.tmp.png: a link planted there was
    followed (the PNG written where it pointed)."""
    from tests.test_trainer_parts import fake_run
    from testbed.analysis.reproduce_plots import draw_timelines
    spans, _, _ = fake_run()
    (tmp_path / "run" / "atlas").mkdir(parents=True)
    (tmp_path / "run" / "atlas" / "trainer_spans.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in spans))
    run = SimpleNamespace(name="run", path=tmp_path / "run", scenario={"name": "tiny"},
                          metrics={"systems": {"atlas": {}}})
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "target"
    target.write_text("keep\n")
    (out / ".run-atlas.tmp.png").symlink_to(target)
    written = draw_timelines([run], out, write_bytes)
    assert target.read_text() == "keep\n"
    assert [p.name for p in written] == ["timeline-run-atlas.png"]
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
