#!/usr/bin/env python3
"""Where temporal sharing (atlas) beats K connections (multitcp): the WAN queue swept from
above the summed burst down to a fraction of it, measured in the emulation beside the model.

Scenario (`bench_queue_regime`): two DCs (ea, we) of D hosts, one WAN link (20 ms one way,
100 Mbit/s, scale 100: 10 Gbit/s real), P=2 x D pipelines (default D=8), M=4, 1F1B, the H200
profile at width 2048, seq 2048, micro-batch 2, 16 blocks; connections auto (K=11: a 168 KB
activation or gradient is one round trip of its K windows), slow start after idle off (a
WAN-tuned host: a message is one burst). The summed burst of a direction
(testbed.analysis.bursts: every pipeline's message at once, wire bytes) is 1.40 MB at D=8;
`wan.queue` (the bfifo at the gateway's egress, per direction) is set to --fractions of it.

At each point multitcp and atlas run (`run_testbed.py run`, a fresh network each, time_scale T)
and the row holds: iteration time, the WAN queue's drops (both directions, over the run: the
bfifo leaves' counters, testbed.emulation.losscounters), TCP's retransmitted segments and
timeouts (every host namespace's counters), the compute overruns as a share of compute, and
the model's prediction (testbed.predict.predict.predict, called when the table is made: its
iteration time, and every figure of the prediction beyond the basic ones, e.g. drops or
retransmits where the model gives them). Writes OUT/rows.json, OUT/table.md and the figure
(iteration time against queue / summed burst, a line per system, measured solid, model
dashed) to --figure.

    sudo .venv/bin/python bench/bench_queue_regime.py [--out DIR] [--fractions 2,1,0.5,0.25,0.1]
    .venv/bin/python bench/bench_queue_regime.py --replot OUT/rows.json   # table and figure
                                                                  # only, the model as now
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_model_vs_emulation import next_time_scale, overrun_share, run_once  # noqa: E402
from testbed.analysis.bursts import summed_burst_bytes  # noqa: E402
from testbed.cli.planview import load_training  # noqa: E402
from testbed.emulation.results import write_bytes, write_json, write_text  # noqa: E402
from testbed.features.temporal.plan import plan_slots  # noqa: E402
from testbed.plans.placement import place_for_system  # noqa: E402
from testbed.predict.predict import predict  # noqa: E402
from testbed.spec.scenario import parse_scenario  # noqa: E402
from testbed.spec.systems import get_system  # noqa: E402

NAME = "bench_queue_regime"
SYSTEMS = ("multitcp", "atlas")
PROFILE = {"file": "h200-transformer.json", "width": 2048, "seq": 2048, "micro_batch": 2,
           "n_layer": 16}
BASIC = {"system", "iteration_time_s", "bubble_fraction", "gpu_utilization",
         "pipeline_bubble_fraction", "per_stage_bubble", "wan_utilization", "allreduce_ms",
         "iterations", "bubbletea"}


def scenario(D: int, iterations: int, queue_bytes: int | None = None) -> dict:
    link = {"between": ["ea", "we"], "delay_ms": 20, "rate_mbit": 100}
    if queue_bytes is not None:
        link["queue"] = f"{int(queue_bytes)}b"
    return {"name": NAME, "scale": 100, "connections": "auto",
            "tcp_slow_start_after_idle": False,
            "dcs": [{"name": "ea", "hosts": D, "rate_mbit": 1000},
                    {"name": "we", "hosts": D, "rate_mbit": 1000}],
            "wan": [link], "systems": list(SYSTEMS),
            "training": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16,
                                   "vocab_size": 64},
                         "stages": 2, "replicas": D, "micro_batches": 4, "micro_batch_size": 2,
                         "schedule": "1f1b", "iterations": iterations, "seed": 0,
                         "compute": "profile", "profile": PROFILE}}


def summed_burst(doc: dict) -> int:
    """The larger direction's summed burst under multitcp (testbed.analysis.bursts)."""
    sc = parse_scenario(doc, f"{NAME}.yaml")
    cfg, system = load_training(sc), get_system("multitcp")
    plan = plan_slots(sc, cfg, place_for_system(sc, cfg, system), system)
    return max(summed_burst_bytes(plan).values())


