#!/usr/bin/env python3
"""The model against the emulation at 16-64 emulated GPUs, each run dilated enough that the
small model's CPU time stays inside the profile holds.

Scenarios (scale 100, connections auto, 1F1B, M=4, the H200 profile at width 2048, seq 2048,
micro-batch 2, 24 blocks over the stages; a 1-layer-per-stage small model):
- four_dc: the shipped topologies/four_dc.yaml network (four DCs of four hosts, full mesh,
  30-100 ms, 50-200 Mbit/s) with a P=4 x D=4 pipeline, stage s in DC s (16 GPUs);
- chain4xD: four DCs of D hosts in a chain d0-d1-d2-d3 (20, 40, 20 ms one way, 100 Mbit/s),
  P=4 x D for D = 4, 8, 16 (16, 32, 64 GPUs).

Per (scenario, system) it runs `run_testbed.py run` (a fresh network each) with time_scale T,
reads the run's compute overruns (metrics.json `compute_overruns`: the small model's CPU time
past its profile hold) as a share of the measured iterations' compute, and while that share is
above --max-overrun (2%) raises T and runs again (up to --attempts); the first system of a
scenario sets the T the next ones start from. It then prints, per row, the model's iteration
time (testbed.predict.predict.predict, called now: the model as it is when the table is made)
against the measured one, the bubble and the busiest WAN direction's use, both ways, and what
the emulation added (ms per iteration of compute past the holds and of the workers' start
latency, the worst all-reduce past the model's, TCP retransmissions, WAN queue drops, delay-line
packets released late). Writes OUT/rows.json (the raw rows) and OUT/table.md; the run folders
stay under OUT/runs/.

    sudo .venv/bin/python bench/bench_model_vs_emulation.py [--out DIR] [--scenarios a,b]
    .venv/bin/python bench/bench_model_vs_emulation.py --remodel OUT/rows.json   # table only,
                                                                  # with the model as it is now
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.cli.planview import load_training  # noqa: E402
from testbed.emulation.results import write_json, write_text  # noqa: E402
from testbed.predict.predict import predict  # noqa: E402
from testbed.spec.links import LinkDir  # noqa: E402
from testbed.spec.scenario import parse_scenario  # noqa: E402
from testbed.spec.systems import get_system  # noqa: E402
from testbed.spec.timescale import TimeScale  # noqa: E402

PROFILE = {"file": "h200-transformer.json", "width": 2048, "seq": 2048, "micro_batch": 2,
           "n_layer": 24}
SYSTEMS = ("multitcp", "atlas", "baseline")       # multitcp first: the shortest runs find T
RUN_TIMEOUT_S = 1500


def training(P: int, D: int, iterations: int) -> dict:
    return {"model": {"n_layer": P, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64},
            "stages": P, "replicas": D, "micro_batches": 4, "micro_batch_size": 2,
            "schedule": "1f1b", "iterations": iterations, "seed": 0, "compute": "profile",
            "profile": PROFILE}


def four_dc(iterations: int) -> dict:
    """The shipped four_dc network, with training: P=4 x D=4, a stage per DC."""
    doc = yaml.safe_load((REPO / "topologies" / "four_dc.yaml").read_text())
    doc.pop("description", None)
    for dc in doc["dcs"]:
        dc["rate_mbit"] = 1000
    doc.update(name="bench_mve_four_dc", scale=100, connections="auto",
               systems=list(SYSTEMS), training=training(4, 4, iterations))
    return doc


def chain(D: int, iterations: int) -> dict:
    """Four DCs of D hosts in a chain, P=4 x D."""
    return {"name": f"bench_mve_chain4x{D}", "scale": 100, "connections": "auto",
            "dcs": [{"name": f"d{i}", "hosts": D, "rate_mbit": 1000} for i in range(4)],
            "wan": [{"between": ["d0", "d1"], "delay_ms": 20, "rate_mbit": 100},
                    {"between": ["d1", "d2"], "delay_ms": 40, "rate_mbit": 100},
                    {"between": ["d2", "d3"], "delay_ms": 20, "rate_mbit": 100}],
            "systems": list(SYSTEMS), "training": training(4, D, iterations)}


# name -> (document maker, first time_scale to try, systems run by default)
SCENARIOS = {
    "four_dc": (four_dc, 6, SYSTEMS),
    "chain4x4": (lambda it: chain(4, it), 6, SYSTEMS),
    "chain4x8": (lambda it: chain(8, it), 8, SYSTEMS),
    "chain4x16": (lambda it: chain(16, it), 10, ("multitcp", "atlas")),
}


def overrun_share(m: dict) -> float:
    """Compute past the profile holds over all compute of the measured iterations."""
    over = m.get("compute_overruns") or {}
    compute_s = sum(s["compute_s"] for s in m["stages"]) * len(m["iterations_averaged"])
    return over.get("total_ms", 0.0) / 1e3 / compute_s if compute_s > 0 else 0.0


def next_time_scale(now: float, share: float, limit: float) -> float:
    """A larger time_scale than `now`: the overruns shrink about as fast as the holds grow."""
    step = 2.0 if share > 5 * limit else 1.5
    return float(min(60, math.ceil(now * step)))


def run_once(doc: dict, system: str, T: float, runs: Path, log, tag: str = ""
             ) -> tuple[dict | None, str, float]:
    """One `run` of doc at time_scale T for system: (its metrics block or None, the run folder
    or the failure, wall seconds). tag tells apart the scenario files of a sweep's points."""
    doc = dict(doc, time_scale=T)
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"{doc['name']}{'-' + tag if tag else ''}-{system}-T{T:g}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    argv = [sys.executable, str(REPO / "run_testbed.py"), "run", str(path), "--systems", system,
            "--out", str(runs), "-q"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, cwd=REPO)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate()
        subprocess.run([sys.executable, str(REPO / "run_testbed.py"), "cleanup"], cwd=REPO)
        return None, f"timed out after {RUN_TIMEOUT_S} s", time.monotonic() - t0
    wall = time.monotonic() - t0
    log.write(out)
    log.flush()
    found = re.search(r"^results: (\S+)$", out, re.MULTILINE)
    if not found:
        return None, f"exit {proc.returncode}: " + out.strip().splitlines()[-1][:300], wall
    run_dir = Path(found.group(1))
    m = json.loads((run_dir / system / "metrics.json").read_text())
    if not m.get("complete"):
        return None, f"incomplete: {m.get('error')}", wall
    return m, str(run_dir), wall


