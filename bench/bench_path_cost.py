#!/usr/bin/env python3
"""The CPU one byte costs on the emulated path against loopback: the factor time_scale auto puts
on its start-up measurement (testbed.run.autoscale.PATH_COST_FACTOR).

    sudo .venv/bin/python bench/bench_path_cost.py [--mib 512] [--rounds 2]

Moves --mib MiB through one TCP connection three ways: on loopback; between two namespaces over a
veth pair; and the same with an HTB root (10 Gbit/s, so it shapes nothing) on the sender, as each
emulated host link has. The figure is the whole machine's busy CPU (/proc/stat: user, system,
softirq...) per byte, so the kernel's work in softirq counts; run it on an otherwise idle machine.
Makes two namespaces of its own (gdpc-<pid>-a/b) and removes them, also on errors.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

RECEIVER = """import socket
s = socket.create_server(("0.0.0.0", 5999)); c, _ = s.accept(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
"""
SENDER = """import socket, sys
s = socket.create_connection((sys.argv[1], 5999)); b = bytes(1 << 20)
for _ in range(int(sys.argv[2])):
    s.sendall(b)
s.close()
"""


def busy_jiffies() -> int:
    v = [int(x) for x in open("/proc/stat").readline().split()[1:8]]
    return sum(v) - v[3] - v[4]          # all but idle and iowait


def ns_per_byte(rx_prefix: list[str], tx_prefix: list[str], addr: str, mib: int) -> float:
    rx = subprocess.Popen([*rx_prefix, sys.executable, "-c", RECEIVER])
    try:
        deadline = time.monotonic() + 10
        while True:                   # the receiver listening
            probe = subprocess.run([*tx_prefix, sys.executable, "-c",
                                    f"import socket; socket.create_connection(('{addr}', 5999))"
                                    f".close()"], capture_output=True)
            if probe.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        rx.wait(timeout=10)           # the probe's connection ended it; start it again
        rx = subprocess.Popen([*rx_prefix, sys.executable, "-c", RECEIVER])
        time.sleep(0.5)
        c0 = busy_jiffies()
        subprocess.run([*tx_prefix, sys.executable, "-c", SENDER, addr, str(mib)], check=True)
        rx.wait(timeout=60)
        c1 = busy_jiffies()
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    return (c1 - c0) / os.sysconf("SC_CLK_TCK") * 1e9 / (mib << 20)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("error: root needed (it makes two network namespaces); run it with sudo",
              file=sys.stderr)
        return 2
    a, b = f"gdpc-{os.getpid()}-a", f"gdpc-{os.getpid()}-b"

    def sh(*argv: str) -> None:
        subprocess.run(argv, check=True)

    try:
        sh("ip", "netns", "add", a)
        sh("ip", "netns", "add", b)
        sh("ip", "-n", a, "link", "add", "pc0", "type", "veth", "peer", "name", "pc1",
           "netns", b)
        sh("ip", "-n", a, "addr", "add", "10.98.0.1/24", "dev", "pc0")
        sh("ip", "-n", b, "addr", "add", "10.98.0.2/24", "dev", "pc1")
        for ns, dev in ((a, "pc0"), (b, "pc1")):
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        in_a, in_b = ["ip", "netns", "exec", a], ["ip", "netns", "exec", b]
        print("| round | loopback ns/byte | veth | veth + HTB | factor (veth + HTB / loopback) |")
        print("|---|---|---|---|---|")
        for r in range(args.rounds):
            lo = ns_per_byte(in_a, in_a, "127.0.0.1", args.mib)
            veth = ns_per_byte(in_b, in_a, "10.98.0.2", args.mib)
            sh("ip", "netns", "exec", a, "tc", "qdisc", "add", "dev", "pc0", "root", "handle",
               "1:", "htb", "default", "1", "r2q", "1000")
            sh("ip", "netns", "exec", a, "tc", "class", "add", "dev", "pc0", "parent", "1:",
               "classid", "1:1", "htb", "rate", "10gbit", "quantum", "60000")
            htb = ns_per_byte(in_b, in_a, "10.98.0.2", args.mib)
            sh("ip", "netns", "exec", a, "tc", "qdisc", "del", "dev", "pc0", "root")
            print(f"| {r + 1} | {lo:.3f} | {veth:.3f} | {htb:.3f} | {htb / lo:.2f} |")
        from testbed.run.autoscale import PATH_COST_FACTOR
        print(f"time_scale auto uses {PATH_COST_FACTOR:g} (testbed/run/autoscale.py)")
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
