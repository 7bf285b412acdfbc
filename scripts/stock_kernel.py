#!/usr/bin/env python3
"""Run a command on Debian's stock kernel (with netem), booted here under QEMU by virtme-ng.

This project's machines run a kernel without netem, so the netem backend is tested in a guest:
Debian's `linux-image-6.12-amd64` over this machine's own filesystem (the guest sees the same
files, the project's .venv included), 2 vCPUs, 4 GB, without KVM (a KVM guest dies at start
here: QEMU cannot set MSR 0x10a), so under TCG: slow, and timing in it is noisy.

    scripts/stock_kernel.py --prepare          # once: virtme-ng, the kernel package, its modules
    scripts/stock_kernel.py run -- CMD ...     # boot, run CMD in the repository, exit with its code

--prepare installs the Debian packages the guest needs when they are missing (as root, as
scripts/setup.sh does), then downloads (pip, apt-get download) and unpacks into the kernel
tree (KERNEL_TREE, or $GEODC_KERNEL_TREE): virtme-ng in its own venv there (a host tool, not a
dependency of geodc, so the project's .venv stays as requirements.txt pins it; installed with
pip's --require-hashes from requirements-virtme-ng.txt, every file's sha256), the package
unpacked with dpkg-deb -x and its modules indexed with depmod -b. virtme-ng finds the modules
beside the image and links them to /lib/modules/<version> in the guest; the tree is under /opt
because the guest gets an empty /tmp, /var/tmp and /var/cache (virtme-ng-init mounts tmpfs on
them). Running it again reuses what is there. `run` never downloads: what is missing is a
one-line error (exit 2) saying what to do.

The guest gets its own empty /tmp (iperf3 fails on the host's, passed read-write) and the
host's root read-only; --rwdir DIR makes DIR writable there (results to bring back).
--log FILE keeps the guest kernel's console (its messages at loglevel 7) in FILE; when the
command fails, the lines of an OOM kill, a panic or an oops are printed from it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import NoReturn

KERNEL_TREE = Path(os.environ.get("GEODC_KERNEL_TREE", "/opt/geodc-kernel"))
PACKAGE = "linux-image-6.12-amd64"   # Debian 12's 6.12 kernel (a meta package: its newest build)
VIRTME_NG = "virtme-ng==1.42"
# One vCPU: with two in TCG's one host thread (below), QEMU runs them in turn, up to 100 ms each
# while the other waits, so the guest's real-time delay line waited behind a busy vCPU (release
# lateness p99 74-98 ms, max 183 ms, in calibrate on 2026-12-06; with one vCPU p99 4.6-10 ms,
# max 19-32 ms: the guest's own scheduler gives the delay line its SCHED_FIFO priority).
CPUS, MEMORY = 1, "4G"
# TCG's vCPUs in one host thread. With one thread per vCPU (QEMU's default), a vCPU can run code
# another has just patched from a stale translation: the kernel patches its static keys with
# int3 (text_poke_bp), and on 2026-12-06 a guest died of "Oops: int3" in
# __netif_receive_skb_core while a ping toggled the timestamping key, then "Kernel panic - not
# syncing: Fatal exception in interrupt" (results/stock-kernel/netem-console.log). One thread
# keeps the vCPUs' view of the code consistent, at the cost of one host core (so it matters
# only with --cpus 2 or more).
TCG = "-accel tcg,thread=single"
# virtme-ng gives the guest its own /etc/shadow (a tmpfs file) with root locked ("!"), and sshd
# refuses a locked account's key login, so the local cluster's sshds (scripts/local_cluster.py)
# could not be reached in the guest: root is unlocked there ("*", no password), the host's
# /etc/shadow untouched. Rewritten in place: the file is a mount point, so sed -i's rename fails.
GUEST_SETUP = "s=$(sed 's/^root:!:/root:*:/' /etc/shadow) && printf '%s\\n' \"$s\" > /etc/shadow"
REPO = Path(__file__).resolve().parent.parent
# VIRTME_NG and its dependencies, each pinned with its file's sha256 (scripts/pin_hashes.py
# writes it): pip installs them with --require-hashes, so a file that is not the one hashed
# (a mirror's, a cache's) stops --prepare.
VIRTME_HASHES = REPO / "requirements-virtme-ng.txt"
# tool -> the Debian package that has it
# (udevadm: virtme-ng-init starts udevd, which names the guest's script I/O ports; without it
# the command runs on the console and its output and exit code are lost)
TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "dpkg-deb": "dpkg", "depmod": "kmod",
         "apt-get": "apt", "udevadm": "udev"}
NEEDED_MODULES = ("sch_netem", "sch_htb", "sch_fq", "nfnetlink_queue", "veth")


class Missing(Exception):
    """Something the step needs is not here; the message says what to do."""


def fail(msg: str) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def need_tools(names) -> None:
    for tool in names:
        if shutil.which(tool) is None:
            raise Missing(f"{tool} is not installed: apt-get install {TOOLS[tool]}")


def static_busybox() -> bool:
    """virtme-ng builds the guest's initramfs (Debian loads 9p and virtio as modules) around a
    statically linked busybox."""
    path = shutil.which("busybox")
    with open(path or "/dev/null", "rb") as f:
        dynamic = b"ld-linux" in f.read(8192)
    return path is not None and not dynamic


def need_static_busybox() -> None:
    if not static_busybox():
        raise Missing("a statically linked busybox is not installed: apt-get install busybox-static")


def install_packages() -> None:
    """The Debian packages of TOOLS and busybox-static that are missing, installed as
    scripts/setup.sh installs the project's (root only; otherwise the one-line error)."""
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool) is None}
                     | (set() if static_busybox() else {"busybox-static"}))
    if not missing:
        return
    if os.geteuid() != 0:
        raise Missing(f"the guest needs Debian packages ({' '.join(missing)}): run as root, "
                      f"or apt-get install {' '.join(missing)}")
    print(f"installing Debian packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sh(["apt-get", "update", "-qq"], "apt-get update", env=env)
    sh(["apt-get", "install", "-y", "-qq", *missing], f"apt-get install {' '.join(missing)}",
       env=env)


def vng_path() -> Path:
    return KERNEL_TREE / "venv" / "bin" / "vng"


def untrusted(tree: Path) -> str:
    """The first thing under tree (itself included) that someone other than root or us could
    have put or changed there: owned by another user, or writable by others or a group other
    than root's (a link is judged by its own owner); '' if none. What runs as root from the tree (vng, its Python
    packages, the kernel and modules, `current`) must be ours alone."""
    ok_owners = {0, os.getuid()}
    for top, dirs, files in os.walk(tree):
        for path in [Path(top)] + [Path(top) / n for n in dirs + files]:
            st = path.lstat()
            if st.st_uid not in ok_owners:
                return f"{path} is owned by uid {st.st_uid}"
            writable = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0)
            if not stat.S_ISLNK(st.st_mode) and writable:
                return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        dirs[:] = [d for d in dirs if not (Path(top) / d).is_symlink()]
    return ""


