"""End to end: `run_testbed.py run` trains across the emulated WAN and writes metrics.json.

Root tests (they build namespaces; `network` marker: skipped without root, checked for
leftovers); CI runs as root.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.network   # needs root; tests/conftest.py checks for leftovers


def scenario(tmp_path: Path, delay_ms: float, name: str, **extra) -> Path:
    doc = {
        "name": name,
        "scale": 100,
        **extra,
        "dcs": [{"name": "east", "hosts": 1}, {"name": "west", "hosts": 1}],
        "wan": [{"between": ["east", "west"], "delay_ms": delay_ms, "rate_mbit": 100}],
        "training": {
            "model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64},
            "stages": 2, "replicas": 1, "micro_batches": 2, "micro_batch_size": 2,
            "schedule": "gpipe", "iterations": 3, "seed": 0, "compute": "profile",
            "profile": {"file": "h200-transformer.json", "width": 2048, "seq": 2048,
                        "micro_batch": 1, "n_layer": 8},
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(path: Path, out: Path, stdout: list[str] | None = None, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "run_testbed.py", "run", str(path), "--out", str(out),
                           *extra], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if stdout is not None:
        stdout += proc.stdout.splitlines()
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("results: "), proc.stdout
    return json.loads((Path(last.removeprefix("results: ")) / "metrics.json").read_text())


@pytest.fixture(scope="module")
def doc_run(tmp_path_factory) -> dict:
    """One run at 5 ms (reno), twice (--repeat 2), shared by the tests that read its metrics
    (test time)."""
    tmp_path = tmp_path_factory.mktemp("doc")
    return run(scenario(tmp_path, 5, "doc", congestion_control="reno"), tmp_path / "results",
               None, "--repeat", "2")


def test_iteration_time_grows_with_wan_delay(tmp_path: Path, doc_run: dict) -> None:
    far = run(scenario(tmp_path, 40, "far", congestion_control="reno"), tmp_path / "results")
    t_near = doc_run["systems"]["baseline"]["iteration_time_s"]
    t_far = far["systems"]["baseline"]["iteration_time_s"]
    # Each iteration crosses the WAN at least 4 times one way (2 activations, 2 gradients, in
    # sequence at the pipeline's ends), so 35 ms more one-way delay adds well over 100 ms.
    assert t_far > t_near + 0.1, (t_near, t_far)


def test_repeats_are_each_a_fresh_run_and_the_figures_their_mean(doc_run: dict) -> None:
    base = doc_run["systems"]["baseline"]
    rep = base["repeats"]
    assert rep["n"] == 2 and rep["folders"][0] == "baseline", rep
    times = rep["iteration_time_s"]["values"]
    assert base["iteration_time_s"] == pytest.approx(sum(times) / 2)
    assert rep["iteration_time_s"]["stdev"] >= 0
    # the second ran in its own folder, with its own figures (the first's folder holds the
    # combined block)
    second = json.loads((Path(doc_run["run_dir"]) / rep["folders"][1] / "metrics.json").read_text())
    assert second["iteration_time_s"] == times[1] and second["complete"]
    assert base["model"]["measured"]["iteration_time_s"] == base["iteration_time_s"]


def test_metrics_document(doc_run: dict) -> None:
    doc = doc_run
    assert doc["scenario"] == "doc" and doc["compute"] == "profile"
    assert doc["backend"] in ("netem", "delayline")
    base = doc["systems"]["baseline"]
    for key in ("iteration_time_s", "tokens_per_s", "bubble_fraction", "gpu_utilization"):
        assert base[key] > 0, key
    assert 0 < base["bubble_fraction"] < 1 and 0 < base["gpu_utilization"] < 1
    assert len(base["loss"]) == 3
    # schema 2: the compute-only schedule under its own name, the model's prediction under model
    assert doc["schema_version"] == 2 and "predicted" not in base, sorted(base)
    assert 0 < base["compute_only"]["iteration_time_s"] < base["model"]["predicted"][
        "iteration_time_s"], (base["compute_only"], base["model"]["predicted"])
    assert [(s["stage"], s["dc"], s["host"]) for s in base["stages"]] == [
        (0, "east", "east-h1"), (1, "west", "west-h1")]
    assert Path(base["timeline_png"]).stat().st_size > 1000
    env = json.loads((Path(doc["run_dir"]) / "env.json").read_text())
    assert isinstance(env["other_runs"], list), env   # live runs beside it: timings not clean
    # every WAN packet of this system's run counted per direction
    wan = base["wan_links"]
    assert sorted(wan) == ["east->west", "west->east"], wan
    assert all(c["packets"] > 0 and c["dropped_loss"] == 0 for c in wan.values()), wan
    assert isinstance(base["wan_warnings"], list)
    env = json.loads((Path(doc["run_dir"]) / "env.json").read_text())
    assert env["network"]["congestion_control"]["configured"] == "reno", env
    assert set(env["network"]["delay_line_realtime"]) == {"east-gw", "west-gw"}, env
    # the scenario's congestion control, read back from the stage-to-stage sockets
    cc = base["congestion_control"]
    assert cc["configured"] == "reno" and cc["in_use"] == ["reno"], cc
    assert cc["host_routes"] == "reno", cc   # every other socket (gloo's) through the routes


def test_time_scale_runs_slower_and_reports_real_time(tmp_path: Path) -> None:
    """time_scale 4: delays x4, rates /4 and profile holds x4 on the wire and in the workers;
    metrics.json reports real time (divided back), so the figures match the undilated run's."""
    plain_doc = run(scenario(tmp_path, 5, "ts1"), tmp_path / "results")
    plain = plain_doc["systems"]["baseline"]
    said: list[str] = []
    slow_doc = run(scenario(tmp_path, 5, "ts4", time_scale=4), tmp_path / "results", said)
    slow = slow_doc["systems"]["baseline"]
    # the progress lines give each iteration's time after the first, in real time too
    took = [float(m.group(1)) for line in said
            if (m := re.search(r"iteration [23]/3: ([\d.]+) s, loss [\d.]+ \(replica 0\)", line))]
    assert len(took) == 2 and all(t == pytest.approx(slow["iteration_time_s"], rel=0.5)
                                  for t in took), (took, slow["iteration_time_s"], said)
    assert slow["time_scale"] == 4 and "real time" in slow["figures"]
    assert slow_doc["time_scale"] == 4
    # Real-time figures, not 4x them (loose: this is no timing test, a busy machine can
    # lengthen any span; a missing division back would be off by 4x).
    assert slow["iteration_time_s"] == pytest.approx(plain["iteration_time_s"], rel=0.5), (
        plain["iteration_time_s"], slow["iteration_time_s"])
    # In the workers each forward really lasted 4x its profile hold (the shortest forward: a
    # hold is a floor; the CPU can only make a span longer), and divided back it is the hold.
    def shortest_forward_ms(doc: dict) -> float:
        spans = Path(doc["run_dir"]) / "baseline" / "trainer_spans.jsonl"
        return min((r["t_end_ns"] - r["t_start_ns"]) / 1e6 for r in map(json.loads, spans.open())
                   if r["name"] == "F" and r["stage"] == 0)

    one, four = shortest_forward_ms(plain_doc), shortest_forward_ms(slow_doc)
    # (upper bound with 5 ms of slack: a sleep on a busy 2-core machine can overshoot by ms;
    # a missing or doubled dilation is off by 4x)
    assert 4 * one * 0.95 <= four <= 4 * one * 1.5 + 5.0, (one, four)
    # the mean divided back is at least the hold (the shortest forward at T = 1); a double
    # division would be 4x lower. (Not against the T = 1 run's mean: a busy machine's
    # overshoots are a larger share of a ~2 ms hold at T = 1, and once made it 4.13 ms
    # against 1.87 ms at T = 4.)
    assert slow["stages"][0]["forward_ms"] >= 0.8 * one, (one, slow["stages"][0])


