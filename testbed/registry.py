"""What a run created, written down as it is created, so a killed run can be cleaned up.

One job: a small JSON file per run under /run/geotestbed/ (RUNTIME_DIR) listing the processes
(pid plus kernel start time, so a reused pid is never signalled) and the root-namespace
interfaces (bridges and their ports) that the run made. Network namespaces need no entry: they
are held only by the run's processes and vanish with them, taking their veths, qdiscs and
iptables rules along. `cleanup()` (the `run_testbed.py cleanup` command) reads the files of
runs whose owner process is gone and removes exactly what they list.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

RUNTIME_DIR = Path(os.environ.get("GEOTESTBED_RUNTIME_DIR", "/run/geotestbed"))


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/pid/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


class Registry:
    """The resources of one run, kept in RUNTIME_DIR/<run_id>.json (rewritten atomically)."""

    def __init__(self, run_id: str, directory: Path = RUNTIME_DIR) -> None:
        self.path = directory / f"{run_id}-{os.getpid()}.json"  # unique even for equal run ids
        self.data: dict = {"run_id": run_id, "owner": {"pid": os.getpid(),
                                                       "start": _start_time(os.getpid())},
                           "pids": [], "interfaces": []}
        directory.mkdir(parents=True, exist_ok=True)
        self._write()

    def add_pid(self, pid: int, what: str) -> None:
        self.data["pids"].append({"pid": pid, "start": _start_time(pid), "what": what})
        self._write()

    def add_interfaces(self, names: list[str]) -> None:
        self.data["interfaces"].extend(names)
        self._write()

    def close(self) -> None:
        """The run tore everything down itself: forget it."""
        self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


def alive(entry: dict) -> bool:
    return entry.get("start") is not None and _start_time(entry["pid"]) == entry["start"]


def cleanup(directory: Path = RUNTIME_DIR) -> list[str]:
    """Remove what crashed runs left. Returns one line per thing removed. Runs whose owner is
    still alive are skipped."""
    done: list[str] = []
    if not directory.is_dir():
        return done
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if alive(data.get("owner", {})):
            done.append(f"skipped {data.get('run_id')}: its run (pid {data['owner']['pid']}) is still going")
            continue
        done += _remove(data)
        path.unlink(missing_ok=True)
    return done


def _remove(data: dict) -> list[str]:
    done = []
    live = [e for e in data.get("pids", []) if alive(e)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for entry in live:
            if not alive(entry):
                continue
            for kill in (os.killpg, os.kill):
                try:
                    kill(entry["pid"], sig)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + 2.0
        while any(alive(e) for e in live) and time.monotonic() < deadline:
            time.sleep(0.05)
    done += [f"ended {e['what']} (pid {e['pid']})" for e in live]
    for name in data.get("interfaces", []):
        if Path(f"/sys/class/net/{name}").exists():
            try:
                with IPRoute() as ipr:
                    ipr.link("del", ifname=name)
            except NetlinkError as exc:
                if exc.code != errno.ENODEV:  # gone meanwhile (its peer was deleted): fine
                    done.append(f"could not delete interface {name}: {exc}")
                    continue
            done.append(f"deleted interface {name}")
    return done
