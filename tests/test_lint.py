"""The tree passes ruff with the project's rules (pyproject.toml [tool.ruff])."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is not installed beside this Python; run: make setup"
    out = subprocess.run([ruff, "check", "--no-cache", "."], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
