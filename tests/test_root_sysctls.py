"""tests/root_sysctls.py as scripts/container_check.sh runs it: save, then diff finds nothing,
and a value that differs from the saved one is named with both values (exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.loopback

SCRIPT = Path(__file__).with_name("root_sysctls.py")


def tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def test_save_then_diff(tmp_path):
    saved = tmp_path / "before.json"
    assert tool("save", str(saved)).returncode == 0
    doc = json.loads(saved.read_text())
    assert "net.ipv4.ip_forward" in doc and "kernel.pty.nr" not in doc
    same = tool("diff", str(saved))
    assert same.returncode == 0 and same.stdout.startswith(f"0 of {len(doc)} "), same.stdout
    now = doc["net.ipv4.ip_forward"]
    doc["net.ipv4.ip_forward"] = "7\n"
    saved.write_text(json.dumps(doc))
    changed = tool("diff", str(saved))
    assert changed.returncode == 1, changed
    assert changed.stdout.splitlines() == [f"1 of {len(doc)} root-namespace sysctls changed",
                                           f"net.ipv4.ip_forward: 7 -> {now.strip()}"]
    assert tool("load", str(saved)).returncode == 2