def wan_messages(sys_dir: Path, T: float) -> dict:
    """The measured iterations' stage-to-stage messages between DCs, real ms, per direction
    (src DC->dst DC) and median: `spread`, first byte to last at the receiver (a message alone
    on its link: its wire time; messages interleaved in the bottleneck's FIFO spread over
    their sum), and `latency`, from the sender's enqueue to the last byte; and the direction
    whose median spread is largest."""
    import statistics
    ts = TimeScale(T)
    spans = [json.loads(line) for line in (sys_dir / "trainer_spans.jsonl").open()]
    send = {(r["name"][-1], r["stage"], r["replica"], r["iteration"], r["microbatch"]): r
            for r in spans if r["name"] in ("SEND_F", "SEND_B")}
    by: dict[str, list[tuple[float, float]]] = {}
    for r in spans:
        if r["name"] not in ("RECV_F", "RECV_B") or not r.get("iteration"):
            continue
        kind = r["name"][-1]
        src = r["stage"] - 1 if kind == "F" else r["stage"] + 1
        s = send.get((kind, src, r["replica"], r["iteration"], r["microbatch"]))
        if s is None or s["dc"] == r["dc"] or "t_first_ns" not in r:
            continue
        by.setdefault(str(LinkDir(s["dc"], r["dc"])), []).append(
            (ts.real_span((r["t_arrived_ns"] - r["t_first_ns"]) / 1e6),
             ts.real_span((r["t_arrived_ns"] - s["t_enqueue_ns"]) / 1e6)))
    if not by:
        return {}
    per = {k: {"n": len(v), "spread_ms_p50": statistics.median(x[0] for x in v),
               "spread_ms_max": max(x[0] for x in v),
               "latency_ms_p50": statistics.median(x[1] for x in v)} for k, v in by.items()}
    worst = max(per, key=lambda k: per[k]["spread_ms_p50"])
    return {"by_direction": per, "worst": worst}


