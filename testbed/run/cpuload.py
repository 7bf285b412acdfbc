"""CPU-bound load beside the testbed, a job of its own: (cores + 1) single-threaded torch matmul loops.

One job: make the machine as busy as trainers and prefill servers make it, so the emulation can
be measured under that load (bench/bench_loaded_rtt.py) and the tests run beside it:

    sudo .venv/bin/python -m testbed.run.cpuload [--workers N]     # until Ctrl-C or SIGTERM

The workers run on this machine (the root namespace), each in its own process group and listed
in a registry; stop() ends exactly those.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from testbed.spec.errors import TestbedError
from testbed.emulation.procs import HostProcess, LocalSpawner, stop_all
from testbed.emulation.registry import Registry

LOAD_READY_TIMEOUT_S = 120.0
# One CPU-bound worker: single-threaded torch matmuls, forever (until SIGTERM).
LOAD_CODE = """
import torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
b = torch.randn(256, 256) / 16
print("LOADED", flush=True)
while True:
    a = torch.tanh(a @ b)
"""



class CpuLoad:
    """(cpu_count + 1) single-threaded torch matmul loops in the root namespace, listed in a
    registry (testbed.emulation.registry) while they run; stop() ends exactly these processes (their own
    process groups, through testbed.emulation.procs)."""

    def __init__(self, log_dir: Path, workers: int | None = None) -> None:
        self.workers = workers or (os.cpu_count() or 1) + 1
        self.log_dir = log_dir
        self.spawner = LocalSpawner()

    @property
    def procs(self) -> list[HostProcess]:
        return self.spawner.procs

    def start(self, timeout_s: float = LOAD_READY_TIMEOUT_S) -> float:
        """Start the workers; return once each has printed LOADED (seconds it took)."""
        t0 = time.monotonic()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.spawner.registry = Registry("cpuload")
        for i in range(self.workers):
            log = self.log_dir / f"cpu-load-{i}.log"
            _create(log)
            self.spawner.spawn("localhost", [sys.executable, "-c", LOAD_CODE], log)
        while not all("LOADED" in proc.output() for proc in self.procs):
            for proc in self.procs:
                if proc.poll() is not None:
                    raise TestbedError(f"CPU load worker {proc.pid} exited with "
                                       f"{proc.popen.returncode}: {proc.output(300)}")
            if time.monotonic() - t0 > timeout_s:
                raise TestbedError(f"CPU load workers not running after {timeout_s:g} s")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self) -> None:
        stuck = stop_all(self.procs, grace_s=5.0)
        self.procs.clear()
        if self.spawner.registry is not None and not stuck:
            self.spawner.registry.close()   # else it stays listed for `run_testbed.py cleanup`
            self.spawner.registry = None


def _create(path: Path) -> None:
    """Create path as a new, empty file: never one that exists, nor a link (another user's
    link in a shared folder would make us, root, write where it points). The spawner then
    opens it without following links (testbed.emulation.procs.open_log)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
    except FileExistsError:
        raise TestbedError(f"CPU load log {path} exists; give a new or empty --log-dir") from None
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=None, help="default: cores + 1")
    ap.add_argument("--log-dir", help="a new or empty folder (default: a new private one "
                    "under $TMPDIR)")
    args = ap.parse_args(argv)
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="cpuload-"))
    load = CpuLoad(log_dir, args.workers)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGHUP):   # SIGHUP: the terminal went away
        signal.signal(sig, lambda *_: stop.append(1))
    try:
        try:
            took = load.start()
        except TestbedError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{load.workers} CPU-bound workers running ({took:.1f} s to start, logs in "
              f"{log_dir}); Ctrl-C stops them", flush=True)
        while not stop:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        load.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
