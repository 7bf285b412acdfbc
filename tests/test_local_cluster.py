"""scripts/local_cluster.py (issue 25 part 3), as root: `up 2` gives two servers that real ssh
reaches with the cluster file's key and known_hosts (strict host key checking), one server
pings the other over the underlay, and `down` leaves no namespace, link, process or file
(the `network` ring's fixture checks the root namespace too)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geodc.spec.cluster import load_cluster

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, str(ROOT / "scripts" / "local_cluster.py")]
STATE = Path("/run/geodclc")


def ssh(server, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                           *server.ssh_options, server.destination, command],
                          capture_output=True, text=True, timeout=30)


def test_up_ssh_ping_down_leaves_nothing(tmp_path):
    out = tmp_path / "cluster.yaml"
    subprocess.run([*SCRIPT, "up", "2", "--out", str(out)], check=True, timeout=60)
    try:
        procs = json.loads((STATE / "state.json").read_text())["procs"]
        cluster = load_cluster(out)
        assert [s.address for s in cluster.servers] == ["10.250.0.1", "10.250.0.2"]
        for s in cluster.servers:
            r = ssh(s, "ip -br addr show eth0")
            assert r.returncode == 0, r.stderr
            assert s.address in r.stdout
        r = ssh(cluster.servers[1], "ping -c 10 -i 0.05 -q 10.250.0.1")
        assert r.returncode == 0, r.stderr
        rtt = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", r.stdout)
        print(f"underlay RTT s2->s1 min/avg/max/mdev ms: {rtt.groups()}")
        assert float(rtt.group(2)) < 5.0
    finally:
        subprocess.run([*SCRIPT, "down"], check=True, timeout=60)
    assert not STATE.exists() and not out.exists()
    assert "geodclc" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True).stdout
    assert "geodclc" not in subprocess.run(["ip", "-br", "link"], capture_output=True,
                                           text=True).stdout
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{p['pid']}").exists() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)   # a stopped sshd is reaped by init (it outlived `up`)
    assert not any(Path(f"/proc/{p['pid']}").exists() for p in procs)


def test_up_never_touches_a_file_it_did_not_write(tmp_path):
    """An --out that exists is refused before anything is made, and kept (a failed up used to
    delete it with the rest)."""
    out = tmp_path / "mine.yaml"
    out.write_text("my own notes\n")
    r = subprocess.run([*SCRIPT, "up", "2", "--out", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and r.stderr.strip() == (
        f"error: --out: {out} exists; give a new path (up writes the cluster file and down "
        f"removes it)"), r.stderr
    assert out.read_text() == "my own notes\n" and not STATE.exists()