def test_a_run_and_a_calibration_of_one_scenario_at_once(tmp_path: Path, leftovers) -> None:
    """Two jobs on one machine at the same time, same scenario, same results folder: both
    finish with their own results and correct figures, and both clean up (the leftovers
    fixture checks the machine after). Each network lives in its own namespaces, so the
    names, subnets, NFQUEUE numbers and ports they share never meet."""
    path = scenario(tmp_path, 10, "twice")
    out = tmp_path / "results"
    cmds = {"run": [sys.executable, "run_testbed.py", "run", str(path), "--out", str(out), "-q"],
            "calibrate": [sys.executable, "run_testbed.py", "calibrate", str(path), "--out",
                          str(out), "--seconds", "2", "--streams", "1"]}
    procs = {k: subprocess.Popen(c, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for k, c in cmds.items()}
    outs = {k: p.communicate(timeout=300) for k, p in procs.items()}
    for k, p in procs.items():
        assert p.returncode == 0, (k, *outs[k])
    run_dirs = sorted(x for x in out.iterdir() if x.is_dir())
    assert len(run_dirs) == 2, run_dirs                  # one folder each, never shared
    metrics = json.loads(next(out.glob("*/metrics.json")).read_text())
    calib = json.loads(next(out.glob("*/calibration.json")).read_text())
    base = metrics["systems"]["baseline"]
    # The run measured its own scenario: never faster than the model by more than noise (a
    # WAN delay or hold that went missing would be), and not far slower (2 cores carry both
    # jobs here, iperf3 at full rate beside the trainers, so slower is load: a CI run once
    # measured 2.04x the model; a wrong scenario or a doubled delay would be off much more).
    measured_over_model = 1 / (1 + base["model"]["error"]["iteration_time_rel"])
    assert 0.9 < measured_over_model < 3.0, base["model"]
    link = calib["links"][0]
    assert abs(link["measured"]["rtt_ms"] - 20) < 5, link        # 2 x delay_ms
