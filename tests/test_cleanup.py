"""`run_testbed.py cleanup` after a crashed run, and two networks at once (root).

- a run killed with SIGKILL leaves no process after 5 s (testbed.emulation.leash), only its registry
  file; cleanup removes that (an unlisted interface and a live run's network survive it, and
  the live run's processes survive the killed run's leash), and the run left nothing in the
  root namespace;
- two Networks of one scenario run side by side, each works, and stopping one leaves the other;
- a stale registry of an earlier version listing a live run's root interfaces (by name, or with
  another ifindex and alias) leaves every one of them alone;
- the supervisor's SIGUSR1 during stop() cannot cut the teardown short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from testbed.spec.errors import TestbedError
from testbed.emulation.network import Network
from testbed.spec.scenario import load_scenario
from tests.scenarios import two_dc, write_scenario

pytestmark = pytest.mark.network

REPO_ROOT = Path(__file__).resolve().parent.parent
KEEP = "keepme0"

CRASH_SCRIPT = r"""
import sys, time
from pathlib import Path
from testbed.emulation.network import Network
from testbed.spec.scenario import load_scenario
from testbed.emulation.tools import iperf
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

        # Its processes die with it (testbed.emulation.leash); its registry file stays for cleanup.
        left = leftovers.new_since(before)
        deadline = time.monotonic() + 5
        while left.get("processes") and time.monotonic() < deadline:
            time.sleep(0.1)
            left = leftovers.new_since(before)
        out = cli("cleanup", env=subprocess_env)  # first, so a failed check leaves nothing
        assert not left.get("interfaces"), f"a run made root-namespace interfaces: {left}"
        assert [f"crash-run-{child.pid}.json"] == left.get("registry files"), left
        assert not left.get("processes"), f"5 s after the SIGKILL: {left}"

        assert out.returncode == 0, out
        assert f"skipped {live.run_id}" in out.stdout, out
        assert "Traceback" not in out.stderr, out

        leftovers.assert_nothing_new(before, "after run_testbed.py cleanup")
        assert keepme in leftovers.root_links(), f"cleanup removed {keepme}: {out.stdout}"
        assert live.registry is not None and live.registry.path.exists()
        ping_ok(live, "la-h1", "lb-h1")  # the live run still works
        live.check()


def test_cleanup_with_nothing_to_clean(subprocess_env, leftovers):
    assert not list(leftovers.runtime_dir().glob("*.json"))
    out = cli("cleanup", env=subprocess_env)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "nothing to clean up", ""), out


def test_two_networks_of_one_scenario_run_side_by_side(tmp_path, leftovers):
    """Same names, subnets, NFQUEUE numbers and ports, in separate namespaces: both work at
    once (each delays by its own link's figures), and ending one leaves the other whole."""
    before = leftovers.snapshot()
    sc = load_scenario(write_scenario(tmp_path, two_dc("n")))
    with Network(sc, tmp_path / "first") as first:
        with Network(sc, tmp_path / "second") as second:
            assert first.registry.path != second.registry.path
            for net in (first, second):
                ping_ok(net, "na-h1", "nb-h1")
                if net.backend == "delayline":
                    assert [q.num for dl in net.delaylines for q in dl.queues] == [1, 2]
            assert not {"na-s", "nb-s"} & leftovers.root_links()
        ping_ok(first, "na-h1", "nb-h1")
        first.check()
    leftovers.assert_nothing_new(before, "after two networks side by side")


def test_stale_registry_with_a_live_runs_names_leaves_the_live_run_alone(tmp_path, leftovers,
                                                                          subprocess_env):
    """Registry files of earlier versions list root-namespace interfaces. One whose teardown
    left its file (a process would not die) named the same interfaces as a run that is live
    now: cleanup removes the stale registry and must not touch one interface of the live run,
    whether the stale file lists the names only (killed mid-build) or with the ifindex and
    alias its run recorded. The live run's interfaces are made here as an earlier version's
    run made them: bridges in the root namespace, stamped with the run's alias."""
    from testbed.emulation.registry import ALIAS_PREFIX, Registry, _remove, cleanup, live_interfaces
    names = ["zz-s", "zz-s2"]
    live = Registry("livez", leftovers.runtime_dir())
    live.data["interfaces"] = names
    alias = f"{ALIAS_PREFIX}livez:{os.getpid()}"
    stamped = {}
    try:
        with IPRoute() as ipr:
            for name in names:
                ipr.link("add", ifname=name, kind="bridge")
                index = ipr.link_lookup(ifname=name)[0]
                ipr.link("set", index=index, ifalias=alias)
                stamped[name] = {"ifindex": index, "alias": alias}
        live.data["interface_ids"] = stamped
        live._write()
        dead = {"pid": 1, "start": -1}  # an owner that is not alive
        stale_ids = {n: {"ifindex": v["ifindex"] + 100000, "alias": "geotestbed:old:1"}
                     for n, v in stamped.items()}
        for i, extra in enumerate(({}, {"interface_ids": stale_ids})):
            doc = {"run_id": f"old{i}", "owner": dead, "pids": [], "interfaces": names, **extra}
            (leftovers.runtime_dir() / f"old{i}-1.json").write_text(json.dumps(doc))
        done = cleanup(leftovers.runtime_dir())
        assert not any(line.startswith("deleted") for line in done), done
        assert "skipped livez" in " ".join(done), done
        assert not list(leftovers.runtime_dir().glob("old*.json")), done
        # Past the live-registry check (as if the live run's registry were gone), the ifindex
        # and alias still protect every interface.
        assert names[0] in live_interfaces(leftovers.runtime_dir())
        for i, extra in enumerate(({}, {"interface_ids": stale_ids})):
            doc = {"run_id": f"old{i}", "owner": dead, "pids": [], "interfaces": names, **extra}
            done = _remove(doc, held=set())
            assert not any(line.startswith("deleted") for line in done), done
            assert all("skipped interface" in line for line in done) and len(done) == len(names), done
        assert set(names) <= leftovers.root_links()
        # The dead run's own interfaces (its alias, its ifindex) are removed.
        own = {"run_id": "livez", "owner": {"pid": os.getpid()}, "pids": [], "interfaces": names,
               "interface_ids": stamped}
        done = _remove(own, held=set())
        assert sorted(done) == [f"deleted interface {n}" for n in names], done
        assert not set(names) & leftovers.root_links()
    finally:
        live.close()
        with IPRoute() as ipr:
            for name in names:
                if ipr.link_lookup(ifname=name):
                    ipr.link("del", ifname=name)


