"""Atlas's design choices, each alone and together, across WAN delay, D and WAN rate.

Runs every system (baseline, multitcp, temporal, atlas, dp-across-dcs) through the emulated WAN
for one-way delay 10, 50, 100 ms x D = 2, 4 x WAN rate 50, 200 Mbit/s (scaled 100x: 5 and
20 Gbit/s real), in profile mode with the H200 profile, each system on a fresh network
(run_testbed.py's run job), and prints one table row per (point, system): iteration time,
speedup vs baseline, GPU utilization, WAN utilization (the busier direction, from the workers'
records), slot adherence (temporal systems, from the capture), and the compute-only iteration
time beside them; then one summary row per point. Writes sweep.json, sweep.md, summary.md and
speedup_vs_delay.png to --out (`--replot sweep.json` redraws them only); the figure is
reproduce's (testbed.analysis.reproduce_plots), and `run_testbed.py reproduce OUT/runs/*` draws it
again from the run folders.

Scenario of a point: two DCs (east, west) of D hosts each, one WAN link; P = 2 stages, M = 4
micro-batches, 1F1B; target model: 8 blocks of width 2048, seq 2048, micro-batch 2 (168 KB
per activation message after scale 100, 4 MB of gradients per stage). The DCs are equal, so
Atlas's placement is the baseline's here: placement's gain is shown by
topologies/atlas_paper.yaml, not by this sweep.

    sudo .venv/bin/python bench/bench_atlas_sweep.py [--quick] [--out DIR] [--iterations 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.run.jobs import run_job  # noqa: E402
from testbed.emulation.results import write_json, write_text  # noqa: E402
from testbed.spec.systems import SYSTEMS as ALL_SYSTEMS  # noqa: E402

SYSTEMS = tuple(ALL_SYSTEMS)
NAME = "bench_atlas_sweep"
PROFILE = {"file": "h200-transformer.json", "width": 2048, "seq": 2048, "micro_batch": 2,
           "n_layer": 8}


def scenario(delay_ms: float, replicas: int, rate_mbit: float, iterations: int) -> dict:
    return {
        "name": NAME,     # one scenario: reproduce draws its runs as one figure
        "scale": 100, "connections": "auto",
        "dcs": [{"name": "east", "hosts": replicas, "rate_mbit": 1000},
                {"name": "west", "hosts": replicas, "rate_mbit": 1000}],
        "wan": [{"between": ["east", "west"], "delay_ms": delay_ms, "rate_mbit": rate_mbit}],
        "systems": list(SYSTEMS),
        "training": {"model": {"n_layer": 4, "n_embd": 32, "n_head": 2, "seq_len": 16,
                               "vocab_size": 64},
                     "stages": 2, "replicas": replicas, "micro_batches": 4,
                     "micro_batch_size": 2, "schedule": "1f1b", "iterations": iterations,
                     "seed": 0, "compute": "profile", "profile": PROFILE}}


def row(point: dict, name: str, m: dict) -> dict:
    links = [v for v in m["wan_links"].values() if v.get("training_bytes")]
    adherence = [v["slot_adherence"] for v in links if v.get("slot_adherence") is not None]
    switch = [v["switch_error_ms"] for v in links if v.get("switch_error_ms") is not None]
    return dict(point, system=name, iteration_s=m["iteration_time_s"],
                predicted_compute_only_s=m["compute_only"].get("iteration_time_s"),
                speedup=m.get("speedup_vs_baseline"), gpu_util=m["gpu_utilization"],
                wan_util=max((v["utilization"] for v in links), default=0.0),
                slot_adherence=min(adherence) if adherence else None,
                switch_error_ms=max(switch) if switch else None,
                connections=max(m["connections"].values(), default=1),
                loss_last=m["loss"][-1], run_dir=m["timeline_png"].rsplit("/", 2)[0])


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    head = ("| delay ms | D | rate Mbit/s | system | K | iteration s (compute only) | speedup "
            "| GPU util | WAN util | slot adherence | switch err ms |")
    out = [head, "|" + "---|" * 11]
    for r in rows:
        out.append(f"| {r['delay_ms']:g} | {r['D']} | {r['rate_mbit']:g} | {r['system']} | "
                   f"{r['connections']} | {r['iteration_s']:.3f} "
                   f"({fmt(r['predicted_compute_only_s'], '.3f')}) | {fmt(r['speedup'], '.2f')}x | "
                   f"{r['gpu_util']:.2f} | {r['wan_util']:.0%} | "
                   f"{fmt(r['slot_adherence'], '.1%')} | {fmt(r['switch_error_ms'], '.2f')} |")
    return "\n".join(out)


def summary_table(rows: list[dict]) -> str:
    """One row per sweep point: each system's iteration time and speedup, and atlas's slots."""
    pts: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        pts.setdefault((r["D"], r["rate_mbit"], r["delay_ms"]), {})[r["system"]] = r
    names = [n for n in SYSTEMS if any(n in by for by in pts.values())]
    out = ["| D | WAN Mbit/s | one-way ms | compute only s | " + " | ".join(names)
           + " | atlas K | atlas WAN util | atlas slot adherence / switch error |",
           "|" + "---|" * (len(names) + 7)]
    for (D, rate, delay), by in sorted(pts.items()):
        first = next(iter(by.values()))
        cells = [("-" if by.get(n) is None else
                  f"{by[n]['iteration_s']:.2f} s ({fmt(by[n]['speedup'], '.2f')}x)") for n in names]
        a = by.get("atlas")
        slots = ("-" if a is None or a["slot_adherence"] is None else
                 f"{a['slot_adherence']:.1%} / {fmt(a['switch_error_ms'], '.2f')} ms")
        out.append(f"| {D} | {rate:g} | {delay:g} | {fmt(first['predicted_compute_only_s'], '.3f')}"
                   f" | " + " | ".join(cells) + f" | {'-' if a is None else a['connections']} | "
                   f"{'-' if a is None else format(a['wan_util'], '.0%')} | {slots} |")
    return "\n".join(out)


def figure_points(rows: list[dict]) -> list:
    """The rows as reproduce's points (testbed.analysis.series): the panel fields are the ones
    `reproduce` finds varying in this benchmark's run folders."""
    from testbed.analysis.series import Point
    return [Point(scenario=NAME, system=r["system"], x=r["delay_ms"], y={"speedup": r["speedup"]},
                  panel=(("training.replicas", r["D"]), ("wan.0.rate_mbit", r["rate_mbit"])),
                  run=r["run_dir"]) for r in rows if r["speedup"] is not None]


