#!/usr/bin/env python3
"""Benchmark: one TCP flow over a lossy WAN link per congestion control, against Mathis et al.

The scenario's `congestion_control` decides what every testbed socket runs, and on a lossy link
it decides everything: reno is loss-limited at the Mathis et al. (1997) rate
MSS / RTT x sqrt(3/2) / sqrt(p); cubic grows faster between losses; bbr ignores random loss.
Target: reno within 15% of the formula; cubic and bbr are printed beside it. Goodput is the
mean of the receiver's 1 s intervals after the first 3 s (a long-run average, as the formula's),
the median of the repeats. Prints figures, asserts nothing.

    sudo .venv/bin/python bench/bench_congestion.py [--delay-ms 20] [--rate-mbit 100]
        [--loss-pct 1] [--seconds 20] [--repeats 3] [--out results]
Writes results/bench-congestion-<time>/bench.json and prints `results: PATH` last.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.run.calibrate import mathis_mbit, measure_goodput  # noqa: E402
from testbed.emulation.network import Network  # noqa: E402
from testbed.emulation.results import new_run_dir, provenance, write_json  # noqa: E402
from testbed.spec.scenario import CONGESTION_CONTROLS, parse_scenario  # noqa: E402

TARGET_PCT = 15.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--rate-mbit", type=float, default=100.0)
    ap.add_argument("--loss-pct", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="results")
    args = ap.parse_args()
    scenario = parse_scenario({
        "name": "bench_cc",
        "dcs": [{"name": "cca", "hosts": 1}, {"name": "ccb", "hosts": 1}],
        "wan": [{"between": ["cca", "ccb"], "delay_ms": args.delay_ms,
                 "rate_mbit": args.rate_mbit, "loss_pct": args.loss_pct}]})
    run_dir = new_run_dir(Path(args.out), "bench-congestion")
    mathis = mathis_mbit(args.delay_ms, args.loss_pct)
    rows = []
    with Network(scenario, run_dir / "net") as net:
        for cc in CONGESTION_CONTROLS:
            got = []
            for i in range(args.repeats):
                print(f"  {cc} run {i + 1}/{args.repeats} ({args.seconds:g} s)", flush=True)
                r = measure_goodput(net, "cca-h1", "ccb-h1", 5301, args.seconds,
                                    congestion_control=cc)
                # Mathis predicts a long-run average: the mean of the receiver's 1 s intervals
                # without the first two (3 s with iperf3's omitted second: slow start), not
                # their median (a loss-limited flow's intervals are skewed).
                steady = r.intervals_mbit[2:]
                got.append(statistics.fmean(steady) if steady else r.received_mbit)
                assert r.congestion_control == cc, (cc, r.congestion_control)
            rows.append({"congestion_control": cc, "goodput_mbit": statistics.median(got),
                         "runs_mbit": got})
    print(f"\none flow, {args.delay_ms:g} ms one way, {args.rate_mbit:g} Mbit/s, "
          f"{args.loss_pct:g}% loss per direction; Mathis (reno): {mathis:.2f} Mbit/s")
    print(f"{'cc':<6} {'goodput Mbit/s':>15} {'vs Mathis':>10}  runs")
    for r in rows:
        err = 100 * (r["goodput_mbit"] - mathis) / mathis
        r["vs_mathis_pct"] = round(err, 1)
        note = (f"  target +-{TARGET_PCT:g}%: {'ok' if abs(err) <= TARGET_PCT else 'MISSED'}"
                if r["congestion_control"] == "reno" else "")
        print(f"{r['congestion_control']:<6} {r['goodput_mbit']:>15.2f} {err:>+9.1f}%  "
              f"{', '.join(f'{x:.2f}' for x in r['runs_mbit'])}{note}")
    path = write_json(run_dir / "bench.json", {
        "env": provenance(), "link": {"delay_ms": args.delay_ms, "rate_mbit": args.rate_mbit,
                                      "loss_pct": args.loss_pct},
        "seconds": args.seconds, "mathis_mbit": mathis, "rows": rows})
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
