"""What a run started on each server, kept on that server, and ended there.

One job: a registry folder per run on every server it uses, REMOTE_STATE/<run id>/: one file per
process (`pid starttime`, written by the process itself before it runs anything, self_record)
and `owner` (the starting machine's boot id, pid and start time). Signals to recorded processes
are sent on the server through pidfds, only while the recorded start time still matches
(SIGNAL_RECORDED), never by name; `cleanup_servers` is `cleanup --cluster`. While a run lasts,
each server's leash (testbed.emulation.serverleash) ends it there if this machine goes silent.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import threading
from collections.abc import Iterable
from pathlib import Path

from testbed.emulation.registry import start_time
from testbed.emulation.serverleash import ServerLeash
from testbed.emulation.servers import server_run
from testbed.emulation.underlayfilter import remove_all_script, remove_script
from testbed.spec.cluster import Server
from testbed.spec.errors import TestbedError

REMOTE_STATE = "/run/geotestbed-remote"
_RUN_ID_RE = re.compile(r"[A-Za-z0-9_.:+-]{1,128}")


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
        self.leash = ServerLeash()

    def open(self, server: Server) -> None:
        """Make the folder on server (once), with its owner: this process, on this machine;
        and the server's leash (testbed.emulation.serverleash), which ends what the run started
        there should this machine go silent."""
        if server.name not in self.servers:
            server_run(server, f"mkdir -p -m 700 {self.dir} && echo {shlex.quote(owner_line())} "
                       f"> {self.dir}/owner")
            self.servers[server.name] = server
            self.leash.start(server, end_run_script(self.run_id))

    def entry(self, what: str) -> str:
        """A new file name on a server for one process (what: a label, letters and digits)."""
        with self._lock:
            self._n += 1
            return f"{self.dir}/{self._n:05d}-{re.sub(r'[^A-Za-z0-9_-]', '_', what)[:40]}.pid"

    def cleanup(self) -> list[str]:
        """End every recorded process on every server, remove the folders; lines of what could
        not be reached (empty: all clean)."""
        left, ended = [], set()
        for server in self.servers.values():
            if server.name in self.lost_servers:
                left.append(f"server {server.name} ({server.destination}): lost during the run")
                continue
            try:
                end_run(server, self.run_id)
                ended.add(server.name)
            except TestbedError as exc:
                left.append(str(exc))
        self.leash.stop(ended)   # where the run was not ended, the leash ends it
        return left


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def owner_line() -> str:
    """`boot_id pid starttime` of this process: who owns a run folder on a server."""
    return f"{_boot_id()} {os.getpid()} {start_time(os.getpid())}"


def owner_alive(line: str) -> bool | None:
    """Whether the owner a run folder names is alive: True or False if it is this machine's
    process, None if it is another machine's or the line is not an owner line."""
    parts = line.split()
    if len(parts) != 3 or not parts[1].isdigit() or parts[0] != _boot_id():
        return None
    return str(start_time(int(parts[1]))) == parts[2]   # None (gone) never matches


def end_run(server: Server, run_id: str) -> str:
    """SIGKILL every process a run recorded on server (through pidfds, by start time), remove
    its tunnels' filter (testbed.emulation.underlayfilter) and its folder (and REMOTE_STATE if
    that leaves it empty); what the server said."""
    return server_run(server, end_run_script(run_id)).strip()


def end_run_script(run_id: str) -> str:
    """The shell, run on a server, that end_run runs there (the server's leash runs it too)."""
    if not _RUN_ID_RE.fullmatch(run_id) or set(run_id) == {"."}:
        raise ValueError(f"run id {run_id!r}")
    d = f"{REMOTE_STATE}/{run_id}"
    return (f'[ -d {d} ] || exit 0; {signal_files(signal.SIGKILL, f"{d}/*.pid")}'
            f' && {{ {remove_script(run_id)}; }}'
            f' && rm -rf {d} && {{ rmdir {REMOTE_STATE} 2>/dev/null; true; }}')


def cleanup_servers(servers: Iterable[Server]) -> list[str]:
    """`cleanup --cluster`: on every server, each run folder whose owner is gone (a killed run
    started from this machine) is ended (end_run); a live run's, or one started from another
    machine, is kept and said so. Where no run is left on a server, a stray tunnel device
    (a VXLAN device named gdvx*: a build killed between making it and moving it into its node;
    nothing else of that name) and a stray filter
    chain (GDVX-*: a run whose folder is gone) are removed. Lines of what was done or could
    not be."""
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
            out = server_run(server, "ip -o link show type vxlan | sed -n 's/^[0-9]*: \\(gdvx[0-9]*\\)[:@].*/\\1/p' "
                             "| while read -r l; do ip link del \"$l\" && echo \"$l\"; done")
            unfiltered = server_run(server, remove_all_script())
        except TestbedError as exc:
            done.append(f"could not remove tunnel devices or filters: {exc}")
            continue
        done += [f"{server.name}: removed tunnel device {name}" for name in out.split()]
        done += [f"{server.name}: removed filter chain {line.split()[-1]} ({line.split()[1]})"
                 for line in unfiltered.splitlines() if line.startswith("unfiltered ")]
    return done


def signal_recorded(server: Server, path: str, sig: int) -> bool:
    """Send sig to the process that wrote `pid starttime` into path on server, only if that pid
    still has that start time (never a stranger that took the number); True if it was sent."""
    out = server_run(server, signal_files(sig, shlex.quote(path)), timeout_s=10)
    return out.strip().endswith("signalled 1")


def self_record(path: str) -> str:
    """Shell words that write `$$ starttime` into path (then the caller execs)."""
    return f'echo $$ $(cut -d" " -f22 /proc/$$/stat) > {shlex.quote(path)}'
