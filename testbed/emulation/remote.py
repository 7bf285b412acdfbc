"""Nodes on other servers, through Mininet's cluster mode (mininet/examples/cluster.py), extended.

One job: what a node on another server needs beyond Mininet's RemoteMixin, which it keeps:
  - ssh options per server (port, key, known_hosts from the cluster file, testbed.spec.cluster),
    a connect timeout and keep-alives, so a dead server is an error within seconds; no agent
    forwarded (Mininet forwards it) or used;
  - no local sudo (we are root here; Mininet runs ssh as `sudo -E -u user`) and no remote sudo
    for root logins (a server need not have sudo installed);
  - every argument quoted for the remote shell (ssh joins argv with spaces: Mininet's popen
    breaks an argument holding a space or a quote);
  - every shell and process the run starts on a server written into that server's registry
    (testbed.emulation.serverregistry) before it runs, so teardown ends exactly those;
  - a node whose ssh ended (its server lost) is asked nothing more (Mininet's reads would block);
  - one ssh connection authenticating per server at a time (sshd's MaxStartups).
Every command reaches a node through its server's ssh (its shell, popen, rcmd); nothing here
enters a remote node's namespace from this machine by pid.
"""

from __future__ import annotations

import os
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time

from mininet.examples.cluster import RemoteMixin
from mininet.node import Host
from mininet.nodelib import LinuxBridge

from testbed.emulation import leash
from testbed.emulation.serverregistry import ServerRegistry, self_record
from testbed.emulation.servers import SSH_EXTRA
from testbed.spec.cluster import Server
from testbed.spec.errors import TestbedError


class ServerLost(TestbedError):
    """A node's server stopped answering (its ssh ended) while a command waited on it."""


SHELL_EXIT_S = 5.0   # for a node's ssh to end after SIGHUP
AUTH_WAIT_S = 15.0   # the most a spawn waits for its ssh to authenticate before the next
_AUTH_LOCKS: dict[str, threading.Lock] = {}   # per server: one connection authenticating
_SPAWNING = threading.local()                 # extra ssh options of the spawn in progress