def measured_row(name: str, doc: dict, system: str, m: dict, run_dir: str, wall: float,
                 attempts: list) -> dict:
    used = {k: v for k, v in m["wan_links"].items() if v.get("training_bytes")}
    emu = (m.get("model") or {}).get("emulation") or {}
    slots = emu.get("wan_slots") or {}
    return {
        "scenario": name, "scenario_name": doc["name"], "document": doc, "system": system,
        "gpus": doc["training"]["stages"] * doc["training"]["replicas"],
        "time_scale": m["time_scale"], "overrun_share": overrun_share(m), "attempts": attempts,
        "iteration_s": m["iteration_time_s"], "iteration_walls_s": m["iteration_walls_s"],
        "bubble": m["bubble_fraction"],
        "wan_use": {k: v["utilization"] for k, v in used.items()},
        "connections": m.get("connections"),
        "compute_overrun_ms_per_iteration": emu.get("compute_overrun_ms_per_iteration"),
        "start_latency_ms_per_iteration": emu.get("start_latency_ms_per_iteration"),
        "allreduce_over_model_ms": emu.get("allreduce_over_model_ms"),
        "allreduce_measured_ms": [a["measured_ms"] for a in m.get("allreduce", [])],
        "slot_over_wire_ms": {k: v["over_wire_ms"] for k, v in slots.items()},
        "slot_handover_ms": {k: v["handover_ms"] for k, v in slots.items()},
        "tcp": m.get("tcp"),
        "queue_drops": {k: (v.get("queue") or {}).get("drops") for k, v in used.items()},
        "late_packets": {k: v.get("late_packets") for k, v in used.items()},
        "cpu_busy_pct": m["cpu"]["busy_pct"],
        "model_at_run": (m.get("model") or {}).get("predicted"),
        "wan_messages": wan_messages(Path(run_dir) / system, m["time_scale"]),
        "run_dir": run_dir, "run_wall_s": round(wall, 1),
    }


def refreshed(row: dict) -> dict:
    """The row with its message figures read again from its run folder, where that is kept."""
    sys_dir = Path(row["run_dir"]) / row["system"]
    if (sys_dir / "trainer_spans.jsonl").exists():
        return dict(row, wan_messages=wan_messages(sys_dir, row["time_scale"]))
    return row


def with_model(row: dict) -> dict:
    """The row with the model's figures as the model is now (real time)."""
    doc = dict(row["document"], time_scale=row["time_scale"])
    sc = parse_scenario(doc, f"{row['scenario']}.yaml")
    cfg = load_training(sc)
    t0 = time.perf_counter()
    p = predict(sc, cfg, get_system(row["system"]), cfg.iterations)
    return dict(row, model={"iteration_s": p.iteration_time_s, "bubble": p.bubble_fraction,
                            "wan_use": dict(p.wan_utilization),
                            "allreduce_ms": list(p.allreduce_ms),
                            "seconds": round(time.perf_counter() - t0, 2)})


def fmt_ms(v) -> str:
    return "-" if v is None else f"{v:.0f}"


