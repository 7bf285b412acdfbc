"""Never signal a process that is not provably ours; nothing of a run outlives it.

- a child reaped by poll() is never signalled again, nor its process group: shown with a real
  process that gets the reaped child's pid (and so its group id) inside a pid namespace of the
  test's own (ns_last_pid);
- a leader's leftover group members end when it is reaped, and with stop() while it runs;
- a SIGKILLed `run_testbed.py run` leaves no process after 5 s, the next command says in one
  line that a dead run left something and how to remove it, and `cleanup` removes it (root);
- SIGHUP to a `run` tears it down as SIGTERM does (root);
- a second `run --resume` of a sweep folder another run holds is refused with one line, exit 2.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed.emulation.procs import LocalSpawner

REPO = Path(__file__).resolve().parent.parent

REUSE_SCRIPT = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
from testbed.emulation import procs
logs = Path(sys.argv[1])
sp = procs.LocalSpawner()
for _ in range(20):
    a = sp.spawn("local", ["true"], logs / "a.log")
    while a.poll() is None:          # reaped here, as wait_all and cross-traffic do
        time.sleep(0.01)
    # The kernel gives the next process a's pid: this pid namespace's last pid, set back.
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(a.pid - 1))
    victim = subprocess.Popen(["sleep", "30"], start_new_session=True)
    if victim.pid == a.pid:
        break
    victim.kill(); victim.wait()
assert victim.pid == a.pid and os.getpgid(victim.pid) == a.pid, (victim.pid, a.pid)
refused = getattr(a, "signal", lambda sig: "no helper")(signal.SIGTERM)
a.stop()
procs.stop_all([a])
time.sleep(0.2)
state = "alive" if victim.poll() is None else f"killed {victim.returncode}"
print("helper", refused, "victim", state)
victim.kill(); victim.wait()
"""


@pytest.mark.network   # root: a pid namespace and its ns_last_pid
def test_reaped_child_is_never_signalled_again(tmp_path, subprocess_env):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    script = tmp_path / "reuse.py"
    script.write_text(REUSE_SCRIPT)
    out = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                          str(script), str(tmp_path)], env=subprocess_env, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "helper False victim alive", out.stdout + out.stderr


