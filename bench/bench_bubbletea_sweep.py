"""BubbleTea across the request rate: GPU utilization, training slowdown and TTFT.

Runs topologies/atlas_bubbletea.yaml (the Atlas paper-like scenario with decode hosts, profile
mode, time_scale 4) once per request rate, each time as `atlas` and `atlas+bubbletea` in the same
command (each on a fresh network), so the slowdown is a ratio against a baseline run beside it.
The rate is the conversation trace's rate multiplier. Prints one row per rate: offered and served
requests/s, overall GPU utilization with BubbleTea (training + prefill) next to training alone,
the training slowdown (iteration time with / without over the same iterations, 3 on), TTFT p50 and
p99, KV transfer p50, deadline misses, the time training waited for an overrunning prefill, and
where the unused bubble time went. Too little load leaves bubbles empty ("no_request"); too
much must not slow training (it only grows the queue and the misses).

Writes sweep.json, sweep.md and utilization_vs_rate.png to --out (`--replot sweep.json` redraws);
the figure is reproduce's (testbed.analysis.reproduce_plots), and `run_testbed.py reproduce
OUT/runs/*` draws it again from the run folders.

    sudo .venv/bin/python bench/bench_bubbletea_sweep.py [--quick] [--rates 5,10,20,40,80]
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

SCENARIO = Path(__file__).resolve().parent.parent / "topologies" / "atlas_bubbletea.yaml"
NAME = "atlas_bubbletea"


def row(rate: float, doc: dict) -> dict:
    base, m = doc["systems"]["atlas"], doc["systems"]["atlas+bubbletea"]
    bt = m["bubbletea"]
    pf = bt["prefill"]
    causes = sorted(bt["unused_bubble"]["share_by_cause"].items(), key=lambda kv: -kv[1])
    return {"rate_multiplier": rate, "offered_per_s": bt["load"]["offered_per_s"],
            "served_per_s": pf["requests_per_s"],
            "prompt_tokens_per_s": pf["prompt_tokens_per_s"],
            "gpu_util": bt["gpu_utilization"], "training_only": bt["training_only"],
            "gpu_util_without": base["gpu_utilization"],
            "per_stage": [s["gpu_utilization"] for s in bt["per_stage"]],
            "iteration_s": bt["iteration_time_s"], "iteration_without_s":
                bt["iteration_time_without_s"], "slowdown": bt["training_slowdown"],
            "ttft_p50_ms": pf["ttft_ms"]["p50"], "ttft_p99_ms": pf["ttft_ms"]["p99"],
            "kv_p50_ms": pf["kv_transfer_ms"]["p50"], "misses": pf["deadline_misses"],
            "outcomes": pf["outcomes"], "gpu_wait_ms": bt["gpu_wait"]["total_ms"],
            "gpu_wait_count": bt["gpu_wait"]["count"], "overlaps": bt["overlap"]["count"],
            "unused_ms_per_s": bt["unused_bubble"]["per_host_ms_per_s"],
            "unused_top": [(c, round(v, 3)) for c, v in causes[:3]],
            "cpu_s": bt.get("cpu_s"), "run_dir": doc["run_dir"]}


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list[dict]) -> str:
    out = ["| rate x | offered req/s | served req/s | GPU util (training alone) | per stage "
           "| slowdown | TTFT p50 / p99 ms | KV p50 ms | misses | training waited | "
           "unused bubble: top causes |", "|" + "---|" * 11]
    for r in rows:
        out.append(
            f"| {r['rate_multiplier']:g} | {r['offered_per_s']:.0f} | {r['served_per_s']:.0f} | "
            f"{r['gpu_util']:.1%} ({r['training_only']:.1%}) | "
            + " / ".join(f"{x:.0%}" for x in r["per_stage"])
            + f" | {r['slowdown']:+.1%} ({r['iteration_without_s']:.3f} -> "
            f"{r['iteration_s']:.3f} s) | {fmt(r['ttft_p50_ms'], '.0f')} / "
            f"{fmt(r['ttft_p99_ms'], '.0f')} | {fmt(r['kv_p50_ms'], '.1f')} | {r['misses']} | "
            f"{r['gpu_wait_count']}x, {r['gpu_wait_ms']:.0f} ms | "
            + ", ".join(f"{c} {v:.0%}" for c, v in r["unused_top"]) + " |")
    return "\n".join(out)


def figure_points(rows: list[dict]) -> list:
    """The rows as reproduce's points (testbed.analysis.series): atlas+bubbletea's figures, and
    atlas's GPU utilization beside them."""
    from testbed.analysis.series import Point
    out = []
    for r in rows:
        out.append(Point(scenario=NAME, panel=(), system="atlas+bubbletea",
                         x=r["offered_per_s"], run=r["run_dir"],
                         y={"gpu_utilization": r["gpu_util"], "training_slowdown": r["slowdown"],
                            "ttft_p50_ms": r["ttft_p50_ms"], "ttft_p99_ms": r["ttft_p99_ms"]}))
        out.append(Point(scenario=NAME, panel=(), system="atlas", x=r["offered_per_s"],
                         run=r["run_dir"], y={"gpu_utilization": r["gpu_util_without"]}))
    return out


