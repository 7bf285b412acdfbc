"""Nodes on other servers, through Mininet's cluster mode (mininet/examples/cluster.py), extended.

One job: what a node on another server needs beyond Mininet's RemoteMixin, which it keeps:
  - ssh options per server (port, key, known_hosts from the cluster file, geodc.spec.cluster),
    a connect timeout and keep-alives, so a dead server is an error within seconds;
  - no local sudo (we are root here; Mininet runs ssh as `sudo -E -u user`) and no remote sudo
    for root logins (a server need not have sudo installed);
  - every argument quoted for the remote shell (ssh joins argv with spaces: Mininet's popen
    breaks an argument holding a space or a quote);
  - a registry on each server (ServerRegistry): every shell and process the run starts there
    writes its pid and kernel start time into /run/geotestbed-remote/<run id>/ on that server,
    so teardown ends exactly those, on every server, over ssh, and removes the folder.
Every command reaches a node through its server's ssh (its shell, popen, rcmd); nothing here
enters a remote node's namespace from this machine by pid.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import threading

from mininet.examples.cluster import RemoteMixin
from mininet.node import Host
from mininet.nodelib import LinuxBridge

from geodc.emulation import leash
from geodc.plans.crossing import Underlay
from geodc.spec.cluster import Server
from geodc.spec.errors import TestbedError

REMOTE_STATE = "/run/geotestbed-remote"
SSH_EXTRA = ["-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=2",
             "-o", "ServerAliveCountMax=3"]
_RTT_RE = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")
_RUN_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def ssh_argv(server: Server) -> list[str]:
    """ssh to server's root namespace, non-interactive, with the cluster file's options."""
    return ["ssh", "-q", "-o", "BatchMode=yes", *SSH_EXTRA, *server.ssh_options,
            server.destination]


def server_run(server: Server, script: str, timeout_s: float = 30.0) -> str:
    """Run a shell script on server (its root namespace) over ssh; its output. TestbedError,
    one line naming the server, if ssh fails or the script exits non-zero."""
    try:
        r = subprocess.run([*ssh_argv(server), script], capture_output=True, text=True,
                           timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"server {server.name} ({server.destination}): no answer over ssh "
                           f"in {timeout_s:g} s") from None
    if r.returncode == 255:
        raise TestbedError(f"server {server.name} ({server.destination}): ssh failed: "
                           f"{r.stderr.strip() or 'exit 255'}")
    if r.returncode != 0:
        raise TestbedError(f"server {server.name}: {script.splitlines()[0][:80]!r} exited "
                           f"{r.returncode}: {(r.stderr or r.stdout).strip()[-300:]}")
    return r.stdout


def parse_underlay(text: str) -> Underlay:
    m = _RTT_RE.search(text)
    if not m:
        raise TestbedError(f"no RTT in ping's output: {text.strip()[-200:]}")
    mn, avg, mx, mdev = map(float, m.groups())
    return Underlay(rtt_ms=avg, mdev_ms=mdev, min_ms=mn, max_ms=mx)


def measure_underlay(a: Server, b: Server, count: int = 20, interval_s: float = 0.05) -> Underlay:
    """ping from server a to server b's address (the underlay between them, no tunnel)."""
    out = server_run(a, f"ping -n -q -c {count} -i {interval_s} {shlex.quote(b.address)}",
                     timeout_s=count * interval_s + 15)
    return parse_underlay(out)


class ServerRegistry:
    """What a run started on each server, kept on that server: one file per process under
    REMOTE_STATE/<run id>/ holding `pid starttime` (written by the process itself, before it
    runs anything). cleanup() ends each whose start time still matches, then removes the folder."""

    def __init__(self, run_id: str) -> None:
        if not _RUN_ID_RE.fullmatch(run_id):
            raise ValueError(f"run id {run_id!r}")
        self.run_id = run_id
        self.dir = f"{REMOTE_STATE}/{run_id}"
        self.servers: dict[str, Server] = {}
        self._lock = threading.Lock()
        self._n = 0

    def open(self, server: Server) -> None:
        """Make the folder on server (once)."""
        if server.name not in self.servers:
            server_run(server, f"mkdir -p -m 700 {self.dir}")
            self.servers[server.name] = server

    def entry(self, what: str) -> str:
        """A new file name on a server for one process (what: a label, letters and digits)."""
        with self._lock:
            self._n += 1
            return f"{self.dir}/{self._n:05d}-{re.sub(r'[^A-Za-z0-9_-]', '_', what)[:40]}.pid"

    def cleanup(self) -> list[str]:
        """End every recorded process on every server, remove the folders; lines of what could
        not be reached (empty: all clean)."""
        script = (f'd={self.dir}; [ -d "$d" ] || exit 0; n=0; '
                  'for f in "$d"/*.pid; do [ -f "$f" ] || continue; set -- $(cat "$f"); '
                  '[ -n "$2" ] && [ "$(cut -d" " -f22 /proc/$1/stat 2>/dev/null)" = "$2" ] '
                  '&& kill -9 "$1" 2>/dev/null && n=$((n+1)); done; rm -rf "$d"; '
                  f'rmdir {REMOTE_STATE} 2>/dev/null; echo "killed $n"')
        left = []
        for server in self.servers.values():
            try:
                server_run(server, script)
            except TestbedError as exc:
                left.append(str(exc))
        return left


def signal_recorded(server: Server, path: str, sig: int) -> bool:
    """Send sig to the process that wrote `pid starttime` into path on server, only if that pid
    still has that start time (never a stranger that took the number); True if it was sent."""
    out = server_run(server, f'set -- $(cat {shlex.quote(path)} 2>/dev/null); '
                     '[ -n "$2" ] && [ "$(cut -d" " -f22 /proc/$1/stat 2>/dev/null)" = "$2" ] '
                     f'&& kill -{int(sig)} "$1" && echo sent; true', timeout_s=10)
    return out.strip().endswith("sent")


def self_record(path: str) -> str:
    """Shell words that write `$$ starttime` into path (then the caller execs)."""
    return f'echo $$ $(cut -d" " -f22 /proc/$$/stat) > {shlex.quote(path)}'


SHELL_EXIT_S = 5.0   # for a node's ssh to end after SIGHUP


class ClusterMixin(RemoteMixin):
    """RemoteMixin with the cluster file's ssh options, no sudo where we are root, quoted
    arguments, and every shell and popen'd process in the server's ServerRegistry."""

    def __init__(self, name: str, *, cluster_server: Server, registry: ServerRegistry,
                 **params) -> None:
        self.sshbase = [*RemoteMixin.sshbase, *SSH_EXTRA, *cluster_server.ssh_options]
        self.cluster_server = cluster_server
        self.registry = registry
        registry.open(cluster_server)
        super().__init__(name, **cluster_server.mininet_params, **params)

    @property
    def sshcmd(self) -> list[str]:
        return self._sshcmd

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
        popen = self._popen(["mnexec", "-a", str(self.pid), *wrapped], tt=True, **kwargs)
        popen.remote_record = path   # where it wrote itself: signal_recorded() reaches it
        return popen


class ClusterHost(ClusterMixin, Host):
    """A host (or gateway) on a cluster server."""


class ClusterBridge(ClusterMixin, LinuxBridge):
    """A DC's Linux bridge, in its own namespace on a cluster server."""
