#!/usr/bin/env python3
"""Benchmark: does the emulated WAN behave like the configured one? Prints figures, asserts nothing.

  1. Fidelity matrix: one hub DC with a spoke per (rate, delay) pair, rates 10-1000 Mbit/s and
     one-way delays 5-100 ms; each link calibrated (testbed.run.calibrate) in turn. Targets: idle RTT
     within max(0.5 ms, 2%) of 2 x delay; RTT under a paced load (90% of the rate's TCP
     payload; the load achieved is printed) within 5%; TCP goodput of N flows 93-101% of
     rate_mbit, both directions.
  2. Window limit with `scale`: one flow's goodput against advertised window / RTT (within 10%).
  3. Build and teardown time of topologies/four_dc.yaml (4 DCs x 4 hosts): targets 5 s and 3 s.

    sudo .venv/bin/python bench/bench_network.py [--quick] [--out results]
Writes results/bench-network-<time>/bench.json and prints `results: PATH` last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.run.calibrate import Settings, calibrate  # noqa: E402
from testbed.emulation.network import Network  # noqa: E402
from testbed.emulation.results import new_run_dir, provenance, write_json  # noqa: E402
from testbed.spec.scenario import load_scenario, parse_scenario  # noqa: E402

RATES_MBIT = (10, 100, 1000)
DELAYS_MS = (5, 50, 100)


def star(name: str, pairs: list[tuple[float, float]], scale: float = 1.0):
    dcs = [{"name": "hub", "hosts": 1}] + [{"name": f"s{i}", "hosts": 1} for i in range(len(pairs))]
    wan = [{"between": ["hub", f"s{i}"], "delay_ms": d, "rate_mbit": r}
           for i, (r, d) in enumerate(pairs)]
    return parse_scenario({"name": name, "scale": scale, "dcs": dcs, "wan": wan})


def run_star(scenario, run_dir: Path, settings: Settings) -> dict:
    with Network(scenario, run_dir / scenario.name) as net:
        return calibrate(net, settings, progress=lambda line: print("  " + line, flush=True))


def fidelity_rows(doc: dict) -> list[dict]:
    rows = []
    for link in doc["links"]:
        c, m, p = link["configured"], link["measured"], link["predicted"]
        want = p["rtt_ms"]
        tol = max(0.5, 0.02 * want)
        rows.append({
            "rate_mbit": c["rate_mbit"], "delay_ms": c["delay_ms"],
            "rtt_ms": m["rtt_ms"], "rtt_err_ms": round(m["rtt_ms"] - want, 3),
            "rtt_ok": abs(m["rtt_ms"] - want) <= tol,
            "rtt_loaded_ms": m["rtt_loaded_ms"],
            "rtt_loaded_err_pct": round(100 * (m["rtt_loaded_ms"] - want) / want, 2),
            "rtt_loaded_ok": abs(m["rtt_loaded_ms"] - want) <= 0.05 * want,
            "load_pct": round(100 * m["load_mbit"] / c["rate_mbit"], 1),
            "goodput_reverse_pct": round(100 * m["goodput_reverse_mbit"] / c["rate_mbit"], 1),
            "goodput_pct": round(100 * m["goodput_mbit"] / c["rate_mbit"], 1),
            "goodput_ok": all(93 <= 100 * m[k] / c["rate_mbit"] <= 101
                              for k in ("goodput_mbit", "goodput_reverse_mbit")),
            "goodput_1flow_pct": round(100 * m["goodput_1flow_mbit"] / c["rate_mbit"], 1),
            "goodput_1flow_mbit": m["goodput_1flow_mbit"],
            "window_expected_mbit": p["goodput_1flow_mbit"],
            "window_err_pct": round(100 * (m["goodput_1flow_mbit"] - p["goodput_1flow_mbit"])
                                    / p["goodput_1flow_mbit"], 1),
        })
    return rows


def print_fidelity(rows: list[dict]) -> None:
    print(f"{'rate':>6} {'delay':>6} | {'RTT ms':>8} {'err ms':>7} {'':4} | {'loaded':>8} {'err %':>6} "
          f"{'':4} {'load %':>6} | {'N flows %':>9} {'':4} {'reverse %':>9} | {'1 flow %':>8}")
    for r in rows:
        print(f"{r['rate_mbit']:>6g} {r['delay_ms']:>6g} | {r['rtt_ms']:>8.3f} {r['rtt_err_ms']:>+7.3f} "
              f"{_ok(r['rtt_ok'])} | {r['rtt_loaded_ms']:>8.3f} {r['rtt_loaded_err_pct']:>+6.2f} "
              f"{_ok(r['rtt_loaded_ok'])} {r['load_pct']:>6.1f} | {r['goodput_pct']:>9.1f} "
              f"{_ok(r['goodput_ok'])} {r['goodput_reverse_pct']:>9.1f} | {r['goodput_1flow_pct']:>8.1f}")


def _ok(flag: bool) -> str:
    return "ok" if flag else "MISS"


def build_times(path: str, repeats: int, run_dir: Path) -> list[dict]:
    scenario = load_scenario(path)
    out = []
    for i in range(repeats):
        net = Network(scenario, run_dir / f"build-{i}")
        with net:
            pass
        out.append({"up_s": round(net.timings_s["up"], 3), "down_s": round(net.timings_s["down"], 3)})
        print(f"  {scenario.name}: up {out[-1]['up_s']:.2f} s, down {out[-1]['down_s']:.2f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer links, shorter tests")
    ap.add_argument("--out", default="results")
    ap.add_argument("--streams", type=int, default=4)
    args = ap.parse_args()
    run_dir = new_run_dir(Path(args.out), "bench-network")
    settings = Settings(seconds=3.0 if args.quick else 6.0, streams=args.streams,
                        check_paths=False)  # the star's spoke pairs are not what it measures
    pairs = ([(10, 5), (100, 50), (1000, 100)] if args.quick
             else [(r, d) for r in RATES_MBIT for d in DELAYS_MS])
    doc: dict = {"env": provenance(), "settings": {"seconds": settings.seconds,
                                                   "streams": settings.streams}}
    t0 = time.monotonic()
    print(f"1. fidelity: {len(pairs)} links (rate Mbit/s, one-way delay ms)", flush=True)
    fid = run_star(star("bench_fidelity", pairs), run_dir, settings)
    doc["fidelity"] = fidelity_rows(fid)
    doc["backend"] = fid["backend"]
    print("2. window limit with scale (one flow vs advertised window / RTT)", flush=True)
    win = run_star(star("bench_window", [(100, 20), (1000, 50), (100, 50)], scale=100.0),
                   run_dir, Settings(seconds=settings.seconds, streams=2, check_paths=False))
    doc["window"] = [{"rate_mbit": r["rate_mbit"], "delay_ms": r["delay_ms"], "scale": 100,
                      "expected_1flow_mbit": r["window_expected_mbit"],
                      "measured_1flow_mbit": r["goodput_1flow_mbit"],
                      "err_pct": r["window_err_pct"], "ok": abs(r["window_err_pct"]) <= 10}
                     for r in fidelity_rows(win)]
    print("3. build and teardown of topologies/four_dc.yaml", flush=True)
    doc["build"] = build_times("topologies/four_dc.yaml", 2 if args.quick else 3, run_dir)

    print(f"\nbackend: {doc['backend']}   (ok = within target, MISS = not)")
    print_fidelity(doc["fidelity"])
    print("\nscale 100: one flow, expected = 0.73 x tcp_rmem_max / RTT")
    for w in doc["window"]:
        print(f"  {w['rate_mbit']:>6g} Mbit/s {w['delay_ms']:>4g} ms: expected {w['expected_1flow_mbit']:.2f}, "
              f"measured {w['measured_1flow_mbit']:.2f} Mbit/s ({w['err_pct']:+.1f}%) {_ok(w['ok'])}")
    ups = [b["up_s"] for b in doc["build"]]
    downs = [b["down_s"] for b in doc["build"]]
    print(f"\nfour_dc (4 DCs x 4 hosts): up max {max(ups):.2f} s (target 5) {_ok(max(ups) <= 5)}, "
          f"down max {max(downs):.2f} s (target 3) {_ok(max(downs) <= 3)}")
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    path = write_json(run_dir / "bench.json", doc)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
