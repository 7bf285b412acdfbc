#!/usr/bin/env python3
"""The model against a grid of emulation points, and the distribution of its error (issue 36,
item 5).

A base point (2 DCs of D hosts, P=2 x D with stage s in DC s, one WAN link d0-d1 of 25 ms one
way and 100 Mbit/s, cubic, K=4 connections, the default queue, no loss; scale 100,
`time_scale: auto`, the H200 profile at width 2048, seq 2048, micro-batch 2, 24 blocks over the
stages (bench_model_vs_emulation's training()), 1F1B, M=4, 4 iterations, 0 the warm-up) and
points that move one or two axes from it: the one-way delay, random loss (`loss_pct`), the
connections K, the WAN queue (as a multiple of the summed burst: K connections x the window one
connection may have in flight, 45.9 kB at scale 100, x the pipelines that cross the link at once:
D for the concurrent systems, 1 for atlas' temporal slots), reno against cubic at lossy points,
and D. Each point runs one or two of baseline, multitcp and atlas (POINTS says which), each
(point, system) --repeats times (default 2; the issue asks for 3), each repeat a fresh network
(`run_testbed.py run` through bench_model_vs_emulation.run_once, with time_scale auto: the
testbed picks T per run).

Rows, one per (point, system), go to --rows (docs/model_grid.json, rewritten atomically after
every run, so a grid cut short keeps what it measured): the scenario document, the system, per
repeat the measured iteration time, bubble, T, compute overrun share, TCP retransmits and
timeouts, WAN queue and random-loss drops, the run folder, the wall time (or the failure). The
model's figures (testbed.predict.predict.predict) are computed when the table is drawn: the model
as it is then, never stored as the truth. The table (point, system, measured mean and min..max
over the repeats, model, error, within 10% or within the run-to-run spread) and the error
distribution (within 5/10/20%, median and worst |error|) go to docs/model_grid.md and stdout,
the |error| CDF to docs/model_grid_cdf.png. The run folders stay under OUT/runs/.

    sudo .venv/bin/python bench/bench_model_grid.py [--repeats N] [--out DIR] [--points a,b]
    .venv/bin/python bench/bench_model_grid.py --dry-run      # the points, the summed bursts,
                                                               # the model, the time estimate
    .venv/bin/python bench/bench_model_grid.py --remodel docs/model_grid.json   # no runs: the
                                                   # table and CDF with the model as it is now
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_model_vs_emulation import overrun_share, run_once, training  # noqa: E402
from testbed.cli.planview import load_training  # noqa: E402
from testbed.emulation.results import write_json, write_text  # noqa: E402
from testbed.predict.predict import predict  # noqa: E402
from testbed.spec.scenario import (RCV_WINDOW_FRACTION, parse_scenario,  # noqa: E402
                                 scaled_tcp_rmem_max_bytes)
from testbed.spec.systems import get_system  # noqa: E402
from testbed.spec.timescale import TimeScale  # noqa: E402

SCALE = 100
P = 2
ITERATIONS = 4
# The window one connection may have in flight at SCALE (bytes): the scaled receive buffer's
# payload share, 45.9 kB at scale 100.
WINDOW_BYTES = scaled_tcp_rmem_max_bytes(SCALE) * RCV_WINDOW_FRACTION
BASE = {"delay": 25, "loss": 0.0, "K": 4, "queue_x": None, "cc": "cubic", "D": 2}
# Measured here (2-core VM, 2026-12-07; base multitcp, 4 workers: 20 s a run at T=1; D8 multitcp,
# 16 workers: 66 s at T=4): a run's wall time outside its iterations (the testbed's start, time_scale
# auto's probes, the network up and down, the workers' start, the results) grows with the workers,
# and so does T; only for the estimate printed at the start.
RUN_OVERHEAD_S = 7.0
RUN_OVERHEAD_S_PER_WORKER = 2.75


class AutoT(str):
    """time_scale "auto" that run_once can format as a number (its file names use T:g) and
    yaml.safe_dump writes as the plain string auto."""

    def __format__(self, spec: str) -> str:
        return str(self)


yaml.SafeDumper.add_representer(AutoT, yaml.representer.SafeRepresenter.represent_str)
AUTO = AutoT("auto")


def pt(pid: str, axes: str, systems: tuple[str, ...], **moved) -> dict:
    unknown = set(moved) - set(BASE)
    assert not unknown, unknown
    return {"id": pid, "axes": axes, "systems": systems, **BASE, **moved}


MB, MT, AT = "baseline", "multitcp", "atlas"
# One or two axes at a time around BASE; every system appears on several axes.
POINTS = [
    # one-way delay (ms)
    pt("base", "base", (MT, MB)),
    pt("d10", "delay", (MT, MB), delay=10),
    pt("d50", "delay", (MT, AT), delay=50),
    pt("d100", "delay", (MT, MB), delay=100),
    pt("d150", "delay", (MT, AT), delay=150),
    pt("base_at", "base", (AT,)),
    # random loss (%)
    pt("l0p1", "loss", (MT, AT), loss=0.1),
    pt("l0p5", "loss", (MT, MB), loss=0.5),
    pt("l1", "loss", (MT, AT), loss=1.0),
    pt("l2", "loss", (MT, MB), loss=2.0),
    # reno against cubic at the lossy points (the cubic ones above)
    pt("l0p5_reno", "loss x cc", (MT, MB), loss=0.5, cc="reno"),
    pt("l1_reno", "loss x cc", (MT, AT), loss=1.0, cc="reno"),
    pt("l2_reno", "loss x cc", (MT,), loss=2.0, cc="reno"),
    # connections K (baseline always uses 1)
    pt("k1", "K", (MT,), K=1),
    pt("k2", "K", (MT, AT), K=2),
    pt("k8", "K", (MT,), K=8),
    pt("k16", "K", (MT, AT), K=16),
    # the WAN queue as a multiple of the summed burst
    pt("q0p1", "queue", (MT, MB), queue_x=0.1),
    pt("q0p5", "queue", (MT, AT), queue_x=0.5),
    pt("q1", "queue", (MT,), queue_x=1.0),
    pt("q2", "queue", (MT,), queue_x=2.0),
    # D (2 DCs of D hosts)
    pt("D1", "D", (MT, AT), D=1),
    pt("D1_mb", "D", (MB,), D=1),
    pt("D4", "D", (MT, AT), D=4),
    pt("D4_mb", "D", (MB,), D=4),
    # two axes
    pt("d10_k16", "delay x K", (MT,), delay=10, K=16),
    pt("d100_k1", "delay x K", (MT,), delay=100, K=1),
    pt("d150_k16", "delay x K", (MT,), delay=150, K=16),
    pt("d100_l0p5", "delay x loss", (MT, MB), delay=100, loss=0.5),
    pt("d100_l1_reno", "delay x loss x cc", (MT,), delay=100, loss=1.0, cc="reno"),
    pt("d50_l0p1", "delay x loss", (MT, AT), delay=50, loss=0.1),
    pt("d10_l1", "delay x loss", (MT,), delay=10, loss=1.0),
    pt("k16_l1", "K x loss", (MT,), K=16, loss=1.0),
    pt("k16_q0p5", "K x queue", (MT,), K=16, queue_x=0.5),
    pt("k1_q0p1", "K x queue", (MT,), K=1, queue_x=0.1),
    pt("D4_l0p5", "D x loss", (MT, AT), D=4, loss=0.5),
    pt("D4_k16", "D x K", (MT, AT), D=4, K=16),
    pt("D4_d100", "D x delay", (MT,), D=4, delay=100),
    pt("D4_q0p5", "D x queue", (MT,), D=4, queue_x=0.5),
    pt("D1_d100", "D x delay", (MB, AT), D=1, delay=100),
    pt("D1_l1", "D x loss", (MT,), D=1, loss=1.0),
    # D=8: 16 workers on the 2 cores (time_scale auto stretches it)
    pt("D8", "D", (MT,), D=8),
]


def pipelines_at_once(point: dict, system: str) -> int:
    """The pipelines whose messages cross the WAN link at once: D under concurrent sharing,
    one under temporal slots (atlas)."""
    return 1 if get_system(system).temporal else point["D"]


def summed_burst(point: dict, system: str) -> float:
    """Bytes the senders may have in flight on the WAN link at once: K x window x pipelines."""
    k = 1 if get_system(system).connections == "one" else point["K"]
    return k * WINDOW_BYTES * pipelines_at_once(point, system)


def queue_bytes(point: dict) -> int | None:
    """The point's WAN queue (bytes): queue_x x the summed burst of the point's first system."""
    if point["queue_x"] is None:
        return None
    return max(1500, int(point["queue_x"] * summed_burst(point, point["systems"][0])))


def document(point: dict) -> dict:
    link = {"between": ["d0", "d1"], "delay_ms": point["delay"], "rate_mbit": 100}
    if point["loss"]:
        link["loss_pct"] = point["loss"]
    q = queue_bytes(point)
    if q is not None:
        link["queue"] = f"{q}B"
    return {"name": f"grid_{point['id']}", "scale": SCALE, "time_scale": "auto",
            "congestion_control": point["cc"], "connections": point["K"],
            "dcs": [{"name": f"d{i}", "hosts": point["D"], "rate_mbit": 1000} for i in range(2)],
            "wan": [link], "systems": list(point["systems"]),
            "training": training(P, point["D"], ITERATIONS)}


def label(point: dict) -> str:
    parts = [f"{point['delay']:g} ms", f"loss {point['loss']:g}%", f"K={point['K']}",
             f"D={point['D']}", point["cc"]]
    if point["queue_x"] is not None:
        parts.append(f"queue {point['queue_x']:g}x burst ({queue_bytes(point) / 1e3:.0f} kB)")
    return ", ".join(parts)


def model_of(doc: dict, system: str, T: float) -> dict:
    """The model's figures for doc under system, as the model is now (real time)."""
    sc = parse_scenario(dict(doc, time_scale=T), f"{doc['name']}.yaml")
    cfg = load_training(sc)
    p = predict(sc, cfg, get_system(system), cfg.iterations)
    return {"iteration_s": p.iteration_time_s, "bubble": p.bubble_fraction,
            "wan_use": dict(p.wan_utilization), "time_scale": T,
            # per run, as the runs count them: every iteration's, both directions
            "queue_drops": sum(p.wan_drop_packets.values()) * cfg.iterations}