def test_supervisor_signal_during_teardown_cannot_cut_it_short(tmp_path, leftovers, monkeypatch):
    """A delay line that dies as the run ends: its SIGUSR1 arrives while stop() tears down.
    Teardown must finish whole, and the failure is still raised afterwards."""
    import testbed.emulation.network as network_mod

    before = leftovers.snapshot()
    real_stop_all = network_mod.stop_all
    sent = []

    def stop_all_then_signal(procs, *args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGUSR1)  # as the supervisor would, mid-teardown
        return real_stop_all(procs, *args, **kwargs)

    with pytest.raises(TestbedError, match="died"):
        with Network(load_scenario(write_scenario(tmp_path, two_dc("y"))), tmp_path / "run") as net:
            if net.backend != "delayline":
                pytest.skip(f"backend is {net.backend}")
            net.failure = "delay line in ya-gw (links yb->ya) died with exit code -9"
            monkeypatch.setattr(network_mod, "stop_all", stop_all_then_signal)
    assert sent
    leftovers.assert_nothing_new(before, "after a SIGUSR1 during teardown")


def test_an_alias_counts_as_a_runs_own_only_when_it_is_exactly_its_own():
    from testbed.emulation.registry import _owned

    dead = {"run_id": "r", "owner": {"pid": 123}}
    assert _owned(dead, "x-s", (7, "geotestbed:r:123")) == ""
    assert _owned(dead, "x-s", (7, "")) == ""   # never stamped: killed mid-build
    assert "another run" in _owned(dead, "x-s", (7, "geotestbed:r:1234"))
    recorded = dict(dead, interface_ids={"x-s": {"ifindex": 7, "alias": "geotestbed:r:123"}})
    assert _owned(recorded, "x-s", (7, "geotestbed:r:123")) == ""
    assert "not the one" in _owned(recorded, "x-s", (8, "geotestbed:r:123"))


def test_registry_takes_pids_from_many_threads_at_once(tmp_path):
    """Processes are spawned from several threads (trainers, cross-traffic clients): every
    pid is recorded and the file stays whole."""
    import threading

    from testbed.emulation.registry import Registry
    reg = Registry("threads", tmp_path)
    threads = [threading.Thread(target=lambda k=k: [reg.add_pid(os.getpid(), f"t{k}-{i}")
                                                    for i in range(50)]) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    doc = json.loads(reg.path.read_text())
    assert len(doc["pids"]) == 400 and len({p["what"] for p in doc["pids"]}) == 400
    reg.close()


def test_a_dead_cluster_runs_notice_and_cleanup_name_its_cluster_file(tmp_path):
    """A run whose nodes were on servers records its cluster file: the dead-run notice and
    `cleanup` say to run `cleanup --cluster` with it (what it left there is theirs to end)."""
    from testbed.emulation.registry import Registry, cleanup, dead_runs_notice
    reg = Registry("deadc", tmp_path, cluster="/srv/c.yaml")
    reg.data["owner"] = {"pid": os.getpid(), "start": -1}   # not this process: dead
    reg._write()
    notice = dead_runs_notice(tmp_path)
    assert notice is not None and notice.endswith("run_testbed.py cleanup --cluster /srv/c.yaml"), \
        notice
    lines = cleanup(tmp_path)
    assert "deadc ran on the servers of /srv/c.yaml: cleanup --cluster /srv/c.yaml ends what it " \
           "left there" in lines, lines
    assert dead_runs_notice(tmp_path) is None
