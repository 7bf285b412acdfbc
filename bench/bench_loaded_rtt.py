#!/usr/bin/env python3
"""Benchmark: does every WAN link hold its delay while the CPUs are busy? Prints figures only.

For each WAN link of a scenario (default: a triangle of 3 DCs, one-way 10, 20 and 40 ms, all
100 Mbit/s; or --scenario topologies/X.yaml), ping between the first hosts of the link's two DCs
(200 pings 10 ms apart by default), first on an idle machine, then beside (cpu_count + 1) Python
processes running torch matmuls on one thread each (started in the root namespace, stopped by
PID at the end, always). Printed per link, next to the configured RTT (2 x delay_ms):

    idle and loaded RTT p50 / p99 / max
    target: loaded p99 within max(0.5 ms, 2%) of 2 x delay, loaded max within 1 ms of it
    late_ms max: how late the delay lines released packets (Network.wan_stats() over exactly
                 each ping, the larger of the link's two directions), idle / loaded
    steal %:     CPU time this VM's host took meanwhile (/proc/stat): stalls no priority
                 inside the guest prevents; a MISS beside a high steal is the host's

Rows for the delay lines at real-time priority (Network(..., realtime=True)) and at normal
priority (realtime=False), with each network's realtime_status. The load is testbed.run.cpuload.

Precision: p50 and p99 come from ping's per-reply lines, which iputils prints to 3 significant
digits (0.1 ms at 10-99 ms RTT, 1 ms from 100 ms); max comes from ping's summary line (us).

    sudo .venv/bin/python bench/bench_loaded_rtt.py [--scenario topologies/three_dc.yaml]
         [--count 200] [--interval-s 0.01] [--realtime on,off] [--out results]
Writes results/bench-loaded-rtt-<time>/bench.json and prints `results: PATH` last.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.spec.errors import ScenarioError  # noqa: E402
from testbed.emulation.network import Network  # noqa: E402
from testbed.emulation.results import new_run_dir, provenance, write_json  # noqa: E402
from testbed.spec.scenario import Scenario, load_scenario, parse_scenario  # noqa: E402
from testbed.plans.topo import WanPlan  # noqa: E402
from testbed.emulation.machine import CpuTimes  # noqa: E402
from testbed.emulation.tools import ping  # noqa: E402
from testbed.run.cpuload import CpuLoad  # noqa: E402

TRIANGLE_DELAYS_MS = (10.0, 20.0, 40.0)
TRIANGLE_RATE_MBIT = 100.0
P99_TOL_MS, P99_TOL_FRACTION = 0.5, 0.02
MAX_TOL_MS = 1.0
@dataclass(frozen=True, kw_only=True, slots=True)
class RttStats:
    samples: int
    loss_pct: float
    p50_ms: float
    p99_ms: float
    max_ms: float          # ping's summary (us precision)


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkRow:
    link: str
    delay_ms: float
    want_rtt_ms: float
    realtime: str            # "on", "off" or "n/a"
    idle: RttStats
    loaded: RttStats
    p99_err_ms: float
    max_err_ms: float
    p99_ok: bool
    max_ok: bool
    late_idle_max_ms: float | None
    late_loaded_max_ms: float | None
    steal_idle_pct: float      # CPU time this VM's host took during the pings (/proc/stat)
    steal_loaded_pct: float


def triangle() -> Scenario:
    """3 DCs (names no test uses), one host each, links of 10, 20 and 40 ms one way."""
    names = ("bxa", "bxb", "bxc")
    pairs = ((names[0], names[1]), (names[1], names[2]), (names[0], names[2]))
    return parse_scenario({
        "name": "bench_loaded_rtt",
        "dcs": [{"name": n, "hosts": 1} for n in names],
        "wan": [{"between": list(p), "delay_ms": d, "rate_mbit": TRIANGLE_RATE_MBIT}
                for p, d in zip(pairs, TRIANGLE_DELAYS_MS)]})


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def rtt_stats(result: ping.PingResult) -> RttStats:
    samples = list(result.samples_ms)
    return RttStats(samples=len(samples), loss_pct=round(result.loss_pct, 1),
                    p50_ms=percentile(samples, 50), p99_ms=percentile(samples, 99),
                    max_ms=result.max_ms)


def measure_rtt(net: Network, w: WanPlan, count: int, interval_s: float,
                tag: str) -> tuple[RttStats, float | None, float]:
    """Ping across the link; with the delay lines' lateness over exactly the ping (the largest
    of the link's two directions), where the Network can report it."""
    src = net.plan.hosts_in(w.link.a)[0]
    dst = net.plan.hosts_in(w.link.b)[0]
    net.run(src.name, ping.ping_argv(dst.ip, 3, 0.05), timeout_s=10, name="ping-warmup")  # ARP
    net.wan_stats()  # starts a new interval
    cpu0 = CpuTimes.now()
    out = net.run(src.name, ping.ping_argv(dst.ip, count, interval_s),
                  timeout_s=count * interval_s * 3 + 20, name=f"ping-{tag}")
    stats = net.wan_stats()
    net.check()
    found = [stats[key]["lateness_ms"]["max"] for key in map(str, w.link.directions)
             if key in stats]
    steal = cpu0.usage(CpuTimes.now())["steal_pct"]
    return rtt_stats(ping.parse_ping(out)), (max(found) if found else None), steal


