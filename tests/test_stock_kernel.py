"""scripts/stock_kernel.py without booting anything (unit): the guest's command line, and the
one-line errors (exit 2) of a `run` with nothing prepared or no command. The boot itself is
the stock-kernel ring (`make test-stock-kernel`)."""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "stock_kernel.py"


@pytest.fixture
def stock(monkeypatch, tmp_path):
    spec = importlib.util.spec_from_file_location("stock_kernel", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "KERNEL_TREE", tmp_path / "tree")   # an empty kernel tree
    return module


def host_tool_missing(stock) -> str:
    """What `run` says first on this machine if one of its host tools is missing, or ''."""
    try:
        stock.need_tools(["qemu-system-x86_64", "udevadm"])
        stock.need_static_busybox()
    except stock.Missing as exc:
        return str(exc)
    return ""


def test_guest_command_line(stock, tmp_path):
    argv = stock.guest_argv("6.12.1+deb12-amd64", ["env", "A=b c", "pytest", "-q"], [str(tmp_path)])
    assert argv[:3] == [str(tmp_path / "tree/venv/bin/vng"), "--run",
                        str(tmp_path / "tree/6.12.1+deb12-amd64/boot/vmlinuz-6.12.1+deb12-amd64")]
    for flag, value in (("--cpus", "1"), ("--memory", "4G"), ("--cwd", str(stock.REPO)),
                        ("--rwdir", str(tmp_path))):
        assert argv[argv.index(flag) + 1] == value, argv
    assert "--disable-kvm" in argv
    assert "--qemu-opts=-accel tcg,thread=single" in argv     # one TCG thread: no stale int3
    assert "--verbose" not in argv
    assert "--verbose" in stock.guest_argv("6.12.1+deb12-amd64", ["true"], [], console=True)
    assert "--overlay-rwdir=/root" in argv    # root's profile may write there (pyenv)
    # root unlocked in the guest's own /etc/shadow (the local cluster's sshds refuse a locked
    # account), then the command
    assert argv[-2] == "--exec" and argv[-1] == f"{stock.GUEST_SETUP} && exec env 'A=b c' pytest -q"
    assert shlex.split(argv[-1].split(" && exec ", 1)[1]) == ["env", "A=b c", "pytest", "-q"]


def test_run_with_nothing_prepared_says_what_to_do(stock, capsys):
    with pytest.raises(SystemExit) as info:
        stock.main(["run", "--", "true"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    missing = host_tool_missing(stock)
    assert err == (f"error: {missing}\n" if missing else
                   f"error: no prepared kernel in {stock.KERNEL_TREE}: run scripts/stock_kernel.py "
                   f"--prepare\n")


@pytest.mark.parametrize("argv", [[], ["run"], ["run", "--"]], ids=["nothing", "run", "run --"])
def test_no_step_or_no_command_is_refused(stock, capsys, argv):
    (stock.KERNEL_TREE / "v1" / "boot").mkdir(parents=True)
    (stock.KERNEL_TREE / "v1" / ".ready").write_text("x\n")
    (stock.KERNEL_TREE / "current").write_text("v1\n")
    (stock.KERNEL_TREE / "venv" / "bin").mkdir(parents=True)
    (stock.KERNEL_TREE / "venv" / "bin" / "vng").write_text("")
    with pytest.raises(SystemExit) as info:
        stock.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    missing = host_tool_missing(stock)
    if argv and missing:
        assert err == [f"error: {missing}"]
    else:
        assert err[-1] in ("error: give --prepare, or run -- CMD ...",
                           "error: no command: scripts/stock_kernel.py run -- CMD ..."), err


def test_prepare_without_root_names_the_debian_packages(stock, capsys, monkeypatch, tmp_path):
    """--prepare installs what is missing only as root (scripts/setup.sh's rule); otherwise it
    says which packages, in one line. A PATH with nothing on it: every host tool is missing."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(stock.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as info:
        stock.main(["--prepare"])
    assert info.value.code == 2
    packages = "apt busybox-static dpkg kmod qemu-system-x86 udev"
    assert capsys.readouterr().err == (f"error: the guest needs Debian packages ({packages}): run "
                                       f"as root, or apt-get install {packages}\n")


def test_a_failed_guest_prints_what_its_console_says(stock, tmp_path, capsys):
    log = tmp_path / "console.log"
    log.write_text("[    1.0] booting\n[  187.9] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n"
                   "[  187.9] Kernel panic - not syncing: Fatal exception in interrupt\n")
    stock.report_console(log)
    err = capsys.readouterr().err
    assert f"the guest's console (3 lines): {log}" in err
    assert "Oops: int3" in err and "Kernel panic" in err and "booting" not in err
    log.write_text("[    1.0] booting\n")
    stock.report_console(log)
    assert "no kernel message of an OOM kill, panic or oops" in capsys.readouterr().err


def test_a_tree_someone_else_could_change_is_refused(stock, capsys):
    """What runs as root from the kernel tree must be root's alone: a `current` file writable
    by others, or (as root) a venv file owned by another user, stops `run` with exit 2 naming
    it before anything in the tree runs."""
    import os
    tree = stock.KERNEL_TREE
    (tree / "venv" / "bin").mkdir(parents=True)
    (tree / "current").write_text("6.12.1+deb12-amd64\n")
    assert stock.untrusted(tree) == ""
    (tree / "current").chmod(0o666)
    assert stock.untrusted(tree) == f"{tree / 'current'} is writable by others (mode 666)"
    (tree / "current").chmod(0o644)
    if os.getuid() == 0:
        vng = tree / "venv" / "bin" / "vng"
        vng.write_text("#!/bin/sh\n")
        os.chown(vng, 65534, 65534)
        assert stock.untrusted(tree) == f"{vng} is owned by uid 65534"
        with pytest.raises(stock.Missing) as info:
            stock.current_version()
        assert "runs as root unless it is root's alone" in str(info.value)


def test_virtme_ng_is_installed_with_hashes(stock, monkeypatch, capsys):
    """--prepare installs virtme-ng with pip's --require-hashes from requirements-virtme-ng.txt
    (every package pinned with its file's sha256; before: `pip install virtme-ng==1.42`, no
    hash), and makes again a venv that was not installed from that list as it is now."""
    calls: list[list[str]] = []

    def sh(argv, what, **kw):
        calls.append(argv)
        if argv[1:3] == ["-m", "venv"]:
            (Path(argv[3]) / "bin").mkdir(parents=True)
        elif "install" in argv:
            stock.vng_path().write_text("#!/bin/sh\n")

    monkeypatch.setattr(stock, "sh", sh)
    venv = stock.KERNEL_TREE / "venv"
    stock.install_virtme(venv)
    pip = calls[-1]
    assert pip[:2] == [str(venv / "bin" / "pip"), "install"], calls
    assert "--require-hashes" in pip and pip[pip.index("-r") + 1] == str(stock.VIRTME_HASHES)
    assert not any(a.startswith("virtme-ng") for a in pip)
    lines = stock.VIRTME_HASHES.read_text()
    assert stock.VIRTME_NG in lines.split()
    # a venv made before the list (no stamp): made again; one made from it: kept
    calls.clear()
    stock.install_virtme(venv)
    assert calls == []
    (venv / ".requirements.sha256").unlink()
    (venv / "bin" / "old").write_text("")
    stock.install_virtme(venv)
    assert len(calls) == 2 and not (venv / "bin" / "old").exists()
    assert "made again" in capsys.readouterr().out
