"""The rings of tests/conftest.py can fail: the unit ring's guard refuses sockets, processes and
sysctl writes (and records them, so a test that swallows the error fails too), and a pytest
session of tests with no ring or two rings stops at collection."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import UNIT_TOOLS, _UnitGuard

REPO = Path(__file__).resolve().parent.parent


def _child() -> None:
    pass


@pytest.mark.unit
def test_the_guard_refuses_sockets_processes_and_sysctl_writes():
    # (inside a unit test the outer guard stands behind this one: a miss raises there too)
    attempts = {
        "socket": lambda: socket.socket(),
        "socketpair": lambda: socket.socketpair(),
        "connection": lambda: socket.create_connection(("127.0.0.1", 9), timeout=1),
        "subprocess": lambda: subprocess.run(["true"], check=True),
        "shell": lambda: subprocess.run("true", shell=True, check=True),
        "fork": lambda: os.fork() or os._exit(0),       # a child let through ends at once
        "system": lambda: os.system("true"),
        "spawn": lambda: os.posix_spawn("/bin/true", ["true"], os.environ),
        "multiprocessing": lambda: multiprocessing.get_context("spawn").Process(
            target=_child).start(),
        "sysctl open": lambda: open("/proc/sys/net/ipv4/ip_forward", "w"),
        "sysctl os.open": lambda: os.open("/proc/sys/net/ipv4/ip_forward", os.O_WRONLY),
        "sysctl pathlib": lambda: Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n"),
    }
    originals = (socket.socket.__init__, subprocess.Popen.__init__, os.fork, os.open, open)
    with _UnitGuard("self-test") as guard:
        for what, attempt in attempts.items():
            with pytest.raises(RuntimeError, match="unit ring"):
                attempt()
                pytest.fail(f"{what} was let through")
        assert open("/proc/sys/net/ipv4/ip_forward").read()     # reading stays allowed
        try:                                                      # a swallowed refusal
            socket.socket()
        except Exception:
            pass
    assert len(guard.violations) == len(attempts) + 1, guard.violations
    with pytest.raises(pytest.fail.Exception, match="belongs in `loopback` or `network`"):
        guard.check()
    # and what it patched is back once it is gone (the outer guard's, this test's own)
    assert (socket.socket.__init__, subprocess.Popen.__init__, os.fork, os.open, open) == originals


@pytest.mark.unit
def test_the_guard_lets_the_static_checkers_run():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff and Path(ruff).name in UNIT_TOOLS
    with _UnitGuard("self-test") as guard:
        out = subprocess.run([ruff, "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not guard.violations, (out, guard.violations)


INNER = '''
import os, socket, subprocess
import pytest

{body}
'''


def inner_session(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """pytest on one test file `body` beside a copy of tests/conftest.py (and the sysctl list it
    imports) and the project's pytest settings."""
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "__init__.py").write_text("")
    for name in ("conftest.py", "root_sysctls.py"):
        shutil.copy(REPO / "tests" / name, tests / name)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tests / "test_inner.py").write_text(INNER.format(body=body))
    env = {k: v for k, v in os.environ.items() if k != "GEOTESTBED_RUNTIME_DIR"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_inner.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.loopback
@pytest.mark.parametrize("marks, says", [
    ("", "no ring"),
    ("@pytest.mark.unit\n@pytest.mark.loopback\n", "loopback, unit"),
])
def test_a_test_without_exactly_one_ring_stops_collection(tmp_path, marks, says):
    out = inner_session(tmp_path, f"{marks}def test_x():\n    pass\n")
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    assert f"tests/test_inner.py::test_x: {says}" in out.stderr, out.stdout + out.stderr


@pytest.mark.loopback
def test_a_misclassified_unit_test_fails_and_the_same_test_in_loopback_passes(tmp_path):
    body = ""
    for ring in ("unit", "loopback"):
        body += (f"@pytest.mark.{ring}\ndef test_swallowed_socket_{ring}():\n"
                 f"    try:\n        socket.socket().close()\n    except Exception:\n"
                 f"        pass\n\n"
                 f"@pytest.mark.{ring}\ndef test_process_{ring}():\n"
                 f"    subprocess.run(['true'], check=True)\n\n")
    out = inner_session(tmp_path, body)
    text = out.stdout + out.stderr
    assert out.returncode == pytest.ExitCode.TESTS_FAILED, text
    assert "2 failed, 2 passed" in text, text
    for name in ("test_swallowed_socket_unit", "test_process_unit"):
        assert f"FAILED tests/test_inner.py::{name}" in text, text


@pytest.mark.loopback
def test_a_sysctl_changed_during_the_last_unit_tests_fails_the_session(tmp_path):
    """Unit tests are not read one by one (their guard refuses writes); the session's end
    compares. Here the unit test stands in for a change by forging what was last read."""
    body = ("@pytest.mark.unit\ndef test_forges_the_last_reading():\n"
            "    import tests.conftest as c\n"
            "    key = next(iter(c._last_sysctls))\n"
            "    c._last_sysctls = {**c._last_sysctls, key: b'forged'}\n")
    out = inner_session(tmp_path, body)
    text = out.stdout + out.stderr
    assert out.returncode == pytest.ExitCode.TESTS_FAILED, text
    assert "1 passed" in out.stdout and "sysctls changed during the session's last tests" in \
        out.stderr and "tests/test_inner.py::test_forges_the_last_reading" in out.stderr, text
