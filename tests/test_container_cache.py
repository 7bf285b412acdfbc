"""scripts/container_check.sh's wheel cache is root's alone: a CACHE another user made first (where
pip would find a wheel planted there and install it, as root, in a privileged container), one
open to other users' writes, or a symbolic link is refused with exit 2, a line naming CACHE and
the fix, before docker is asked anything and before its OUT folder is made."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.network   # root: it makes folders owned by another user

ROOT = Path(__file__).resolve().parents[1]


def check(cache: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "scripts" / "container_check.sh"), "--build-only"],
                          env={**os.environ, "CACHE": str(cache), "OUT": str(out)},
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_a_cache_anyone_else_could_write_is_refused(tmp_path):
    tmp_path.chmod(0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, 65534, 65534)
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o1777)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    for cache in (theirs, open_to_all, link):
        out = tmp_path / f"out-{cache.name}"
        r = check(cache, out)
        assert r.returncode == 2, (cache, r.stdout, r.stderr)
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith(f"error: CACHE: {cache} is not a folder owned by root"), line
        assert "remove it or set CACHE" in line
        assert not out.exists()
