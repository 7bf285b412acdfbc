"""Shared test setup: the `network` marker (root tests) and the "teardown leaves nothing" check.

Tests that build emulated networks carry `pytest.mark.network`. They are skipped with reason
'needs root' when not run as root, and an autouse fixture snapshots the machine before and after
each of them and fails the test if anything new remains:

    - interface names in the root namespace (`ip -br link`): a run must make none
    - registry files of the testbed (geodc.emulation.registry.RUNTIME_DIR)
    - processes whose command line contains mnexec, iperf3, geodc.emulation.delayline, 'bash --norc'
      (Mininet's host shells), geodc.hostproc.trainer.worker (training processes), geodc.features.temporal.arbiter or
      geodc.hostproc.traffic.capture (temporal WAN sharing)
    - named network namespaces (`ip netns list`)

Every test, network or not, is also checked against the root namespace's sysctls (this process
runs in it) under net.core, net.ipv4, net.ipv6.conf.all, kernel.pty and fs.file-max: a test that
changes one fails, naming it with its value before and after. Each test is compared with the
state the previous one left (the first with the session's start), so a change made while a
module-scoped network was built is caught too, at the first test that uses it. Reading them
costs about 9 ms a test on an idle machine (35 ms under a load of 7 on 2 cores). Left out,
because they change on their own: SYSCTLS_THAT_MOVE.

The session uses its own registry directory, /run/geotestbed/tests-XXXX (GEOTESTBED_RUNTIME_DIR,
set before the testbed is imported), so `run_testbed.py cleanup` in the tests only ever sees runs
the tests made, and a plain `run_testbed.py cleanup` (which reads only /run/geotestbed/*.json)
never touches a test session's runs. What other live runs on the same machine hold (listed in
/run/geotestbed/*.json or /run/geotestbed/*/*.json with a live owner: someone's `make run`, or
another test session) is not counted as a leftover, nor is a process whose environment names
another GEOTESTBED_RUNTIME_DIR (say trainer workers of a concurrent non-root test run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_RUNTIME_DIR = Path("/run/geotestbed")
PROC_MARKERS = ("mnexec", "iperf3", "geodc.emulation.delayline", "bash --norc", "geodc.hostproc.trainer.worker",
                "geodc.features.temporal.arbiter", "geodc.hostproc.traffic.capture")
SETTLE_S = 3.0  # things a teardown ended may take this long to vanish from /proc
PROC_SYS = "/proc/sys/"
ROOT_SYSCTL_TREES = ("net/core", "net/ipv4", "net/ipv6/conf/all", "kernel/pty", "fs/file-max")
SYSCTLS_THAT_MOVE = {
    "kernel.pty.nr": "a count of the ptys in use: every Mininet shell holds one while it runs",
    "net.ipv4.tcp_available_congestion_control": "grows when a congestion control's module is "
                                                  "loaded (env.json records module loads)",
}

_session_runtime_dir: Path | None = None
_last_sysctls: dict[str, bytes] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _session_runtime_dir
    config.addinivalue_line(
        "markers", "network: builds emulated networks (needs root); checked for leftovers")
    # Mininet's LinuxBridge.setup() reports bridge-nf sysctls through logging's deprecated warn().
    config.addinivalue_line(
        "filterwarnings", "ignore:The 'warn' method is deprecated:DeprecationWarning")
    if "geodc.emulation.registry" in sys.modules:
        raise pytest.UsageError("geodc.emulation.registry was imported before tests/conftest.py could "
                                "give the session its own GEOTESTBED_RUNTIME_DIR")
    try:
        SHARED_RUNTIME_DIR.mkdir(parents=True, exist_ok=True)
        _session_runtime_dir = Path(tempfile.mkdtemp(prefix="tests-", dir=SHARED_RUNTIME_DIR))
    except OSError:  # not root: the network tests are skipped anyway
        _session_runtime_dir = Path(tempfile.mkdtemp(prefix="geotestbed-tests-"))
    os.environ["GEOTESTBED_RUNTIME_DIR"] = str(_session_runtime_dir)
    global _last_sysctls
    _last_sysctls = root_sysctls()


def pytest_unconfigure(config: pytest.Config) -> None:  # noqa: ARG001
    if _session_runtime_dir is not None and _session_runtime_dir.is_dir():
        if any(_session_runtime_dir.iterdir()):
            print(f"\nregistry files left in {_session_runtime_dir}; remove them with: "
                  f"sudo GEOTESTBED_RUNTIME_DIR={_session_runtime_dir} python run_testbed.py cleanup",
                  file=sys.stderr)
        else:
            shutil.rmtree(_session_runtime_dir, ignore_errors=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Before any fixture (module-scoped networks included) is built.
    if item.get_closest_marker("network") is not None and os.geteuid() != 0:
        pytest.skip("needs root")


# ---- snapshots ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Snapshot:
    links: frozenset[str]
    registry: frozenset[str]
    procs: frozenset[tuple[int, str]]   # (pid, command line)
    netns: frozenset[str]


def runtime_dir() -> Path:
    return Path(os.environ["GEOTESTBED_RUNTIME_DIR"])


def root_links() -> set[str]:
    out = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0].split("@")[0] for line in out.splitlines() if line.strip()}


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def testbed_procs() -> set[tuple[int, str]]:
    found = set()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        cmd = _cmdline(int(entry.name))
        if any(marker in cmd for marker in PROC_MARKERS):
            found.add((int(entry.name), cmd))
    return found


def take_snapshot() -> Snapshot:
    rdir = runtime_dir()
    registry = {p.name for p in rdir.iterdir()} if rdir.is_dir() else set()
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return Snapshot(links=frozenset(root_links()), registry=frozenset(registry),
                    procs=frozenset(testbed_procs()),
                    netns=frozenset(line.split()[0] for line in out.splitlines() if line.strip()))


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _foreign() -> tuple[set[int], set[str]]:
    """Pids and interfaces of other live runs: registry files in /run/geotestbed and its
    subfolders (other test sessions) other than ours, whose owner is alive and not us."""
    pids: set[int] = set()
    links: set[str] = set()
    ours = runtime_dir().resolve()
    paths = list(SHARED_RUNTIME_DIR.glob("*.json")) + list(SHARED_RUNTIME_DIR.glob("*/*.json"))
    for path in paths:
        if path.parent.resolve() == ours:
            continue
        try:
            data = json.loads(path.read_text())
            owner = data["owner"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        stat = _stat(owner["pid"])
        if owner["pid"] == os.getpid() or stat is None or int(stat[19]) != owner.get("start"):
            continue
        pids.add(owner["pid"])
        pids.update(e["pid"] for e in data.get("pids", []))
        links.update(data.get("interfaces", []))
    return pids, links


def _other_session(pid: int) -> bool:
    """The process's environment names another GEOTESTBED_RUNTIME_DIR: it belongs to another
    test session or run (e.g. trainer workers of a concurrent non-root test run)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    for item in env:
        if item.startswith(b"GEOTESTBED_RUNTIME_DIR="):
            return item.split(b"=", 1)[1].decode(errors="replace") != str(runtime_dir())
    return False