def plot(rows: list[dict], path: Path) -> None:
    """reproduce's figure (testbed.analysis.reproduce_plots), drawn from sweep.json's rows, as
    `run_testbed.py reproduce OUT/runs/*` draws it from the run folders (where atlas's point is
    the +bubbletea block's gpu_utilization_without, over the same iterations)."""
    from testbed.analysis.reproduce_plots import bubbletea_figure, png_bytes
    from testbed.analysis.series import lines
    from testbed.emulation.results import write_bytes
    write_bytes(path, png_bytes(bubbletea_figure(NAME, lines(figure_points(rows))[NAME])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench-bubbletea-sweep")
    parser.add_argument("--rates", default="5,10,20,40,80",
                        help="rate multipliers of the conversation trace")
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--quick", action="store_true", help="rates 10 and 40, 8 iterations")
    parser.add_argument("--replot", metavar="SWEEP_JSON", default=None)
    args = parser.parse_args()
    out = Path(args.out)
    if args.replot:
        rows = json.loads(Path(args.replot).read_text())["rows"]
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "sweep.md", table(rows) + "\n")
        plot(rows, out / "utilization_vs_rate.png")
        print(f"wrote {out / 'sweep.md'}, {out / 'utilization_vs_rate.png'}")
        return 0
    rates = [10.0, 40.0] if args.quick else [float(x) for x in args.rates.split(",")]
    iterations = 8 if args.quick else args.iterations
    base = yaml.safe_load(SCENARIO.read_text())
    (out / "scenarios").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    t0 = time.monotonic()
    for i, rate in enumerate(rates, 1):
        doc = json.loads(json.dumps(base))
        doc["name"] = NAME      # one scenario: reproduce draws its runs as one figure
        doc["bubbletea"]["load"]["rate_multiplier"] = rate
        doc["systems"] = ["atlas", "atlas+bubbletea"]
        path = out / "scenarios" / f"x{rate:g}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            metrics_path = run_job(str(path), out_dir=out / "runs", iterations=iterations)
        write_text(out / "logs" / f"{path.stem}.log", log.getvalue())
        rows.append(row(rate, json.loads(Path(metrics_path).read_text())))
        r = rows[-1]
        done = time.monotonic() - t0
        print(f"[{i}/{len(rates)}] x{rate:g}: {r['offered_per_s']:.0f} req/s offered, GPU "
              f"utilization {r['gpu_util']:.1%} (training {r['training_only']:.1%}), slowdown "
              f"{r['slowdown']:+.1%}, TTFT p50 {fmt(r['ttft_p50_ms'], '.0f')} ms "
              f"(ETA {done / i * (len(rates) - i):.0f} s)", flush=True)
    md = table(rows)
    print(md)
    write_json(out / "sweep.json", {"rows": rows, "scenario": str(SCENARIO),
                                    "iterations": iterations})
    write_text(out / "sweep.md", md + "\n")
    plot(rows, out / "utilization_vs_rate.png")
    print(f"wrote {out / 'sweep.md'}, {out / 'utilization_vs_rate.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
