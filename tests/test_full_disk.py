"""A full disk, on a real tmpfs: `run` refuses an --out whose filesystem has less free than the run
will write (testbed.run.diskspace), exit 2 before anything is built or written, the line naming
--out, the path and both sizes; a write that finds the disk full names the file it lost and
leaves no temporary file, synced or not (the delay line's reports are not)."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.emulation.results import write_bytes, write_json
from testbed.run.diskspace import estimate_bytes
from testbed.spec.scenario import load_scenario
from testbed.spec.training import TrainConfig

pytestmark = pytest.mark.network   # root: it mounts a tmpfs

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def tmpfs(mnt: Path, options: str):
    """A tmpfs mounted at mnt (made) with options, unmounted after."""
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "geodc-test-disk", str(mnt)],
                   check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def run_two_dc(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run_testbed.py"), "run",
                           str(ROOT / "topologies" / "two_dc.yaml"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (the auditor's)."""
    with tmpfs(tmp_path / "disk", "size=256k") as mnt:
        yield mnt


def test_run_on_a_disk_without_room_is_refused_before_the_build(small_disk):
    cfg = TrainConfig.from_dict(load_scenario(ROOT / "topologies" / "two_dc.yaml").training)
    need = estimate_bytes(cfg, 1)
    assert need > 256 << 10
    r = run_two_dc(small_disk / "r")
    assert r.returncode == 2, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: --out: {small_disk} has ") and "KiB free" in line, line
    assert "this run writes about" in line and "give --out a folder with room" in line
    assert list(small_disk.iterdir()) == []


def test_a_write_that_fills_the_disk_names_its_file_and_leaves_no_temporary(small_disk):
    write_json(small_disk / "metrics.json", {"complete": False})
    for sync in (True, False):
        target = small_disk / f"big-{sync}.json"
        with pytest.raises(OSError) as info:
            write_bytes(target, b"x" * (512 << 10), sync=sync)
        assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert sorted(p.name for p in small_disk.iterdir()) == ["metrics.json"]


def test_run_into_a_read_only_folder_is_refused_before_the_build(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=64k") as ro:
        r = run_two_dc(ro / "r")
    assert r.returncode == 2, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line == (f"error: --out: '{ro}' cannot be written here (a read-only filesystem); "
                    f"give a folder you can write"), line
