"""`run_testbed.py plan`: exit codes, text, JSON, and that it imports neither torch nor Mininet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.loopback

REPO_ROOT = Path(__file__).resolve().parent.parent
TWO_DC = "topologies/two_dc.yaml"


def plan(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run_testbed.py", "plan", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)


def test_plan_prints_hosts_and_exits_0():
    res = plan(TWO_DC)
    assert res.returncode == 0, res.stderr
    assert "stage 0: r0-1 east-h[1-2] (east)" in res.stdout      # hosts as ranges
    assert "stage 1: r0-1 west-h[1-2] (west)" in res.stdout
    assert res.stdout.startswith(TWO_DC) and "baseline:" in res.stdout
    full = plan(TWO_DC, "--full")
    assert full.returncode == 0, full.stderr
    assert "stage 0: r0 east-h1 (east), r1 east-h2 (east)" in full.stdout   # every host
    assert "stage 1: r0 west-h1 (west), r1 west-h2 (west)" in full.stdout


def test_plan_json_parses_and_has_every_asked_system():
    res = plan(TWO_DC, "--json", "--systems", "baseline,atlas,dp-across-dcs")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert list(doc["systems"]) == ["baseline", "atlas", "dp-across-dcs"]
    atlas = doc["systems"]["atlas"]
    assert atlas["placement"]["hosts"] == [["east-h1", "east-h2"], ["west-h1", "west-h2"]]
    assert atlas["boundaries"][0]["connections"] == 11
    assert atlas["slot_plan"]["sharing"] == "temporal"
    assert doc["systems"]["dp-across-dcs"]["placement"]["allreduce_across_wan"] == [True, True]


def test_bad_system_is_one_line_exit_2():
    res = plan(TWO_DC, "--systems", "baseline,zeus")
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: systems[1]: 'zeus'")


def test_infeasible_placement_is_one_line_exit_2(tmp_path):
    # west holds 1 stage (1 host spare), east 1 stage: the 3rd stage needs 1 more host in west
    data = yaml.safe_load((REPO_ROOT / TWO_DC).read_text())
    data["dcs"] = [{"name": "east", "hosts": 2}, {"name": "west", "hosts": 3}]
    data["training"]["stages"] = 3
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = plan(str(path), "--systems", "atlas")
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "1 more host" in lines[0] and "west" in lines[0]


def test_pinned_dcs_in_the_scenario(tmp_path):
    data = yaml.safe_load((REPO_ROOT / TWO_DC).read_text())
    data["training"]["placement"] = ["west", "east"]
    path = tmp_path / "pin.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = plan(str(path), "--json", "--systems", "atlas")
    assert res.returncode == 0, res.stderr
    hosts = json.loads(res.stdout)["systems"]["atlas"]["placement"]["hosts"]
    assert hosts == [["west-h1", "west-h2"], ["east-h1", "east-h2"]]


def test_plan_imports_neither_torch_nor_mininet():
    code = ("import contextlib, io, json, sys\n"
            "import run_testbed\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = run_testbed.main(['plan', {TWO_DC!r}])\n"
            "print(json.dumps([rc, 'torch' in sys.modules, "
            "any(m == 'mininet' or m.startswith('mininet.') for m in sys.modules)]))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == [0, False, False]


def test_plan_of_a_bubbletea_system_names_its_hosts_and_load():
    out = subprocess.run([sys.executable, "run_testbed.py", "plan", "topologies/atlas_bubbletea.yaml",
                          "--systems", "atlas+bubbletea", "--json"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    bt = json.loads(out.stdout)["systems"]["atlas+bubbletea"]["bubbletea"]
    assert bt["dcs"]["us"]["decode"] == ["us-d1", "us-d2"] and bt["dcs"]["us"]["controller"] == "us-d1"
    assert bt["dcs"]["eu"]["prefill"] == ["eu-h1", "eu-h2"]
    assert bt["kept"] == sum(d["requests"] for d in bt["dcs"].values()) > 0
    bad = subprocess.run([sys.executable, "run_testbed.py", "plan", "topologies/atlas_paper.yaml",
                          "--systems", "atlas+bubbletea"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: bubbletea:")
    assert len(bad.stderr.strip().splitlines()) == 1