class ClusterMixin(RemoteMixin):
    """RemoteMixin with the cluster file's ssh options, no sudo where we are root, quoted
    arguments, and every shell and popen'd process in the server's ServerRegistry."""

    def __init__(self, name: str, *, cluster_server: Server, registry: ServerRegistry,
                 **params) -> None:
        # Mininet's base forwards the ssh agent (ForwardAgent=yes, and ssh keeps an option's
        # first value): dropped, SSH_EXTRA says no.
        base = list(RemoteMixin.sshbase)
        for i in range(len(base) - 1, 0, -1):
            if base[i - 1:i + 1] == ["-o", "ForwardAgent=yes"]:
                del base[i - 1:i + 1]
        self.sshbase = [*base, *SSH_EXTRA, *cluster_server.ssh_options]
        self.cluster_server = cluster_server
        self.registry = registry
        registry.open(cluster_server)
        super().__init__(name, **cluster_server.mininet_params, **params)

    @property
    def sshcmd(self) -> list[str]:
        extra = getattr(_SPAWNING, "ssh_options", None)
        return self._sshcmd if not extra else [*self._sshcmd[:-1], *extra, self._sshcmd[-1]]

    @sshcmd.setter
    def sshcmd(self, cmd: list[str]) -> None:
        # Mininet runs ssh as `sudo -E -u <user>` to use that user's keys; the cluster file
        # names the key, we are root, and sudo may not exist here.
        if cmd[:2] == ["sudo", "-E"] and cmd[2:3] == ["-u"]:
            cmd = cmd[4:]
        self._sshcmd = cmd

    @staticmethod
    def _ignoreSignal() -> None:  # noqa: N802 - Mininet's hook, run in each ssh child
        """Mininet's (its own process group), and SIGHUP back to its default: a run started
        under nohup hands ssh SIGHUP ignored, and ssh then outlives the SIGHUP with which
        Mininet ends a shell, and Mininet's stop waits for it forever."""
        os.setpgrp()
        signal.signal(signal.SIGHUP, signal.SIG_DFL)

    def terminate(self) -> None:
        """Mininet's (SIGHUP to the shell's group), then, should the ssh still run after
        SHELL_EXIT_S, SIGKILL to it: our child, not yet reaped, so its pid is still its own."""
        if self.shell is not None and self.shell.poll() is None:
            os.killpg(self.shell.pid, signal.SIGHUP)
            try:
                self.shell.wait(SHELL_EXIT_S)
            except subprocess.TimeoutExpired:
                self.shell.kill()
        super().terminate()

    def lost(self) -> bool:
        """Whether this node's ssh has ended, or its server was found lost (by another node's
        ssh ending: the registry's lost_servers), so nothing more is asked of it."""
        return self.shell is not None and (self.shell.poll() is not None or
                                           self.cluster_server.name in self.registry.lost_servers)

    def read(self, size=1024) -> str:
        """Mininet's read, waiting (0.5 s at a time) for output only while the node is not lost:
        a pty whose ssh has ended never reads end-of-file here."""
        if not self.readbuf:   # (Mininet's pollOut also reports POLLOUT: always ready)
            readable = select.poll()
            readable.register(self.stdout.fileno(), select.POLLIN | select.POLLPRI)
            while not readable.poll(500):
                if self.lost():
                    raise ServerLost(f"{self.name}: server {self.cluster_server.name} lost")
        return super().read(size)

    def cmd(self, *args, **kwargs) -> str:
        """Mininet's, but nothing (an empty output) once the node's ssh has ended: Mininet
        keeps the pty's slave end open here, so a read from a dead shell never ends."""
        if self.lost():
            return ""
        return super().cmd(*args, **kwargs)

    def waitOutput(self, verbose=False, findPid=True) -> str:  # noqa: N802 - Mininet's API
        """Mininet's, polling every 0.5 s whether the ssh has ended meanwhile (then what was
        read so far)."""
        output = ""
        while self.waiting:
            try:
                data = self.monitor(timeoutms=500, findPid=findPid)
            except ServerLost:
                data = ""
            output += data
            if not data and self.lost():
                self.waiting = False
        return output

    def _popen(self, cmd, sudo=True, tt=True, **params):  # noqa: D401 - Mininet's hook
        if isinstance(cmd, str):
            cmd = cmd.split()
        if self.isRemote:
            cmd = [shlex.quote(c) for c in cmd]
        return super()._popen(cmd, sudo=sudo and self.user != "root", tt=tt, **params)

    def rcmd(self, *cmd, **opts) -> str:
        """A command on the node's server, in its root namespace (Mininet's reads bytes into
        a str: Python 2's)."""
        popen = self.rpopen(*cmd, text=True, **opts)
        out, _ = popen.communicate()
        return out

    def finishInit(self) -> None:  # noqa: N802 - Mininet's API
        super().finishInit()
        out = self.cmd(self_record(self.registry.entry(f"shell-{self.name}")) + " && echo ok")
        if "ok" not in out:
            raise TestbedError(f"{self.name} on {self.cluster_server.name}: could not record "
                               f"its shell: {out.strip()[-200:]}")

    def popen(self, *args, **kwargs):
        """Node.popen on the node's server: the process first writes itself into the server's
        registry; env (what differs from ours, never our leash token) and cwd are applied
        there, not to the local ssh; it runs on ssh's pseudo-terminal and is not detached
        (mnexec -a, not -da), so it gets SIGHUP, and ends, when its ssh ends."""
        if not self.isRemote:
            return super().popen(*args, **kwargs)
        cmd = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else (
            args[0].split() if len(args) == 1 else list(args))
        env = kwargs.pop("env", None) or {}
        cwd = kwargs.pop("cwd", None)
        pairs = [f"{k}={v}" for k, v in env.items()
                 if os.environ.get(k) != v and k != leash.TOKEN_VAR]
        path = self.registry.entry(f"{self.name}-{cmd[0].rsplit('/', 1)[-1]}")
        script = self_record(path) + (f" && cd {shlex.quote(str(cwd))}" if cwd else "")
        wrapped = ["sh", "-c", script + ' && exec env "$@"', "sh", *pairs, *cmd]
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        # One connection at a time is authenticating to a server: sshd drops connections past
        # its MaxStartups (10 unauthenticated by default; a run starts 64 workers at once).
        # ssh runs LocalCommand once it is authenticated; the next spawn waits for that.
        with _AUTH_LOCKS.setdefault(self.cluster_server.name, threading.Lock()):
            folder = tempfile.mkdtemp(prefix="geodc-ssh-")
            marker = os.path.join(folder, "authenticated")
            _SPAWNING.ssh_options = ["-o", "PermitLocalCommand=yes",
                                     "-o", f"LocalCommand=touch {marker}"]
            try:
                popen = self._popen(["mnexec", "-a", str(self.pid), *wrapped], tt=True, **kwargs)
                deadline = time.monotonic() + AUTH_WAIT_S
                while (not os.path.exists(marker) and popen.poll() is None
                       and time.monotonic() < deadline):
                    time.sleep(0.005)
            finally:
                _SPAWNING.ssh_options = None
                shutil.rmtree(folder, ignore_errors=True)
        popen.remote_record = path   # where it wrote itself: signal_recorded() reaches it
        return popen


class ClusterHost(ClusterMixin, Host):
    """A host (or gateway) on a cluster server."""


class ClusterBridge(ClusterMixin, LinuxBridge):
    """A DC's Linux bridge, in its own namespace on a cluster server."""
