"""Reading a file named in a scenario or on the command line: a regular file, of bounded size.

A path may name a directory, a FIFO (`/dev/stdin` of a pipe waits forever) or a device
(`/dev/zero` never ends); each is refused with one ScenarioError line, as is a file over the
caller's size limit or one that is not UTF-8.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from testbed.spec.errors import ScenarioError


def read_text(path: str | Path, field: str, max_bytes: int, fix: str) -> str:
    """The UTF-8 text of a regular file of at most max_bytes, else ScenarioError(field). Opened
    without blocking, so that a FIFO or a device is refused, not waited on or read forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ScenarioError(field, f"no file {str(path)!r}", fix) from None
    except OSError as exc:
        raise ScenarioError(field, f"cannot open {str(path)!r} ({exc.strerror})",
                            fix) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ScenarioError(field, f"{str(path)!r} is a directory", fix)
        if not stat.S_ISREG(mode):
            raise ScenarioError(field, f"{str(path)!r} is not a regular file", fix)
        data = b""
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - len(data))):
            data += chunk
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ScenarioError(field, f"{str(path)!r} is over {max_bytes} bytes",
                            "give a smaller file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(field, f"{str(path)!r} is not UTF-8 text (byte {exc.start})",
                            fix) from None
