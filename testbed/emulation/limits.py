"""What a network of N namespaces needs from this process and this machine, taken without
changing the machine.

One job: before a build, make sure the run can hold its namespaces' shells. Each Mininet
namespace has a shell on a pty, held open by this process:
- open files: this process's own RLIMIT_NOFILE, raised (soft, and hard if it must) to what the
  network needs when it is lower; nothing else changes, and only for this process and the
  processes it starts;
- ptys: kernel.pty.max is machine-wide, so it is only read: a scenario that needs more ptys than
  are free stops before the build with one line saying how to raise it.
Nothing here writes a sysctl: the root namespace's settings belong to the machine's owner.
"""

from __future__ import annotations

import resource
from pathlib import Path

from testbed.spec.errors import TestbedError

FDS_PER_NAMESPACE = 2   # its shell's pty and pipe (measured: 48 open files for 24 namespaces)
FD_HEADROOM = 256       # the run's own sockets, logs and pipes
PTY_DIR = Path("/proc/sys/kernel/pty")


def open_files_needed(namespaces: int) -> int:
    return FDS_PER_NAMESPACE * namespaces + FD_HEADROOM


def reserve_open_files(namespaces: int) -> int:
    """Raise this process's RLIMIT_NOFILE to what `namespaces` shells need, if it is lower;
    return the soft limit it has now."""
    need = open_files_needed(namespaces)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return soft
    new_hard = hard if hard == resource.RLIM_INFINITY or hard >= need else need
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, new_hard))
    except (OSError, ValueError) as exc:
        raise TestbedError(f"{namespaces} namespaces need {need} open files and this process "
                           f"may hold {soft} (could not raise RLIMIT_NOFILE: {exc}); run with "
                           f"ulimit -n {need}, or use a smaller scenario") from None
    return need


def check_free_ptys(namespaces: int, pty_dir: Path = PTY_DIR) -> None:
    """Refuse, before anything is built, a network that needs more ptys than the machine has
    free (kernel.pty.max less kernel.pty.nr)."""
    most = int((pty_dir / "max").read_text())
    used = int((pty_dir / "nr").read_text())
    if most - used < namespaces:
        raise TestbedError(f"{namespaces} namespaces need as many ptys and this machine has "
                           f"{most - used} free (kernel.pty.max {most}, {used} in use); use a "
                           f"smaller scenario, or raise the machine's limit yourself: "
                           f"sudo sysctl kernel.pty.max={used + namespaces + 64}")
