"""What a run created, written down as it is created, so a killed run can be cleaned up.

One job: a small JSON file per run under /run/geotestbed/ (RUNTIME_DIR) listing the processes
(pid plus kernel start time, checked through a pidfd, so a reused pid is never signalled) that
hold the run's network namespaces: Mininet's host and bridge shells, delay lines, workers. The
namespaces need no entry: they are held only by those processes and vanish with them, taking
their veths, bridges, qdiscs and iptables rules along. A run makes nothing in the root
namespace. `cleanup()` (the `run_testbed.py cleanup` command) reads the files of runs whose
owner process is gone and ends exactly what they list; `dead_runs_notice` is the line `run`
and `calibrate` print while such files exist, and `live_runs` the other runs going on
(recorded in env.json: their load skews timings).

Interfaces: registry files of earlier versions (whose bridges were in the root namespace) also
list root-namespace interfaces, each stamped with an alias (IFLA_IFALIAS `geotestbed:<run
id>:<pid>`) and its ifindex. `cleanup` still removes those, never touching a live run's: it skips
every name that a live run's registry lists (any registry under RUNTIME_DIR or /run/geotestbed
whose owner is alive), deletes a recorded interface only if its ifindex and alias are still the
recorded ones, and one recorded by name only (a run killed mid-build) only if it carries no
other run's alias.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
import time
from pathlib import Path

from typing import TYPE_CHECKING

from testbed.emulation.results import write_text

if TYPE_CHECKING:
    from pyroute2 import IPRoute

RUNTIME_DIR = Path(os.environ.get("GEOTESTBED_RUNTIME_DIR", "/run/geotestbed"))
SHARED_RUNTIME_DIR = Path("/run/geotestbed")
ALIAS_PREFIX = "geotestbed:"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/pid/stat)."""
    stat = _stat(pid)
    return int(stat[19]) if stat is not None else None


class Registry:
    """The resources of one run, kept in RUNTIME_DIR/<run_id>.json (rewritten atomically)."""

    def __init__(self, run_id: str, directory: Path = RUNTIME_DIR,
                 cluster: str | None = None) -> None:
        self.path = directory / f"{run_id}-{os.getpid()}.json"  # unique even for equal run ids
        self.data: dict = {"run_id": run_id, "owner": {"pid": os.getpid(),
                                                       "start": start_time(os.getpid())},
                           "pids": [], "interfaces": []}
        if cluster is not None:   # the run's nodes are on these servers (cleanup --cluster)
            self.data["cluster"] = cluster
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._write()

    def add_pid(self, pid: int, what: str) -> None:
        entry = {"pid": pid, "start": start_time(pid), "what": what}
        with self._lock:    # processes are spawned from several threads (cross-traffic's too)
            self.data["pids"].append(entry)
            self._write()

    def remove_all(self) -> list[str]:
        """Remove what this registry lists, as `cleanup` would for a crashed run (for a
        teardown that Mininet could not finish, e.g. interrupted mid-build). Lines as
        cleanup's; those starting with "could not" are what is left."""
        return _remove(self.data, live_interfaces(self.path.parent) - set(self.data["interfaces"]))

    def close(self) -> None:
        """The run tore everything down itself: forget it."""
        self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        write_text(self.path, json.dumps(self.data, indent=1))


def alive(entry: dict) -> bool:
    return entry.get("start") is not None and start_time(entry["pid"]) == entry["start"]


def _signal(entry: dict, sig: int) -> None:
    """sig to a recorded process and the members of its group, each through a pidfd, so a pid
    reused since is never signalled: the leader's pidfd is opened before its start time is
    checked; each member's is opened before its group is checked, and the members count only
    if the leader is still alive after that (a live leader's number names no other group)."""
    try:
        fd = os.pidfd_open(entry["pid"])
    except OSError:
        return
    members: list[int] = []
    try:
        if not alive(entry):
            return
        members = _group_pidfds(entry["pid"])
        if not alive(entry):
            return
        for member in (*members, fd):
            try:
                signal.pidfd_send_signal(member, sig)
            except ProcessLookupError:
                pass
    finally:
        for member in (*members, fd):
            os.close(member)


