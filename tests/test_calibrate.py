"""`run_testbed.py calibrate` end to end on a small scenario (root).

- exit 0, the last stdout line is 'results: PATH', calibration.json holds the backend and, per
  link, the configured and measured rtt_ms / rtt_loaded_ms / goodput_mbit / goodput_1flow_mbit,
  with idle and loaded RTT and goodput within the project's margins (the triangle: three links,
  each measured over itself);
- (a second run writes a new folder and leaves the first as it was: tests/test_results.py,
  on the function every command makes its folder with);
- Ctrl-C during a measurement tears the network down and exits 130 with one line on stderr.
"""

from __future__ import annotations

import json
import signal
import statistics
import time
from pathlib import Path

import pytest
import yaml

from tests.realtime_here import without_refusal_warning
from tests.tolerance import retried

pytestmark = pytest.mark.network

DELAY_MS, RATE_MBIT = 5, 20
SMALL = {"name": "cal_small",
         "dcs": [{"name": "ca", "hosts": 1}, {"name": "cb", "hosts": 1}],
         "wan": [{"between": ["ca", "cb"], "delay_ms": DELAY_MS, "rate_mbit": RATE_MBIT}]}


@pytest.fixture
def small_yaml(tmp_path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(SMALL, sort_keys=False))
    return path


def calibrate(start_child, small_yaml: Path, out: Path, *extra: str):
    child = start_child(["run_testbed.py", "calibrate", str(small_yaml), "--out", str(out),
                         "--seconds", "2", "--streams", "2", *extra])
    rc = child.wait(timeout_s=120)
    return child, rc


def results_path(child) -> Path:
    lines = child.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("results: "), child.describe()
    return Path(lines[-1].removeprefix("results: ")) / "calibration.json"


def test_calibrate_interrupted(start_child, small_yaml, tmp_path):
    out = tmp_path / "results"
    child = start_child(["run_testbed.py", "calibrate", str(small_yaml), "--out", str(out),
                         "--seconds", "3", "--streams", "2"])
    child.wait_for("measuring ca <-> cb", timeout_s=30)
    # Interrupt while the first iperf3 test runs (its client log appears when it starts), so
    # the teardown of running iperf3 server and client processes is what gets exercised.
    deadline = time.monotonic() + 30
    while not list(out.glob("*/logs/*iperf3-c-*.log")):
        assert time.monotonic() < deadline and child.popen.poll() is None, child.describe()
        time.sleep(0.05)
    time.sleep(0.3)
    child.popen.send_signal(signal.SIGINT)
    rc = child.wait(timeout_s=20)
    assert rc == 130, child.describe()
    assert without_refusal_warning(child.stderr).splitlines() == [
        "interrupted: the testbed was torn down"], child.describe()
    assert not list(out.glob("*/calibration.json")), child.describe()


# A triangle whose direct ta<->tc link (15 ms, 10 Mbit/s) is slower than the detour through tb
# (5 + 5 ms, faster links): calibration must measure that link over itself.
TRIANGLE = {"name": "cal_tri",
            "dcs": [{"name": "ta", "hosts": 1}, {"name": "tb", "hosts": 1}, {"name": "tc", "hosts": 1}],
            "wan": [{"between": ["ta", "tb"], "delay_ms": 5, "rate_mbit": 20},
                    {"between": ["tb", "tc"], "delay_ms": 5, "rate_mbit": 20},
                    {"between": ["ta", "tc"], "delay_ms": 15, "rate_mbit": 10}]}