def repeat_record(m: dict, where: str, wall: float) -> dict:
    """What one run measured (metrics.json), for the row."""
    used = {k: v for k, v in m["wan_links"].items() if v.get("training_bytes")}
    tcp = m.get("tcp") or {}
    auto = m.get("time_scale_auto") or {}
    return {"iteration_s": m["iteration_time_s"], "iteration_walls_s": m["iteration_walls_s"],
            "bubble": m["bubble_fraction"], "time_scale": m["time_scale"],
            "time_scale_auto_reason": auto.get("reason"),
            "overrun_share": overrun_share(m),
            "tcp_retransmits": tcp.get("retransmitted_segments"),
            "tcp_timeouts": tcp.get("timeouts"),
            "tcp_spurious": tcp.get("dsack_received_segments"),     # DSACKed: not lost
            "tcp_reorderings": tcp.get("reordering_detected"),
            "queue_drops": {k: (v.get("queue") or {}).get("drops") for k, v in used.items()},
            "delay_line_queue_full": {k: v.get("dropped_queue_full") for k, v in used.items()},
            "loss_drops": {k: v.get("dropped_loss") for k, v in used.items()},
            "wan_use": {k: v.get("utilization") for k, v in used.items()},
            "connections": m.get("connections"),
            "cpu_busy_pct": (m.get("cpu") or {}).get("busy_pct"),
            "run_dir": where, "run_wall_s": round(wall, 1)}


