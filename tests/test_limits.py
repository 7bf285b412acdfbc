"""testbed.emulation.limits: a network's open files taken for this process alone, ptys only read.

reserve_open_files runs in a child Python (it changes the limits of the process that calls it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from testbed.spec.errors import TestbedError
from testbed.emulation.limits import check_free_ptys, open_files_needed

REPO = __file__.rsplit("/tests/", 1)[0]
RESERVE = """
import resource, sys
from testbed.emulation.limits import reserve_open_files
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
got = reserve_open_files(int(sys.argv[2]))
print(got, *resource.getrlimit(resource.RLIMIT_NOFILE), hard)
"""


def reserve(soft: int, namespaces: int) -> list[int]:
    out = subprocess.run([sys.executable, "-c", RESERVE, str(soft), str(namespaces)], cwd=REPO,
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.loopback
def test_open_files_left_alone_when_enough():
    got, soft, hard, hard_before = reserve(1024, 10)
    assert got == soft == 1024 and hard == hard_before


@pytest.mark.loopback
def test_open_files_raised_to_what_the_network_needs_only():
    need = open_files_needed(400)
    got, soft, hard, hard_before = reserve(512, 400)
    assert got == soft == need and hard == max(hard_before, need)


@pytest.mark.unit
def test_too_few_free_ptys_is_one_line_naming_the_fix(tmp_path):
    (tmp_path / "max").write_text("4096\n")
    (tmp_path / "nr").write_text("4090\n")
    check_free_ptys(6, tmp_path)
    with pytest.raises(TestbedError) as exc:
        check_free_ptys(7, tmp_path)
    assert "kernel.pty.max 4096" in str(exc.value) and "sysctl kernel.pty.max=" in str(exc.value)
    assert "\n" not in str(exc.value)
