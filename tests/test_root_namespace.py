"""A `calibrate` and a `run` change nothing outside their namespaces (root).

Checked from values Mininet's init would change, not from the ones an earlier run left: before
the jobs, at least one watched sysctl must differ from what Mininet's fixLimits() writes
(FIXLIMITS); if none does (a run of older code left them all), net.core.rmem_max goes back to
the kernel's default for the test and is restored after. Each runner starts with soft NOFILE
and NPROC limits below Mininet's, so a raise would show in its /proc/PID/limits, read once its
network is up. After both jobs, every root-namespace sysctl tests/conftest.py watches is as it
was, each runner's limits were the ones it started with, and env.json says which kernel
modules the build loaded.
"""

from __future__ import annotations

import re
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_run import scenario

REPO = Path(__file__).resolve().parent.parent
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
RUNNER_LIMITS = {resource.RLIMIT_NOFILE: 1024, resource.RLIMIT_NPROC: 4096}  # below Mininet's
LIMIT_NAMES = {resource.RLIMIT_NOFILE: "Max open files", resource.RLIMIT_NPROC: "Max processes"}


def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys", name.replace(".", "/"))


def _differs_from_fixlimits(name: str, value: bytes) -> bool:
    want, have = FIXLIMITS[name], " ".join(value.decode().split())
    if want.isdigit():
        return int(have) < int(want)   # fixLimits raises integers, never lowers them
    return have != want


def _lower_limits() -> None:
    for which, soft in RUNNER_LIMITS.items():
        resource.setrlimit(which, (soft, resource.getrlimit(which)[1]))


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
        tmp_path: Path, leftovers, mininet_would_change_something) -> None:
    path = scenario(tmp_path, 5, "rootns")
    out = tmp_path / "results"
    cmds = {"run": ["run", str(path), "--out", str(out)],
            "calibrate": ["calibrate", str(path), "--out", str(out), "--seconds", "2",
                          "--streams", "1"]}
    expected = limits_of("self")   # what a runner inherits, less what _lower_limits sets
    for which, soft in RUNNER_LIMITS.items():
        expected[LIMIT_NAMES[which]] = (str(soft), expected[LIMIT_NAMES[which]][1])
    before = leftovers.root_sysctls()
    procs, logs, limits = {}, {}, {}
    for job, argv in cmds.items():
        logs[job] = tmp_path / f"{job}.log"
        with open(logs[job], "wb") as log:
            procs[job] = subprocess.Popen([sys.executable, "run_testbed.py", *argv], cwd=REPO,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, preexec_fn=_lower_limits)
    try:
        deadline = time.monotonic() + 120
        while len(limits) < len(procs):
            for job, proc in procs.items():
                if job not in limits and "network up" in logs[job].read_text(errors="replace"):
                    limits[job] = limits_of(proc.pid)
                assert proc.poll() is None or job in limits, (job, logs[job].read_text())
            assert time.monotonic() < deadline, {j: logs[j].read_text() for j in procs}
            time.sleep(0.05)
        for job, proc in procs.items():
            assert proc.wait(timeout=300) == 0, (job, logs[job].read_text())
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    changed = [f"root-namespace sysctl {c}"
               for c in leftovers.sysctl_changes(before, leftovers.root_sysctls())]
    changed += [f"{job}'s limit {name}: {expected.get(name)} -> {got}"
                for job, table in limits.items() for name, got in table.items()
                if expected.get(name) != got]
    assert not changed, changed
    for env in out.glob("*/env.json"):
        loaded = json.loads(env.read_text())["network"]["kernel_modules_loaded"]
        assert isinstance(loaded, list) or loaded.startswith("unavailable"), loaded
    assert len(list(out.glob("*/env.json"))) == 2
