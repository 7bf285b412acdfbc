"""Start a process (in an emulated host or on this machine), wait for it, stop it, read its log.

One job: process lifecycle. Every worker (trainer stage, iperf3, delay line) is started from an
argv list with its output in a log file, leads its own process group (Mininet's `mnexec -d` and
`start_new_session=True` both call setsid), and is stopped by signalling exactly that group:
SIGTERM, a grace period, then SIGKILL. Nothing here kills by name, and nothing signals a
process or group whose leader was reaped (HostProcess.signal). Every child carries the
runner's leash (testbed.emulation.leash): it dies within seconds if the runner is killed.

A `Spawner` is what callers use to start processes "in host X": `LocalSpawner` runs them on this
machine (tests, loopback runs); `testbed.emulation.network.Network` provides one that runs them inside the
Mininet host's namespace.
"""

from __future__ import annotations

import os
import random
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from testbed.emulation import interrupts, leash
from testbed.spec.paths import REPO_ROOT

if TYPE_CHECKING:
    from testbed.emulation.registry import Registry


class HostProcess:
    """A started process: its host, argv, pid and log file, and a pidfd held from spawn.

    Signals go through `signal()`, which refuses once the process was reaped: its pid (and so
    its process group's id) may then be another process's. While the leader is unreaped (alive
    or a zombie) no other process or group can hold its number, so the group is signalled only
    then, and its leftover members are ended just before the leader is reaped."""

    def __init__(self, host: str, argv: Sequence[str], popen: subprocess.Popen, log_path: Path,
                 on_exit: Callable[[int], None] | None = None) -> None:
        self.host = host
        self.argv = list(argv)
        self.popen = popen
        self.pid = popen.pid
        self.pidfd = os.pidfd_open(popen.pid)  # nothing reaps it before this: only we wait
        self.log_path = log_path
        self._on_exit = on_exit
        self._lock = threading.Lock()   # a reap and a group signal never interleave

    @property
    def reaped(self) -> bool:
        return self.popen.returncode is not None

    def signal(self, sig: int, group: bool = True) -> bool:
        """Send sig to the process group (group=False: the process only) unless the leader was
        reaped; False then."""
        with self._lock:
            if self.reaped:
                return False
            try:
                if group:
                    os.killpg(self.pid, sig)
                else:
                    signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:  # a zombie's group with no other member
                pass
            return True

    def poll(self) -> int | None:
        if not self.reaped and _exited(self.pidfd, 0.0):
            self._reap()
        return self.popen.returncode

    def wait(self, timeout_s: float) -> int:
        """Wait for exit; raise TimeoutError naming the process if it runs past timeout_s."""
        if not self.reaped and not _exited(self.pidfd, timeout_s):
            raise TimeoutError(f"{self.describe()} still running after {timeout_s:.0f} s")
        self._reap()
        return self.popen.returncode

    def stop(self, grace_s: float = 3.0) -> int | None:
        """SIGTERM the process group, wait grace_s, then SIGKILL it. Returns the exit code."""
        self.signal(signal.SIGTERM)
        return self._finish(time.monotonic() + grace_s)

    def _finish(self, deadline: float) -> int | None:
        """Wait for exit until deadline, then SIGKILL the group. None if it still won't die
        (e.g. stuck in the kernel): the caller keeps it in the registry for `cleanup`."""
        if not self.reaped and not _exited(self.pidfd, max(0.0, deadline - time.monotonic())):
            self.signal(signal.SIGKILL)
            if not _exited(self.pidfd, 5.0):
                return None
        self._reap()
        return self.popen.returncode

    def _reap(self) -> None:
        """The leader has exited: end what it left in its group (its zombie still holds the
        group's id), then reap it. Only after that is the pid free for reuse."""
        with self._lock:
            if not self.reaped:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait()   # the pidfd stays open (__del__): another thread may poll it
        if self._on_exit is not None:
            cb, self._on_exit = self._on_exit, None
            cb(self.pid)

    def __del__(self) -> None:
        fd, self.pidfd = getattr(self, "pidfd", -1), -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def output(self, tail_chars: int = 4000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text[-tail_chars:]

    def describe(self) -> str:
        """'<program> in <host> (pid N)'; a Python module run with -m is named by its module
        (trainer.worker, prefill.server), behind any wrapper such as nice."""
        name = Path(self.argv[0]).name
        if "-m" in self.argv[:-1]:
            name = self.argv[self.argv.index("-m") + 1]
        return f"{name} in {self.host} (pid {self.pid})"


def _exited(pidfd: int, timeout_s: float) -> bool:
    """Has the process of pidfd exited (it is then a zombie until reaped)? Waits up to
    timeout_s; reaps nothing."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def stop_all(procs: Sequence[HostProcess], grace_s: float = 2.0) -> list[HostProcess]:
    """SIGTERM every process group at once, give them one shared grace period, SIGKILL the
    rest. Returns the processes that would not die."""
    for proc in procs:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    return [proc for proc in procs if proc._finish(deadline) is None]


class Spawner(Protocol):
    def spawn(self, host: str, argv: Sequence[str], log_path: Path,
              env: dict[str, str] | None = None) -> HostProcess: ...


def open_log(path: Path):
    """A process's log file opened for writing, truncated; never through a link (a link
    planted where a log goes would make us, root, write where it points)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    return os.fdopen(fd, "wb")


@dataclass
class LocalSpawner:
    """Runs processes on this machine, each in a new session; remembers them for stop_all(),
    and lists them in registry if one is given (for `cleanup`)."""

    procs: list[HostProcess] = field(default_factory=list)
    registry: Registry | None = None

    def spawn(self, host: str, argv: Sequence[str], log_path: Path,
              env: dict[str, str] | None = None) -> HostProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open_log(log_path) as log:
            popen = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=leash.child_env(env),
                                     start_new_session=True)
        if self.registry is not None:
            self.registry.add_pid(popen.pid, f"{Path(argv[0]).name} on {host}")
        proc = HostProcess(host, argv, popen, log_path)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        stop_all(list(reversed(self.procs)))
        self.procs.clear()


def wait_all(procs: Sequence[HostProcess], timeout_s: float, poll_s: float = 0.05,
             on_tick: Callable[[], None] | None = None) -> None:
    """Wait until every process exits 0. On the first failure or at the deadline, stop all of
    them and raise RuntimeError with the failing process's log tail. on_tick runs every
    poll_s while waiting (e.g. to report progress)."""
    deadline = time.monotonic() + timeout_s
    pending = list(procs)
    try:
        while pending:
            interrupts.check()     # a Ctrl-C swallowed in a fork's handler stops us here
            if on_tick is not None:
                on_tick()
            for proc in list(pending):
                rc = proc.poll()
                if rc is None:
                    continue
                pending.remove(proc)
                if rc != 0:
                    raise RuntimeError(f"{proc.describe()} exited with {rc}:\n{proc.output()}")
            if pending and time.monotonic() > deadline:
                raise TimeoutError(f"{pending[0].describe()} still running after {timeout_s:.0f} s"
                                   f":\n{pending[0].output()}")
            time.sleep(poll_s)
    finally:
        stop_all(pending)


def worker_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a Python process the testbed starts on a host: geodc importable,
    unbuffered output, one BLAS thread (one host is one GPU; the CPUs are shared)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"]
                                          if env.get("PYTHONPATH") else "")
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def free_base_port(n: int, ip: str = "127.0.0.1") -> int:
    """A base port with n free consecutive ports on ip (for loopback runs: tests, benchmarks)."""
    for _ in range(50):
        base = random.randint(20000, 45000)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind((ip, port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {n} free consecutive ports on {ip}")