def _spurious(rec: dict) -> str:
    """' (N spurious)' where the run counted DSACKed retransmits (runs before the counter: '')."""
    n = rec.get("tcp_spurious")
    return "" if n is None else f" ({n} spurious)"


def new_row(point: dict, system: str) -> dict:
    return {"point": point["id"], "axes": point["axes"], "label": label(point),
            "params": {k: point[k] for k in BASE}, "document": document(point),
            "system": system, "summed_burst_bytes": round(summed_burst(point, system)),
            "queue_bytes": queue_bytes(point), "repeats": []}


def with_model(row: dict) -> dict:
    """The row with the model's figures as the model is now, at the T its first good repeat
    used (the model's real-time figures barely depend on it)."""
    ok = [r for r in row["repeats"] if "iteration_s" in r]
    T = ok[0]["time_scale"] if ok else 1.0
    try:
        return dict(row, model=model_of(row["document"], row["system"], T))
    except Exception as e:  # noqa: BLE001 - a model failure is a row's finding, not the end
        return dict(row, model={"error": f"{type(e).__name__}: {e}"})


def summary(row: dict) -> dict | None:
    """Measured mean / min / max over the good repeats, the model, the error; None if none."""
    ok = [r["iteration_s"] for r in row["repeats"] if "iteration_s" in r]
    mo = (row.get("model") or {}).get("iteration_s")
    if not ok or mo is None:
        return None
    mean = statistics.fmean(ok)
    lo, hi = min(ok), max(ok)
    err = mo / mean - 1
    return {"mean": mean, "min": lo, "max": hi, "n": len(ok), "model": mo, "err": err,
            "within10": abs(err) <= 0.10, "within_spread": len(ok) > 1 and lo <= mo <= hi}


