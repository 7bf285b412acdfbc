"""Measured pipeline bubbles against the textbook formula, on loopback, in profile mode.

For GPipe and 1F1B x P in {2, 4} x M in {4, 8}, runs a real training job (8 worker processes:
P=2 x D=4 and P=4 x D=2) through testbed.run.launch with LocalSpawner on 127.0.0.1, each F/B held to
an H200 profile (32 blocks of width 4096, seq 2048, micro-batch 2), and prints:

  formula   (P-1)/(M+P-1)
  pipe      measured bubble over F/B only (first forward to last backward): what the formula means
  full      measured bubble over the whole iteration (adds all-reduce, optimizer step and the
            gap to the next iteration)
  iter_s    measured iteration time (first compute start to the next iteration's first compute
            start; the last iteration to its last compute end) and predicted (testbed/rules/schedule.py
            simulator with the profile's durations, no communication, no gap)
  cv        largest coefficient of variation of F or B durations on any worker

Ratios, not timing asserts: this machine's 2 cores are shared. Run:
    .venv/bin/python bench/bench_bubbles.py [--iterations 4] [--scale 1000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.emulation.procs import LocalSpawner  # noqa: E402
from testbed.spec.training import TrainConfig  # noqa: E402
from testbed.plans.workers import HostInfo, WorkerSetup  # noqa: E402
from testbed.run.launch import launch
from testbed.emulation.procs import free_base_port  # noqa: E402
from testbed.analysis.metrics import compute_metrics  # noqa: E402

PROFILE = {"file": "h200-transformer.json", "width": 4096, "seq": 2048, "micro_batch": 2,
           "n_layer": 32}
MODEL = {"n_layer": 4, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64}
PROCESSES = 8


def run_case(schedule: str, P: int, M: int, iterations: int, scale: float, root: Path) -> dict:
    D = PROCESSES // P
    cfg = TrainConfig.from_dict({
        "model": MODEL, "stages": P, "replicas": D, "micro_batches": M, "micro_batch_size": 2,
        "schedule": schedule, "iterations": iterations, "compute": "profile",
        "profile": PROFILE})
    hosts = [HostInfo(name=f"h{i}", ip="127.0.0.1", dc="dc0") for i in range(P * D)]
    spawner = LocalSpawner()
    run_dir = root / f"{schedule}-P{P}-M{M}"
    try:
        launch(cfg, hosts, run_dir, spawner,
               WorkerSetup(scale=scale, base_port=free_base_port(P * D + P)), timeout_s=300)
    finally:
        spawner.stop_all()
    m = compute_metrics(run_dir)
    return {"schedule": schedule, "P": P, "D": D, "M": M,
            "formula": m["bubble_fraction_formula"],
            "simulated": m["compute_only"]["bubble_fraction"],
            "pipe": m["pipeline_bubble_fraction"], "full": m["bubble_fraction"],
            "iter_s": m["iteration_time_s"], "pred_iter_s": m["compute_only"]["iteration_time_s"],
            "cv": m["op_duration_cv_max"], "run_dir": str(run_dir)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--scale", type=float, default=1000.0,
                    help="divide padded message and all-reduce bytes by this")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = []
    head = (f"{'schedule':8} {'P':>2} {'D':>2} {'M':>2} {'formula':>8} {'pipe':>6} {'diff':>6} "
            f"{'full':>6} {'iter_s':>7} {'pred_s':>7} {'cv':>6}")
    print(head)
    with tempfile.TemporaryDirectory(prefix="bench-bubbles-") as tmp:
        for schedule in ("gpipe", "1f1b"):
            for P in (2, 4):
                for M in (4, 8):
                    r = run_case(schedule, P, M, args.iterations, args.scale, Path(tmp))
                    rows.append(r)
                    print(f"{schedule:8} {P:>2} {r['D']:>2} {M:>2} {r['formula']:8.3f} "
                          f"{r['pipe']:6.3f} {r['pipe'] - r['formula']:+6.3f} {r['full']:6.3f} "
                          f"{r['iter_s']:7.3f} {r['pred_iter_s']:7.3f} {r['cv']:6.3f}",
                          flush=True)
    worst = max(abs(r["pipe"] - r["formula"]) for r in rows)
    print(f"largest |pipe - formula| = {worst:.3f}; largest per-op CV = "
          f"{max(r['cv'] for r in rows):.3%} ({PROCESSES} worker processes per run)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
