"""The root namespace's sysctls a run could change, read and compared: one list for the test
session's check (tests/conftest.py, after every test) and for scripts/container_check.sh (the
host's, before and after the container ran). Read from the calling process's namespace, so
call it from the root namespace.

    python3 tests/root_sysctls.py save FILE      write them (JSON, name -> value)
    python3 tests/root_sysctls.py diff FILE      compare with FILE now: prints 'N of M' and one
                                                 'name: before -> after' line per change; exit 1
                                                 if any changed

Standard library only (the container check runs it with the host's python3)."""

from __future__ import annotations

import json
import os
import sys

PROC_SYS = "/proc/sys/"
TREES = ("net/core", "net/ipv4", "net/ipv6/conf/all", "kernel/pty", "fs/file-max")
THAT_MOVE = {
    "kernel.pty.nr": "a count of the ptys in use: every Mininet shell holds one while it runs",
    "net.ipv4.tcp_available_congestion_control": "grows when a congestion control's module is "
                                                  "loaded (env.json records module loads)",
}


def _read(path: str, out: dict[str, bytes]) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:   # write-only (net.ipv4.route.flush) or gone
        return
    try:
        value = os.read(fd, 4096)
    except IsADirectoryError:
        value = None
    except OSError:   # unreadable as it stands (net.ipv6.conf.all.stable_secret unset)
        return
    finally:
        os.close(fd)
    if value is not None:
        key = path.removeprefix(PROC_SYS).replace("/", ".")
        if key not in THAT_MOVE:
            out[key] = value
        return
    for entry in os.scandir(path):
        _read(entry.path, out)


def read() -> dict[str, bytes]:
    """Every readable sysctl under TREES, name -> raw value, less THAT_MOVE."""
    out: dict[str, bytes] = {}
    for tree in TREES:
        _read(PROC_SYS + tree, out)
    return out


def changes(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    """'name: before -> after' for each sysctl in both whose value differs (sysctls that appear
    or vanish belong to root-namespace interfaces that came or went: the interface checks name
    those)."""
    def show(raw: bytes) -> str:
        return " ".join(raw.decode(errors="replace").split())
    return [f"{k}: {show(before[k])} -> {show(after[k])}"
            for k in sorted(before.keys() & after.keys()) if before[k] != after[k]]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("save", "diff"):
        print("usage: root_sysctls.py save|diff FILE", file=sys.stderr)
        return 2
    what, path = argv
    if what == "save":
        with open(path, "w") as f:
            json.dump({k: v.decode("latin-1") for k, v in read().items()}, f, sort_keys=True)
        return 0
    with open(path) as f:
        before = {k: v.encode("latin-1") for k, v in json.load(f).items()}
    found = changes(before, read())
    print(f"{len(found)} of {len(before)} root-namespace sysctls changed")
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
