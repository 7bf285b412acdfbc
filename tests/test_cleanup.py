"""`run_testbed.py cleanup` after a crashed run, and names a running network holds (root).

- a run killed with SIGKILL leaves its bridges, delay lines and registry file; cleanup removes
  exactly those (an unlisted interface and a live run's network survive it);
- a second Network with the same scenario while the first runs is refused with a TestbedError
  that names the taken interface, and the first keeps working.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from testbed.errors import TestbedError
from testbed.network import Network
from testbed.scenario import load_scenario
from tests.scenarios import two_dc, write_scenario

pytestmark = pytest.mark.network

REPO_ROOT = Path(__file__).resolve().parent.parent
KEEP = "keepme0"

CRASH_SCRIPT = r"""
import sys, time
from pathlib import Path
from testbed.network import Network
from testbed.scenario import load_scenario
from traffic import iperf
with Network(load_scenario(sys.argv[1]), Path(sys.argv[2])) as net:
    net.spawn(net.plan.hosts[-1].name, iperf.server_argv(5205), Path(sys.argv[2]) / "iperf3-s.log")
    print("UP", flush=True)
    time.sleep(60)
"""


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "run_testbed.py"), *args], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture
def keepme():
    """An interface no run lists; 'dummy' where the kernel has it, else a bridge."""
    with IPRoute() as ipr:
        try:
            ipr.link("add", ifname=KEEP, kind="dummy")
        except Exception:  # noqa: BLE001 - this kernel may lack dummy
            ipr.link("add", ifname=KEEP, kind="bridge")
    try:
        yield KEEP
    finally:
        with IPRoute() as ipr:
            if ipr.link_lookup(ifname=KEEP):
                ipr.link("del", ifname=KEEP)


def ping_ok(net: Network, src: str, dst: str) -> None:
    net.run(src, ["ping", "-n", "-c", "1", "-W", "2", net.host_ip(dst)], timeout_s=10, name="ping")


def test_cleanup_after_killed_run(tmp_path, leftovers, start_child, subprocess_env, keepme):
    # A live run of our own (its owner, this process, is alive): cleanup must skip it.
    with Network(load_scenario(write_scenario(tmp_path / "live", two_dc("l"))),
                 tmp_path / "live" / "live-run") as live:
        before = leftovers.snapshot()
        script = tmp_path / "crash.py"
        script.write_text(CRASH_SCRIPT)
        child = start_child([str(script), str(write_scenario(tmp_path, two_dc("k"))),
                             str(tmp_path / "crash-run")])
        child.wait_for("UP", timeout_s=30)
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout_s=10) == -signal.SIGKILL

        left = leftovers.new_since(before)
        out = cli("cleanup", env=subprocess_env)  # first, so a failed check leaves nothing
        assert {"ka-s", "kb-s"} <= set(left.get("interfaces", [])), left
        assert [f"crash-run-{child.pid}.json"] == left.get("registry files"), left
        procs = " | ".join(cmd for _, cmd in left.get("processes", []))
        if live.backend == "delayline":
            assert "testbed.delayline" in procs, left
        assert "iperf3" in procs, left

        assert out.returncode == 0, out
        assert "deleted interface ka-s" in out.stdout and "deleted interface kb-s" in out.stdout, out
        assert f"skipped {live.run_id}" in out.stdout, out
        assert "Traceback" not in out.stderr, out

        leftovers.assert_nothing_new(before, "after run_testbed.py cleanup")
        assert keepme in leftovers.root_links(), f"cleanup removed {keepme}: {out.stdout}"
        assert live.registry is not None and live.registry.path.exists()
        assert {"la-s", "lb-s"} <= leftovers.root_links(), out.stdout
        ping_ok(live, "la-h1", "lb-h1")  # the live run still works
        live.check()


def test_cleanup_with_nothing_to_clean(subprocess_env, leftovers):
    assert not list(leftovers.runtime_dir().glob("*.json"))
    out = cli("cleanup", env=subprocess_env)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "nothing to clean up", ""), out


def test_second_network_with_the_same_names_is_refused(tmp_path):
    sc = load_scenario(write_scenario(tmp_path, two_dc("n")))
    with Network(sc, tmp_path / "first") as first:
        with pytest.raises(TestbedError) as info:
            with Network(sc, tmp_path / "second"):
                pass
        msg = str(info.value)
        assert "already exists" in msg and any(n in msg for n in first.plan.root_interfaces()), msg
        assert "\n" not in msg


def test_refused_second_network_leaves_the_first_intact(tmp_path, leftovers):
    sc = load_scenario(write_scenario(tmp_path, two_dc("n")))
    with Network(sc, tmp_path / "first") as first:
        with pytest.raises(TestbedError):
            with Network(sc, tmp_path / "second"):
                pass
        missing = set(first.plan.root_interfaces()) - leftovers.root_links()
        assert not missing, f"the refused second network deleted {sorted(missing)}"
        ping_ok(first, "na-h1", "nb-h1")