def test_calibrate_triangle_measures_each_link_over_itself(start_child, tmp_path):
    path = tmp_path / "tri.yaml"
    path.write_text(yaml.safe_dump(TRIANGLE, sort_keys=False))
    # 4 s per iperf3 test, not 2: the goodput is the median of the steady 1 s intervals, and
    # with only 2-4 of them one loss burst on the 10 Mbit/s, 30 ms link could lift it to 1.05x
    # the rate (2 failures in 8 runs, 2026-11-30)
    # one flow (--streams 1): calibrate then measures it once per direction, not twice
    # Idle RTTs and goodput are wall-clock figures on a shared 2-core machine: a miss is
    # retried once, in its own results folder; a real fault misses both.
    def calibrate_once(attempt):
        child, rc = calibrate(start_child, path, tmp_path / f"results{attempt or ''}",
                              "--seconds", "4", "--streams", "1")
        assert rc == 0, child.describe()
        doc = json.loads(results_path(child).read_text())
        assert doc["routing"] == "direct" and doc["congestion_control"]["per_socket"] == "cubic"
        problems = []
        for link, cfg in zip(doc["links"], TRIANGLE["wan"]):
            assert link["between"] == cfg["between"]
            want = 2 * cfg["delay_ms"]
            idle = statistics.median(link["samples"]["rtt_ms"])
            if abs(idle - want) > max(0.5, 0.02 * want):
                problems.append(f"{cfg['between']}: idle RTT median {idle}, want {want}")
            got = link["measured"]["goodput_mbit"]
            if not 0.90 * cfg["rate_mbit"] <= got <= 1.01 * cfg["rate_mbit"]:
                problems.append(f"{cfg['between']}: goodput {got}, rate {cfg['rate_mbit']}")
            if link["measured"]["congestion_control"] != "cubic":
                problems.append(f"{cfg['between']}: iperf3 ran "
                                f"{link['measured']['congestion_control']}")
        # every ordered DC pair: its path (all direct here), checked by RTT and TTL
        assert len(doc["paths"]) == 6
        assert all(p["hops"] == 1 for p in doc["paths"]), doc["paths"]
        problems += [f"path: {p}" for p in doc["paths"] if not p["ok"]]
        if problems:
            print(f"attempt {attempt + 1}: " + "; ".join(problems))
        return child, doc, problems

    child, doc, problems = retried(calibrate_once, ok=lambda t: not t[2], tries=2)[-1]
    assert not problems, "\n".join(problems) + "\n" + child.stdout
    assert "ta > tc" in child.stdout and "MISMATCH" not in child.stdout, child.stdout
    # one link in full (ta <-> tb: 5 ms, 20 Mbit/s)
    first = results_path(child)
    assert doc["backend"] in ("netem", "delayline"), doc
    link = doc["links"][0]
    assert link["configured"]["delay_ms"] == 5 and link["configured"]["rate_mbit"] == 20
    m = link["measured"]
    for key in ("rtt_ms", "rtt_loaded_ms", "goodput_mbit", "goodput_1flow_mbit"):
        assert isinstance(m.get(key), (int, float)) and m[key] > 0, f"measured.{key}: {m}"
    raw = f"measured {m}; samples {link.get('samples')}"
    # One calibration costs a minute, so no second try: the RTTs are checked on the median of
    # the per-reply samples (0.1 ms resolution), which one scheduling hiccup on this shared
    # 2-core machine cannot move, rather than on the average. Under a paced load at 90% of
    # the rate the delay line must hold its delay; ping shares the link with the load, so
    # allow 1 ms (a few 1500-byte packet times at 20 Mbit/s).
    loaded = statistics.median(link["samples"]["rtt_loaded_ms"])
    assert abs(loaded - 10) <= 1.0, f"loaded median {loaded}: {raw}"
    assert 0.90 * 20 <= m["goodput_1flow_mbit"] <= 1.01 * 20, f"goodput_1flow_mbit: {raw}"
    # every packet accounted for: both directions counted, nothing dropped on a lossless link
    wan = link["wan"]
    assert sorted(wan) == ["ta->tb", "tb->ta"], wan
    for direction, counts in wan.items():
        assert counts["packets"] > 1000 and counts["bytes"] > counts["packets"] * 40, (direction, counts)
        assert counts["dropped_loss"] == counts["id_gaps"] == 0, (direction, counts)
        assert counts["dropped_queue_full"] in (0, None), (direction, counts)
    assert doc["network"]["delay_line_realtime"], doc["network"]
    env = json.loads((first.parent / "env.json").read_text())
    assert env["network"]["congestion_control"]["per_socket"] == "cubic", env