def table(rows: list[dict]) -> str:
    out = ["| scenario | GPUs | system | T | overrun share | model s | measured s | error | "
           "bubble model / measured | busiest WAN direction: use model / measured | "
           "emulation added per iteration: compute past holds, start latency (ms); worst "
           "all-reduce past the model (ms); TCP retransmits; queue drops | WAN messages' "
           "first to last byte, the most spread direction: median / max ms |",
           "|" + "---|" * 11]
    for r in rows:
        if r.get("failed"):
            out.append(f"| {r['scenario']} | {r['gpus']} | {r['system']} | "
                       f"{r.get('time_scale', '-')} | - | - | - | - | - | - | failed: "
                       f"{r['failed']} | - |")
            continue
        mo = r["model"]
        err = mo["iteration_s"] / r["iteration_s"] - 1
        label = r["scenario"] + (", no slow start after idle" if r["document"].get(
            "tcp_slow_start_after_idle") is False else "")
        link = max(r["wan_use"], key=lambda k: mo["wan_use"].get(k, 0.0), default=None)
        use = ("-" if link is None else
               f"{link} {mo['wan_use'].get(link, 0.0):.0%} / {r['wan_use'][link]:.0%}")
        tcp = r.get("tcp") or {}
        ar = r.get("allreduce_over_model_ms") or []
        flag = "" if abs(err) <= 0.10 else " **miss**"
        msgs = r.get("wan_messages") or {}
        w = (msgs.get("by_direction") or {}).get(msgs.get("worst"))
        spread = (f"{msgs['worst']} {w['spread_ms_p50']:.0f} / {w['spread_ms_max']:.0f}"
                  if w else "-")
        out.append(
            f"| {label} | {r['gpus']} | {r['system']} | {r['time_scale']:g} | "
            f"{r['overrun_share']:.1%} | {mo['iteration_s']:.3f} | {r['iteration_s']:.3f} | "
            f"{err:+.1%}{flag} | {mo['bubble']:.3f} / {r['bubble']:.3f} | {use} | "
            f"{fmt_ms(r['compute_overrun_ms_per_iteration'])}, "
            f"{fmt_ms(r['start_latency_ms_per_iteration'])}; "
            f"{fmt_ms(max(ar) if ar else None)}; {tcp.get('retransmitted_segments', '-')}; "
            f"{sum(v or 0 for v in r['queue_drops'].values())} | {spread} |")
    return "\n".join(out)


def run_all(args) -> list[dict]:
    out = Path(args.out)
    runs = out / "runs"
    rows: list[dict] = []
    log = open(out / "runs.log", "a")
    for name in args.scenarios.split(","):
        make, T, default_systems = SCENARIOS[name]
        T = args.time_scale or T
        doc = make(args.iterations)
        if args.slow_start_after_idle is not None:
            doc["tcp_slow_start_after_idle"] = args.slow_start_after_idle == "on"
            doc["name"] += f"_ssai_{args.slow_start_after_idle}"
        systems = args.systems.split(",") if args.systems else list(default_systems)
        for system in systems:
            attempts = []
            while True:
                m, where, wall = run_once(doc, system, T, runs, log)
                share = None if m is None else overrun_share(m)
                attempts.append({"time_scale": T, "overrun_share": share,
                                 "iteration_s": None if m is None else m["iteration_time_s"],
                                 "run": where, "wall_s": round(wall, 1)})
                print(f"{name} {system} T={T:g}: " + (where if m is None else
                      f"{m['iteration_time_s']:.3f} s, overruns {share:.1%} of compute") +
                      f" ({wall:.0f} s)", flush=True)
                if m is None or share <= args.max_overrun or len(attempts) >= args.attempts:
                    break
                T = next_time_scale(T, share, args.max_overrun)
            if m is None:
                rows.append({"scenario": name, "document": doc, "system": system,
                             "gpus": doc["training"]["stages"] * doc["training"]["replicas"],
                             "time_scale": T, "failed": where, "attempts": attempts})
            else:
                rows.append(with_model(measured_row(name, doc, system, m, where, wall, attempts)))
            write_json(out / "rows.json", rows)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench-model-vs-emulation")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--systems", default=None,
                    help="comma-separated (default: each scenario's, SCENARIOS)")
    ap.add_argument("--iterations", type=int, default=3, help="per run; 0 is warm-up")
    ap.add_argument("--slow-start-after-idle", choices=("on", "off"), default=None,
                    help="set the scenarios' tcp_slow_start_after_idle (default: Linux's, on)")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="the first T to try for every scenario (default: SCENARIOS')")
    ap.add_argument("--max-overrun", type=float, default=0.02)
    ap.add_argument("--attempts", type=int, default=3, help="runs per row at most")
    ap.add_argument("--remodel", metavar="ROWS_JSON", default=None,
                    help="no runs: the table of ROWS_JSON's measurements with the model as now")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.remodel:
        rows = [r if r.get("failed") else with_model(refreshed(r))
                for r in json.loads(Path(args.remodel).read_text())]
    else:
        rows = run_all(args)
    write_json(out / "rows.json", rows)
    text = (f"Model against the emulation ({time.strftime('%Y-%m-%d')}, "
            f"{time.monotonic() - t0:.0f} s)\n\n{table(rows)}\n")
    write_text(out / "table.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
