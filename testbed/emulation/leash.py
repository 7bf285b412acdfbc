"""Children die with the runner: a SIGKILLed run leaves no process running.

One job. `ensure()` (called before the runner starts its first child) gives the runner a random
token, put in the environment every child and grandchild inherits (`child_env` adds it to an
explicit env), and starts one watcher process (`python -m testbed.emulation.leash`) that holds a pidfd
of the runner. When the runner is gone, however it ended, the watcher SIGKILLs every process
whose environment carries the token: workers, delay lines, servers, `iperf3`, Mininet's host
shells and whatever they started, wherever they run (children of Mininet host shells have the
shell, not the runner, as parent, so a parent-death signal alone would miss them). A process is
signalled only through a pidfd opened before its environment is checked, so a pid reused
meanwhile is never hit. The namespaces vanish with their shells; the registry files stay, and
the next `run` or `calibrate` names them (testbed.emulation.registry.dead_runs) for `cleanup`.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from testbed.spec.paths import REPO_ROOT

TOKEN_VAR = "GEOTESTBED_LEASH"
SWEEP_S = 1.0   # keep sweeping this long for processes forked while a sweep ran

_started_for: int | None = None   # the pid whose watcher runs (a fork starts its own)
_lock = threading.Lock()          # children are spawned from several threads
_watcher: subprocess.Popen | None = None   # held: it runs as long as we do


def ensure() -> None:
    """Start the watcher for this process once, and put its token in os.environ."""
    with _lock:
        if _started_for != os.getpid():
            _start()


def _start() -> None:
    global _started_for, _watcher
    token = secrets.token_hex(16)
    pidfd = os.pidfd_open(os.getpid())
    try:
        env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
        env["PYTHONPATH"] = str(REPO_ROOT)
        _watcher = subprocess.Popen([sys.executable, "-m", "testbed.emulation.leash", token, str(pidfd)],
                                    pass_fds=(pidfd,), env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, start_new_session=True)
    finally:
        os.close(pidfd)
    os.environ[TOKEN_VAR] = token
    _started_for = os.getpid()


def child_env(env: dict[str, str] | None) -> dict[str, str] | None:
    """env with this runner's token (None: inherit os.environ, which has it)."""
    ensure()
    return None if env is None else dict(env, **{TOKEN_VAR: os.environ[TOKEN_VAR]})


def carriers(token: str) -> list[int]:
    """Pids of the processes whose environment carries token (this one left out)."""
    mark = f"{TOKEN_VAR}={token}".encode()
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me and _carries(int(entry.name), mark):
            found.append(int(entry.name))
    return found


def _carries(pid: int, mark: bytes) -> bool:
    try:
        return mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def kill_carriers(token: str) -> int:
    """SIGKILL every carrier of token, each through a pidfd opened before it was checked.
    Returns how many were signalled."""
    mark = f"{TOKEN_VAR}={token}".encode()
    n = 0
    for pid in carriers(token):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if _carries(pid, mark):   # the pidfd's process, not one that got the pid since
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                n += 1
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
    return n


def main(argv: list[str]) -> int:
    token, pidfd = argv[0], int(argv[1])
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # a Ctrl-C to the terminal is the runner's
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    while not poller.poll():   # readable once the runner has exited
        pass
    deadline = time.monotonic() + SWEEP_S
    while kill_carriers(token) or time.monotonic() < deadline:
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
