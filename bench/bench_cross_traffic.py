"""Atlas and BubbleTea when the WAN is not theirs alone: the same run with and without tenants.

Runs topologies/atlas_bubbletea.yaml (three DCs, Atlas's temporal slots, BubbleTea in the
bubbles; profile mode, time_scale 4) twice in one command: as shipped, and with two tenants on
the busiest link (eu<->us, 100 Mbit/s scaled): a UDP load of --udp-mbit from eu to us and a
4-flow TCP tenant from us to eu, both for the whole run (training ends first: "cut short").
Each run is `atlas` and `atlas+bubbletea` on fresh networks, so every figure has its baseline
beside it. Prints per system: iteration time without and with tenants, GPU utilization and
BubbleTea's training slowdown, the slot adherence on eu->us, and each tenant's goodput (what
the training left it) with UDP loss and TCP retransmits.

    sudo .venv/bin/python bench/bench_cross_traffic.py [--udp-mbit 30] [--iterations 6]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.run.jobs import run_job  # noqa: E402

SCENARIO = Path(__file__).resolve().parent.parent / "topologies" / "atlas_bubbletea.yaml"


def tenants(udp_mbit: float) -> list[dict]:
    return [{"from": "eu", "to": "us", "kind": "udp", "rate_mbit": udp_mbit, "start_s": 0,
             "stop_s": 10000},
            {"from": "us", "to": "eu", "kind": "tcp", "flows": 4, "start_s": 0,
             "stop_s": 10000}]


def run(doc: dict, folder: Path, iterations: int) -> dict:
    path = folder / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        metrics = run_job(str(path), out_dir=folder / "results", iterations=iterations,
                          quiet=True)
    return json.loads(Path(metrics).read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--udp-mbit", type=float, default=30.0)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--out", default=None, help="keep the results here (default: a temp dir)")
    args = ap.parse_args()
    base = yaml.safe_load(SCENARIO.read_text())
    folder = Path(args.out or tempfile.mkdtemp(prefix="bench-cross-"))
    folder.mkdir(parents=True, exist_ok=True)
    alone = run(dict(base, name="alone"), folder, args.iterations)
    shared = run(dict(base, name="shared", cross_traffic=tenants(args.udp_mbit)), folder,
                 args.iterations)
    print(f"atlas_bubbletea, {args.iterations} iterations, eu<->us 100 Mbit/s; tenants: udp "
          f"{args.udp_mbit:g} Mbit/s eu->us, tcp x4 us->eu (results in {folder})")
    print("| system | iteration s alone | with tenants | change | GPU util alone | with "
          "tenants | BubbleTea slowdown alone | with tenants | eu->us slot adherence alone "
          "| with tenants |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in ("atlas", "atlas+bubbletea"):
        a, s = alone["systems"][name], shared["systems"][name]
        bt_a, bt_s = a.get("bubbletea") or {}, s.get("bubbletea") or {}
        util_a = bt_a.get("gpu_utilization", a["gpu_utilization"])
        util_s = bt_s.get("gpu_utilization", s["gpu_utilization"])
        slow = [bt.get("training_slowdown") for bt in (bt_a, bt_s)]
        adh = [m["wan_links"].get("eu->us", {}).get("slot_adherence") for m in (a, s)]
        print(f"| {name} | {a['iteration_time_s']:.3f} | {s['iteration_time_s']:.3f} | "
              f"{s['iteration_time_s'] / a['iteration_time_s'] - 1:+.1%} | {util_a:.1%} | "
              f"{util_s:.1%} | " + " | ".join("-" if x is None else f"{x:+.1%}" for x in slow)
              + " | " + " | ".join("-" if x is None else f"{x:.1%}" for x in adh) + " |")
    print("\n| system | tenant | goodput Mbit/s | UDP lost | TCP retransmits |")
    print("|---|---|---|---|---|")
    for name in ("atlas", "atlas+bubbletea"):
        for e in shared["systems"][name].get("cross_traffic", []):
            good = "-" if e["goodput_mbit"] is None else f"{e['goodput_mbit']:.1f}"
            print(f"| {name} | {e['what']} | {good} | "
                  f"{'-' if e.get('lost_pct') is None else str(e['lost_pct']) + '%'} | "
                  f"{'-' if e.get('retransmits') is None else e['retransmits']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
