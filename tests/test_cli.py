"""The commands that need neither root nor Mininet nor torch (validate, plan, predict, whatif,
list, show), run as a user would, in a Python where importing mininet, pyroute2, torch, scapy or
matplotlib fails; every command's --help; bad input exits 2 with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.loopback

REPO = Path(__file__).resolve().parent.parent
BLOCKED = ("mininet", "pyroute2", "torch", "scapy", "matplotlib")
RUNNER = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("not installed here: " + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(REPO)!r})
import run_testbed
sys.exit(run_testbed.main(sys.argv[1:]))
"""


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args", [
    ["validate", "topologies/two_dc.yaml", "topologies/atlas_bubbletea.yaml",
     "topologies/paper/gpt70b_3dc.yaml"],
    ["plan", "topologies/atlas_paper.yaml", "--systems", "atlas"],
    ["predict", "topologies/atlas_bubbletea.yaml"],
    ["whatif", "topologies/atlas_paper.yaml"],
    ["list"],
    ["show", "topologies/atlas_bubbletea.yaml"],
    ["reproduce", *[str(p.relative_to(REPO)) for p in
                    sorted((REPO / "results" / "reference").glob("two_dc-*"))[:1]],
     "--no-figures", "--out", "/tmp/rep-cli-test"],
], ids=lambda a: a[0])
def test_needs_no_mininet_nor_torch(args):
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and not proc.stderr


def test_list_names_every_shipped_scenario():
    out = cli("list").stdout
    for path in sorted((REPO / "topologies").rglob("*.yaml")):
        assert str(path.relative_to(REPO)) in out
    assert "model only" in out and "network only" in out and "network + training" in out


def test_show_resolves_settings_and_placements():
    doc = json.loads(cli("show", "topologies/atlas_paper.yaml", "--json").stdout)
    assert doc["settings"]["window_bytes_per_connection"] > 0
    assert {d["name"] for d in doc["dcs"]} == {"eu", "us", "asia"}
    assert doc["systems"]["atlas"]["stage_dcs"] == ["us x2", "us x2", "eu x2"]
    assert len(doc["routes"]) == 6 and all(r["connections"] >= 1 for r in doc["routes"])
    text = cli("show", "topologies/atlas_paper.yaml").stdout
    assert "stage 2: eu x2" in text and "routes (direct)" in text
    assert "faults" not in text and "cross-traffic" not in text


def test_show_lists_faults_and_cross_traffic():
    doc = json.loads(cli("show", "topologies/two_dc_faults.yaml", "--json").stdout)
    assert doc["faults"][:2] == ["faults[0] (link down east<->west at 6 s for 1 s)",
                                 "restore after faults[0] (link down east<->west at 6 s for 1 s)"]
    assert doc["cross_traffic"] == ["cross_traffic[0] (east->west udp 30 Mbit/s, 4-20 s)"]
    assert doc["tenant_hosts"] == ["east-x1", "west-x1"]
    text = cli("show", "topologies/two_dc_faults.yaml").stdout
    assert "cross-traffic (tenant hosts east-x1, west-x1):" in text


@pytest.mark.parametrize("command", ["run", "calibrate", "validate", "plan", "predict", "whatif",
                                     "list", "show", "reproduce", "cleanup"])
def test_every_command_has_help(command):
    proc = cli(command, "--help")
    assert proc.returncode == 0 and "usage: run_testbed.py " + command in proc.stdout


@pytest.mark.parametrize("args,field", [
    (["show", "nope.yaml"], "scenario"),
    (["show"], "required"),
    (["frobnicate"], "frobnicate"),                 # run's shorthand: no such scenario
    (["run", "topologies/two_dc.yaml", "--systems", "warp"], "systems[0]"),
    (["calibrate", "topologies/paper/gpt7b_2dc.yaml"], "predict_only"),
    (["predict", "topologies/two_dc.yaml", "--systems", "warp"], "systems[0]"),
    (["whatif", "topologies/sweep_delay.yaml"], "sweep"),
    # a rate fault cannot hold under temporal sharing (its arbiter owns the link's rates)
    (["run", "topologies/two_dc_faults.yaml", "--systems", "temporal"],
     "faults[2].steps[0]: temporal shares the WAN in time"),
])
def test_bad_input_one_line_exit_2(args, field):
    proc = cli(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], proc.stderr


@pytest.mark.parametrize("args, flag", [
    (["calibrate", "topologies/two_dc.yaml", "--seconds", "nan"], "--seconds"),
    (["calibrate", "topologies/two_dc.yaml", "--seconds", "inf"], "--seconds"),
    (["calibrate", "topologies/two_dc.yaml", "--seconds", "1e7"], "--seconds"),
    (["calibrate", "topologies/two_dc.yaml", "--streams", "100000"], "--streams"),
    (["run", "topologies/two_dc.yaml", "--systems", ""], "--systems"),
    (["run", "topologies/two_dc.yaml", "--systems", "baseline,"], "--systems"),
    (["run", "topologies/two_dc.yaml", "--out", "DANGLING"], "--out"),
], ids=lambda a: "_".join(a) if isinstance(a, list) else a)
def test_bad_flags_are_refused_before_the_build(args, flag, tmp_path):
    """Exit 2 with one line naming the flag, before Mininet, pyroute2 or torch is imported (the
    runner blocks them) and before anything is written."""
    link = tmp_path / "gone"
    link.symlink_to(tmp_path / "nothing-here")
    proc = cli(*[str(link) if a == "DANGLING" else a for a in args])
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {flag}: "), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone"]