def _pid_gone(pidfd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _member(proc, timeout_s: float = 5.0) -> int:
    """The pid the child's shell printed (its background member)."""
    deadline = time.monotonic() + timeout_s
    while not proc.output().strip():
        assert time.monotonic() < deadline, "the shell printed no pid"
        time.sleep(0.01)
    return int(proc.output().split()[0])


@pytest.mark.loopback
def test_group_members_end_with_their_leader(tmp_path):
    spawner = LocalSpawner()
    try:
        # the leader exits and leaves a member: it ends when the leader is reaped
        left = spawner.spawn("local", ["sh", "-c", "sleep 30 & echo $!"], tmp_path / "left.log")
        member = os.pidfd_open(_member(left))
        deadline = time.monotonic() + 5
        while left.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert _pid_gone(member, 2.0), "a member outlived its reaped leader"
        os.close(member)
        assert left.signal(signal.SIGTERM) is False     # refused after the reap
        # a live leader and its member: stop() ends both
        live = spawner.spawn("local", ["sh", "-c", "sleep 30 & echo $!; wait"],
                             tmp_path / "live.log")
        member = os.pidfd_open(_member(live))
        assert live.stop(grace_s=2.0) is not None
        assert _pid_gone(member, 2.0), "stop() left a member of the group running"
        os.close(member)
    finally:
        spawner.stop_all()


# ---- a real run: SIGKILL, SIGHUP ------------------------------------------------------------
def _scenario(tmp_path: Path, name: str, iterations: int = 200) -> Path:
    """test_run's two-DC pipeline, long enough to be signalled while it trains."""
    doc = {
        "name": name, "scale": 100,
        "dcs": [{"name": "east", "hosts": 1}, {"name": "west", "hosts": 1}],
        "wan": [{"between": ["east", "west"], "delay_ms": 5, "rate_mbit": 100}],
        "training": {
            "model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64},
            "stages": 2, "replicas": 1, "micro_batches": 2, "micro_batch_size": 2,
            "schedule": "gpipe", "iterations": iterations, "seed": 0, "compute": "profile",
            "profile": {"file": "h200-transformer.json", "width": 2048, "seq": 2048,
                        "micro_batch": 1, "n_layer": 8},
        },
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process below root."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = {}, [root]
    while todo:
        p = todo.pop()
        for child, pp in parent.items():
            if pp == p and child not in found:
                start = _start_time(child)
                if start is not None:
                    found[child] = start
                    todo.append(child)
    return found


def _running(procs: dict[int, int]) -> list[str]:
    out = []
    for pid, start in procs.items():
        if _start_time(pid) == start:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            out.append(f"{pid} {cmd.decode(errors='replace')[:80]}")
    return out


def _start_training(start_child, tmp_path: Path, name: str):
    child = start_child(["run_testbed.py", "run", str(_scenario(tmp_path, name)), "--out",
                         str(tmp_path / "results")])
    child.wait_for("training (baseline)", timeout_s=60)
    deadline = time.monotonic() + 60   # both stages started: the run's whole process tree
    while not list((tmp_path / "results").glob("*/baseline/trainer_plan.json")):
        assert child.popen.poll() is None and time.monotonic() < deadline, child.describe()
        time.sleep(0.1)
    time.sleep(1.0)
    return child


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "run_testbed.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.network
def test_sigkilled_run_leaves_no_process(tmp_path, leftovers, start_child, subprocess_env):
    before = leftovers.snapshot()
    child = _start_training(start_child, tmp_path, "killed")
    tree = _descendants(child.pid)
    assert len(tree) >= 6, tree     # host shells, delay line, two workers, the leash
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout_s=10) == -signal.SIGKILL
    deadline = time.monotonic() + 5.0
    while _running(tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(tree), f"5 s after the SIGKILL: {_running(tree)}"
    left = leftovers.new_since(before)
    assert not left.get("processes"), left
    assert len(left.get("registry files", [])) == 1, left
    # the metrics.json written at the start says it did not finish
    metrics = json.loads(next((tmp_path / "results").glob("*/metrics.json")).read_text())
    assert metrics["complete"] is False and metrics["error"] == "running (or killed)", metrics
    # the next run or calibrate names it (this one then stops on its bad flag) ...
    out = cli("calibrate", str(_scenario(tmp_path, "next")), "--seconds", "1",
              env=subprocess_env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 2, out
    assert lines[0].startswith("note: 1 dead run(s) left") and "run_testbed.py cleanup" in lines[0]
    assert lines[1].startswith("error: --seconds:"), out
    # ... and cleanup removes it
    out = cli("cleanup", env=subprocess_env)
    assert out.returncode == 0 and "removed the registry of killed" in out.stdout, out
    assert "Traceback" not in out.stderr, out
    leftovers.assert_nothing_new(before, "after the SIGKILL and cleanup")


@pytest.mark.network
def test_sighup_tears_a_run_down_as_sigterm(tmp_path, leftovers, start_child):
    before = leftovers.snapshot()
    child = _start_training(start_child, tmp_path, "hangup")
    child.popen.send_signal(signal.SIGHUP)
    try:
        rc = child.wait(timeout_s=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running 30 s after SIGHUP:\n{child.describe()}") from None
    assert rc == 130 and "interrupted: the testbed was torn down" in child.stderr, child.describe()
    assert "Traceback" not in child.stderr, child.describe()
    metrics = json.loads(next((tmp_path / "results").glob("*/metrics.json")).read_text())
    assert metrics["complete"] is False and "SIGHUP" in metrics["error"], metrics
    leftovers.assert_nothing_new(before, "after SIGHUP")


# ---- the sweep folder lock ------------------------------------------------------------------
@pytest.mark.loopback
def test_second_resume_of_a_held_sweep_is_refused(tmp_path, subprocess_env):
    from testbed.spec.sweep import expand
    from testbed.run.sweeprun import INDEX_SCHEMA, LOCK_NAME, read_doc, sweep_key

    doc = yaml.safe_load(_scenario(tmp_path, "swept", iterations=3).read_text())
    doc["sweep"] = {"wan.0.delay_ms": [5, 20]}
    path = tmp_path / "swept.yaml"
    path.write_text(yaml.safe_dump(doc))
    doc = read_doc(str(path))
    sweep_dir = tmp_path / "swept-sweep"
    sweep_dir.mkdir()
    (sweep_dir / "index.json").write_text(json.dumps({
        "schema_version": INDEX_SCHEMA, "scenario": doc["name"], "key": sweep_key(doc, None, None),
        "sweep": doc["sweep"], "systems": None, "iterations": None,
        "points": [{"index": p.index, "label": p.label, "values": p.values, "status": "pending"}
                   for p in expand(doc)]}))
    index = (sweep_dir / "index.json").read_bytes()
    with open(sweep_dir / LOCK_NAME, "w") as held:     # the first run, working on it
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = cli("run", str(path), "--resume", str(sweep_dir), "-q", env=subprocess_env)
    assert out.returncode == 2, out
    assert out.stderr.startswith("error: --resume:") and "another process" in out.stderr, out
    assert len(out.stderr.strip().splitlines()) == 1, out
    assert (sweep_dir / "index.json").read_bytes() == index


# ---- cleanup's signals, CPU load workers ------------------------------------------------------
@pytest.mark.loopback
def test_cleanup_signals_only_the_recorded_process(tmp_path):
    """A registry entry whose start time is not the live process's (its pid was reused) is
    left alone; the recorded one is ended."""
    from testbed.emulation.registry import cleanup

    owner = subprocess.Popen(["true"])
    owner.wait()    # a dead run's owner
    # an orphan (not our child: init reaps it), in its own session
    out = subprocess.run(["setsid", "sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, timeout=10)
    pid = int(out.stdout)
    victim = os.pidfd_open(pid)
    try:
        start = _start_time(pid)
        for recorded, ended in ((start + 1, False), (start, True)):
            (tmp_path / "dead-1.json").write_text(json.dumps({
                "run_id": "dead", "owner": {"pid": owner.pid, "start": 1},
                "pids": [{"pid": pid, "start": recorded, "what": "sleep"}],
                "interfaces": []}))
            lines = cleanup(tmp_path)
            assert _pid_gone(victim, 2.0 if ended else 0.0) == ended, (recorded, lines)
            assert ("ended sleep" in " ".join(lines)) == ended, lines
    finally:
        if not _pid_gone(victim, 0.0):
            signal.pidfd_send_signal(victim, signal.SIGKILL)
        os.close(victim)


@pytest.mark.loopback
def test_cleanup_ends_a_recorded_leaders_group_through_pidfds(tmp_path):
    """A recorded group leader and its group's members end (each through a pidfd checked
    after it was opened); a process of another group is not touched."""
    from testbed.emulation.registry import cleanup

    owner = subprocess.Popen(["true"])
    owner.wait()
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], start_new_session=True)
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(members := _group_members(leader.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(members) == 2, members
        fds = [os.pidfd_open(p) for p in members]
        (tmp_path / "dead-1.json").write_text(json.dumps({
            "run_id": "dead", "owner": {"pid": owner.pid, "start": 1},
            "pids": [{"pid": leader.pid, "start": _start_time(leader.pid), "what": "sh"}],
            "interfaces": []}))
        cleanup(tmp_path)
        assert leader.wait(timeout=5) is not None
        assert all(_pid_gone(fd, 2.0) for fd in fds)
        assert bystander.poll() is None
    finally:
        for proc in (leader, bystander):
            proc.kill()
            proc.wait()


def _group_members(pgid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if name.isdigit() and int(name) != pgid and stat[2] == str(pgid):
            out.append(int(name))
    return out


CPULOAD_SCRIPT = r"""
import sys, time
from pathlib import Path
from testbed.run import cpuload
# a light loop in place of the torch one (test time); the process handling is CpuLoad's own
cpuload.LOAD_CODE = "import time\nprint('LOADED', flush=True)\nwhile True: time.sleep(1)"
load = cpuload.CpuLoad(Path(sys.argv[1]), workers=1)
load.start()
print("UP", load.procs[0].pid, flush=True)
time.sleep(60)
"""


@pytest.mark.network   # root: the registry under /run/geotestbed
def test_cpu_load_workers_are_registered_and_die_with_their_runner(tmp_path, leftovers,
                                                                   start_child, subprocess_env):
    before = leftovers.snapshot()
    script = tmp_path / "load.py"
    script.write_text(CPULOAD_SCRIPT)
    child = start_child([str(script), str(tmp_path / "logs")])
    child.wait_for("UP", timeout_s=60)
    worker = int(child.stdout.split()[1])
    [registry] = leftovers.runtime_dir().glob(f"cpuload-{child.pid}.json")
    assert worker in [e["pid"] for e in json.loads(registry.read_text())["pids"]]
    start = _start_time(worker)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout_s=10)
    deadline = time.monotonic() + 5.0
    while _running({worker: start}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running({worker: start}), "the CPU load worker outlived its runner by 5 s"
    out = cli("cleanup", env=subprocess_env)
    assert out.returncode == 0 and not registry.exists(), out
    leftovers.assert_nothing_new(before, "after the CPU load's runner was killed")


@pytest.mark.loopback
def test_live_runs_lists_only_runs_whose_owner_lives(tmp_path):
    from testbed.emulation.registry import live_runs

    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "30"])
    try:
        for name, pid, start in (("gone", dead.pid, 1), ("going", live.pid,
                                                        _start_time(live.pid))):
            (tmp_path / f"{name}-{pid}.json").write_text(json.dumps({
                "run_id": name, "owner": {"pid": pid, "start": start}, "pids": [],
                "interfaces": []}))
        mine = [r for r in live_runs(tmp_path) if Path(r["registry"]).parent == tmp_path]
        assert mine == [{"run_id": "going", "pid": live.pid,
                         "registry": str(tmp_path / f"going-{live.pid}.json")}], mine
    finally:
        live.kill()
        live.wait()