def model_of(row: dict) -> dict:
    """The model's prediction for the row's scenario and system, as the model is now: its
    iteration time and whatever it gives beyond the basic figures (drops, retransmits...)."""
    doc = dict(row["document"], time_scale=row["time_scale"])
    sc = parse_scenario(doc, f"{NAME}.yaml")
    cfg = load_training(sc)
    p = predict(sc, cfg, get_system(row["system"]), cfg.iterations)
    fields = dataclasses.asdict(p) if dataclasses.is_dataclass(p) else dict(vars(p))
    return {"iteration_s": p.iteration_time_s,
            "extra": {k: v for k, v in fields.items() if k not in BASIC}}


def measured(m: dict) -> dict:
    links = m["wan_links"]
    tcp = m.get("tcp") or {}
    return {"iteration_s": m["iteration_time_s"], "iteration_walls_s": m["iteration_walls_s"],
            "bubble": m["bubble_fraction"],
            "queue_drops": {k: (v.get("queue") or {}).get("drops") for k, v in links.items()},
            "queue_packets": {k: (v.get("queue") or {}).get("packets") for k, v in links.items()},
            "wan_use": {k: v.get("utilization") for k, v in links.items()},
            "retransmitted_segments": tcp.get("retransmitted_segments"),
            "out_segments": tcp.get("out_segments"), "timeouts": tcp.get("timeouts"),
            "fast_retransmits": tcp.get("fast_retransmits"),
            "overrun_share": overrun_share(m), "cpu_busy_pct": m["cpu"]["busy_pct"],
            "connections": m.get("connections")}


def short(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {short(x)}" for k, x in v.items()) + "}"
    return str(v)


def table(rows: list[dict]) -> str:
    out = ["| queue / summed burst | queue KB | system | measured s | model s | model error | "
           "queue drops (both directions) | TCP retransmitted segments (timeouts) | "
           "overrun share | atlas over multitcp (measured / model) | model's other figures |",
           "|" + "---|" * 11]
    by = {(r["fraction"], r["system"]): r for r in rows}
    for r in rows:
        if r.get("failed"):
            out.append(f"| {r['fraction']:g}x | {r['queue_bytes'] / 1e3:.0f} | {r['system']} | "
                       f"failed: {r['failed']} | | | | | | | |")
            continue
        me, mo = r["measured"], r["model"]
        drops = sum(v or 0 for v in me["queue_drops"].values())
        ratio = "-"
        mt = by.get((r["fraction"], "multitcp"))
        if r["system"] == "atlas" and mt and not mt.get("failed"):
            ratio = (f"{me['iteration_s'] / mt['measured']['iteration_s']:.2f} / "
                     f"{mo['iteration_s'] / mt['model']['iteration_s']:.2f}")
        extra = short(mo["extra"]) if mo["extra"] else "-"
        out.append(
            f"| {r['fraction']:g}x | {r['queue_bytes'] / 1e3:.0f} | {r['system']} | "
            f"{me['iteration_s']:.3f} | {mo['iteration_s']:.3f} | "
            f"{mo['iteration_s'] / me['iteration_s'] - 1:+.1%} | {drops:,} | "
            f"{me['retransmitted_segments']:,} ({me['timeouts']:,}) | "
            f"{me['overrun_share']:.1%} | {ratio} | {extra} |")
    return "\n".join(out)


