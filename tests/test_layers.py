"""testbed/'s layers hold: `lint-imports` with the contracts in pyproject.toml ([tool.importlinter]:
the data-flow layers, what host processes and the pure layers may import, independent features
and host process packages). In the unit ring: lint-imports is one of conftest's UNIT_TOOLS, a
static checker that only reads the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


def test_the_import_contracts_hold():
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "lint-imports is not installed beside this Python; run: make setup"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # --no-cache: no .import_linter_cache folder left in the tree
    out = subprocess.run([lint_imports, "--config", "pyproject.toml", "--no-cache"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (f"lint-imports exit {out.returncode}:\n{out.stdout[-12000:]}"
                                 f"{out.stderr[-4000:]}")