def _stat(pid: int) -> list[str] | None:
    """Fields 3 on of /proc/pid/stat (state, ppid, pgrp, ...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _group_pidfds(pgid: int) -> list[int]:
    """pidfds of the other processes whose group is pgid, each checked after it was opened."""
    fds = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == pgid:
            continue
        stat = _stat(int(name))
        if stat is None or stat[2] != str(pgid):
            continue
        try:
            fd = os.pidfd_open(int(name))
        except OSError:
            continue
        stat = _stat(int(name))
        if stat is not None and stat[2] == str(pgid):
            fds.append(fd)
        else:
            os.close(fd)
    return fds


def _registries(directory: Path) -> list[tuple[Path, dict]]:
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        data = _read(path)
        if data is not None:
            found.append((path, data))
    return found


def live_runs(directory: Path = RUNTIME_DIR) -> list[dict]:
    """Other runs going on now (registries here or in /run/geotestbed, one level below either,
    whose owner is alive and not this process): run id, owner pid, registry file."""
    out = []
    paths = {p for d in {directory, SHARED_RUNTIME_DIR} if d.is_dir()
             for p in (*d.glob("*.json"), *d.glob("*/*.json"))}
    for path in sorted(paths):
        data = _read(path)
        owner = (data or {}).get("owner", {})
        if data is not None and alive(owner) and owner.get("pid") != os.getpid():
            out.append({"run_id": data.get("run_id"), "pid": owner["pid"], "registry": str(path)})
    return out


def dead_runs_notice(directory: Path = RUNTIME_DIR) -> str | None:
    """One line if runs that died without tearing down left registries here, else None."""
    dead = [data for _, data in _registries(directory) if not alive(data.get("owner", {}))]
    if not dead:
        return None
    prefix = "" if directory == SHARED_RUNTIME_DIR else f"GEOTESTBED_RUNTIME_DIR={directory} "
    clusters = sorted({str(d["cluster"]) for d in dead if d.get("cluster")})
    return (f"note: {len(dead)} dead run(s) left namespaces, links or processes behind "
            f"({', '.join(str(d.get('run_id')) for d in dead)}); remove them with: sudo "
            f"{prefix}python run_testbed.py cleanup"
            + "".join(f" --cluster {c}" for c in clusters[:1])
            + (f" (and the same with --cluster {', '.join(clusters[1:])})" if clusters[1:] else ""))


def cleanup(directory: Path = RUNTIME_DIR) -> list[str]:
    """Remove what crashed runs left. Returns one line per thing removed. Runs whose owner is
    still alive are skipped."""
    done: list[str] = []
    for path, data in _registries(directory):
        if alive(data.get("owner", {})):
            done.append(f"skipped {data.get('run_id')}: its run (pid {data['owner']['pid']}) is still going")
            continue
        # What live runs hold, read afresh for each dead run (one may have started meanwhile).
        lines = _remove(data, live_interfaces(directory))
        if data.get("cluster"):
            lines.append(f"{data.get('run_id')} ran on the servers of {data['cluster']}: "
                         f"cleanup --cluster {data['cluster']} ends what it left there")
        done += lines
        if any(line.startswith("could not") for line in lines):
            done.append(f"kept {path.name}: run cleanup again once that is resolved")
        else:
            path.unlink(missing_ok=True)
            done.append(f"removed the registry of {data.get('run_id')} ({path.name})")
    return done


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def live_interfaces(*directories: Path) -> set[str]:
    """Interface names that live runs hold: listed in a registry (in these folders, in
    /run/geotestbed or one level below either) whose owner is alive."""
    names: set[str] = set()
    paths: set[Path] = set()
    for d in {*directories, SHARED_RUNTIME_DIR}:
        paths.update(d.glob("*.json"))
        paths.update(d.glob("*/*.json"))
    for path in paths:
        data = _read(path)
        if data is not None and alive(data.get("owner", {})):
            names.update(data.get("interfaces", []))
    return names


def _current(ipr: IPRoute, name: str) -> tuple[int, str] | None:
    found = ipr.link_lookup(ifname=name)
    if not found:
        return None
    link = ipr.get_links(found[0])[0]
    return found[0], link.get_attr("IFLA_IFALIAS") or ""


def _owned(data: dict, name: str, now: tuple[int, str]) -> str:
    """'' if interface `name` (now: ifindex, alias) is this stale run's, else why not."""
    recorded = data.get("interface_ids", {}).get(name)
    if recorded is not None:
        if (recorded["ifindex"], recorded["alias"]) != now:
            return (f"it is not the one this run made (ifindex {now[0]}, alias {now[1]!r}; "
                    f"recorded {recorded['ifindex']}, {recorded['alias']!r})")
        return ""
    own = f"{ALIAS_PREFIX}{data.get('run_id')}:{data.get('owner', {}).get('pid')}"
    if now[1].startswith(ALIAS_PREFIX) and now[1] != own:
        return f"another run holds it ({now[1]})"
    return ""


def _remove(data: dict, held: set[str] = frozenset()) -> list[str]:
    done = []
    live = [e for e in data.get("pids", []) if alive(e)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for entry in live:
            _signal(entry, sig)
        deadline = time.monotonic() + 2.0
        while any(alive(e) for e in live) and time.monotonic() < deadline:
            time.sleep(0.05)
    done += [f"ended {e['what']} (pid {e['pid']})" for e in live]
    # pyroute2 only here: reading the registry (a dead run's notice, before a command's flags
    # are checked) needs none of it
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError
    for name in data.get("interfaces", []):
        if name in held:
            done.append(f"skipped interface {name}: a live run holds it")
            continue
        try:
            with IPRoute() as ipr:
                now = _current(ipr, name)
                if now is None:
                    continue
                why = _owned(data, name, now)
                if why:
                    done.append(f"skipped interface {name}: {why}")
                    continue
                ipr.link("del", index=now[0])
        except NetlinkError as exc:
            if exc.code != errno.ENODEV:  # gone meanwhile (its peer was deleted): fine
                done.append(f"could not delete interface {name}: {exc}")
            continue
        done.append(f"deleted interface {name}")
    return done