def _sum(d) -> int | None:
    vals = [v for v in (d or {}).values() if v is not None]
    return sum(vals) if vals else None


def _drops(ok: list[dict], model: dict) -> str:
    """The WAN queue drops per run, measured (mean of the repeats) and the model's."""
    measured = [_sum(x.get("queue_drops")) for x in ok]
    measured = [m for m in measured if m is not None]
    mo = model.get("queue_drops")
    return (f"{statistics.fmean(measured):.0f}" if measured else "-") + " / " + (
        "-" if mo is None else f"{mo:.0f}")


def table(rows: list[dict]) -> tuple[str, list[float]]:
    head = ["| point | axes | system | T | measured s: mean (min..max, n) | model s | error | "
            "within 10% / run spread | bubble measured / model | per run: TCP retransmits, "
            "WAN queue drops, loss drops | WAN queue drops per run: measured mean / model |",
            "|" + "---|" * 11]
    out, errs = list(head), []
    for r in rows:
        s = summary(r)
        ok = [x for x in r["repeats"] if "iteration_s" in x]
        failed = [x["failed"] for x in r["repeats"] if "failed" in x]
        name = f"{r['point']} ({r['label']})"
        if s is None:
            why = ("failed: " + "; ".join(failed) if failed else
                   "model failed: " + r["model"]["error"] if "error" in (r.get("model") or {})
                   else "not run")
            out.append(f"| {name} | {r['axes']} | {r['system']} | - | - | - | - | - | - | "
                       f"{why[:250]} | - |")
            continue
        errs.append(abs(s["err"]))
        Ts = sorted({x["time_scale"] for x in ok})
        within = ("yes" if s["within10"] else "no") + " / " + (
            "yes" if s["within_spread"] else "no" if s["n"] > 1 else "-")
        bub = statistics.fmean(x["bubble"] for x in ok)
        per = "; ".join(f"{x.get('tcp_retransmits', '-')}{_spurious(x)}, "
                        f"{_sum(x.get('queue_drops'))}, {_sum(x.get('loss_drops'))}" for x in ok)
        if failed:
            per += f"; {len(failed)} failed"
        out.append(f"| {name} | {r['axes']} | {r['system']} | "
                   f"{'/'.join(format(t, 'g') for t in Ts)} | {s['mean']:.3f} ({s['min']:.3f}.."
                   f"{s['max']:.3f}, {s['n']}) | {s['model']:.3f} | {s['err']:+.1%}"
                   f"{'' if s['within10'] else ' **miss**'} | {within} | {bub:.3f} / "
                   f"{r['model']['bubble']:.3f} | {per} | {_drops(ok, r['model'])} |")
    return "\n".join(out), errs


def distribution(errs: list[float]) -> str:
    if not errs:
        return "No row has both a measurement and a model figure."
    n = len(errs)
    cnt = {b: sum(e <= b for e in errs) for b in (0.05, 0.10, 0.20)}
    return (f"Error distribution over {n} (point, system) rows (|model / measured mean - 1|): "
            + ", ".join(f"within {b:.0%}: {c} ({c / n:.0%})" for b, c in cnt.items())
            + f"; median {statistics.median(errs):.1%}, worst {max(errs):.1%}.")


