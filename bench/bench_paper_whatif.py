#!/usr/bin/env python3
"""Which settings give the paper's headline results, by the model: Atlas's speedup over the
baseline (the paper: up to 17x) and GPU utilization with BubbleTea (up to 94 %), at paper scale.

    .venv/bin/python bench/bench_paper_whatif.py [--quick]

Starts from the shipped paper-scale scenarios (topologies/paper/, predict_only) and changes one
setting at a time: WAN rate and delay, pipelines per DC pair (replicas, DC sizes), the hosts'
slow start after idle, and the BubbleTea request rate. Prints two Markdown tables (the README's):
per setting, the iteration time of baseline, multitcp, atlas and dp-across-dcs and Atlas's
speedups; per request rate, BubbleTea's GPU utilization, throughput and TTFT. No root, no
network: geodc.predict.predict only (about a minute; --quick: the first rows of each).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from geodc.predict.predict import predict  # noqa: E402
from geodc.cli.planview import load_training  # noqa: E402
from geodc.spec.scenario import load_scenario, parse_scenario  # noqa: E402
from geodc.spec.systems import get_system  # noqa: E402

PAPER = REPO / "topologies" / "paper"
SYSTEMS = ("baseline", "multitcp", "atlas", "dp-across-dcs")

# (label, scenario file, changes): real Gbit/s for rate (x 1000 / scale -> scaled Mbit/s),
# delay: every WAN link's one-way delay times delay / the first link's
SPEEDUP_ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("as shipped: 3 DCs, 100 Gbit/s, 40-100 ms", "gpt70b_3dc", {}),
    ("WAN 10 Gbit/s", "gpt70b_3dc", {"rate": 10}),
    ("WAN 400 Gbit/s, 150-375 ms", "gpt70b_3dc", {"rate": 400, "delay": 150}),
    ("10-25 ms one way", "gpt70b_3dc", {"delay": 10}),
    ("8 pipelines on 48/48/32 GPUs, 150-375 ms", "gpt70b_3dc",
     {"replicas": 8, "hosts": [48, 48, 32], "delay": 150}),
    ("32 pipelines on 192/192/128 GPUs, 400 Gbit/s, 150-375 ms", "gpt70b_3dc",
     {"replicas": 32, "hosts": [192, 192, 128], "rate": 400, "delay": 150}),
    ("DC sizes 1000/1000/560 (not whole stages)", "gpt70b_3dc", {"hosts": [1000, 1000, 560]}),
    ("slow start after idle on (Linux's default)", "gpt70b_3dc",
     {"tcp_slow_start_after_idle": True}),
    ("as shipped: 2 DCs, 100 Gbit/s, 40 ms", "gpt7b_2dc", {}),
    ("as shipped: 5 DCs, 100-400 Gbit/s, 10-150 ms", "gpt160b_5dc", {}),
]
BUBBLETEA_ROWS: list[tuple[str, dict[str, Any]]] = [
    ("gpt70b_3dc", {"poisson_per_s": 20000}),
    ("gpt70b_3dc", {"poisson_per_s": 40000}),
    ("gpt70b_3dc", {"poisson_per_s": 60000}),
    ("gpt70b_3dc", {"poisson_per_s": 80000}),
    ("gpt70b_3dc", {"poisson_per_s": 100000}),
    ("gpt70b_3dc", {"poisson_per_s": 80000, "guard_ms": 0, "guard_pct": 0}),
    ("gpt7b_2dc", {"poisson_per_s": 30000}),
    ("gpt7b_2dc", {"poisson_per_s": 40000}),
    ("gpt160b_5dc", {"poisson_per_s": 300000}),
    ("gpt160b_5dc", {"poisson_per_s": 400000}),
]


def variant(name: str, changes: dict[str, Any]):
    doc = json.loads(json.dumps(load_scenario(PAPER / f"{name}.yaml").raw))
    scale = doc.get("scale", 1)
    first = doc["wan"][0]["delay_ms"]
    for key, value in changes.items():
        if key == "rate":
            for w in doc["wan"]:
                w["rate_mbit"] = value * 1000 / scale
        elif key == "delay":
            for w in doc["wan"]:
                w["delay_ms"] = round(w["delay_ms"] * value / first, 3)
        elif key == "hosts":
            for dc, hosts in zip(doc["dcs"], value):
                dc["hosts"] = hosts
        elif key == "replicas":
            doc["training"]["replicas"] = value
        elif key in ("poisson_per_s", "guard_ms", "guard_pct"):
            bt = doc["bubbletea"]
            if key == "poisson_per_s":
                bt["load"] = dict(bt["load"], poisson_per_s=value)
            else:
                bt[key] = value
        else:
            doc[key] = value
    return parse_scenario(doc, path=str(PAPER / f"{name}.yaml"))


def speedups(rows: list) -> list[str]:
    out = ["| setting | GPUs | baseline s | multitcp s | atlas s | dp-across-dcs s | Atlas vs "
           "baseline | Atlas vs dp-across-dcs | >= 17x over baseline |",
           "|---|---|---|---|---|---|---|---|---|"]
    for label, name, changes in rows:
        sc = variant(name, changes)
        cfg = load_training(sc)
        t = {s: predict(sc, cfg, get_system(s)).iteration_time_s for s in SYSTEMS}
        x = t["baseline"] / t["atlas"]
        out.append(f"| {name}: {label} | {cfg.stages * cfg.replicas:,} | {t['baseline']:.2f} | "
                   f"{t['multitcp']:.2f} | {t['atlas']:.2f} | {t['dp-across-dcs']:.1f} | "
                   f"{x:.2f}x | {t['dp-across-dcs'] / t['atlas']:.0f}x | "
                   f"{'yes' if x >= 17 else 'no'} |")
        print(out[-1], file=sys.stderr, flush=True)
    return out


def bubbletea(rows: list) -> list[str]:
    out = ["| scenario | requests/s offered | guard | GPU util (training alone) | served "
           "req/s | TTFT p50 / p99 ms | requests that missed the 2 s TTFT | unused bubble: top causes | "
           ">= 94 % |", "|---|---|---|---|---|---|---|---|---|"]
    for name, changes in rows:
        sc = variant(name, changes)
        bt = predict(sc, load_training(sc), get_system("atlas+bubbletea")).bubbletea
        pf = bt["prefill"]
        guard = f"{sc.bubbletea.guard_ms:g} ms + {sc.bubbletea.guard_pct:g}%"
        causes = sorted(bt["unused_bubble"]["share_by_cause"].items(), key=lambda kv: -kv[1])
        ttft = pf["ttft_ms"]
        out.append(f"| {name} | {bt['load']['offered_per_s']:,.0f} | {guard} | "
                   f"{bt['gpu_utilization']:.1%} ({bt['training_only']:.1%}) | "
                   f"{pf['requests_per_s']:,.0f} | {ttft['p50']:.0f} / {ttft['p99']:.0f} | "
                   f"{pf['deadline_misses'] / max(1, sum(pf['outcomes'].values())):.0%} | "
                   + ", ".join(f"{c} {v:.0%}" for c, v in causes[:2] if v > 0)
                   + f" | {'yes' if bt['gpu_utilization'] >= 0.94 else 'no'} |")
        print(out[-1], file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first two rows of each table")
    args = ap.parse_args(argv)
    n = 2 if args.quick else None
    t0 = time.perf_counter()
    print("\n".join(speedups(SPEEDUP_ROWS[:n])))
    print()
    print("\n".join(bubbletea(BUBBLETEA_ROWS[:n])))
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
