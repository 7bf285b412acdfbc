"""A local cluster for tests (issue 25 part 3): N "servers" on this machine, each reached by real ssh.

    sudo python scripts/local_cluster.py up 2 --out CLUSTER.yaml [--name NAME]
    sudo python scripts/local_cluster.py down [--name NAME]

Several can be up at once, each under its own name (--name: 1 to 7 of a-z and 0-9, the first a
letter; without it the default instance, named as before). Names, per instance:

    instance   state dir            prefix    subnet
    default    /run/geodclc         geodclc   10.250.0.0/24 when free, else as below
    NAME       /run/geodclc-NAME    glc-NAME  the first free of 10.250.1.0/24 .. 10.250.255.0/24

`up N` makes an underlay namespace `PREFIX-ul` holding a bridge `br0`, and per server a
namespace `PREFIX-sK` whose `eth0` (address K of the subnet) is a veth port on that bridge;
each runs its own sshd (generated host key, listening on its address, port 22, root login by a
generated client key only). So that ssh works from this machine's root namespace, one veth
`PREFIX0` (address 254 of the subnet) joins the bridge; that link, its connected route and the
namespaces' names under /run/netns are all this script changes in the root namespace, and all
are recorded and removed. Every name fits Linux's 15-character limit on interface names. The
subnet is a /24 that no address or route of the root namespace overlaps (no free one: a
one-line error, exit 2); it is recorded in the state, and `up` and `down` hold a lock (flock on
/run) so that two never choose at once. Each server sees this machine's /run through an
overlay whose writes are its own, so what a run keeps under /run on one server is not on
another. It writes the cluster file (docs/cluster.md) with the key and known_hosts.

State (keys, sshd configs, logs, pids, the subnet) lives in the instance's state dir, root's
with mode 0700. Before anything is made or read, `up` and `down` refuse (one line naming the
path, exit 2) a state dir, or any folder above it, that is a symbolic link, is not root's, or
is open to writes by others (the state dir: anything but mode 0700): another user could
otherwise plant keys, or pids for root to signal. `down` stops the sshds it started (each
checked by pid and start time, signalled through a pidfd; never by name), deletes the
namespaces and the link it made (each checked against the inode or index recorded when it
was made, so a namesake made later is left alone), and removes the state dir, the cluster
file it wrote, and /run/sshd if it made it and no other instance is up (else that instance
removes it).
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

RUN = Path("/run")
SSHD_DIR = RUN / "sshd"     # sshd's privilege-separation dir, made if missing
MAX_SERVERS = 20
NAME_RE = re.compile(r"[a-z][a-z0-9]{0,6}")    # glc-NAME-s20: 15 characters at most
DEFAULT_SUBNET = ipaddress.ip_network("10.250.0.0/24")
SUBNETS = ipaddress.ip_network("10.250.0.0/16")


class Instance:
    """One local cluster's names: its state dir, namespaces and root-namespace link."""

    def __init__(self, name: str | None) -> None:
        self.name = name or "default"
        self.prefix = "geodclc" if name is None else f"glc-{name}"
        self.state = RUN / ("geodclc" if name is None else f"geodclc-{name}")
        self.underlay = f"{self.prefix}-ul"
        self.root_link = f"{self.prefix}0"
        self.flag = "" if name is None else f" --name {name}"

    def server(self, k: int) -> str:
        return f"{self.prefix}-s{k}"


def address(subnet: ipaddress.IPv4Network, k: int) -> str:
    return str(subnet.network_address + k)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def ip_json(*args: str) -> list:
    return json.loads(subprocess.run(["ip", "-j", *args], check=True, capture_output=True,
                                     text=True).stdout or "[]")


def refuse(msg: str) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def check_state_dir(inst: Instance) -> None:
    """Exit 2 unless the state dir (if it exists) is a folder of root's with mode 0700 and
    every folder above it is root's, not a link and not open to others' writes."""
    path = inst.state
    for entry in [*reversed(path.parents), path]:
        try:
            st = entry.lstat()
        except FileNotFoundError:
            if entry == path:
                return
            raise
        fix = (f"remove it (rm -r {path}) if no local cluster named {inst.name} is up, "
               f"then run up again" if entry == path else "use a machine where it is root's")
        if stat.S_ISLNK(st.st_mode):
            refuse(f"state: {entry} is a symbolic link (root's folder, mode 0700, expected); "
                   f"{fix}")
        mode = stat.S_IMODE(st.st_mode)
        wrong = (mode != 0o700) if entry == path else bool(mode & 0o022)
        if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode) or wrong:
            what = "folder" if stat.S_ISDIR(st.st_mode) else "file"
            refuse(f"state: {entry} is a {what} of uid {st.st_uid}, mode {mode:o} "
                   f"({'mode 0700' if entry == path else 'not writable by others'}, root's, "
                   f"expected); {fix}")


