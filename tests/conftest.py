"""Shared test setup: the three rings, and the "teardown leaves nothing" check of root tests.

Every test is in exactly one ring, by a marker (registered in pyproject.toml; a test with none or
with two fails collection):

    - `unit`: pure: no processes, no sockets; the whole ring runs in under a minute
      (`make test-unit`). Enforced in each phase of a unit test (setup, call, teardown): opening
      a socket, starting a process (subprocess, multiprocessing, os.fork/posix_spawn/system/
      exec) or opening a file under /proc/sys for writing raises and fails the test, even when
      the code under test catches the error; so does a socket still open or a child process
      still running at its end (what a C library made behind Python's back). The one exception
      is UNIT_TOOLS: static checkers that only read the tree (ruff, lint-imports). torch runs
      on one thread in unit tests (_torch_on_one_thread).
    - `loopback`: real processes and sockets on 127.0.0.1, no root (`make test-loopback`).
    - `network`: needs root: builds emulated networks in namespaces, or asks for what only root
      gets (SCHED_FIFO). CI runs as root, so none of these is skipped there.

Tests that build emulated networks carry `pytest.mark.network`. They are skipped with reason
'needs root' when not run as root, and an autouse fixture snapshots the machine before and after
each of them and fails the test if anything new remains:

    - interface names in the root namespace (`ip -br link`): a run must make none
    - registry files of the testbed (testbed.emulation.registry.RUNTIME_DIR)
    - processes whose command line contains mnexec, iperf3, testbed.emulation.delayline, 'bash --norc'
      (Mininet's host shells), trainer.worker (training processes), testbed.features.temporal.arbiter or
      traffic.capture (temporal WAN sharing)
    - named network namespaces (`ip netns list`)

GEODC_TEST_BACKEND=netem|delayline (tests/scenarios.py) forces the backend of the scenarios the
tests write; with netem forced on a kernel without it, every `network` test is skipped with
that reason (the stock-kernel ring, `make test-stock-kernel`, boots a kernel that has it).

Every test, network or not, is also checked against the root namespace's sysctls (this process
runs in it) under net.core, net.ipv4, net.ipv6.conf.all, kernel.pty and fs.file-max: a test that
changes one fails, naming it with its value before and after. Each test is compared with the
state the previous one left (the first with the session's start), so a change made while a
module-scoped network was built is caught too, at the first test that uses it. Reading them
costs about 9 ms a test on an idle machine (35 ms under a load of 7 on 2 cores), so unit tests
(which cannot write them) are not read one by one: a change in a run of unit tests is found at
the next test checked, or at the session's end, naming the run. Left out, because they change
on their own: tests/root_sysctls.py's THAT_MOVE (the list of sysctls watched is there, shared
with scripts/container_check.sh).

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
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import root_sysctls as watched_sysctls

# as tests/scenarios.py reads them (read here too: tests/test_rings.py runs this file alone)
BACKENDS = ("netem", "delayline")
TEST_BACKEND = os.environ.get("GEODC_TEST_BACKEND", "")

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_RUNTIME_DIR = Path("/run/geotestbed")
PROC_MARKERS = ("mnexec", "iperf3", "testbed.emulation.delayline", "bash --norc", "trainer.worker",
                "testbed.features.temporal.arbiter", "traffic.capture")
SETTLE_S = 3.0  # things a teardown ended may take this long to vanish from /proc

_session_runtime_dir: Path | None = None
_last_sysctls: dict[str, bytes] | None = None
_unit_tests_unchecked: list[str] = []   # unit tests run since the sysctls were last read


def pytest_configure(config: pytest.Config) -> None:
    global _session_runtime_dir
    if TEST_BACKEND and TEST_BACKEND not in BACKENDS:
        raise pytest.UsageError(f"GEODC_TEST_BACKEND={TEST_BACKEND!r} is not a backend: use "
                                f"{' or '.join(BACKENDS)}, or leave it unset (auto)")
    # Mininet's LinuxBridge.setup() reports bridge-nf sysctls through logging's deprecated warn().
    config.addinivalue_line(
        "filterwarnings", "ignore:The 'warn' method is deprecated:DeprecationWarning")
    if "testbed.emulation.registry" in sys.modules:
        raise pytest.UsageError("testbed.emulation.registry was imported before tests/conftest.py could "
                                "give the session its own GEOTESTBED_RUNTIME_DIR")
    try:
        SHARED_RUNTIME_DIR.mkdir(parents=True, exist_ok=True)
        _session_runtime_dir = Path(tempfile.mkdtemp(prefix="tests-", dir=SHARED_RUNTIME_DIR))
    except OSError:  # not root: the network tests are skipped anyway
        _session_runtime_dir = Path(tempfile.mkdtemp(prefix="geotestbed-tests-"))
    os.environ["GEOTESTBED_RUNTIME_DIR"] = str(_session_runtime_dir)
    global _last_sysctls
    _last_sysctls = root_sysctls()
    _warm_matplotlib()


def _warm_matplotlib() -> None:
    """Build matplotlib's font cache now, outside any test: on a machine where it was never
    built, matplotlib runs fc-list for it at its first figure, which a unit test may not do."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib import font_manager  # noqa: F401  (builds the cache on import)
    except ImportError:
        pass


