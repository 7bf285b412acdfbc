"""A server of a cluster (testbed.spec.cluster.Server) reached over ssh, in its root namespace.

One job: run a shell script on a server with the cluster file's ssh options, a connect timeout
and keep-alives (so a dead server is an error within seconds); with it, ask a server what its
kernel has (netem, the loaded modules) and measure the underlay between two servers (ping from
one to the other's address).
"""

from __future__ import annotations

import re
import shlex
import subprocess

from testbed.emulation import machine
from testbed.plans.crossing import Underlay
from testbed.spec.cluster import Server
from testbed.spec.errors import TestbedError

# Keep-alives (a dead server is an error within seconds), and nothing of this machine's reaches
# a server: no agent forwarded or even asked (IdentityAgent none: the cluster file's key
# authenticates), no port forwarded from a user's ssh config.
SSH_EXTRA = ["-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=2",
             "-o", "ServerAliveCountMax=3", "-o", "ForwardAgent=no", "-o", "IdentityAgent=none",
             "-o", "ClearAllForwardings=yes"]
_RTT_RE = re.compile(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms")


class SshFailed(TestbedError):
    """ssh to a server did not connect or answer (server_run)."""


def ssh_argv(server: Server) -> list[str]:
    """ssh to server's root namespace, non-interactive, with the cluster file's options; its
    errors (a refused key, a changed host key, a timeout) on stderr, its warnings not."""
    return ["ssh", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", *SSH_EXTRA,
            *server.ssh_options, server.destination]


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


def as_root(server: Server, script: str) -> str:
    """script as root on server: through `sudo -n` unless its login is root."""
    return script if server.user == "root" else f"sudo -n sh -c {shlex.quote(script)}"


# netem tried on lo of a throwaway network namespace: nothing to remove, the namespace ends
# with the probe (testbed.emulation.network.probe_netem does the same on this machine).
_NETEM_PROBE = ("unshare -n sh -c 'ip link set lo up && tc qdisc add dev lo root handle 1: "
                "netem delay 1ms' >/dev/null 2>&1 && echo netem || echo none")


_MODULES = "cat /proc/modules 2>/dev/null || echo none-listed"


def server_kernel(server: Server) -> tuple[frozenset[str] | None, bool]:
    """In one ssh: the kernel modules loaded on server (server_modules), then whether its kernel
    has netem (loading sch_netem there if it is a module)."""
    modules, netem = server_run(server, f"{_MODULES}; echo @@; "
                                f"{as_root(server, _NETEM_PROBE)}").split("@@")
    return _module_names(modules), netem.split()[-1:] == ["netem"]


def server_modules(server: Server) -> frozenset[str] | None:
    """Names of the kernel modules loaded on server; None where its kernel lists none."""
    return _module_names(server_run(server, _MODULES))


def _module_names(out: str) -> frozenset[str] | None:
    return None if out.strip() == "none-listed" else machine.module_names(out)


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