def breakdown(rows: list[dict], key: str) -> str:
    """Per system (or axes): rows, within 10%, median |error|."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        s = summary(r)
        if s:
            groups.setdefault(r[key], []).append(abs(s["err"]))
    return "; ".join(f"{g}: {len(e)} rows, {sum(x <= 0.10 for x in e)} within 10%, median "
                     f"{statistics.median(e):.1%}" for g, e in groups.items())


def worst(rows: list[dict], k: int = 5) -> str:
    ranked = sorted(((summary(r), r) for r in rows if summary(r)),
                    key=lambda x: -abs(x[0]["err"]))[:k]
    lines = [f"The {len(ranked)} worst:"]
    for s, r in ranked:
        way = "over-predicts (model slower)" if s["err"] > 0 else "under-predicts (model faster)"
        lines.append(f"- {r['point']} ({r['label']}), {r['system']}: model {s['model']:.3f} s, "
                     f"measured {s['mean']:.3f} s ({s['min']:.3f}..{s['max']:.3f}): "
                     f"{s['err']:+.1%}, {way}")
    return "\n".join(lines)


def cdf_plot(errs: list[float], path: Path, title_note: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = sorted(100 * e for e in errs)
    ys = [(i + 1) / len(xs) for i in range(len(xs))]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.step([0.0] + xs, [0.0] + ys, where="post", label="model: |iteration-time error|")
    ax.axvline(10, color="grey", linestyle="--", label="10%")
    ax.set_xlabel("|model / measured mean - 1| (%)")
    ax.set_ylabel("fraction of (point, system) rows")
    ax.set_ylim(0, 1.02)
    ax.set_xlim(left=0)
    ax.set_title(f"Model vs emulation grid: iteration-time error CDF\n{title_note}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def report(rows: list[dict], rows_path: Path, note: str) -> str:
    rows = [with_model(r) for r in rows]
    text, errs = table(rows)
    n_runs = sum(len(r["repeats"]) for r in rows)
    n_fail = sum("failed" in x for r in rows for x in r["repeats"])
    reps = sorted({len(r["repeats"]) for r in rows})
    points = list(dict.fromkeys(r["point"] for r in rows))
    head = (f"Model against the emulation grid ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
            f"; the model as it is now). {len(points)} points, {len(rows)} (point, system) rows, "
            f"{n_runs} runs ({n_fail} failed); repeats per row: "
            f"{'/'.join(map(str, reps))} (the issue asks for 3). Scale {SCALE}, time_scale auto, "
            f"P={P}, 1F1B, M=4, {ITERATIONS} iterations (0 warm-up). Summed burst = K x "
            f"{WINDOW_BYTES / 1e3:.1f} kB x pipelines crossing at once (D; 1 for atlas); a "
            f"queue point's queue is that of its first system. {note}\n\n"
            f"'within 10% / run spread': |error| <= 10% / the model inside the repeats' "
            f"min..max. Per run: TCP retransmitted segments (with, where counted, how many "
            f"the receiver already had: DSACKed, reordered on the way, not lost), WAN queue "
            f"drops and random-loss "
            f"drops summed over both directions.\n")
    body = (f"{head}\n{text}\n\n{distribution(errs)}\n\nBy system: {breakdown(rows, 'system')}."
            f"\n\nBy axes: {breakdown(rows, 'axes')}.\n\n{worst(rows)}\n")
    md = rows_path.with_suffix(".md")
    write_text(md, body)
    if errs:
        cdf_plot(errs, rows_path.with_name(rows_path.stem + "_cdf.png"),
                 f"{len(errs)} rows, {n_runs} runs, {time.strftime('%Y-%m-%d', time.gmtime())}")
    write_json(rows_path, rows)
    return body


def estimate_s(point: dict, system: str, repeats: int) -> float:
    """A run's wall time guessed from the model: the overhead plus the iterations dilated by a
    T that grows with the workers on this machine's cores."""
    m = model_of(document(point), system, 1.0)
    workers = P * point["D"]
    dilation = TimeScale(max(1.0, workers / 4))
    return repeats * (RUN_OVERHEAD_S + RUN_OVERHEAD_S_PER_WORKER * workers
                      + ITERATIONS * dilation.emulated_span(m["iteration_s"]))


def plan(points: list[dict], repeats: int) -> float:
    total = 0.0
    for p in points:
        for s in p["systems"]:
            est = estimate_s(p, s, repeats)
            total += est
            m = model_of(document(p), s, 1.0)
            print(f"{p['id']:>14} {s:>8}: {label(p)}; summed burst "
                  f"{summed_burst(p, s) / 1e3:.0f} kB; model {m['iteration_s']:.3f} s, bubble "
                  f"{m['bubble']:.3f}; ~{est:.0f} s for {repeats} runs", file=sys.stderr)
    return total


_child_group: list[int] = []


def _children() -> list[int]:
    """The process ids whose parent is this process (the run run_once started)."""
    me, kids = os.getpid(), []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                    kids.append(int(d.name))
            except (OSError, ValueError, IndexError):
                pass
    return kids


class Stop(Exception):
    pass


def _on_term(signum, frame) -> None:
    raise Stop(signal.Signals(signum).name)


