"""The folder `reproduce --out` writes: one it made, replaced whole, one writer at a time.

One job. `reproduce --out DIR` builds the tables and figures in a new folder beside DIR and
swaps it in for DIR when all are written, so DIR never holds a half-written set or an earlier
call's figures beside new tables; MARK inside says reproduce made it, and an existing folder
without it that holds anything (`/`, a home folder, a results folder) is refused, not written
into. Two calls into one folder take turns: each holds an flock on DIR's parent folder while it
swaps (and while it builds, so the later one's set is the one left).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from testbed.emulation.results import umask
from testbed.spec.errors import ScenarioError

MARK = ".made-by-reproduce"


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_out(out: Path) -> None:
    """ScenarioError if out is a folder that reproduce did not make and holds anything."""
    if out.is_dir() and not (out / MARK).exists() and any(out.iterdir()):
        raise ScenarioError("--out", f"{str(out)!r} holds files reproduce did not write",
                            "give a new or empty folder, or one an earlier reproduce made "
                            "(its files are replaced)")


def write_folder(out: Path, build: Callable[[Path], list[Path]]) -> list[Path]:
    """build(folder) writes the files into a new folder, which then replaces out whole; the
    files' final paths."""
    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.parent):
        check_out(out)
        new = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.parent))
        try:
            files = build(new)
            (new / MARK).write_text("this folder's files were written by run_testbed.py "
                                    "reproduce, which replaces them whole\n")
            new.chmod(0o777 & ~umask())   # mkdtemp's 0700 to a plain mkdir's mode
            old = None
            if out.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
                os.rename(out, old / "folder")
            os.rename(new, out)
            if old is not None:
                shutil.rmtree(old)
        except BaseException:
            shutil.rmtree(new, ignore_errors=True)
            raise
    return [out / f.relative_to(new) for f in files]
