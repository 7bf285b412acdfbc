"""Sweeps (testbed.spec.sweep, testbed.run.sweeprun) and `reproduce` (testbed.analysis.reproduce): expansion and
its errors; a real sweep interrupted with Ctrl-C and resumed; reproduce's tables, byte for byte,
and its refusals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed.spec.errors import ScenarioError
from testbed.features.checks import check_points
from testbed.spec.sweep import expand

REPO = Path(__file__).resolve().parent.parent

BASE = {"name": "tiny", "scale": 100,
        "dcs": [{"name": "ea", "hosts": 2, "rate_mbit": 1000},
                {"name": "we", "hosts": 2, "rate_mbit": 1000}],
        "wan": [{"between": ["ea", "we"], "delay_ms": 5, "rate_mbit": 100}],
        "systems": ["baseline", "atlas"],
        "training": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16,
                               "vocab_size": 64},
                     "stages": 2, "replicas": 2, "micro_batches": 2, "micro_batch_size": 2,
                     "schedule": "1f1b", "iterations": 3, "seed": 0, "compute": "profile",
                     "profile": {"file": "h200-transformer.json", "width": 2048, "seq": 2048,
                                 "micro_batch": 2, "n_layer": 4}}}


def with_sweep(sweep: dict) -> dict:
    return dict(json.loads(json.dumps(BASE)), sweep=sweep)


@pytest.mark.unit
def test_expansion_is_the_product_in_order():
    doc = with_sweep({"wan.delay_ms": [5, 20], "training.micro_batches": [2, 4, 8]})
    doc["wan"].append({"between": ["ea", "we"], "delay_ms": 1, "rate_mbit": 1})
    points = expand(doc)
    assert [(p.values["wan.delay_ms"], p.values["training.micro_batches"]) for p in points] == [
        (5, 2), (5, 4), (5, 8), (20, 2), (20, 4), (20, 8)]
    assert all(w["delay_ms"] == 20 for w in points[3].doc["wan"])     # every link
    assert "sweep" not in points[0].doc and points[4].doc["training"]["micro_batches"] == 4
    assert points[4].label == "p04-delay_ms=20-micro_batches=4"
    one = expand(with_sweep({"wan.0.delay_ms": [7]}))
    assert one[0].doc["wan"][0]["delay_ms"] == 7
    assert [p.values for p in expand(with_sweep({"systems": [["baseline"], ["atlas"]]}))] == [
        {"systems": ["baseline"]}, {"systems": ["atlas"]}]
    assert expand(BASE)[0].doc == BASE                                  # no sweep: one point


@pytest.mark.unit
def test_labels_stay_distinct_when_cut():
    """Labels are cut to 120 characters (folder and file names); points whose values differ
    only past the cut still get distinct labels (each starts with its own index)."""
    long = ["baseline"] * 20
    points = expand(with_sweep({"systems": [long + ["atlas"], long + ["baseline"]],
                                "training.seed": list(range(500))}))
    labels = [p.label for p in points]
    assert len(labels) == 1000 and len(set(labels)) == 1000
    assert all(len(x) == 120 and x.startswith(f"p{i:02d}-") for i, x in enumerate(labels))


@pytest.mark.unit
@pytest.mark.parametrize("sweep,field", [
    ({"wan.delay_msec": [1]}, "sweep.wan.delay_msec"),       # a typo is not a new field
    ({"training.replicas": 2}, "sweep.training.replicas"),   # not a list
    ({"training.replicas": []}, "sweep.training.replicas"),
    ({"wan.3.delay_ms": [1]}, "sweep.wan.3.delay_ms"),
    ({"training.micro_batches": list(range(1, 40)), "training.seed": list(range(40))}, "sweep"),
    ([1, 2], "sweep"),
])
def test_bad_sweeps_name_the_field(sweep, field):
    with pytest.raises(ScenarioError) as exc:
        expand(with_sweep(sweep))
    assert str(exc.value).startswith(field + ":"), exc.value


@pytest.mark.unit
def test_every_point_is_checked_as_run_would():
    points = expand(with_sweep({"training.replicas": [2, 4]}))   # 4 x 2 stages > 4 hosts
    with pytest.raises(ScenarioError, match=r"sweep point 1 .*replicas"):
        check_points(points)


def cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "run_testbed.py", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.network
def test_sweep_interrupted_resumed_and_reproduced(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("builds network namespaces: needs root")
    path = tmp_path / "tiny.yaml"
    doc = dict(with_sweep({"wan.delay_ms": [5, 20, 40]}), systems=["baseline"])  # test time
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "results"
    proc = cli("run", str(path), "--out", str(out), "-q")
    deadline = time.monotonic() + 120
    index_path = None
    while time.monotonic() < deadline:          # Ctrl-C once the first point is done
        found = list(out.glob("tiny-sweep-*/index.json"))
        if found:
            index_path = found[0]
            try:
                doc = json.loads(index_path.read_text())
            except json.JSONDecodeError:
                doc = {"points": []}
            # ... and the second point trains (an interrupt while Mininet builds can be lost
            # in a fork's handlers: issue 11)
            training = list(out.glob("tiny-sweep-*/runs/*/baseline/trainer_plan.json"))
            if doc["points"] and doc["points"][0]["status"] == "done" and len(training) >= 2:
                time.sleep(0.5)
                break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, (stdout, stderr)
    index = json.loads(index_path.read_text())
    status = [e["status"] for e in index["points"]]
    assert status[0] == "done" and status[1] == "interrupted" and status[2] == "pending", status
    first_run = index["points"][0]["run_dir"]
    sweep_dir = index_path.parent
    # the same sweep with other flags is refused
    other = cli("run", str(path), "--resume", str(sweep_dir), "--iterations", "4", "-q")
    _, err = other.communicate(timeout=60)
    assert other.returncode == 2 and err.startswith("error: --resume:"), err
    resumed = cli("run", str(path), "--resume", str(sweep_dir), "-q")
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, (stdout, stderr)
    assert "3 points, 1 done before" in stdout and stdout.strip().splitlines()[-1].startswith(
        "results: ")
    index = json.loads(index_path.read_text())
    assert [e["status"] for e in index["points"]] == ["done"] * 3
    assert index["points"][0]["run_dir"] == first_run           # not run again
    # reproduce: the tables name each point's folder; the same bytes twice
    runs = []
    for n in (1, 2):
        rep = cli("reproduce", str(sweep_dir), "--out", str(tmp_path / f"rep{n}"))
        stdout, stderr = rep.communicate(timeout=120)
        assert rep.returncode == 0, stderr
        runs.append({p.name: p.read_bytes() for p in (tmp_path / f"rep{n}").iterdir()})
    assert runs[0] == runs[1]
    table = runs[0]["training.md"].decode()
    for e in index["points"]:
        assert Path(e["run_dir"]).name in table
    assert table.count("| baseline |") == 3 and "speedup_vs_delay-tiny.png" in runs[0]
    assert sum(name.startswith("timeline-") for name in runs[0]) == 3
    # the sweep's own tables and figure, and each run's own tables
    assert (sweep_dir / "training.md").read_bytes() == runs[0]["training.md"]
    assert (sweep_dir / "speedup_vs_delay-tiny.png").is_file()
    for e in index["points"]:
        assert "| baseline |" in (sweep_dir / e["run_dir"] / "training.md").read_text()
        assert (sweep_dir / e["run_dir"] / "training.csv").is_file()
    # every system of every point has a Perfetto trace
    for e in index["points"]:
        trace = json.loads((sweep_dir / e["run_dir"] / "baseline" / "trace.json").read_text())
        assert any(ev["ph"] == "X" and ev["name"].startswith("F") for ev in trace["traceEvents"])


def _fake_run(folder: Path, schema: int | None) -> Path:
    src = REPO / "docs" / "atlas" / "atlas_paper-metrics.json"
    doc = json.loads(src.read_text())
    if schema is None:
        doc.pop("schema_version", None)
    else:
        doc["schema_version"] = schema
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(doc))
    return folder


def run_main(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "run_testbed.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.loopback
def test_reproduce_refuses_other_schemas_and_incomplete_folders(tmp_path):
    old = _fake_run(tmp_path / "old-run", None)
    rc, _, err = run_main("reproduce", str(old), "--out", str(tmp_path / "o"))
    assert rc == 2 and err.count("\n") == 1 and "schema version None" in err, err
    partial = tmp_path / "killed-run"                  # killed mid-write: only the temp file
    partial.mkdir()
    (partial / ".metrics.json.tmp").write_text('{"schema_version": 1, "syst')
    rc, _, err = run_main("reproduce", str(partial), "--out", str(tmp_path / "o"))
    assert rc == 2 and "neither metrics.json nor index.json" in err, err
    broken = tmp_path / "broken-run"
    broken.mkdir()
    (broken / "metrics.json").write_text('{"schema_version": 1, "syst')
    rc, _, err = run_main("reproduce", str(broken), "--out", str(tmp_path / "o"))
    assert rc == 2 and "incomplete" in err, err


@pytest.mark.loopback
def test_reproduce_tables_from_a_run_folder(tmp_path):
    run = _fake_run(tmp_path / "atlas_paper-run", 1)
    shutil.copy(REPO / "topologies" / "atlas_paper.yaml", run / "scenario.resolved.yaml")
    rc, out, err = run_main("reproduce", str(run), "--out", str(tmp_path / "o"), "--no-figures")
    assert rc == 0, err
    md = (tmp_path / "o" / "training.md").read_text()
    assert md.count("| atlas_paper-run |") == 5 and "| atlas |" in md
    assert (tmp_path / "o" / "training.csv").read_text().splitlines()[0].startswith("results,")
    assert md in out
