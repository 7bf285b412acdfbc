"""The commands that need neither root nor Mininet nor torch (validate, plan, predict, whatif,
list, show), run as a user would, in a Python where importing mininet, pyroute2, torch, scapy or
matplotlib fails; every command's --help; bad input exits 2 with one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
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
     "--no-figures", "--out", "OUT"],
], ids=lambda a: a[0])
def test_needs_no_mininet_nor_torch(args, tmp_path):
    proc = cli(*[str(tmp_path / "rep") if a == "OUT" else a for a in args])
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


SYSTEM_PYTHON = "/usr/bin/python3"


def test_the_command_users_type_runs_under_the_project_env_from_anywhere(tmp_path):
    """`python run_testbed.py ...` with the system's Python (no project packages) from another
    folder: it re-runs itself under .venv; scenarios by path from the checkout and by name."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no {SYSTEM_PYTHON} on this machine")
    script = str(REPO / "run_testbed.py")
    for args in (["predict", "two_dc"], ["predict", "topologies/two_dc.yaml"], ["two_dc.yaml"]):
        cmd = [SYSTEM_PYTHON, script, *args]
        if args == ["two_dc.yaml"]:   # the run shorthand, as far as validate goes
            cmd = [SYSTEM_PYTHON, script, "validate", "two_dc.yaml", "-q"]
        r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, (args, r.stderr)
        assert "two_dc" in r.stdout.splitlines()[0], r.stdout


def test_without_the_project_env_one_line_names_what_is_missing(tmp_path):
    """A copy of the checkout with no .venv, started by the system's Python: exit 2, one line
    naming the module and `make setup`, nothing written."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no {SYSTEM_PYTHON} on this machine")
    if subprocess.run([SYSTEM_PYTHON, "-c", "import ruamel.yaml"],
                      capture_output=True).returncode == 0:
        pytest.skip(f"{SYSTEM_PYTHON} has ruamel.yaml: nothing would be missing")
    copy = tmp_path / "checkout"
    for package in ("testbed", "trainer", "prefill", "traffic"):
        shutil.copytree(REPO / package, copy / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "run_testbed.py", copy)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = subprocess.run([SYSTEM_PYTHON, str(copy / "run_testbed.py"), "run", "two_dc"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {SYSTEM_PYTHON} has no module 'ruamel'") and \
        "make setup" in line, line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_missing_package_for_one_command_is_one_line(tmp_path):
    """The quick start's .venv (ruamel.yaml alone): `run` says which package it needs and how
    to get it (exit 2) instead of a ModuleNotFoundError; `reproduce` does so before writing."""
    runner = RUNNER.replace('raise ImportError("not installed here: " + name)',
                            'raise ModuleNotFoundError("no " + name, name=name.split(".")[0])')
    for args, what in ((["run", "two_dc", "--out", str(tmp_path / "r")], "`run` needs"),
                       (["reproduce", str(next((REPO / "results" / "reference").glob("two_dc-*"))),
                         "--out", str(tmp_path / "rep")], "`reproduce` needs matplotlib")):
        r = subprocess.run([sys.executable, "-c", runner, *args], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 2, r.stderr
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"error: {what}") and "make setup" in line, line
    assert list(tmp_path.iterdir()) == []


def test_a_mistyped_command_is_named_and_version_is_said():
    r = cli("pridict", "two_dc")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: 'pridict' is not a command; did you mean predict? (see --help)"), r.stderr
    r = cli("--version")
    assert r.returncode == 0 and re.fullmatch(r"run_testbed\.py \d+\.\d+\.\d+ \(commit \w+\)\n",
                                              r.stdout), r.stdout


def test_every_command_explains_itself_with_two_examples():
    from testbed.cli.main import COMMANDS
    for command in COMMANDS:
        r = cli(command, "--help")
        assert r.returncode == 0, (command, r.stderr)
        text = r.stdout
        examples = text.split("examples:\n", 1)[1].strip().splitlines()
        assert len(examples) == 2 and all(f"run_testbed.py {command}" in e for e in examples), text
        if "\n  scenario " in text.split("options:")[0]:
            assert "shipped scenario's name" in text or "as run takes them" in text, text


def test_reproduce_out_is_a_folder_it_made_replaced_whole(tmp_path):
    """reproduce --out refuses a folder holding files it did not write (`/`, say), replaces
    its own folder whole (an earlier call's figures do not stay beside new tables), and
    leaves nothing beside it."""
    run = str(next((REPO / "results" / "reference").glob("two_dc-*")))
    r = cli("reproduce", run, "--out", "/", "--no-figures")
    assert r.returncode == 2 and r.stderr.startswith("error: --out: '/' holds files reproduce "
                                                     "did not write"), r.stderr
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    r = cli("reproduce", run, "--out", str(theirs), "--no-figures")
    assert r.returncode == 2 and (theirs / "notes.txt").read_text() == "mine", r.stderr
    out = tmp_path / "tables"
    assert cli("reproduce", run, "--out", str(out), "--no-figures").returncode == 0
    first = sorted(p.name for p in out.iterdir())
    assert ".made-by-reproduce" in first and "training.md" in first, first
    (out / "stale.png").write_bytes(b"an earlier call's figure")
    assert cli("reproduce", run, "--out", str(out), "--no-figures").returncode == 0
    assert sorted(p.name for p in out.iterdir()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tables", "theirs"]


def test_ctrl_c_on_a_command_that_builds_nothing_says_only_interrupted():
    # SIGINT at its default in the child (a suite started in the background has it ignored,
    # and Python then keeps ignoring it)
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, "predict", "gpt160b_5dc"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(3)   # importing and loading; predict itself takes minutes
    proc.send_signal(signal.SIGINT)   # our child, not yet reaped
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
    assert "torn down" not in err


def test_plan_and_validate_say_what_a_small_scenario_has():
    """A DC that gets no stage is named; one WAN link is 'link', not 'links'."""
    text = cli("plan", "atlas_paper", "--systems", "atlas").stdout
    assert "  asia: no stage (2 hosts idle for training)" in text, text
    doc = json.loads(cli("plan", "atlas_paper", "--systems", "atlas", "--json").stdout)
    assert doc["systems"]["atlas"]["idle_dcs"] == {"asia": 2}, doc["systems"]["atlas"].keys()
    assert ", 1 WAN link, " in cli("validate", "two_dc", "-q").stdout


def test_rates_read_the_same_everywhere_and_whatif_labels_the_change_it_made():
    """show gives a link's real rate with the emulated one beside it (whatif's unit), plan says
    its rates are emulated; whatif's fewer-pipelines row names the factor it applied."""
    show = cli("show", "atlas_paper").stdout
    assert "eu <-> us: 40 ms one way, 10 Gbit/s (100 Mbit/s emulated)" in show, show
    plan = cli("plan", "atlas_paper").stdout.splitlines()[0]
    assert "rates and windows below as emulated (the real link's are 100x" in plan, plan
    what = cli("whatif", "two_dc").stdout
    assert "pipelines /2 (D 2 -> 1" in what and "pipelines /16" not in what, what
