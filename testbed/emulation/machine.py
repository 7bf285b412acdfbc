"""The machine under the emulation: how much of its CPU time it really had, and its idle states.

One job: facts about this machine that decide whether the delay lines can keep time, and
what a run left in its kernel.
- `CpuTimes`: the machine-wide CPU time split from /proc/stat, read at the start and end of a
  phase; `usage()` gives the shares of busy, idle, softirq and *steal* (time a virtual machine's
  host ran something else while this guest wanted the CPU). On a VM, steal comes in stalls of
  several ms that no priority inside the guest can prevent: results print it beside the delay
  lines' lateness, so a late release is traced to its cause.
- `hold_cpu_wakeup_latency()`: the PM QoS request (/dev/cpu_dma_latency = 0 us) that keeps idle
  CPUs from halting while a network runs. A halted vCPU wakes through the hypervisor, which took
  several ms here when its host was busy; with the request, idle CPUs poll instead (cpuidle's
  POLL state). The request lives as long as the file stays open (the kernel drops it when the
  process exits, however it exits), so it cannot outlive the run.
- `loaded_modules()`: the kernel modules loaded now (/proc/modules), read before and after a
  build so env.json says which modules the run made the kernel load (a netem probe, a bridge,
  veths, a congestion control): the one machine-wide change a build may cause.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

CPU_DMA_LATENCY = Path("/dev/cpu_dma_latency")
PROC_MODULES = Path("/proc/modules")
_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """The first line of /proc/stat (all CPUs, in clock ticks)."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int

    @classmethod
    def now(cls) -> "CpuTimes":
        return cls.parse(Path("/proc/stat").read_text())

    @classmethod
    def parse(cls, text: str) -> "CpuTimes":
        cols = text.splitlines()[0].split()
        if cols[0] != "cpu":
            raise ValueError(f"not /proc/stat: {text[:40]!r}")
        values = [int(x) for x in cols[1:1 + len(_FIELDS)]]
        values += [0] * (len(_FIELDS) - len(values))
        return cls(*values)

    def usage(self, later: "CpuTimes") -> dict[str, float]:
        """Percent of all CPU time between self and later: busy (user, nice, system, irq,
        softirq), idle (with iowait), softirq alone, steal."""
        d = {f: getattr(later, f) - getattr(self, f) for f in _FIELDS}
        total = sum(d.values())
        if total <= 0:
            return {"busy_pct": 0.0, "idle_pct": 0.0, "softirq_pct": 0.0, "steal_pct": 0.0}
        busy = d["user"] + d["nice"] + d["system"] + d["irq"] + d["softirq"]
        return {"busy_pct": round(100 * busy / total, 1),
                "idle_pct": round(100 * (d["idle"] + d["iowait"]) / total, 1),
                "softirq_pct": round(100 * d["softirq"] / total, 1),
                "steal_pct": round(100 * d["steal"] / total, 1)}


def hold_cpu_wakeup_latency(path: Path = CPU_DMA_LATENCY) -> tuple[int | None, str]:
    """Ask that no CPU take longer than 0 us to wake (no halting while idle); returns the open
    file (close it to drop the request) and a status: 'poll' or 'refused:<why>'."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"refused:{exc.strerror or exc}"
    try:
        os.write(fd, struct.pack("i", 0))
    except OSError as exc:
        os.close(fd)
        return None, f"refused:{exc.strerror or exc}"
    return fd, "poll"


def release_cpu_wakeup_latency(fd: int | None) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def loaded_modules(path: Path = PROC_MODULES) -> frozenset[str] | None:
    """Names of the loaded kernel modules; None where the kernel lists none (built without
    loadable modules: no /proc/modules)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return module_names(text)


def module_names(proc_modules: str) -> frozenset[str]:
    """The module names of /proc/modules' text (of this machine or a server)."""
    return frozenset(line.split()[0] for line in proc_modules.splitlines() if line.strip())


def modules_loaded_since(before: frozenset[str] | None,
                         path: Path = PROC_MODULES) -> list[str] | str:
    """The modules loaded since `before` (loaded_modules() then), sorted; 'unavailable' where
    the kernel lists no modules. A concurrent run's loads would count here too."""
    return modules_between(before, loaded_modules(path))


def modules_between(before: frozenset[str] | None, now: frozenset[str] | None) -> list[str] | str:
    """The modules in `now` not in `before`, sorted; 'unavailable' where either is None."""
    if before is None or now is None:
        return "unavailable (no /proc/modules: this kernel has no loadable modules)"
    return sorted(now - before)