def check_trusted(tree: Path) -> None:
    """Missing (exit 2) naming what could not be trusted under tree."""
    if tree.exists():
        why = untrusted(tree)
        if why:
            raise Missing(f"{why}: nothing under {tree} runs as root unless it is root's alone; "
                          f"remove {tree} and run scripts/stock_kernel.py --prepare")


def current_version() -> str:
    """The prepared kernel's version (KERNEL_TREE/current), or Missing (also for a tree that
    someone else could have changed: check_trusted)."""
    check_trusted(KERNEL_TREE)
    try:
        version = (KERNEL_TREE / "current").read_text().strip()
    except OSError:
        version = ""
    if not version or not (KERNEL_TREE / version / ".ready").exists():
        raise Missing(f"no prepared kernel in {KERNEL_TREE}: run scripts/stock_kernel.py --prepare")
    return version


def kernel_image(version: str) -> Path:
    return KERNEL_TREE / version / "boot" / f"vmlinuz-{version}"


def sh(argv: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise Missing(f"{what} failed (exit {proc.returncode}): {last[0]}")
    return proc


# ---- set-up ---------------------------------------------------------------------------------
def prepare(package: str) -> str:
    install_packages()
    need_tools(TOOLS)
    need_static_busybox()
    KERNEL_TREE.mkdir(mode=0o755, parents=True, exist_ok=True)
    check_trusted(KERNEL_TREE)
    install_virtme(KERNEL_TREE / "venv")
    target = resolve_package(package)
    version = target.removeprefix("linux-image-").removesuffix("-unsigned")
    root = KERNEL_TREE / version
    if (root / ".ready").exists():
        print(f"kernel {version} already prepared in {root}")
    else:
        debs = KERNEL_TREE / "debs"
        debs.mkdir(exist_ok=True)
        deb = next(debs.glob(f"{target}_*.deb"), None)
        if deb is None:
            print(f"downloading {target}")
            sh(["apt-get", "download", target], f"apt-get download {target} (apt-get update?)",
               cwd=debs)
            deb = next(debs.glob(f"{target}_*.deb"))
        print(f"unpacking {deb.name} into {root}")
        sh(["dpkg-deb", "-x", str(deb), str(root)], f"dpkg-deb -x {deb.name}")
        sh(["depmod", "-b", str(root), version], "depmod")
        check_tree(root, version)
        (root / ".ready").write_text(deb.name + "\n")
    (KERNEL_TREE / "current").write_text(version + "\n")
    print(f"ready: {kernel_image(version)}")
    return version


def install_virtme(venv: Path) -> None:
    """VIRTME_NG in its own venv, from VIRTME_HASHES with pip's --require-hashes. A venv whose
    stamp (the hash list's sha256) is not this list's, one made before the list or from
    another, is made again."""
    stamp = venv / ".requirements.sha256"
    want = hashlib.sha256(VIRTME_HASHES.read_bytes()).hexdigest()
    try:
        have = stamp.read_text().strip()
    except OSError:
        have = ""
    if vng_path().exists() and have == want:
        return
    if venv.exists() or venv.is_symlink():
        print(f"{venv}: not installed from {VIRTME_HASHES.name} as it is now; made again")
        if venv.is_symlink():
            venv.unlink()
        else:
            shutil.rmtree(venv)
    print(f"installing {VIRTME_NG} into {venv} (--require-hashes -r {VIRTME_HASHES.name})")
    sh([sys.executable, "-m", "venv", str(venv)], "python3 -m venv (apt-get install python3-venv)")
    sh([str(venv / "bin" / "pip"), "install", "-q", "--require-hashes", "-r", str(VIRTME_HASHES)],
       f"pip install --require-hashes -r {VIRTME_HASHES}")
    stamp.write_text(want + "\n")


def resolve_package(package: str) -> str:
    """A meta package (linux-image-6.12-amd64) -> the versioned one it depends on."""
    if re.fullmatch(r"linux-image-\d+\.\d+\.\d+\+.*", package):   # already versioned
        return package
    out = sh(["apt-cache", "depends", package], f"apt-cache depends {package} (apt-get update?)")
    for line in out.stdout.splitlines():
        word = line.strip().removeprefix("Depends:").strip()
        if line.strip().startswith("Depends:") and word.startswith("linux-image-"):
            return word
    raise Missing(f"{package} names no linux-image package: pass --package linux-image-<version>")


def check_tree(root: Path, version: str) -> None:
    if not kernel_image(version).exists():
        raise Missing(f"{kernel_image(version)} is not in the package")
    mods = root / "lib" / "modules" / version
    dep = (mods / "modules.dep").read_text()
    absent = [m for m in NEEDED_MODULES if f"/{m}.ko" not in dep]
    if absent:
        raise Missing(f"the kernel's modules lack {', '.join(absent)}")


# ---- a command in the guest -----------------------------------------------------------------
def guest_argv(version: str, command: list[str], rwdirs: list[str],
               console: bool = False, cpus: int = CPUS) -> list[str]:
    """vng's command line: the prepared kernel over this machine's filesystem, TCG; with
    console, the kernel's messages (loglevel 7) on QEMU's stderr."""
    argv = [str(vng_path()), "--run", str(kernel_image(version)), "--disable-kvm",
            f"--qemu-opts={TCG}",       # one argument: its value starts with "-"
            # root's home writable in the guest, changes discarded (the local cluster's remote
            # shells are root's login shells, whose profile may write there: pyenv's rehash)
            "--overlay-rwdir=/root",
            "--cpus", str(cpus), "--memory", MEMORY, "--cwd", str(REPO), "--user", "root"]
    if console:
        argv.append("--verbose")
    for d in rwdirs:
        argv += ["--rwdir", str(Path(d).resolve())]
    return argv + ["--exec", f"{GUEST_SETUP} && exec {shlex.join(command)}"]


# kernel messages that say why a guest's command ended early
TROUBLE = re.compile(r"Out of memory|oom-kill|Killed process|Kernel panic|BUG:|Oops|"
                     r"segfault|hung_task|soft lockup|rcu.*stall|Call Trace", re.I)


def run(command: list[str], rwdirs: list[str], timeout_s: float,
        log: Path | None = None, cpus: int = CPUS) -> int:
    need_tools(["qemu-system-x86_64", "udevadm"])
    need_static_busybox()
    version = current_version()
    if not vng_path().exists():
        raise Missing(f"{vng_path()} is missing: run scripts/stock_kernel.py --prepare")
    if not command:
        raise Missing("no command: scripts/stock_kernel.py run -- CMD ...")
    for d in rwdirs:
        if not Path(d).is_dir():
            raise Missing(f"--rwdir {d}: no such folder")
    # own session: a timeout ends QEMU and what it started, nothing else
    env = dict(os.environ, PATH=f"{vng_path().parent}{os.pathsep}{os.environ.get('PATH', '')}")
    # QEMU reopens its stdout and stderr by name (/proc/self/fd/N) without O_APPEND: two
    # opens of one regular file (`> log 2>&1`) overwrite each other. Pipes, copied through.
    console = open(log, "wb") if log is not None else sys.stderr.buffer
    proc = subprocess.Popen(guest_argv(version, command, rwdirs, console=log is not None,
                                       cpus=cpus),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)
    copies = [threading.Thread(target=_copy, args=(src, dst), daemon=True)
              for src, dst in ((proc.stdout, sys.stdout.buffer), (proc.stderr, console))]
    for t in copies:
        t.start()
    killed = True
    try:
        rc = proc.wait(timeout=timeout_s)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        print(f"error: the guest ran past --timeout {timeout_s:g} s and was stopped", file=sys.stderr)
        rc = 124
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = 130
    for t in copies:     # what QEMU wrote, before the log is closed (killed: its pipes end)
        t.join(timeout=10 if killed else None)
    if log is not None:
        console.close()
        if rc != 0:
            report_console(log)
    return rc


def report_console(log: Path) -> None:
    """After a failed command: the guest's kernel messages that say why, and where the rest is."""
    lines = log.read_text(errors="replace").splitlines()
    trouble = [line for line in lines if TROUBLE.search(line)]
    print(f"the guest's console ({len(lines)} lines): {log}", file=sys.stderr)
    for line in trouble[:20] or ["(no kernel message of an OOM kill, panic or oops)"]:
        print(f"  {line}", file=sys.stderr)


def _copy(src, dst) -> None:
    for chunk in iter(lambda: src.read1(65536), b""):
        dst.write(chunk)
        dst.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true",
                        help="install virtme-ng, download and unpack the kernel (once)")
    parser.add_argument("--package", default=PACKAGE,
                        help=f"the Debian kernel package (default {PACKAGE})")
    sub = parser.add_subparsers(dest="step")
    r = sub.add_parser("run", help="run a command in the guest: run [--rwdir DIR] -- CMD ...")
    r.add_argument("--rwdir", action="append", default=[], help="a folder the guest may write")
    r.add_argument("--timeout", type=float, default=3600, help="seconds (default 3600)")
    r.add_argument("--log", type=Path, help="keep the guest's kernel console in this file "
                   "(and on failure print its OOM, panic and oops lines)")
    r.add_argument("--cpus", type=int, default=CPUS, help=f"the guest's vCPUs (default {CPUS})")
    r.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if not args.prepare and args.step is None:
        parser.print_usage(sys.stderr)
        fail("give --prepare, or run -- CMD ...")
    try:
        if args.prepare:
            prepare(args.package)
        if args.step == "run":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if args.log is not None and not args.log.resolve().parent.is_dir():
                raise Missing(f"--log {args.log}: its folder does not exist")
            return run(command, args.rwdir, args.timeout, args.log, args.cpus)
    except Missing as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
