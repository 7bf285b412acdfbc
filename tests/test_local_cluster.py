"""scripts/local_cluster.py (issue 25 part 3), as root: `up 2` gives two servers that real ssh
reaches with the cluster file's key and known_hosts (strict host key checking), one server
pings the other over the underlay, and `down` leaves no namespace, link, process or file
(the `network` ring's fixture checks the root namespace too)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.spec.cluster import load_cluster

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


def state_of(name: str) -> dict:
    return json.loads((Path(f"/run/geodclc-{name}") / "state.json").read_text())


def ours(name: str) -> list[str]:
    """Namespaces and root-namespace links of instance NAME."""
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    return [w for w in (netns + links).split() if w.split("@")[0].startswith(f"glc-{name}")]


def load_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location("local_cluster", SCRIPT[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_two_named_instances_up_at_once_then_down(tmp_path):
    """Two local clusters at once (issue 38: one per machine, and `down` removed another
    invocation's): each its own names (15 characters at most), state dir and /24; ssh reaches
    both; taking the first down leaves the second working; both down leave nothing, /run/sshd
    as it was."""
    sshd_dir_before = Path("/run/sshd").exists()
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    times = {}
    try:
        for name, out in (("ta", a), ("tb", b)):
            t0 = time.monotonic()
            subprocess.run([*SCRIPT, "up", "2", "--name", name, "--out", str(out)], check=True,
                           timeout=60)
            times[f"up {name}"] = time.monotonic() - t0
        sa, sb = state_of("ta"), state_of("tb")
        assert sa["subnet"] != sb["subnet"] and "10.250.0.0/24" not in (sa["subnet"], sb["subnet"])
        for name in ("ta", "tb"):
            names = ours(name)
            assert len(names) == 4 and all(len(n.split("@")[0]) <= 15 for n in names), names
        ca, cb = load_cluster(a), load_cluster(b)
        assert {s.address for s in ca.servers}.isdisjoint(s.address for s in cb.servers)
        for s in [*ca.servers, *cb.servers]:
            r = ssh(s, "ip -br addr show eth0")
            assert r.returncode == 0 and s.address in r.stdout, r.stderr
        again = subprocess.run([*SCRIPT, "up", "1", "--name", "ta", "--out", str(tmp_path / "c")],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 1 and "a local cluster named ta is up" in again.stderr
        bad = subprocess.run([*SCRIPT, "up", "1", "--name", "toolong1", "--out", str(tmp_path / "c")],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.startswith("error: --name: 'toolong1'")
        t0 = time.monotonic()
        subprocess.run([*SCRIPT, "down", "--name", "ta"], check=True, timeout=60)
        times["down ta"] = time.monotonic() - t0
        assert ours("ta") == [] and not a.exists() and len(ours("tb")) == 4
        assert Path("/run/sshd").exists()        # tb's sshds still need it
        r = ssh(cb.servers[1], f"ping -c 3 -i 0.05 -q {cb.servers[0].address}")
        assert r.returncode == 0, r.stderr
    finally:
        for name in ("tb", "ta"):
            t0 = time.monotonic()
            subprocess.run([*SCRIPT, "down", "--name", name], check=True, timeout=60)
            times.setdefault(f"down {name}", time.monotonic() - t0)
    print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in times.items()))
    assert ours("ta") == ours("tb") == [] and not b.exists()
    assert not Path("/run/geodclc-ta").exists() and not Path("/run/geodclc-tb").exists()
    assert Path("/run/sshd").exists() == sshd_dir_before


@pytest.mark.parametrize("form", ["another user's folder", "a link"])
def test_a_state_dir_someone_else_made_is_refused(tmp_path, form):
    """A state dir that is not root's with mode 0700, or is a link, stops `up` and `down`
    (exit 2, one line naming it) before anything is made, read or signalled: the planted
    state.json names a live process for down to stop and a file for it to remove."""
    planted = Path("/run/geodclc-tx")
    victim = subprocess.Popen(["sleep", "60"])
    keep = tmp_path / "keep.txt"
    keep.write_text("mine\n")
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    try:
        if form == "a link":
            planted.symlink_to(target)
        else:
            planted.mkdir()
            planted.chmod(0o777)
            os.chown(planted, 65534, 65534)
        stat = Path(f"/proc/{victim.pid}/stat").read_text()
        start = int(stat.rsplit(")", 1)[1].split()[19])
        (planted / "state.json").write_text(json.dumps({
            "namespaces": [], "root_link": None, "made_sshd_dir": False, "out": str(keep),
            "procs": [{"pid": victim.pid, "start": start, "ns": "x"}]}))
        out = tmp_path / "c.yaml"
        for argv in (["up", "1", "--name", "tx", "--out", str(out)], ["down", "--name", "tx"]):
            r = subprocess.run([*SCRIPT, *argv], capture_output=True, text=True, timeout=60)
            assert r.returncode == 2, (argv, r.stdout, r.stderr)
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"error: state: {planted} is ") \
                and f"rm -r {planted}" in lines[0], r.stderr
        assert victim.poll() is None and keep.read_text() == "mine\n" and not out.exists()
        assert (planted / "state.json").exists() and ours("tx") == []
    finally:
        victim.kill()
        victim.wait()
        if planted.is_symlink():
            planted.unlink()
        elif planted.exists():
            shutil.rmtree(planted)
    # a folder above the state dir that others can write (here /tmp) is refused too
    module = load_script()
    module.RUN = tmp_path / "run"
    module.RUN.mkdir()
    with pytest.raises(SystemExit) as info:
        module.check_state_dir(module.Instance("tx"))
    assert info.value.code == 2


def test_an_occupied_subnet_is_skipped(tmp_path):
    """The /24 that `up` would take is given to a link in the root namespace first (a veth: this
    kernel has no dummy links): up takes another one, which it records, and down removes
    exactly its own link (that one stays). With every /24 in use, a one-line error, exit 2."""
    module = load_script()
    first = module.free_subnet(module.Instance("to"))
    dummy = "gdtestocc0"
    subprocess.run(["ip", "link", "add", dummy, "type", "veth", "peer", "name", "gdtestocc1"],
                   check=True)
    out = tmp_path / "c.yaml"
    try:
        subprocess.run(["ip", "addr", "add", f"{first.network_address + 1}/24", "dev", dummy],
                       check=True)
        subprocess.run([*SCRIPT, "up", "1", "--name", "to", "--out", str(out)], check=True,
                       timeout=60)
        try:
            subnet = state_of("to")["subnet"]
            assert subnet != str(first) and not module.ipaddress.ip_network(subnet).overlaps(first)
            r = ssh(load_cluster(out).servers[0], "true")
            assert r.returncode == 0, r.stderr
        finally:
            subprocess.run([*SCRIPT, "down", "--name", "to"], check=True, timeout=60)
        assert ours("to") == []
        assert subprocess.run(["ip", "link", "show", dummy], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", dummy], check=True)
    module.used_networks = lambda: [module.SUBNETS]
    with pytest.raises(SystemExit) as info:
        module.free_subnet(module.Instance("to"))
    assert info.value.code == 2