def pytest_unconfigure(config: pytest.Config) -> None:  # noqa: ARG001
    if _session_runtime_dir is not None and _session_runtime_dir.is_dir():
        if any(_session_runtime_dir.iterdir()):
            print(f"\nregistry files left in {_session_runtime_dir}; remove them with: "
                  f"sudo GEOTESTBED_RUNTIME_DIR={_session_runtime_dir} python run_testbed.py cleanup",
                  file=sys.stderr)
        else:
            shutil.rmtree(_session_runtime_dir, ignore_errors=True)




# ---- rings ----------------------------------------------------------------------------------
RINGS = ("unit", "loopback", "network")
# What a unit test may run as a child: static checkers that only read the tree (no sockets, no
# process outlives the call). Matched on the executable's file name, with shell=False only.
UNIT_TOOLS = frozenset({"ruff", "lint-imports"})


@pytest.hookimpl(tryfirst=True)   # before -m deselects: `pytest -m unit` checks every test too
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:  # noqa: ARG001
    wrong = []
    for item in items:
        rings = sorted({m.name for m in item.iter_markers() if m.name in RINGS})
        if len(rings) != 1:
            wrong.append(f"  {item.nodeid}: {', '.join(rings) if rings else 'no ring'}")
    if wrong:
        raise pytest.UsageError(
            f"every test needs exactly one ring marker ({', '.join(RINGS)}; tests/conftest.py); "
            f"{len(wrong)} have none or more than one:\n" + "\n".join(wrong))


def _socket_inodes() -> set[str]:
    """The sockets this process holds open ('socket:[inode]' links in /proc/self/fd)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


def _children() -> set[int]:
    """This process's child processes, of every thread."""
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            pids.update(int(p) for p in Path(f"/proc/self/task/{task}/children").read_text().split())
        except OSError:
            continue
    return pids


def _under_proc_sys(file: object) -> bool:
    if isinstance(file, int):
        return False
    try:
        path = os.path.abspath(os.fsdecode(file))
    except TypeError:
        return False
    return path == watched_sysctls.PROC_SYS.rstrip("/") or path.startswith(watched_sysctls.PROC_SYS)


