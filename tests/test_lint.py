"""The tree passes ruff with the project's rules (pyproject.toml [tool.ruff])."""

from __future__ import annotations

import ast
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


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def test_a_script_entry_is_the_last_thing_a_module_defines():
    """`if __name__ == "__main__":` runs main() as the module is read: anything defined below
    it does not exist yet when a script's main() calls it (a controller reached its connection
    check undefined that way and every BubbleTea run failed)."""
    late = []
    for path in sorted([*REPO.glob("testbed/**/*.py"), *REPO.glob("scripts/*.py"),
                        *REPO.glob("bench/*.py"), REPO / "run_testbed.py"]):
        body = ast.parse(path.read_text(), filename=str(path)).body
        guards = [i for i, node in enumerate(body) if _is_main_guard(node)]
        if guards and guards[-1] != len(body) - 1:
            late.append(f"{path.relative_to(REPO)}:{body[guards[-1] + 1].lineno}")
    assert not late, f"defined after the __main__ guard: {late}"
