"""`run --cluster` and `cleanup --cluster` on the local cluster (scripts/local_cluster.py up 2), as
root: a 4-DC ring trained over two servers (two links cross), with these checks:
- the losses over two servers are the single-process reference's (trainer.
  reference: the same model and data in one process on one machine, which the one-machine
  pipeline matches too, tests/test_trainer_run.py), for baseline and for atlas (temporal
  sharing: its arbiters and captures on the sending gateways, on their servers);
- the delay lines' counters are read on both servers (every direction counted, none dropped),
  and every byte the trainers sent over a WAN link passed that link's delay line; the WAN
  queues' counters and every host's TCP counters are read there too (none dropped);
- nothing goes around the emulated WAN: on each server's underlay interface, while the run
  lasts, the only traffic is ssh (port 22), the underlay's pings and VXLAN (UDP 4789), and
  VXLAN carried at least what the delay lines counted on the crossing links leaving it;
- nothing is left on either server.
And a dead server: s2's underlay cut mid-training stops the run within seconds, with one line
naming s2, and s2 ends what the run started there itself once it has not heard from the runner
for serverleash.SILENCE_S (its sshd would keep them for hours); once it is back, nothing is left
for `cleanup --cluster`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from testbed.emulation.serverregistry import REMOTE_STATE
from testbed.emulation.serverleash import SILENCE_S
from testbed.emulation.servers import server_run
from tests.server_leftovers import processes_naming
from tests.test_sweep import with_sweep

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[1]
DCS = ("a", "b", "c", "d")   # default placement: a, b on s1; c, d on s2
CROSSING = {"b->c": "s1", "c->b": "s2", "d->a": "s2", "a->d": "s1"}   # direction: sent from


def ring_scenario(folder: Path, iterations: int = 3) -> Path:
    doc = {
        "name": "ring4", "scale": 100, "connections": 2,
        "dcs": [{"name": dc, "hosts": 1} for dc in DCS],
        "wan": [{"between": [x, y], "delay_ms": 10, "rate_mbit": 100}
                for x, y in zip(DCS, DCS[1:] + DCS[:1])],
        "systems": ["baseline", "atlas"],
        "training": {
            "model": {"n_layer": 4, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64},
            "stages": 4, "replicas": 1, "micro_batches": 2, "micro_batch_size": 2,
            "schedule": "1f1b", "iterations": iterations, "seed": 0, "compute": "profile",
            "profile": {"file": "h200-transformer.json", "width": 2048, "seq": 2048,
                        "micro_batch": 1, "n_layer": 8},
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "ring4.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def cli(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run_testbed.py"), *args],
                          capture_output=True, text=True, timeout=timeout_s)


def metrics_of(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads((Path(last.removeprefix("results: ")) / "metrics.json").read_text())


# Counting rules on a server's underlay interface (the local cluster's own namespace): the
# classes of traffic a run may send between servers, and a last rule for anything else.
CLASSES = (("ssh", "-p tcp --sport 22"), ("ssh", "-p tcp --dport 22"), ("ping", "-p icmp"),
           ("vxlan", "-p udp --dport 4789"), ("other", ""))


def count_underlay(server) -> None:
    server_run(server, "iptables -w -N GEODC_UL && iptables -w -I OUTPUT -o eth0 -j GEODC_UL && "
               + " && ".join(f"iptables -w -A GEODC_UL {match} -j RETURN" for _, match in CLASSES))


def underlay_bytes(server) -> dict[str, int]:
    out = server_run(server, "iptables -w -L GEODC_UL -n -v -x")
    rows = [line.split() for line in out.splitlines()[2:] if line.strip()]
    assert len(rows) == len(CLASSES), out
    got: dict[str, int] = {}
    for (name, _), row in zip(CLASSES, rows):
        got[name] = got.get(name, 0) + int(row[1])
    return got


def test_ring_over_two_servers_trains_as_on_one_machine(cluster, tmp_path):
    from trainer.reference import reference_losses
    from testbed.spec.training import TrainConfig
    path = ring_scenario(tmp_path)
    want = reference_losses(TrainConfig.from_dict(yaml.safe_load(path.read_text())["training"]))
    for s in cluster.servers:
        count_underlay(s)
    proc = cli("run", str(path), "--cluster", cluster.path, "--out", str(tmp_path / "there"))
    print(proc.stdout[-4000:])
    there = metrics_of(proc)
    traffic = {s.name: underlay_bytes(s) for s in cluster.servers}
    print(f"underlay bytes sent per server during the run: {traffic}")

    for name in ("baseline", "atlas"):
        m = there["systems"][name]
        assert m["loss"] == pytest.approx(want, rel=1e-4), (name, m["loss"], want)
        c = m["network"]["cluster"]
        assert c["host_mtu"] == 1450 and sorted(x["link"] for x in c["crossing_links"]) == \
            ["b-c", "d-a"], c
        wan = m["wan_links"]
        assert len(wan) == 8, sorted(wan)   # both directions of the 4 links, on 2 servers
        for direction, w in wan.items():
            # the pipeline a-b-c-d uses every link but d-a
            assert (w["packets"] > 0) == ("a" not in direction or "d" not in direction), \
                (name, direction, w)
            assert w["dropped_loss"] == w["dropped_queue_full"] == 0, (name, direction, w)
            # every byte the trainers sent over the link (their own records) passed its line
            assert w["bytes"] >= w.get("training_bytes", 0), (name, direction, w)
            # the WAN queue's counters, read through the sending gateway's shell on its server
            q = w["queue"]
            assert q["leaves"] >= 1 and q["drops"] == 0, (name, direction, q)
            # (every packet the delay line took passed the sender's queue first, with its
            # Ethernet header; a link the pipeline leaves unused still carries IPv6's few
            # neighbour discovery packets, which the IPv4 delay line does not take)
            assert q["bytes"] >= w["bytes"] and q["packets"] > 0, (name, direction, q, w)
        # every host's TCP counters, read through its shell on its server
        tcp, tcp_base = m["tcp"], there["systems"]["baseline"]["tcp"]
        assert tcp["errors"] == [] and tcp["hosts"] == len(DCS), (name, tcp)   # a host per DC
        assert tcp["out_segments"] > 0 and set(tcp) == set(tcp_base), (name, tcp, tcp_base)
    atlas = there["systems"]["atlas"]["wan_links"]
    assert atlas["a->b"]["slot_adherence"] > 0.9
    # On the crossing link the slot's first byte leaves its sender at the grant, not one link
    # delay (10 ms) later: the delay is where the link enters the receiving DC, after the rate.
    for direction in ("b->c", "c->b"):
        assert atlas[direction]["slot_adherence"] > 0.9, (direction, atlas[direction])
        assert atlas[direction]["switch_error_ms"] < 5, (direction, atlas[direction])

    # Nothing around the WAN; and the crossing links' traffic went through the tunnels.
    for s in cluster.servers:
        assert traffic[s.name]["other"] == 0, traffic
        crossing = sum(m["wan_links"][d]["bytes"] for m in there["systems"].values()
                       for d, src in CROSSING.items() if src == s.name)
        assert traffic[s.name]["vxlan"] >= crossing > 0, (s.name, traffic, crossing)
    for s in cluster.servers:
        assert "No such file" in server_run(s, f"ls {REMOTE_STATE} 2>&1; true")
    assert processes_naming(str(tmp_path), "mininet:a-", "mininet:c-") == []


def test_a_lost_server_stops_the_run_and_ends_what_it_started_there(cluster, tmp_path):
    path = ring_scenario(tmp_path, iterations=40)
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, str(ROOT / "run_testbed.py"), "run", str(path),
                            "--systems", "baseline", "--cluster", cluster.path, "--out", str(out)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("*/baseline/loss/*.jsonl")) or not any(
                p.read_text().strip() for p in out.glob("*/baseline/loss/*.jsonl")):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.5)
        _, s2 = cluster.servers
        subprocess.run(["ip", "netns", "exec", "geodclc-s2", "ip", "link", "set", "eth0", "down"],
                       check=True)
        t_cut = time.monotonic()
        stdout, stderr = run.communicate(timeout=120)
        stopped_s = time.monotonic() - t_cut
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    print(f"run stopped {stopped_s:.1f} s after s2's underlay was cut\n{stderr}")
    assert run.returncode == 1, stdout[-2000:] + stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(r"server s2 \(root@10\.250\.0\.2\) lost", errors[0]), stderr
    assert "cleanup --cluster" in errors[0]
    assert stopped_s < 30, stopped_s   # ssh keep-alives: 3 x 2 s, then the teardown
    # s2's leash, not hearing the runner, ends what the run started there: its hosts' shells
    # (the local servers share this kernel, so they are seen here), still cut off.
    left = processes_naming("mininet:c-", "mininet:d-", wait_s=SILENCE_S + 15)
    ended_s = time.monotonic() - t_cut
    print(f"s2's processes ended {ended_s:.1f} s after the cut")
    assert left == [], left
    subprocess.run(["ip", "netns", "exec", "geodclc-s2", "ip", "link", "set", "eth0", "up"],
                   check=True)
    done = cli("cleanup", "--cluster", cluster.path, timeout_s=120)
    print(done.stdout)
    assert done.returncode == 0, done.stderr
    for s in cluster.servers:
        assert "No such file" in server_run(s, f"ls {REMOTE_STATE} 2>&1; true")
    assert processes_naming(str(tmp_path), "mininet:a-", "mininet:c-") == []
    assert cli("cleanup", "--cluster", cluster.path).stdout.strip() == "nothing to clean up"


def test_a_sweep_runs_every_point_over_the_servers(cluster, tmp_path):
    """`run SWEEP --cluster`: each point is its own run over the servers (the link between the
    two DCs crosses them), with the point's delay; both points train alike (the delay changes
    time, not arithmetic), and nothing is left on either server."""
    doc = with_sweep({"wan.delay_ms": [5, 15]})      # two DCs, P=2 x D=2
    doc.update(name="sweep2", systems=["baseline"])
    doc["training"]["iterations"] = 2
    path = tmp_path / "sweep2.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = cli("run", str(path), "--cluster", cluster.path, "--out", str(tmp_path / "out"))
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweep_dir = next((tmp_path / "out").glob("sweep2-sweep-*"))
    index = json.loads((sweep_dir / "index.json").read_text())
    assert index["cluster"] == str(cluster.path)
    assert [e["status"] for e in index["points"]] == ["done", "done"], index["points"]
    losses, delays = [], []
    for e in index["points"]:
        m = json.loads((sweep_dir / e["run_dir"] / "metrics.json").read_text())
        run = m["systems"]["baseline"]
        c = run["network"]["cluster"]
        assert [x["link"] for x in c["crossing_links"]] == ["ea-we"], c
        assert all(w["packets"] > 0 and w["dropped_loss"] == 0
                   for w in run["wan_links"].values()), run["wan_links"]
        losses.append(run["loss"])
        delays.append(e["values"]["wan.delay_ms"])
    assert losses[0] == losses[1] and delays == [5, 15]
    for s in cluster.servers:
        assert "No such file" in server_run(s, f"ls {REMOTE_STATE} 2>&1; true")
    assert processes_naming(str(tmp_path), "mininet:ea-", "mininet:we-") == []
