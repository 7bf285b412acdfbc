#!/usr/bin/env python3
"""`time_scale: auto` on a real run (issue 25 part 1): the T chosen, its reasons, and per system the
measured iteration time against the model's and the compute overruns as a share of compute
against the 2% bound (each figure with its configured or predicted value beside it).

    sudo .venv/bin/python bench/bench_autoscale.py [SCENARIO] [--systems atlas] [--iterations N]
                                                   [--cluster CLUSTER.yaml]

Default scenario: topologies/scale64.yaml (64 GPUs, 4 DCs, P=4, D=16; 6-9 minutes per system on
2 cores, most of it the workers' start).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.predict.autoscale import LATENESS_BOUND_MS, OVERRUN_BOUND  # noqa: E402
from testbed.run.jobs import run_job  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", nargs="?", default=str(REPO / "topologies/scale64.yaml"))
    ap.add_argument("--systems", default=None, help="comma-separated (default: the scenario's)")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--out", default=None, help="results folder (default: a temporary one)")
    ap.add_argument("--cluster", default=None, metavar="CLUSTER.yaml",
                    help="spread the DCs over the cluster file's servers (docs/cluster.md)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_autoscale_"))
    cluster = None
    if args.cluster:
        from testbed.spec.cluster import load_cluster
        cluster = load_cluster(args.cluster)
    path = run_job(args.scenario, out_dir=out, iterations=args.iterations,
                   systems=args.systems.split(",") if args.systems else None, cluster=cluster)
    doc = json.loads(Path(path).read_text())
    auto = doc.get("time_scale_auto")
    if auto is None:
        print(f"{doc['scenario']}: time_scale is {doc['time_scale']:g}, not auto")
        return 2
    print(f"{doc['scenario']}: time_scale auto chose T={auto['time_scale']:g} "
          f"(predicted CPU load {auto['cpu_load']:.0%}, bound {auto['cpu_load_bound']:.0%}; "
          f"predicted overruns {auto['overrun_fraction']:.1%}, bound {OVERRUN_BOUND:.0%})")
    for r in auto["reasons"]:
        print(f"  {r}")
    print("| system | iteration s measured | model | error | overruns % of compute | bound | "
          "release lateness p99 ms | bound |\n|---|---|---|---|---|---|---|---|")
    for name, m in doc["systems"].items():
        a = m.get("time_scale_auto") or {}
        model = (m.get("model") or {}).get("predicted", {}).get("iteration_time_s")
        err = f"{m['iteration_time_s'] / model - 1:+.1%}" if model else "-"
        print(f"| {name} | {m['iteration_time_s']:.3f} | "
              f"{model if model is None else format(model, '.3f')} | {err} | "
              f"{a.get('measured_overrun_fraction', 0):.2%} | {OVERRUN_BOUND:.0%} | "
              f"{a.get('measured_lateness_p99_ms', 0):.3f} | {LATENESS_BOUND_MS:g} |")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