def plot(rows: list[dict], path: Path) -> None:
    """reproduce's figure (testbed.analysis.reproduce_plots), drawn from sweep.json's rows: the
    same as `run_testbed.py reproduce OUT/runs/*` draws from the run folders."""
    from testbed.analysis.reproduce_plots import png_bytes, speedup_figure
    from testbed.analysis.series import lines
    from testbed.emulation.results import write_bytes
    write_bytes(path, png_bytes(speedup_figure(NAME, lines(figure_points(rows))[NAME])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench-atlas-sweep")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--delays", default="10,50,100")
    parser.add_argument("--replicas", default="2,4")
    parser.add_argument("--rates", default="50,200")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--replot", metavar="SWEEP_JSON", default=None,
                        help="only redraw the table and plot from an earlier sweep.json")
    parser.add_argument("--quick", action="store_true", help="one point: 10 ms, D=2, 200 Mbit/s")
    args = parser.parse_args()
    delays = [10.0] if args.quick else [float(x) for x in args.delays.split(",")]
    reps = [2] if args.quick else [int(x) for x in args.replicas.split(",")]
    rates = [200.0] if args.quick else [float(x) for x in args.rates.split(",")]
    systems = args.systems.split(",")
    out = Path(args.out)
    if args.replot:
        rows = json.loads(Path(args.replot).read_text())["rows"]
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "sweep.md", table(rows) + "\n")
        write_text(out / "summary.md", summary_table(rows) + "\n")
        plot(rows, out / "speedup_vs_delay.png")
        print(f"wrote {out / 'sweep.md'}, {out / 'speedup_vs_delay.png'}")
        return 0
    (out / "scenarios").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    points = [(d, D, r) for D in reps for r in rates for d in delays]
    t0 = time.monotonic()
    for i, (delay, D, rate) in enumerate(points, 1):
        doc = scenario(delay, D, rate, args.iterations)
        path = out / "scenarios" / f"d{delay:g}-D{D}-r{rate:g}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        log = io.StringIO()
        t = time.monotonic()
        with contextlib.redirect_stdout(log):
            metrics_path = run_job(str(path), out_dir=out / "runs", systems=systems)
        write_text(out / "logs" / f"{path.stem}.log", log.getvalue())
        metrics = json.loads(Path(metrics_path).read_text())
        point = {"delay_ms": delay, "D": D, "rate_mbit": rate}
        for name in systems:
            rows.append(row(point, name, metrics["systems"][name]))
        done = time.monotonic() - t0
        print(f"[{i}/{len(points)}] delay {delay:g} ms, D={D}, {rate:g} Mbit/s: "
              + ", ".join(f"{r['system']} {r['iteration_s']:.2f} s" for r in rows[-len(systems):])
              + f" ({time.monotonic() - t:.0f} s; ETA {done / i * (len(points) - i):.0f} s)",
              flush=True)
    md = table(rows)
    print(md)
    write_json(out / "sweep.json", {"rows": rows, "profile": PROFILE})
    write_text(out / "sweep.md", md + "\n")
    write_text(out / "summary.md", summary_table(rows) + "\n")
    print(summary_table(rows))
    plot(rows, out / "speedup_vs_delay.png")
    print(f"wrote {out / 'sweep.md'}, {out / 'speedup_vs_delay.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
