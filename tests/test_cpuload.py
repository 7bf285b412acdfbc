"""testbed.run.cpuload writes its logs where no other user can reach: a new private folder by
default (not a fixed /tmp name), and never through a link planted where a log goes."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.spec.errors import TestbedError
from testbed.run.cpuload import CpuLoad

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.unit
def test_a_link_where_a_log_goes_is_not_followed(tmp_path):
    target = tmp_path / "target"          # stands for /etc/shadow
    target.write_text("keep\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "cpu-load-0.log").symlink_to(target)
    load = CpuLoad(logs, workers=1)
    try:
        with pytest.raises(TestbedError, match=r"cpu-load-0.log exists; give a new or empty"):
            load.start(timeout_s=60)
    finally:
        load.stop()
    assert target.read_text() == "keep\n"
    assert load.procs == []


@pytest.mark.loopback
def test_the_default_log_folder_is_new_and_private(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONUNBUFFERED="1")   # geodc: from the cwd
    proc = subprocess.Popen([sys.executable, "-m", "testbed.run.cpuload", "--workers", "1"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()     # printed once the worker is running (or at its error)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    found = re.search(r"logs in (\S+)\)", line)
    assert found, (line, err[-2000:])
    folder = Path(found.group(1))
    assert folder.parent == tmp_path and folder.name.startswith("cpuload-"), folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert "LOADED" in (folder / "cpu-load-0.log").read_text()
    assert proc.returncode == 0, err[-2000:]