class _UnitGuard:
    """While active (one phase of one unit test), every way to open a socket, start a process or
    write a sysctl raises, and is recorded, so the test fails even if the code under test
    swallows the error. UNIT_TOOLS may be run."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.violations: list[str] = []
        self._undo: list[tuple[object, str, object]] = []
        self._tool = threading.local()

    def refuse(self, action: str) -> RuntimeError:
        where = "".join(traceback.format_stack(limit=8)[:-2])
        self.violations.append(f"{action} (thread {threading.current_thread().name}), at:\n{where}")
        return RuntimeError(f"unit ring: {action} in a `unit` test ({self.what}); a test that "
                            f"opens sockets, starts processes or writes sysctls belongs in "
                            f"`loopback` or `network`")

    def _patch(self, owner: object, name: str, make) -> None:
        if hasattr(owner, name):
            original = getattr(owner, name)
            self._undo.append((owner, name, original))
            setattr(owner, name, make(original))

    def __enter__(self) -> "_UnitGuard":
        import _posixsubprocess
        import builtins
        import io
        import socket
        guard = self

        def refused(action: str):
            def make(original):
                def call(*args, **kwargs):
                    raise guard.refuse(action)
                return call
            return make

        def unless_tool(action: str):
            def make(original):
                def call(*args, **kwargs):
                    if getattr(guard._tool, "active", False):
                        return original(*args, **kwargs)
                    raise guard.refuse(action)
                return call
            return make

        def socket_init(original):
            def init(sock, family=-1, type=-1, proto=-1, fileno=None):
                raise guard.refuse(f"socket.socket(family={family}, type={type})")
            return init

        def popen_init(original):
            def init(popen, args, *rest, **kwargs):
                argv0 = kwargs.get("executable") or (
                    args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
                if not kwargs.get("shell") and Path(os.fsdecode(argv0)).name in UNIT_TOOLS:
                    guard._tool.active = True
                    try:
                        return original(popen, args, *rest, **kwargs)
                    finally:
                        guard._tool.active = False
                raise guard.refuse(f"subprocess.Popen({args!r})")
            return init

        def open_file(original):
            def call(file, mode="r", *args, **kwargs):
                if any(c in mode for c in "wax+") and _under_proc_sys(file):
                    raise guard.refuse(f"open({file!r}, {mode!r})")
                return original(file, mode, *args, **kwargs)
            return call

        def os_open(original):
            def call(path, flags, *args, **kwargs):
                if flags & (os.O_WRONLY | os.O_RDWR) and _under_proc_sys(path):
                    raise guard.refuse(f"os.open({path!r}) for writing")
                return original(path, flags, *args, **kwargs)
            return call

        self._patch(socket.socket, "__init__", socket_init)
        self._patch(socket, "socketpair", refused("socket.socketpair()"))
        self._patch(subprocess.Popen, "__init__", popen_init)
        self._patch(_posixsubprocess, "fork_exec", unless_tool("a process (fork_exec)"))
        for name in ("posix_spawn", "posix_spawnp"):
            self._patch(os, name, unless_tool(f"a process (os.{name})"))
        for name in ("fork", "forkpty", "system", "execv", "execve"):
            self._patch(os, name, refused(f"a process (os.{name})"))
        self._patch(builtins, "open", open_file)
        self._patch(io, "open", open_file)
        self._patch(os, "open", os_open)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def made_behind_pythons_back(self, sockets_before: set[str], children_before: set[int]) -> None:
        """What a C library (torch.distributed, gloo) made that the patches cannot see: sockets
        still open and child processes still running at the end of the test."""
        sockets = _socket_inodes() - sockets_before
        if sockets:
            self.violations.append(f"{len(sockets)} socket(s) left open: {sorted(sockets)}")
        children = _children() - children_before
        if children:
            self.violations.append(f"child processes still running: "
                                   f"{[(pid, _cmdline(pid)) for pid in sorted(children)]}")

    def check(self) -> None:
        if self.violations:
            pytest.fail(f"a `unit` test ({self.what}) opened sockets, started processes or wrote "
                        f"sysctls; it belongs in `loopback` or `network`:\n"
                        + "\n".join(self.violations), pytrace=False)


_BEFORE_UNIT_TEST = pytest.StashKey[tuple[set[str], set[int]]]()
_torch_threads: int | None = None   # torch's own thread count while unit tests hold it at one


def _torch_on_one_thread(unit: bool) -> None:
    """Unit tests run torch on one thread: on a 2-core machine shared with other work its two
    threads spin for each other (test_prefill_model took 3x as long). Others get it back."""
    global _torch_threads
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if unit and _torch_threads is None:
        _torch_threads = torch.get_num_threads()
        torch.set_num_threads(1)
    elif not unit and _torch_threads is not None:
        torch.set_num_threads(_torch_threads)
        _torch_threads = None


def _guarded(item: pytest.Item, phase: str):
    unit = item.get_closest_marker("unit") is not None
    if phase == "setup":
        _torch_on_one_thread(unit)
    if not unit:
        return (yield)
    if phase == "setup":
        item.stash[_BEFORE_UNIT_TEST] = (_socket_inodes(), _children())
    guard = _UnitGuard(f"{item.nodeid}, {phase}")
    with guard:
        result = yield
    if phase == "teardown" and _BEFORE_UNIT_TEST in item.stash:
        guard.made_behind_pythons_back(*item.stash[_BEFORE_UNIT_TEST])
    guard.check()
    return result


_netem_here: bool | None = None   # does this kernel have netem (probed at the first need)


def _forced_netem_missing() -> bool:
    """GEODC_TEST_BACKEND=netem on a kernel without netem."""
    global _netem_here
    if TEST_BACKEND != "netem":
        return False
    if _netem_here is None:
        from testbed.emulation.network import kernel_has_netem
        _netem_here = kernel_has_netem()
    return not _netem_here


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    # Before any fixture (module-scoped networks included) is built.
    if item.get_closest_marker("network") is not None and os.geteuid() != 0:
        pytest.skip("needs root")
    if item.get_closest_marker("network") is not None and _forced_netem_missing():
        pytest.skip("GEODC_TEST_BACKEND=netem but this kernel lacks netem (make "
                    "test-stock-kernel boots one that has it)")
    return (yield from _guarded(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _guarded(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    return (yield from _guarded(item, "teardown"))


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


def root_sysctls() -> dict[str, bytes]:
    """The root namespace's sysctls under root_sysctls.TREES (read from this process, which
    runs in it), name -> raw value, less root_sysctls.THAT_MOVE."""
    return watched_sysctls.read()


sysctl_changes = watched_sysctls.changes


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


def _unit_tests_note() -> str:
    n = len(_unit_tests_unchecked)
    return (f"or by one of the {n} unit tests run since the last check "
            f"({_unit_tests_unchecked[0]} .. {_unit_tests_unchecked[-1]})" if n else "")


@pytest.fixture(autouse=True)
def _root_sysctls_unchanged(request: pytest.FixtureRequest):
    """For every test but unit tests: fail if a root-namespace sysctl differs from what the
    previous test left (the module docstring). A unit test cannot write one (its guard refuses
    writes under /proc/sys), so it is not read for each (9 ms a test); what the unit tests
    changed anyway is found at the next check, the session's end at the latest, naming them."""
    global _last_sysctls
    if request.node.get_closest_marker("unit") is not None:
        _unit_tests_unchecked.append(request.node.nodeid)
        yield
        return
    before = _last_sysctls if _last_sysctls is not None else root_sysctls()
    yield
    _last_sysctls = root_sysctls()
    changed = sysctl_changes(before, _last_sysctls)
    if changed:
        changed += filter(None, [_unit_tests_note(), other_runs_note()])
    _unit_tests_unchecked.clear()
    assert not changed, (f"root-namespace sysctls changed by {request.node.name} (or a fixture "
                         f"set up for it): {'; '.join(changed)}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:  # noqa: ARG001
    """The sysctl check for unit tests that ran after the last checked test."""
    if not _unit_tests_unchecked or _last_sysctls is None:
        return
    changed = sysctl_changes(_last_sysctls, root_sysctls())
    if changed:
        changed += [_unit_tests_note(), other_runs_note()]
        print(f"\nerror: root-namespace sysctls changed during the session's last tests: "
              f"{'; '.join(changed)}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
        from testbed.emulation.registry import cleanup
        cleanup(runtime_dir())


@pytest.fixture
def cluster(tmp_path):
    """A local cluster of 2 servers (scripts/local_cluster.py up 2) for one test: its
    testbed.spec.cluster.Cluster; down after the test, whatever happened."""
    from testbed.spec.cluster import load_cluster
    script = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "local_cluster.py")]
    out = tmp_path / "cluster.yaml"
    subprocess.run([*script, "up", "2", "--out", str(out)], check=True, timeout=60)
    try:
        yield load_cluster(out)
    finally:
        subprocess.run([*script, "down"], check=True, timeout=60)
