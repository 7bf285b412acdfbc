"""Run folders under results/ and atomic writes into them.

One job: where results go. Each run gets a new folder `<scenario>-<UTC time>-<commit>` (a
suffix is added rather than ever reusing a folder), and every file is written to a new temporary
file of its own and renamed, so a reader never sees half a file and no earlier run is overwritten.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from testbed.spec.paths import REPO_ROOT



def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "nogit"
    return out.stdout.strip() or "nogit"


def new_run_dir(out_dir: Path, scenario_name: str) -> Path:
    """Create and return a fresh run folder; never an existing one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = f"{scenario_name}-{stamp}-{git_commit()}"
    for n in range(1, 1000):
        path = out_dir / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RuntimeError(f"could not make a new run folder under {out_dir}")


def write_json(path: Path, doc: Any) -> Path:
    write_text(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")
    return path


def write_text(path: Path, text: str) -> Path:
    return write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes, sync: bool = True) -> Path:
    """path's new content, whole: written to a new temporary file of a unique name beside it
    (mkstemp: never a file someone else made or a link; two writers never share one), synced
    to disk, renamed over path, and the folder synced so the rename survives a crash (sync
    False: neither synced, for a real-time process's frequent reports). The file gets the mode
    a plain open would give it (0666 less the umask). An OSError names path (a full disk
    says which file it lost); the temporary file never stays."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    if not sync:
        return path
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return path


def umask() -> int:
    """This process's umask, read without changing it (os.umask sets it, for every thread)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def provenance() -> dict[str, Any]:
    """Versions and machine facts written into each run (iperf3's `start` block, in spirit)."""
    def version(argv: list[str]) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            return "missing"
        return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""

    info: dict[str, Any] = {
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git_commit(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "gpus": version(["nvidia-smi", "-L"]) or "none",
        "iperf3": version(["iperf3", "--version"]),
    }
    for dist in ("pyroute2", "torch", "mininet", "numpy", "matplotlib", "PyYAML", "scapy",
                 "tqdm"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = "missing"
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def record_modules(env_path: Path, loaded: list[str] | str) -> None:
    """At teardown: the kernel modules the whole run loaded, into the env.json announce wrote
    (none written: nothing to do)."""
    try:
        doc = json.loads(env_path.read_text())
    except (OSError, ValueError):
        return
    if doc.get("network", {}).get("kernel_modules_loaded") != loaded:
        doc.setdefault("network", {})["kernel_modules_loaded"] = loaded
        write_json(env_path, doc)