# ---- one network --------------------------------------------------------------------------------
def run_network(scenario: Scenario, run_dir: Path, realtime: bool, count: int,
                interval_s: float, workers: int | None) -> tuple[list[LinkRow], dict[str, Any]]:
    label = "on" if realtime else "off"
    folder = run_dir / f"realtime-{label}"
    rows: list[LinkRow] = []
    info: dict[str, Any] = {"realtime": label}
    with Network(scenario, folder, realtime=realtime) as net:
        info["backend"] = net.backend
        info["realtime_status"] = dict(net.realtime_status)
        print(f"  built in {net.timings_s['up']:.1f} s (backend {net.backend}); realtime {label}: "
              f"{info['realtime_status']}", flush=True)
        idle: dict[int, tuple[RttStats, float | None]] = {}
        for w in net.plan.wan:
            st, late, steal = measure_rtt(net, w, count, interval_s, "idle")
            idle[w.index] = (st, late, steal)
            print(f"  idle   {w.link.a}<->{w.link.b}: p50 {st.p50_ms:.2f}  p99 {st.p99_ms:.2f}  "
                  f"max {st.max_ms:.3f} ms (want {2 * w.link.delay_ms:g})", flush=True)
        load = CpuLoad(folder / "logs", workers)
        try:
            took = load.start()
            info["load_workers"] = load.workers
            print(f"  {load.workers} CPU load workers running (started in {took:.1f} s)",
                  flush=True)
            for w in net.plan.wan:
                st, late, steal = measure_rtt(net, w, count, interval_s, "loaded")
                want = 2 * w.link.delay_ms
                idle_st, idle_late, idle_steal = idle[w.index]
                p99_err, max_err = st.p99_ms - want, st.max_ms - want
                rows.append(LinkRow(
                    link=f"{w.link.a}<->{w.link.b}", delay_ms=w.link.delay_ms, want_rtt_ms=want,
                    realtime=label, idle=idle_st, loaded=st, p99_err_ms=round(p99_err, 3),
                    max_err_ms=round(max_err, 3),
                    p99_ok=abs(p99_err) <= max(P99_TOL_MS, P99_TOL_FRACTION * want),
                    max_ok=abs(max_err) <= MAX_TOL_MS,
                    late_idle_max_ms=idle_late, late_loaded_max_ms=late,
                    steal_idle_pct=idle_steal, steal_loaded_pct=steal))
                print(f"  loaded {w.link.a}<->{w.link.b}: p50 {st.p50_ms:.2f}  "
                      f"p99 {st.p99_ms:.2f}  max {st.max_ms:.3f} ms (want {want:g})", flush=True)
        finally:
            load.stop()
    info["up_s"] = round(net.timings_s.get("up", 0.0), 2)
    return rows, info


