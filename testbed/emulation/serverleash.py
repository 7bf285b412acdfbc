"""A run's processes on a server end when the server stops hearing from the runner.

One job: the server-side counterpart of testbed.emulation.leash. A server's sshd keeps a session
whose client vanished (a cut underlay, a machine powered off) for as long as TCP lets it, hours,
and with it every process the run started there. So with a run's registry folder on a server
(testbed.emulation.serverregistry), the runner starts one more ssh there: a watcher reading its
stdin, to which the runner writes a heartbeat every HEARTBEAT_S. When the watcher reads `end`
the run has ended itself and it exits; when its input ends (the runner, or its ssh, is gone) or
stays silent SILENCE_S, it ends the run there as `cleanup --cluster` would: every recorded
process SIGKILLed through a pidfd while its start time still matches, the run's filter and
folder removed (serverregistry.end_run_script).
"""

from __future__ import annotations

import shlex
import subprocess
import threading

from testbed.emulation.servers import ssh_argv
from testbed.spec.cluster import Server

HEARTBEAT_S = 2.0
SILENCE_S = 10.0
STOP_WAIT_S = 5.0

# Run on the server as `python3 -c WATCH SILENCE_S`: exit 0 on a line `end`, 3 on end of input
# or silence (then the shell around it ends the run).
WATCH = """
import os, select, sys
silence = float(sys.argv[1])
buf = b""
while True:
    if not select.select([0], [], [], silence)[0]:
        sys.exit(3)
    data = os.read(0, 256)
    if not data:
        sys.exit(3)
    buf = (buf + data)[-16:]
    if b"end\\n" in buf:
        sys.exit(0)
"""


def watch_script(end_script: str) -> str:
    """The shell the watcher's ssh runs: WATCH, then end_script unless it read `end`."""
    return (f"python3 -c {shlex.quote(WATCH)} {SILENCE_S:g}; "
            f"[ $? = 3 ] && {{ {end_script}; }} >/dev/null 2>&1; true")


class ServerLeash:
    """One watcher per server (start), fed by one heartbeat thread; stop() tells each the run
    ended and waits for its ssh."""

    def __init__(self) -> None:
        self._watchers: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, server: Server, end_script: str) -> None:
        """Start server's watcher (once), which runs end_script should the runner go silent."""
        with self._lock:
            if server.name in self._watchers:
                return
            self._watchers[server.name] = subprocess.Popen(
                [*ssh_argv(server), watch_script(end_script)], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="server-leash",
                                                daemon=True)
                self._thread.start()

    def _send(self, data: bytes, only: set[str] | None = None) -> None:
        with self._lock:
            for name, popen in self._watchers.items():
                if popen.poll() is None and (only is None or name in only):
                    try:
                        popen.stdin.write(data)
                        popen.stdin.flush()
                    except OSError:   # its ssh has ended: nothing to tell it
                        pass

    def _beat(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            self._send(b".")

    def stop(self, ended: set[str]) -> None:
        """The run ended itself on the servers named in ended: their watchers are told so and
        their ssh waited for (killed after STOP_WAIT_S, our child, not yet reaped). Every other
        watcher's ssh is killed at once: its end of input, or its silence if the server cannot
        be reached, makes it end the run there."""
        self._stopped.set()
        self._send(b"end\n", only=ended)
        with self._lock:
            watchers, self._watchers = dict(self._watchers), {}
        for name, popen in watchers.items():
            try:
                popen.stdin.close()
            except OSError:
                pass
            try:
                popen.wait(STOP_WAIT_S if name in ended else 0)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()