def run_grid(args, points: list[dict], rows_path: Path) -> tuple[list[dict], str]:
    out = Path(args.out)
    runs = out / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    log = open(out / "runs.log", "a")
    rows: list[dict] = []
    if args.resume and rows_path.exists():
        rows = json.loads(rows_path.read_text())
    have = {(r["point"], r["system"]): r for r in rows}
    todo = []
    for p in points:
        for s in p["systems"]:
            row = have.get((p["id"], s))
            if row is None:
                row = new_row(p, s)
                rows.append(row)
                have[(p["id"], s)] = row
            for i in range(len(row["repeats"]), args.repeats):
                todo.append((p, s, row, i))
    est = sum(estimate_s(p, s, 1) for p, s, _, _ in todo)
    print(f"grid: {len(points)} points, {len(rows)} (point, system) rows, {len(todo)} runs "
          f"({args.repeats} repeats per row{'; the issue asks for 3' if args.repeats < 3 else ''})"
          f"; estimated {est / 60:.0f} min", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _on_term)
    t0 = time.monotonic()
    note = ""
    try:
        for n, (p, s, row, i) in enumerate(todo, 1):
            m, where, wall = run_once(row["document"], s, AUTO, runs, log, tag=f"r{i}")
            if m is None:
                rec = {"failed": where, "run_wall_s": round(wall, 1)}
                said = f"FAILED {where[:200]}"
            else:
                rec = repeat_record(m, where, wall)
                said = (f"{rec['iteration_s']:.3f} s (T={rec['time_scale']:g}, overruns "
                        f"{rec['overrun_share']:.1%}, retrans {rec['tcp_retransmits']})")
            row["repeats"].append(rec)
            write_json(rows_path, rows)
            done = time.monotonic() - t0
            left = est * (1 - n / len(todo)) if n < len(todo) else 0.0
            rate = done / n
            print(f"[{n}/{len(todo)}] {p['id']} {s} repeat {i + 1}: {said} ({wall:.0f} s); "
                  f"elapsed {done / 60:.1f} min, ~{rate * (len(todo) - n) / 60:.0f} min left "
                  f"(model estimate {left / 60:.0f})", file=sys.stderr, flush=True)
    except (Stop, KeyboardInterrupt) as e:
        note = f"Stopped early ({e or 'interrupted'}) after {(time.monotonic() - t0) / 60:.0f} min."
        print(f"stopping: {note}", file=sys.stderr, flush=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for pid in _children():
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        time.sleep(5)
        subprocess.run([sys.executable, str(REPO / "run_testbed.py"), "cleanup"], cwd=REPO)
    log.close()
    rows = [r for r in rows if r["repeats"]] if note else rows
    return rows, note + f" Wall time {(time.monotonic() - t0) / 60:.0f} min."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/bench-model-grid",
                    help="run folders (OUT/runs) and their log (OUT/runs.log)")
    ap.add_argument("--rows", default=str(REPO / "docs" / "model_grid.json"),
                    help="the rows (JSON); the table and CDF go beside it (.md, _cdf.png)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--points", default=None, help="comma-separated point ids (default: all)")
    ap.add_argument("--systems", default=None, help="comma-separated: only these systems")
    ap.add_argument("--resume", action="store_true",
                    help="keep --rows' repeats and run only the missing ones")
    ap.add_argument("--dry-run", action="store_true",
                    help="no runs: the points, their bursts, the model, the time estimate")
    ap.add_argument("--remodel", metavar="ROWS_JSON", default=None,
                    help="no runs: the table and CDF of ROWS_JSON with the model as it is now")
    args = ap.parse_args()
    points = POINTS
    if args.points:
        want = args.points.split(",")
        unknown = set(want) - {p["id"] for p in POINTS}
        if unknown:
            ap.error(f"unknown points: {sorted(unknown)}")
        points = [p for p in POINTS if p["id"] in want]
    if args.systems:
        only = set(args.systems.split(","))
        points = [dict(p, systems=tuple(s for s in p["systems"] if s in only)) for p in points]
        points = [p for p in points if p["systems"]]
    if args.remodel:
        path = Path(args.remodel)
        print(report(json.loads(path.read_text()), path, "Redrawn with --remodel."))
        return 0
    if args.dry_run:
        total = plan(points, args.repeats)
        systems = sorted({s for p in points for s in p["systems"]})
        print(f"{len(points)} points, {sum(len(p['systems']) for p in points)} (point, system) "
              f"rows, systems {', '.join(systems)}; {args.repeats} repeats: "
              f"~{total / 60:.0f} min", file=sys.stderr)
        return 0
    rows_path = Path(args.rows)
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    rows, note = run_grid(args, points, rows_path)
    print(report(rows, rows_path, note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