# ---- report -------------------------------------------------------------------------------------
def print_table(rows: list[LinkRow]) -> None:
    has_late = any(r.late_loaded_max_ms is not None for r in rows)
    head = (f"{'link':<12} {'rt':>3} {'want':>6} | {'idle p50':>8} {'p99':>6} {'max':>7} | "
            f"{'loaded p50':>10} {'p99':>6} {'max':>7} | {'p99 err':>7} {'':4} {'max err':>7} "
            f"{'':4}")
    if has_late:
        head += f" | {'late_ms max':>11} (idle / loaded)"
    head += " | steal % (idle / loaded)"
    print(head)
    for r in rows:
        line = (f"{r.link:<12} {r.realtime:>3} {r.want_rtt_ms:>6g} | {r.idle.p50_ms:>8.1f} "
                f"{r.idle.p99_ms:>6.1f} {r.idle.max_ms:>7.3f} | {r.loaded.p50_ms:>10.1f} "
                f"{r.loaded.p99_ms:>6.1f} {r.loaded.max_ms:>7.3f} | {r.p99_err_ms:>+7.2f} "
                f"{_ok(r.p99_ok):4} {r.max_err_ms:>+7.3f} {_ok(r.max_ok):4}")
        if has_late:
            line += f" | {_fmt(r.late_idle_max_ms):>5} / {_fmt(r.late_loaded_max_ms)}"
        line += f" | {r.steal_idle_pct:g} / {r.steal_loaded_pct:g}"
        if r.loaded.loss_pct or r.idle.loss_pct:
            line += f"  (ping loss idle {r.idle.loss_pct:g}%, loaded {r.loaded.loss_pct:g}%)"
        print(line)


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _ok(flag: bool) -> str:
    return "ok" if flag else "MISS"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", help="a scenario file (default: a 10/20/40 ms triangle)")
    ap.add_argument("--count", type=int, default=200, help="pings per link and phase")
    ap.add_argument("--interval-s", type=float, default=0.01)
    ap.add_argument("--realtime", default="on,off",
                    help="delay-line priority rows: on,off | on | off")
    ap.add_argument("--workers", type=int, default=None,
                    help="CPU load processes (default cpus + 1)")
    ap.add_argument("--out", default="results")
    args = ap.parse_args()
    modes = [m.strip() for m in args.realtime.split(",") if m.strip()]
    if not modes or any(m not in ("on", "off") for m in modes):
        ap.error("--realtime: use on,off, on or off")
    if args.count < 2 or args.interval_s <= 0:
        ap.error("--count must be >= 2 and --interval-s > 0")
    try:
        scenario = load_scenario(args.scenario) if args.scenario else triangle()
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    realtimes = [m == "on" for m in modes]
    run_dir = new_run_dir(Path(args.out), "bench-loaded-rtt")
    doc: dict[str, Any] = {"env": provenance(), "scenario": scenario.name,
                           "settings": {"count": args.count, "interval_s": args.interval_s,
                                        "workers": args.workers or (os.cpu_count() or 1) + 1},
                           "networks": [], "rows": []}
    t0 = time.monotonic()
    rows: list[LinkRow] = []
    for i, rt in enumerate(realtimes):
        label = "on" if rt else "off"
        print(f"{i + 1}/{len(realtimes)}. {scenario.name}, delay lines realtime {label}: "
              f"{len(scenario.wan)} links x {args.count} pings at {args.interval_s * 1e3:g} ms, "
              f"idle then loaded", flush=True)
        got, info = run_network(scenario, run_dir, rt, args.count, args.interval_s, args.workers)
        rows += got
        doc["networks"].append(info)
    doc["rows"] = [asdict(r) for r in rows]
    print(f"\nRTT ms, ping between the first hosts of each link's DCs; want = 2 x delay_ms; "
          f"rt = delay lines at real-time priority.\np50/p99 from per-reply times (iputils prints "
          f"3 significant digits: 0.1 ms at 10-99 ms, 1 ms from 100 ms); max from ping's summary "
          f"(us).\ntarget: loaded p99 within max({P99_TOL_MS:g} ms, {P99_TOL_FRACTION:.0%}) of "
          f"want, loaded max within {MAX_TOL_MS:g} ms (ok = within target, MISS = not). "
          f"Load: {doc['settings']['workers']} single-thread torch matmul processes.")
    print_table(rows)
    for info in doc["networks"]:
        print(f"realtime {info['realtime']}: {info['realtime_status']}")
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    path = write_json(run_dir / "bench.json", doc)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the network was torn down on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
