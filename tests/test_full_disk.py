"""A full disk, on a real tmpfs: `run` refuses an --out whose filesystem has less free than the run
will write (geodc.run.diskspace), exit 2 before anything is built or written, the line naming
--out, the path and both sizes; a write that finds the disk full names the file it lost and
leaves no temporary file, synced or not (the delay line's reports are not)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from geodc.emulation.results import write_bytes, write_json
from geodc.run.diskspace import estimate_bytes
from geodc.spec.scenario import load_scenario
from geodc.spec.training import TrainConfig

pytestmark = pytest.mark.network   # root: it mounts a tmpfs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (the auditor's), unmounted after the test."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "geodc-test-disk", str(mnt)],
                   check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_run_on_a_disk_without_room_is_refused_before_the_build(small_disk):
    cfg = TrainConfig.from_dict(load_scenario(ROOT / "topologies" / "two_dc.yaml").training)
    need = estimate_bytes(cfg, 1)
    assert need > 256 << 10
    r = subprocess.run([sys.executable, str(ROOT / "run_testbed.py"), "run",
                        str(ROOT / "topologies" / "two_dc.yaml"), "--out", str(small_disk / "r")],
                       capture_output=True, text=True, timeout=120)
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
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "geodc-test-ro", str(ro)],
                   check=True)
    try:
        r = subprocess.run([sys.executable, str(ROOT / "run_testbed.py"), "run",
                            str(ROOT / "topologies" / "two_dc.yaml"), "--out", str(ro / "r")],
                           capture_output=True, text=True, timeout=120)
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert r.returncode == 2, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line == (f"error: --out: '{ro}' cannot be written here (a read-only filesystem); "
                    f"give a folder you can write"), line
