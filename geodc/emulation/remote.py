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
import select
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

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
_RUN_ID_RE = re.compile(r"[A-Za-z0-9_.:+-]{1,128}")


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
        raise SshFailed(f"server {server.name} ({server.destination}): no answer over ssh "
                        f"in {timeout_s:g} s") from None
    if r.returncode == 255:
        raise SshFailed(f"server {server.name} ({server.destination}): ssh failed: "
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


# Run on a server as `python3 -c SIGNAL_RECORDED SIG FILE...`: each FILE holds `pid starttime`
# (self_record); the process is signalled through a pidfd opened before its start time is
# checked, so a pid reused since is never signalled. Prints how many were signalled.
SIGNAL_RECORDED = """
import os, signal, sys
n = 0
for path in sys.argv[2:]:
    try:
        pid, start = open(path).read().split()[:2]
        fd = os.pidfd_open(int(pid))
    except (OSError, ValueError):
        continue
    try:
        if open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19] == start:
            signal.pidfd_send_signal(fd, int(sys.argv[1]))
            n += 1
    except (OSError, IndexError):
        pass
    finally:
        os.close(fd)
print("signalled", n)
"""


def signal_files(sig: int, files: str) -> str:
    """Shell words that send sig to the processes recorded in files (a shell glob or path)."""
    return f"python3 -c {shlex.quote(SIGNAL_RECORDED)} {int(sig)} {files}"


class SshFailed(TestbedError):
    """ssh to a server did not connect or answer (server_run)."""


class ServerLost(TestbedError):
    """A node's server stopped answering (its ssh ended) while a command waited on it."""


class ServerRegistry:
    """What a run started on each server, kept on that server: one file per process under
    REMOTE_STATE/<run id>/ holding `pid starttime` (written by the process itself, before it
    runs anything), and `owner`: the starting machine's boot id, pid and start time.
    cleanup() ends each recorded process whose start time still matches, then removes the
    folder."""

    def __init__(self, run_id: str) -> None:
        if not _RUN_ID_RE.fullmatch(run_id):
            raise ValueError(f"run id {run_id!r}")
        self.run_id = run_id
        self.dir = f"{REMOTE_STATE}/{run_id}"
        self.servers: dict[str, Server] = {}
        self.lost_servers: set[str] = set()   # found gone: their nodes are asked nothing more
        self._lock = threading.Lock()
        self._n = 0

    def open(self, server: Server) -> None:
        """Make the folder on server (once), with its owner: this process, on this machine."""
        if server.name not in self.servers:
            server_run(server, f"mkdir -p -m 700 {self.dir} && echo {shlex.quote(owner_line())} "
                       f"> {self.dir}/owner")
            self.servers[server.name] = server

    def entry(self, what: str) -> str:
        """A new file name on a server for one process (what: a label, letters and digits)."""
        with self._lock:
            self._n += 1
            return f"{self.dir}/{self._n:05d}-{re.sub(r'[^A-Za-z0-9_-]', '_', what)[:40]}.pid"

    def cleanup(self) -> list[str]:
        """End every recorded process on every server, remove the folders; lines of what could
        not be reached (empty: all clean)."""
        left = []
        for server in self.servers.values():
            if server.name in self.lost_servers:
                left.append(f"server {server.name} ({server.destination}): lost during the run")
                continue
            try:
                end_run(server, self.run_id)
            except TestbedError as exc:
                left.append(str(exc))
        return left


def _start_field(pid: int | str) -> str:
    """Field 22 of /proc/PID/stat (the start time in clock ticks since boot)."""
    return Path(f"/proc/{int(pid)}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def owner_line() -> str:
    """`boot_id pid starttime` of this process: who owns a run folder on a server."""
    return f"{_boot_id()} {os.getpid()} {_start_field(os.getpid())}"


def owner_alive(line: str) -> bool | None:
    """Whether the owner a run folder names is alive: True or False if it is this machine's
    process, None if it is another machine's or the line is not an owner line."""
    parts = line.split()
    if len(parts) != 3 or not parts[1].isdigit() or parts[0] != _boot_id():
        return None
    try:
        return _start_field(parts[1]) == parts[2]
    except (OSError, IndexError):
        return False


def end_run(server: Server, run_id: str) -> str:
    """SIGKILL every process a run recorded on server (through pidfds, by start time), remove
    its folder (and REMOTE_STATE if that leaves it empty); what the server said."""
    if not _RUN_ID_RE.fullmatch(run_id) or set(run_id) == {"."}:
        raise ValueError(f"run id {run_id!r}")
    d = f"{REMOTE_STATE}/{run_id}"
    return server_run(server, f'[ -d {d} ] || exit 0; {signal_files(signal.SIGKILL, f"{d}/*.pid")}'
                      f' && rm -rf {d} && {{ rmdir {REMOTE_STATE} 2>/dev/null; true; }}').strip()


def cleanup_servers(servers: Iterable[Server]) -> list[str]:
    """`cleanup --cluster`: on every server, each run folder whose owner is gone (a killed run
    started from this machine) is ended (end_run); a live run's, or one started from another
    machine, is kept and said so. Where no run is left on a server, a stray tunnel device
    (gdvx*: a build killed between making it and moving it into its node) is removed. Lines
    of what was done or could not be."""
    done = []
    for server in servers:
        try:
            listing = server_run(server, f'for d in {REMOTE_STATE}/*/; do [ -d "$d" ] || continue; '
                                 'echo "$(basename "$d") $(cat "$d/owner" 2>/dev/null)"; done')
        except TestbedError as exc:
            done.append(f"could not clean up: {exc}")
            continue
        kept = 0
        for line in listing.splitlines():
            run_id, _, owner = line.strip().partition(" ")
            state = owner_alive(owner)
            if state is False:
                try:
                    said = end_run(server, run_id)
                    done.append(f"{server.name}: ended {run_id} ({said or 'nothing running'})")
                    continue
                except (TestbedError, ValueError) as exc:
                    done.append(f"{server.name}: could not end {run_id}: {exc}")
            elif state:
                done.append(f"{server.name}: skipped {run_id}: its run is still going")
            else:
                done.append(f"{server.name}: skipped {run_id}: started from another machine or "
                            f"without an owner ({owner or 'none'}); clean it up from there")
            kept += 1
        if kept:
            continue
        try:
            out = server_run(server, "ip -o link show | sed -n 's/^[0-9]*: \\(gdvx[0-9]*\\)[:@].*/\\1/p' "
                             "| while read -r l; do ip link del \"$l\" && echo \"$l\"; done")
        except TestbedError as exc:
            done.append(f"could not remove tunnel devices: {exc}")
            continue
        done += [f"{server.name}: removed tunnel device {name}" for name in out.split()]
    return done


def signal_recorded(server: Server, path: str, sig: int) -> bool:
    """Send sig to the process that wrote `pid starttime` into path on server, only if that pid
    still has that start time (never a stranger that took the number); True if it was sent."""
    out = server_run(server, signal_files(sig, shlex.quote(path)), timeout_s=10)
    return out.strip().endswith("signalled 1")


def self_record(path: str) -> str:
    """Shell words that write `$$ starttime` into path (then the caller execs)."""
    return f'echo $$ $(cut -d" " -f22 /proc/$$/stat) > {shlex.quote(path)}'


SHELL_EXIT_S = 5.0   # for a node's ssh to end after SIGHUP
AUTH_WAIT_S = 15.0   # the most a spawn waits for its ssh to authenticate before the next
_AUTH_LOCKS: dict[str, threading.Lock] = {}   # per server: one connection authenticating
_SPAWNING = threading.local()                 # extra ssh options of the spawn in progress


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
