"""Ctrl-C that is never lost. Python raises KeyboardInterrupt at the next bytecode of the main
thread; when that is inside a fork's at-fork callback (logging registers one; Mininet and
pyroute2 fork), the exception is printed as "ignored" and the run goes on. Measured: one
Ctrl-C in six during the network build ran the run to the end, exit 0.

One job: remember every SIGINT (`install`), still raising KeyboardInterrupt at once as Python
would, and raise it again at the next safe point (`check`: the processes' wait loop, between
systems and sweep points) if it was swallowed.
"""

from __future__ import annotations

import signal
import threading

_pending = threading.Event()


def _on_sigint(signum, frame) -> None:
    _pending.set()
    raise KeyboardInterrupt


def install() -> None:
    """From the main thread, before anything forks."""
    _pending.clear()
    signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise KeyboardInterrupt if a SIGINT came and was swallowed on its way."""
    if _pending.is_set():
        raise KeyboardInterrupt("interrupted (Ctrl-C)")