_lock_fd: int | None = None


def lock() -> None:
    """An exclusive flock on /run, held until the process exits: one up or down at a time
    (taken once: a second open file's flock would wait on the first)."""
    global _lock_fd
    if _lock_fd is None:
        _lock_fd = os.open(RUN, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(_lock_fd, fcntl.LOCK_EX)


def used_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the root namespace's addresses and of its main table's routes
    (other than the default route)."""
    nets = [ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network
            for link in ip_json("-4", "addr", "show") for a in link.get("addr_info", [])]
    nets += [ipaddress.ip_network(r["dst"] if "/" in r["dst"] else f"{r['dst']}/32")
             for r in ip_json("-4", "route", "show") if r.get("dst") not in (None, "default")]
    return nets


def free_subnet(inst: Instance) -> ipaddress.IPv4Network:
    """The default instance's 10.250.0.0/24 if free, else (and for a named one) the first
    /24 of 10.250.1.0 .. 10.250.255.0 that nothing in the root namespace overlaps."""
    used = used_networks()
    first = [DEFAULT_SUBNET] if inst.name == "default" else []
    for net in first + [n for n in SUBNETS.subnets(new_prefix=24) if n != DEFAULT_SUBNET]:
        if not any(net.overlaps(u) for u in used):
            return net
    refuse(f"subnet: every /24 of {SUBNETS} is in use in the root namespace (ip -4 addr, "
           f"ip -4 route); take a local cluster down or free one")


def start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def save(inst: Instance, state: dict) -> None:
    tmp = inst.state / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(inst.state / "state.json")


def netns_inode(ns: str) -> int:
    return os.stat(RUN / "netns" / ns).st_ino


def up(n: int, out: Path, inst: Instance) -> None:
    if not 1 <= n <= MAX_SERVERS:
        sys.exit(f"error: N: {n} servers; give 1 to {MAX_SERVERS}")
    check_state_dir(inst)
    if inst.state.exists():
        sys.exit(f"error: a local cluster named {inst.name} is up ({inst.state} exists); run "
                 f"`local_cluster.py down{inst.flag}` first, or give another --name")
    if out.exists() or out.is_symlink():
        sys.exit(f"error: --out: {out} exists; give a new path (up writes the cluster file "
                 f"and down removes it)")
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        sys.exit("error: sshd: not installed; apt-get install openssh-server (scripts/setup.sh does)")
    lock()
    subnet = free_subnet(inst)
    try:
        inst.state.mkdir(mode=0o700)
    except FileExistsError:
        sys.exit(f"error: a local cluster named {inst.name} is up ({inst.state} exists); run "
                 f"`local_cluster.py down{inst.flag}` first, or give another --name")
    state: dict = {"name": inst.name, "subnet": str(subnet), "namespaces": [], "netns_inodes": {},
                   "root_link": None, "root_ifindex": None, "made_sshd_dir": False, "procs": [],
                   "out": None}     # the cluster file, once up has written it
    save(inst, state)
    st = inst.state
    try:
        if not SSHD_DIR.exists():
            SSHD_DIR.mkdir(mode=0o755)
            state["made_sshd_dir"] = True
            save(inst, state)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{inst.prefix}-client",
                        "-f", str(st / "client_key")], check=True)

        def add_netns(ns: str) -> None:
            ip("netns", "add", ns)
            state["namespaces"].append(ns)
            state["netns_inodes"][ns] = netns_inode(ns)
            save(inst, state)

        ul = inst.underlay
        add_netns(ul)
        ip("-n", ul, "link", "add", "br0", "type", "bridge")
        ip("-n", ul, "link", "set", "br0", "up")
        ip("-n", ul, "link", "set", "lo", "up")
        ip("link", "add", inst.root_link, "type", "veth", "peer", "name", "root", "netns", ul)
        state["root_link"] = inst.root_link
        state["root_ifindex"] = ip_json("link", "show", "dev", inst.root_link)[0]["ifindex"]
        save(inst, state)
        ip("-n", ul, "link", "set", "root", "master", "br0", "up")
        ip("addr", "add", f"{address(subnet, 254)}/24", "dev", inst.root_link)
        ip("link", "set", inst.root_link, "up")
        known = []
        servers = []
        for k in range(1, n + 1):
            ns, addr = inst.server(k), address(subnet, k)
            add_netns(ns)
            ip("-n", ul, "link", "add", f"s{k}", "type", "veth", "peer", "name", "eth0",
               "netns", ns)
            ip("-n", ul, "link", "set", f"s{k}", "master", "br0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            d = st / f"s{k}"
            d.mkdir(mode=0o700)
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", ns,
                            "-f", str(d / "host_key")], check=True)
            shutil.copy(st / "client_key.pub", d / "authorized_keys")
            (d / "sshd_config").write_text("\n".join([
                f"ListenAddress {addr}", "Port 22", f"HostKey {d / 'host_key'}",
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
            save(inst, state)
            pub = (d / "host_key.pub").read_text().split()
            known.append(f"{addr} {pub[0]} {pub[1]}")
            servers.append(f"  - {{name: s{k}, address: {addr}, user: root, port: 22, "
                           f"key: {st / 'client_key'}, known_hosts: {st / 'known_hosts'}}}")
        (st / "known_hosts").write_text("\n".join(known) + "\n")
        for k in range(1, n + 1):
            wait_listening(inst.server(k), address(subnet, k), st / f"s{k}" / "sshd.log")
        with open(out, "x") as f:   # never a file that appeared meanwhile
            f.write(f"# local cluster {inst.name} of {n} servers on {subnet} "
                    f"(scripts/local_cluster.py; down: local_cluster.py down{inst.flag})\n"
                    f"servers:\n" + "\n".join(servers) + "\n")
        state["out"] = str(out.resolve())
        save(inst, state)
    except BaseException as exc:
        down(inst, quiet=True)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        detail = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) and \
            exc.stderr else str(exc)
        sys.exit(f"error: up: {detail.splitlines()[-1] if detail else type(exc).__name__}; "
                 f"everything it made is removed")
    print(f"{n} servers up as {inst.name} on {subnet} "
          f"({', '.join(address(subnet, k) for k in range(1, n + 1))}); cluster file {out}")


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


def other_instances(inst: Instance) -> list[Path]:
    """The state dirs of the other instances that are up (each checked as check_state_dir
    checks its own; one that fails is skipped)."""
    found = []
    for d in sorted(RUN.glob("geodclc*")):
        if d == inst.state or not (d.name == "geodclc" or d.name.startswith("geodclc-")):
            continue
        st = d.lstat()
        if (stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o700
                and (d / "state.json").is_file()):
            found.append(d)
    return found


def down(inst: Instance, quiet: bool = False) -> list[str]:
    """Remove what `up` recorded; returns what was removed."""
    done: list[str] = []
    check_state_dir(inst)
    path = inst.state / "state.json"
    if not path.exists():
        if not quiet:
            print(f"no local cluster named {inst.name} is up")
        return done
    lock()
    state = json.loads(path.read_text())
    for entry in state["procs"]:
        stop(entry)
        done.append(f"sshd pid {entry['pid']} ({entry['ns']})")
    inodes = state.get("netns_inodes", {})
    for ns in reversed(state["namespaces"]):
        try:
            if ns in inodes and netns_inode(ns) != inodes[ns]:
                done.append(f"not namespace {ns} (another one of that name)")
                continue
        except FileNotFoundError:
            continue
        # any process still in the namespace (an ssh session) was started through our sshd
        r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in r.stdout.split():
            stop({"pid": int(pid), "start": start_time(int(pid))}, grace_s=1.0)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        done.append(f"namespace {ns}")
    link = state["root_link"]
    if link:
        r = subprocess.run(["ip", "-j", "link", "show", "dev", link], capture_output=True,
                           text=True)
        index = json.loads(r.stdout)[0]["ifindex"] if r.returncode == 0 and r.stdout.strip() \
            else None
        if index is not None and state.get("root_ifindex") in (None, index):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
            done.append(f"link {link}")
    if state["made_sshd_dir"]:
        others = other_instances(inst)
        if others:      # still in use: the next instance to go down removes it
            other = json.loads((others[0] / "state.json").read_text())
            other["made_sshd_dir"] = True
            tmp = others[0] / "state.json.tmp"
            tmp.write_text(json.dumps(other, indent=1))
            tmp.replace(others[0] / "state.json")
            done.append(f"not {SSHD_DIR} (left to {others[0]})")
        else:
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
    shutil.rmtree(inst.state, ignore_errors=True)
    done.append(str(inst.state))
    if not quiet:
        print("removed: " + ", ".join(done))
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="local_cluster.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    u = sub.add_parser("up", help="start N servers and write the cluster file")
    u.add_argument("n", type=int)
    u.add_argument("--out", required=True, type=Path, help="the cluster file to write")
    d = sub.add_parser("down", help="remove every server, the underlay and the state")
    for q in (u, d):
        q.add_argument("--name", help="the instance (1 to 7 of a-z, 0-9, the first a letter); "
                                      "without it the default one")
    args = p.parse_args(argv)
    if args.name is not None and not NAME_RE.fullmatch(args.name):
        print(f"error: --name: {args.name!r} is not 1 to 7 of a-z and 0-9 starting with a "
              f"letter (names must fit 15-character interface names); give one that is",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("error: local_cluster.py: needs root (network namespaces); run with sudo",
              file=sys.stderr)
        return 2
    inst = Instance(args.name)
    if args.command == "up":
        up(args.n, args.out, inst)
    else:
        down(inst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