def _descends_from(pid: int, ancestors: set[int]) -> bool:
    for _ in range(64):
        if pid in ancestors:
            return True
        stat = _stat(pid)
        if stat is None or int(stat[1]) <= 1:
            return False
        pid = int(stat[1])
    return False


def new_since(before: Snapshot) -> dict[str, list]:
    """What exists now and did not before, leaving out other people's live runs."""
    now = take_snapshot()
    foreign_pids, foreign_links = _foreign()
    found = {
        "interfaces": sorted(now.links - before.links - foreign_links),
        "registry files": sorted(now.registry - before.registry),
        "processes": sorted(p for p in now.procs - before.procs
                            if not _descends_from(p[0], foreign_pids)
                            and not _other_session(p[0])),
        "netns": sorted(now.netns - before.netns),
    }
    return {k: v for k, v in found.items() if v}


def assert_nothing_new(before: Snapshot, what: str = "", settle_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + settle_s
    while True:
        left = new_since(before)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"left behind{' ' + what if what else ''}: {left}"


def other_runs_note() -> str:
    """Beside a sysctl change: whether another live run could have made it (a run of older
    code, whose Mininet init wrote root-namespace sysctls)."""
    pids = _foreign()[0]
    return (f"other live runs on this machine (pids {sorted(pids)[:5]}): one of older code may "
            f"have written these" if pids else "no other live run was seen")


def _read_sysctls(path: str, out: dict[str, bytes]) -> None:
    """Every readable sysctl at or under path (a /proc/sys file or folder), into out."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:   # write-only (net.ipv4.route.flush) or gone
        return
    try:
        value = os.read(fd, 4096)
    except IsADirectoryError:
        value = None
    except OSError:   # unreadable as it stands (net.ipv6.conf.all.stable_secret unset)
        return
    finally:
        os.close(fd)
    if value is not None:
        key = path.removeprefix(PROC_SYS).replace("/", ".")
        if key not in SYSCTLS_THAT_MOVE:
            out[key] = value
        return
    for entry in os.scandir(path):
        _read_sysctls(entry.path, out)


def root_sysctls() -> dict[str, bytes]:
    """The root namespace's sysctls under ROOT_SYSCTL_TREES (read from this process, which
    runs in it), name -> raw value, less SYSCTLS_THAT_MOVE."""
    out: dict[str, bytes] = {}
    for tree in ROOT_SYSCTL_TREES:
        _read_sysctls(PROC_SYS + tree, out)
    return out


def sysctl_changes(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    """'name: before -> after' for each sysctl in both whose value differs (sysctls that
    appear or vanish belong to root-namespace interfaces, which the interface check names)."""
    def show(raw: bytes) -> str:
        return " ".join(raw.decode(errors="replace").split())
    return [f"{k}: {show(before[k])} -> {show(after[k])}"
            for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]


class Leftovers:
    """Handle for tests: snapshot() now, assert_nothing_new(before), new_since(before)."""

    snapshot = staticmethod(take_snapshot)
    new_since = staticmethod(new_since)
    assert_nothing_new = staticmethod(assert_nothing_new)
    root_links = staticmethod(root_links)
    runtime_dir = staticmethod(runtime_dir)
    root_sysctls = staticmethod(root_sysctls)
    sysctl_changes = staticmethod(sysctl_changes)
    other_runs_note = staticmethod(other_runs_note)


@pytest.fixture(scope="session")
def leftovers() -> Leftovers:
    return Leftovers()


@pytest.fixture(autouse=True)
def _root_sysctls_unchanged(request: pytest.FixtureRequest):
    """For every test: fail if a root-namespace sysctl differs from what the previous test
    left (the module docstring)."""
    global _last_sysctls
    before = _last_sysctls if _last_sysctls is not None else root_sysctls()
    yield
    _last_sysctls = root_sysctls()
    changed = sysctl_changes(before, _last_sysctls)
    if changed:
        changed.append(other_runs_note())
    assert not changed, (f"root-namespace sysctls changed by {request.node.name} (or a fixture "
                         f"set up for it): {'; '.join(changed)}")


@pytest.fixture(autouse=True)
def _network_leaves_nothing(request: pytest.FixtureRequest):
    """For `network` tests: fail if the test (or its network) left anything behind."""
    if request.node.get_closest_marker("network") is None:
        yield
        return
    before = take_snapshot()
    yield
    assert_nothing_new(before, f"by {request.node.name}")


# ---- helpers shared by the network tests ----------------------------------------------------
@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for child Python processes: the repo importable, our registry directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Child:
    """A Python child process (a script or run_testbed.py) whose output we can wait on."""

    def __init__(self, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.stdout_path = log_dir / "stdout.txt"
        self.stderr_path = log_dir / "stderr.txt"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            # SIGINT back to its default in the child: a test run started as a background job
            # inherits SIGINT ignored, and Python then never turns Ctrl-C into KeyboardInterrupt.
            self.popen = subprocess.Popen([sys.executable, *argv], cwd=REPO_ROOT, env=env,
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          preexec_fn=_default_sigint)
        self.pid = self.popen.pid

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float) -> None:
        """Wait until stdout holds text; fail with the child's output if it exits or times out."""
        deadline = time.monotonic() + timeout_s
        while text not in self.stdout:
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"{text!r} not printed (exit {self.popen.poll()}) after {timeout_s} s;\n"
                    f"stdout:\n{self.stdout}\nstderr:\n{self.stderr}")
            time.sleep(0.05)

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout=timeout_s)

    def describe(self) -> str:
        return f"exit {self.popen.poll()}\nstdout:\n{self.stdout}\nstderr:\n{self.stderr}"


@pytest.fixture
def start_child(subprocess_env, tmp_path):
    """start_child(argv) -> Child. Children still running at the end are stopped (SIGINT, then
    SIGKILL), and anything a killed child left is removed via the session's registry."""
    children: list[Child] = []

    def start(argv: list[str]) -> Child:
        child = Child(argv, subprocess_env, tmp_path / f"child{len(children)}")
        children.append(child)
        return child

    yield start
    killed = False
    for child in children:
        if child.popen.poll() is None:
            child.popen.send_signal(signal.SIGINT)
            try:
                child.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.popen.kill()
                child.popen.wait()
                killed = True
    if killed:
        from geodc.emulation.registry import cleanup
        cleanup(runtime_dir())
