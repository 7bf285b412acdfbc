"""A `calibrate` and a `run` change nothing outside their namespaces (root).

Checked from values Mininet's init would change, not from the ones an earlier run left: before
the jobs, at least one watched sysctl must differ from what Mininet's fixLimits() writes
(FIXLIMITS); if none does (a run of older code left them all), net.core.rmem_max goes back to
the kernel's default for the test and is restored after. Each runner starts with soft NOFILE
and NPROC limits below Mininet's, so a raise would show in its /proc/PID/limits, read once its
network is up, and notes every /proc/sys file it opens for writing itself. After both jobs:
no runner wrote one, every root-namespace sysctl tests/conftest.py watches is as it was, each
runner's limits were the ones it started with, and env.json says which kernel modules the
build loaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.test_run import scenario

pytestmark = pytest.mark.network

# What mininet.util.fixLimits() writes in the root namespace (integers only where lower).
FIXLIMITS = {"fs.file-max": "10000", "net.core.wmem_max": "16777216",
             "net.core.rmem_max": "16777216", "net.ipv4.tcp_rmem": "10240 87380 16777216",
             "net.ipv4.tcp_wmem": "10240 87380 16777216", "net.core.netdev_max_backlog": "5000",
             "net.ipv4.neigh.default.gc_thresh1": "4096",
             "net.ipv4.neigh.default.gc_thresh2": "8192",
             "net.ipv4.neigh.default.gc_thresh3": "16384", "net.ipv4.route.max_size": "32768",
             "kernel.pty.max": "20000"}
KERNEL_DEFAULT_RMEM_MAX = b"212992"
RUNNER_LIMITS = {"Max open files": 1024, "Max processes": 4096}   # soft, below Mininet's
WRITE_NOTE = "wrote a sysctl:"
# run_testbed.py in this Python, after it lowers its own soft NOFILE and NPROC limits; it says
# so on stderr whenever it opens a /proc/sys file for writing itself (what fixLimits does),
# which other runs on the machine cannot blur (the snapshot of the sysctls they can)
LOWER_LIMITS_AND_RUN = """
import os, resource, runpy, sys
for which, soft in ((resource.RLIMIT_NOFILE, %d), (resource.RLIMIT_NPROC, %d)):
    resource.setrlimit(which, (soft, resource.getrlimit(which)[1]))
def watch(event, args):
    if event == "open" and str(args[0]).startswith("/proc/sys") and args[2] & 3:
        print("%s", args[0], file=sys.stderr, flush=True)
sys.addaudithook(watch)
sys.argv = ["run_testbed.py", *sys.argv[1:]]
runpy.run_path("run_testbed.py", run_name="__main__")
""" % (RUNNER_LIMITS["Max open files"], RUNNER_LIMITS["Max processes"], WRITE_NOTE)


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys", name.replace(".", "/"))


def _differs_from_fixlimits(name: str, value: bytes) -> bool:
    want, have = FIXLIMITS[name], " ".join(value.decode().split())
    if want.isdigit():
        return int(have) < int(want)   # fixLimits raises integers, never lowers them
    return have != want


def limits_of(pid: int | str) -> dict[str, tuple[str, str]]:
    """/proc/PID/limits as name -> (soft, hard)."""
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {m[1]: (m[2], m[3]) for m in (re.match(r"(.+?)\s{2,}(\S+)\s+(\S+)", r) for r in rows)}


@pytest.fixture
def mininet_would_change_something(leftovers):
    """At least one watched sysctl differs from FIXLIMITS for the test (see the docstring)."""
    now = leftovers.root_sysctls()
    if any(_differs_from_fixlimits(k, now[k]) for k in FIXLIMITS if k in now):
        yield
        return
    path = _sysctl_path("net.core.rmem_max")
    old = path.read_bytes()
    path.write_bytes(KERNEL_DEFAULT_RMEM_MAX)
    try:
        yield
    finally:
        path.write_bytes(old)


def test_calibrate_and_run_leave_the_root_namespace_as_it_was(
        tmp_path: Path, leftovers, start_child, mininet_would_change_something) -> None:
    path = scenario(tmp_path, 5, "rootns")
    out = tmp_path / "results"
    jobs = {"run": ["run", str(path), "--out", str(out)],
            "calibrate": ["calibrate", str(path), "--out", str(out), "--seconds", "2",
                          "--streams", "1"]}
    expected = limits_of("self")   # what a runner inherits, less what it lowers
    for name, soft in RUNNER_LIMITS.items():
        expected[name] = (str(soft), expected[name][1])
    before = leftovers.root_sysctls()
    children = {job: start_child(["-c", LOWER_LIMITS_AND_RUN, *argv]) for job, argv in jobs.items()}
    limits = {}
    for job, child in children.items():   # Mininet's init has run once the network is up
        child.wait_for("network up", timeout_s=120)
        limits[job] = limits_of(child.pid)
    for job, child in children.items():
        assert child.wait(timeout_s=300) == 0, (job, child.describe())
    changed = [f"{job} {line}" for job, child in children.items()
               for line in child.stderr.splitlines() if line.startswith(WRITE_NOTE)]
    moved = leftovers.sysctl_changes(before, leftovers.root_sysctls())
    changed += [f"root-namespace sysctl {c}" for c in moved]
    if moved:
        changed.append(leftovers.other_runs_note())
    changed += [f"{job}'s limit {name}: {expected.get(name)} -> {got}"
                for job, table in limits.items() for name, got in table.items()
                if expected.get(name) != got]
    assert not changed, changed
    envs = list(out.glob("*/env.json"))
    assert len(envs) == 2, envs
    for env in envs:
        loaded = json.loads(env.read_text())["network"]["kernel_modules_loaded"]
        assert isinstance(loaded, list) or loaded.startswith("unavailable"), loaded
