"""A local cluster for tests (issue 25 part 3): N "servers" on this machine, each reached by real ssh.

    sudo python scripts/local_cluster.py up 2 --out CLUSTER.yaml
    sudo python scripts/local_cluster.py down

`up N` makes an underlay namespace `geodclc-ul` holding a bridge `br0`, and per server a
namespace `geodclc-sK` whose `eth0` (10.250.0.K/24) is a veth port on that bridge; each runs its
own sshd (generated host key, listening on 10.250.0.K:22, root login by a generated client key
only). So that ssh works from this machine's root namespace, one veth `geodclc0` (10.250.0.254/24)
joins the bridge; that link, its connected route and the namespaces' names under /run/netns are
all this script changes in the root namespace, and all are recorded and removed. Each server
sees this machine's /run through an overlay whose writes are its own, so what a run keeps under
/run on one server is not on another. It writes the cluster file (docs/cluster.md) with the key and known_hosts. State (keys, sshd configs, logs,
pids) lives in /run/geodclc/; `down` stops the sshds it started (each checked by pid and start
time, signalled through a pidfd; never by name), deletes the namespaces and the link, and
removes /run/geodclc/, the cluster file it wrote, and /run/sshd if it made it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path("/run/geodclc")
PREFIX = "geodclc"
UNDERLAY = f"{PREFIX}-ul"
ROOT_LINK = f"{PREFIX}0"
ROOT_ADDR = "10.250.0.254/24"
SSHD_DIR = Path("/run/sshd")     # sshd's privilege-separation dir, made if missing
MAX_SERVERS = 20


def address(k: int) -> str:
    return f"10.250.0.{k}"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def save(state: dict) -> None:
    tmp = STATE / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(STATE / "state.json")


def up(n: int, out: Path) -> None:
    if not 1 <= n <= MAX_SERVERS:
        sys.exit(f"error: N: {n} servers; give 1 to {MAX_SERVERS}")
    if STATE.exists():
        sys.exit(f"error: a local cluster is up ({STATE} exists); run `local_cluster.py down` first")
    if out.exists() or out.is_symlink():
        sys.exit(f"error: --out: {out} exists; give a new path (up writes the cluster file "
                 f"and down removes it)")
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        sys.exit("error: sshd: not installed; apt-get install openssh-server (scripts/setup.sh does)")
    STATE.mkdir(mode=0o700)
    state: dict = {"namespaces": [], "root_link": None, "made_sshd_dir": False, "procs": [],
                   "out": None}     # the cluster file, once up has written it
    save(state)
    try:
        if not SSHD_DIR.exists():
            SSHD_DIR.mkdir(mode=0o755)
            state["made_sshd_dir"] = True
            save(state)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "geodclc-client",
                        "-f", str(STATE / "client_key")], check=True)
        ip("netns", "add", UNDERLAY)
        state["namespaces"].append(UNDERLAY)
        save(state)
        ip("-n", UNDERLAY, "link", "add", "br0", "type", "bridge")
        ip("-n", UNDERLAY, "link", "set", "br0", "up")
        ip("-n", UNDERLAY, "link", "set", "lo", "up")
        ip("link", "add", ROOT_LINK, "type", "veth", "peer", "name", "root", "netns", UNDERLAY)
        state["root_link"] = ROOT_LINK
        save(state)
        ip("-n", UNDERLAY, "link", "set", "root", "master", "br0", "up")
        ip("addr", "add", ROOT_ADDR, "dev", ROOT_LINK)
        ip("link", "set", ROOT_LINK, "up")
        known = []
        servers = []
        for k in range(1, n + 1):
            ns = f"{PREFIX}-s{k}"
            ip("netns", "add", ns)
            state["namespaces"].append(ns)
            save(state)
            ip("-n", UNDERLAY, "link", "add", f"s{k}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            ip("-n", UNDERLAY, "link", "set", f"s{k}", "master", "br0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{address(k)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            d = STATE / f"s{k}"
            d.mkdir(mode=0o700)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", ns,
                            "-f", str(d / "host_key")], check=True)
            shutil.copy(STATE / "client_key.pub", d / "authorized_keys")
            (d / "sshd_config").write_text("\n".join([
                f"ListenAddress {address(k)}", "Port 22", f"HostKey {d / 'host_key'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}", "PidFile none",
                "PermitRootLogin prohibit-password", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
                "AcceptEnv LANG", "Subsystem sftp internal-sftp", ""]))
            log = open(d / "sshd.log", "wb")
            # Each server's /run is its own (as on a real server): an overlay over this
            # machine's /run, writes going to a tmpfs in sshd's mount namespace (ip netns exec
            # makes one per command), so they vanish with the server.
            ovl = d / "run-overlay"
            ovl.mkdir()
            private_run = (f"mount -t tmpfs {ns} {ovl} && mkdir {ovl}/up {ovl}/work && "
                           f"mount -t overlay {ns} -o lowerdir=/run,upperdir={ovl}/up,"
                           f"workdir={ovl}/work /run")
            proc = subprocess.Popen(["ip", "netns", "exec", ns, "sh", "-c",
                                     f'{private_run} && exec "$@"', "sh", sshd, "-D", "-e",
                                     "-f", str(d / "sshd_config")],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            log.close()
            state["procs"].append({"pid": proc.pid, "start": start_time(proc.pid), "ns": ns})
            save(state)
            pub = (d / "host_key.pub").read_text().split()
            known.append(f"{address(k)} {pub[0]} {pub[1]}")
            servers.append(f"  - {{name: s{k}, address: {address(k)}, user: root, port: 22, "
                           f"key: {STATE / 'client_key'}, known_hosts: {STATE / 'known_hosts'}}}")
        (STATE / "known_hosts").write_text("\n".join(known) + "\n")
        for k in range(1, n + 1):
            wait_listening(f"{PREFIX}-s{k}", address(k), STATE / f"s{k}" / "sshd.log")
        with open(out, "x") as f:   # never a file that appeared meanwhile
            f.write(f"# local cluster of {n} servers (scripts/local_cluster.py; "
                    f"down: local_cluster.py down)\nservers:\n" + "\n".join(servers) + "\n")
        state["out"] = str(out.resolve())
        save(state)
    except BaseException as exc:
        down(quiet=True)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) and \
            exc.stderr else str(exc)
        sys.exit(f"error: up: {detail.splitlines()[-1] if detail else type(exc).__name__}; "
                 f"everything it made is removed")
    print(f"{n} servers up ({', '.join(address(k) for k in range(1, n + 1))}); cluster file {out}")


def wait_listening(ns: str, addr: str, log: Path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htln", f"src {addr}:22"],
                           capture_output=True, text=True)
        if r.stdout.strip():
            return
        time.sleep(0.1)
    tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
    raise RuntimeError(f"sshd in {ns} not listening after {timeout_s:g} s ({' '.join(tail)})")


def stop(entry: dict, grace_s: float = 3.0) -> None:
    """SIGTERM then SIGKILL to the process we started, through a pidfd opened after checking
    that the pid still has the start time we recorded (else it is not ours: left alone)."""
    pid = entry["pid"]
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if start_time(pid) != entry["start"]:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            try:
                signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if start_time(pid) is None or _zombie(pid):
                    return
                time.sleep(0.05)
    finally:
        os.close(fd)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def down(quiet: bool = False) -> list[str]:
    """Remove what `up` recorded; returns what was removed."""
    done: list[str] = []
    path = STATE / "state.json"
    if not path.exists():
        if not quiet:
            print("no local cluster is up")
        return done
    state = json.loads(path.read_text())
    for entry in state["procs"]:
        stop(entry)
        done.append(f"sshd pid {entry['pid']} ({entry['ns']})")
    for ns in reversed(state["namespaces"]):
        # any process still in the namespace (an ssh session) was started through our sshd
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in r.stdout.split():
            stop({"pid": int(pid), "start": start_time(int(pid))}, grace_s=1.0)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        done.append(f"namespace {ns}")
    if state["root_link"]:
        subprocess.run(["ip", "link", "del", state["root_link"]], capture_output=True)
        done.append(f"link {state['root_link']}")
    if state["made_sshd_dir"]:
        try:
            SSHD_DIR.rmdir()
            done.append(str(SSHD_DIR))
        except OSError:
            pass
    if state.get("out"):
        out = Path(state["out"])
        if out.exists():
            out.unlink()
            done.append(str(out))
    shutil.rmtree(STATE, ignore_errors=True)
    done.append(str(STATE))
    if not quiet:
        print("removed: " + ", ".join(done))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="local_cluster.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start N servers and write the cluster file")
    u.add_argument("n", type=int)
    u.add_argument("--out", required=True, type=Path, help="the cluster file to write")
    sub.add_parser("down", help="remove every server, the underlay and the state")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("error: local_cluster.py: needs root (network namespaces); run with sudo",
              file=sys.stderr)
        return 2
    if args.command == "up":
        up(args.n, args.out)
    else:
        down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