def figure(rows: list[dict], burst: int, D: int, T: str) -> bytes:
    from testbed.analysis.reproduce_plots import _pyplot, colour_of, png_bytes
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    model_style = {"multitcp": ((0, (6, 3)), 3.0), "atlas": ((0, (2, 2)), 1.6)}
    for system in SYSTEMS:
        pts = sorted((r["fraction"], r["measured"]["iteration_s"], r["model"]["iteration_s"])
                     for r in rows if r["system"] == system and not r.get("failed"))
        if not pts:
            continue
        x = [p[0] for p in pts]
        ax.plot(x, [p[1] for p in pts], "-o", color=colour_of(system),
                label=f"{system} measured")
        dash, width = model_style.get(system, ("--", 1.5))
        ax.plot(x, [p[2] for p in pts], linestyle=dash, lw=width, color=colour_of(system),
                alpha=0.8, label=f"{system} model")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ticks = sorted({r["fraction"] for r in rows})
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    yt = [t for t in (0.5, 0.7, 1, 1.5, 2, 3, 5, 7, 10) if any(
        t / 1.6 <= r["measured"]["iteration_s"] <= t * 1.6 for r in rows if "measured" in r)]
    ax.set_yticks(yt, [f"{t:g}" for t in yt])
    ax.minorticks_off()
    ax.axvline(1.0, color="#999999", lw=0.8)
    ax.text(1.0, ax.get_ylim()[1], " summed burst", va="top", fontsize=8, color="#666666")
    one = first_message_fraction(rows)
    if one is not None:
        ax.axvline(one, color="#999999", lw=0.8, ls=":")
        ax.text(one, ax.get_ylim()[1], " one message", va="top", fontsize=8, color="#666666")
    ax.set_xlabel(f"WAN queue / summed burst ({burst / 1e6:.2f} MB: {D} pipelines' "
                  "messages at once), log")
    ax.set_ylabel("iteration time (s, real time), log")
    ax.set_title(f"{NAME}: 2 DCs, P=2 x D={D}, one 100 Mbit/s 20 ms link, K=11 "
                 f"(time_scale {T})", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    return png_bytes(fig)


def first_message_fraction(rows: list[dict]) -> float | None:
    """One pipeline's message (its first round, wire bytes) as a fraction of the summed burst."""
    if not rows:
        return None
    D = rows[0]["document"]["training"]["replicas"]
    return 1.0 / D


def run_all(args, burst: int) -> list[dict]:
    out = Path(args.out)
    runs = out / "runs"
    log = open(out / "runs.log", "a")
    rows: list[dict] = []
    for frac in [float(x) for x in args.fractions.split(",")]:
        q = round(frac * burst)
        doc = scenario(args.replicas, args.iterations, q)
        for system in args.systems.split(","):
            T, tries = args.time_scale, []
            while True:
                m, where, wall = run_once(doc, system, T, runs, log, tag=f"q{frac:g}")
                share = None if m is None else overrun_share(m)
                tries.append({"time_scale": T, "overrun_share": share, "run": where})
                if m is None or share <= args.max_overrun or len(tries) >= 2:
                    break
                print(f"{frac:g}x {system} T={T:g}: overruns {share:.1%} of compute, again",
                      flush=True)
                T = next_time_scale(T, share, args.max_overrun)
            row = {"fraction": frac, "queue_bytes": q, "summed_burst_bytes": burst,
                   "system": system, "time_scale": T, "document": doc, "attempts": tries,
                   "run": where, "run_wall_s": round(wall, 1)}
            if m is None:
                row["failed"] = where
                print(f"{frac:g}x {system}: {where}", flush=True)
            else:
                row["measured"] = measured(m)
                row["model"] = model_of(row)
                me = row["measured"]
                print(f"{frac:g}x ({q / 1e3:.0f} KB) {system}: {me['iteration_s']:.3f} s "
                      f"(model {row['model']['iteration_s']:.3f}), drops "
                      f"{sum(v or 0 for v in me['queue_drops'].values())}, retransmits "
                      f"{me['retransmitted_segments']}, overruns {me['overrun_share']:.1%} "
                      f"({wall:.0f} s)", flush=True)
            rows.append(row)
            write_json(out / "rows.json", rows)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench-queue-regime")
    ap.add_argument("--figure", default=None, help="the figure's path (default OUT/queue_regime.png)")
    ap.add_argument("--fractions", default="2,1,0.5,0.25,0.1")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--time-scale", type=float, default=8.0,
                    help="T of every run; raised once where compute overruns pass --max-overrun")
    ap.add_argument("--max-overrun", type=float, default=0.02)
    ap.add_argument("--iterations", type=int, default=4, help="per run; 0 is warm-up")
    ap.add_argument("--replot", metavar="ROWS_JSON", default=None,
                    help="no runs: table and figure of ROWS_JSON with the model as now")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.replot:
        rows = json.loads(Path(args.replot).read_text())
        rows = [r if r.get("failed") else dict(r, model=model_of(r)) for r in rows]
        burst, D, T = (rows[0]["summed_burst_bytes"], rows[0]["document"]["training"]["replicas"],
                       rows[0]["time_scale"])
    else:
        burst, D, T = summed_burst(scenario(args.replicas, args.iterations)), args.replicas, \
            args.time_scale
        print(f"summed burst: {burst:,} B per direction ({D} pipelines)", flush=True)
        rows = run_all(args, burst)
    write_json(out / "rows.json", rows)
    T = "/".join(f"{t:g}" for t in sorted({r["time_scale"] for r in rows}))
    fig = Path(args.figure) if args.figure else out / "queue_regime.png"
    write_bytes(fig, figure(rows, burst, D, T))
    text = (f"{NAME}: summed burst {burst:,} B, D={D}, time_scale {T} "
            f"({time.strftime('%Y-%m-%d')}, {time.monotonic() - t0:.0f} s)\n\n{table(rows)}\n")
    write_text(out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
