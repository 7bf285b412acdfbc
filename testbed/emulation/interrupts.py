"""Ctrl-C that is never lost, and SIGTERM and SIGHUP treated as Ctrl-C. Python raises
KeyboardInterrupt at the next bytecode of the main thread; when that is inside a fork's at-fork
callback (logging registers one; Mininet and pyroute2 fork), the exception is printed as
"ignored" and the run goes on. Measured: one Ctrl-C in six during the network build ran the run
to the end, exit 0.

One job: remember every SIGINT, SIGTERM and SIGHUP (`install`; SIGHUP is a dropped ssh session
running `sudo make run`), still raising KeyboardInterrupt at once as Python would for SIGINT,
and raise it again at the next safe point (`check`: the processes' wait loop, between systems
and sweep points) if it was swallowed. After SIGHUP the terminal is gone: stdout and stderr
then go to /dev/null (`detach_from_terminal`) so the teardown cannot fail writing to it.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_pending = threading.Event()
_owner: int | None = None


def _on_stop(signum, frame) -> None:
    if os.getpid() != _owner:  # a forked helper (pyroute2's) inherited this: just die
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _pending.set()
    if signum == signal.SIGHUP:
        detach_from_terminal()
    raise KeyboardInterrupt if signum == signal.SIGINT else KeyboardInterrupt(
        f"interrupted ({signal.Signals(signum).name})")


def install() -> None:
    """From the main thread, before anything forks."""
    global _owner
    _pending.clear()
    _owner = os.getpid()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _on_stop)


@contextmanager
def installed() -> Iterator[None]:
    """install() for a block (a command that runs in its caller's process, as `whatif` may):
    the handlers there before are back after it."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    install()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def check() -> None:
    """Raise KeyboardInterrupt if a SIGINT, SIGTERM or SIGHUP came and was swallowed."""
    if _pending.is_set():
        raise KeyboardInterrupt("interrupted (Ctrl-C, SIGTERM or SIGHUP)")


def detach_from_terminal() -> None:
    """Send stdout and stderr to /dev/null where they are a terminal (one that hung up
    answers writes with EIO)."""
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        if os.isatty(fd):
            os.dup2(null, fd)
    os.close(null)
