"""Packet-level cross-check of the model's TCP-under-loss rules (testbed/rules/tcploss.py) against
ns-3, past what the emulation can reach (issue 36, item 4: 256-1,024 flows on one 10 Gbit/s
link, unscaled, 0.01-1% random loss). SimAI and ASTRA-sim check their flow models against ns-3;
this does the same for `bulk_goodput_mbit`.

    python3 bench/bench_packet_level.py --setup          # once: ns-3 into its own venv
    .venv/bin/python bench/bench_packet_level.py         # the quick grid (default)
    .venv/bin/python bench/bench_packet_level.py --full  # the full grid, 3 seeds, longer runs
    .venv/bin/python bench/bench_packet_level.py --remodel docs/packet_level.json  # no ns-3

ns-3 is never a dependency of the project: `--setup` makes a separate venv (/var/tmp/
geodc-ns3-venv, or --venv) with `python3 -m venv` and `pip install ns3==3.44.post0` (the PyPI
wheel of ns-3.44; a bare `ns3==3.44` does not match its only 3.44 release, a post-release).
The ns-3 part runs in that venv's python as a subprocess (`--worker`: parameters as JSON on
stdin, results as JSON on stdout); the model side runs in the project's interpreter.

What each point simulates (ns-3.44, one run per seed, RngRun = seed):
- N long-running TCP bulk flows (BulkSendApplication, MaxBytes 0) over a dumbbell: sender hosts
  -- 100 Gbit/s, 0 delay -- router A -- 10 Gbit/s, one-way delay 20 ms (RTT 40 ms) -- router B
  -- 100 Gbit/s, 0 delay -- receiver hosts. The flows are spread over ceil(N / 32) host pairs
  (at most 32 connections a host: ns-3's endpoint demultiplexer is a linear list, and 1,024
  connections on one node made it a third of the run time).
- The bottleneck (router A's device) is a drop-tail queue of one bandwidth-delay product: 10
  Gbit/s x 40 ms of 1502-byte frames = 33,290 packets (its queue disc removed, so that device
  queue is the only one). Random loss with probability p on the data direction only: a
  RateErrorModel (ERROR_UNIT_PACKET) on router B's receiving device.
- TCP: segment 1448 bytes (1500-byte MTU with timestamps), SACK on, ns3::TcpCubic or
  ns3::TcpLinuxReno, SndBufSize = RcvBufSize = 4,592,762 bytes (Linux's tcp_rmem max 6291456 x
  0.73, set as the buffer, so the advertised window is at most that), initial cwnd 10, minimum
  RTO 200 ms, delayed ACK count 2 (Linux-like: an ACK per two segments), ns-3 defaults otherwise
  (PRR recovery, 3 duplicate ACKs / SACK scoreboard for loss detection: no RACK, no pacing).
- Goodput: bytes the receivers' PacketSinks got between the end of the warm-up (a third of the
  simulated time) and the end, over that span. Simulated time is sized per point to a packet
  budget (the model's estimate of the rate, clamped to [--min-sim, --max-sim] seconds), since
  ns-3 processes only about 10-30 thousand packets a wall second here; what each run simulated
  is in the JSON. Measured here (2 shared cores, load 3-5): about 2,500-6,000 packets a wall
  second at 1,024 flows (a 1-second run of a near-saturated 10 Gbit/s link: 260-330 s), about
  10-25 thousand at 16-64 flows; importing ns-3 takes 14-20 s a run. A 1-second run at 1,024
  flows is not steady state: data that crossed the link during the warm-up sits in the
  receivers' out-of-order queues until its holes are resent, so a short window can even show
  more than the link's rate (seen: 10.6 Gbit/s); trust those points only as "fills the link or
  not", and use --full (30 s cap) where the time is there.

The model figure is tcploss.bulk_goodput_mbit(flows, 10000, 40, p, 4592762, cc). Its link
payload rate assumes 1514-byte Ethernet frames; ns-3's point-to-point frames are 1502 bytes, so
ns-3's link cap is 0.8% higher (9,640 vs 9,564 Mbit/s): below 1% on link-bound points, noted.

Prints a table (point, model, ns-3 mean and min..max over seeds, model error vs ns-3, wall
seconds per run) and writes every run's figures to docs/packet_level.json (atomically, after
each run, so an interrupted grid keeps what it finished); --remodel reprints the table from
that JSON against the current model, without ns-3.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path("/var/tmp/geodc-ns3-venv")
DEFAULT_JSON = ROOT / "docs" / "packet_level.json"
NS3_PIN = "ns3==3.44.post0"

RATE_MBIT = 10_000.0
ONE_WAY_MS = 20.0
RTT_MS = 2 * ONE_WAY_MS
WINDOW_BYTES = 4_592_762            # 6291456 x 0.73
SEGMENT = 1448
P2P_FRAME = SEGMENT + 52 + 2        # TCP/IP headers with timestamps, PPP header
QUEUE_PKTS = round(RATE_MBIT * 1e6 * RTT_MS / 1e3 / (P2P_FRAME * 8))   # one BDP: 33,290
ACCESS_RATE = "100Gbps"
FLOWS_PER_HOST = 32
DEL_ACK_COUNT = 2
CC_TYPES = {"cubic": "ns3::TcpCubic", "reno": "ns3::TcpLinuxReno"}

QUICK = {
    "points": [(16, 1e-3), (16, 1e-2), (64, 1e-3), (64, 1e-2), (256, 1e-4), (256, 1e-3),
               (256, 1e-2), (1024, 1e-3), (1024, 1e-2)],
    "seeds": 1, "budget_pkts": 250_000, "min_sim": 1.0, "max_sim": 6.0,
}
FULL = {
    "points": [(f, p) for f in (16, 64, 256, 1024) for p in (1e-4, 1e-3, 1e-2)],
    "seeds": 3, "budget_pkts": 1_500_000, "min_sim": 3.0, "max_sim": 30.0,
}


# ---------------------------------------------------------------- the ns-3 side (ns-3 venv)

def _worker() -> int:
    """Run one point in ns-3: JSON parameters on stdin, JSON results on stdout."""
    params = json.loads(sys.stdin.read())
    t0 = time.perf_counter()
    # cling prints symbol warnings on stderr at import: send fd 2 to /dev/null meanwhile
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        from ns import ns
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)
    t_import = time.perf_counter() - t0

    flows, loss = int(params["flows"]), float(params["loss"])
    sim_s, warm_s = float(params["sim_s"]), float(params["warm_s"])
    cd = ns.Config.SetDefault
    cd("ns3::TcpL4Protocol::SocketType", ns.StringValue(CC_TYPES[params["cc"]]))
    cd("ns3::TcpSocket::SegmentSize", ns.UintegerValue(SEGMENT))
    cd("ns3::TcpSocket::InitialCwnd", ns.UintegerValue(10))
    cd("ns3::TcpSocket::DelAckCount", ns.UintegerValue(DEL_ACK_COUNT))
    cd("ns3::TcpSocket::SndBufSize", ns.UintegerValue(WINDOW_BYTES))
    cd("ns3::TcpSocket::RcvBufSize", ns.UintegerValue(WINDOW_BYTES))
    cd("ns3::TcpSocketBase::Sack", ns.BooleanValue(True))
    cd("ns3::TcpSocketBase::MinRto", ns.TimeValue(ns.MilliSeconds(200)))
    ns.RngSeedManager.SetSeed(1)
    ns.RngSeedManager.SetRun(int(params["seed"]))

    hosts = math.ceil(flows / FLOWS_PER_HOST)
    routers = ns.NodeContainer()
    routers.Create(2)
    senders, receivers = ns.NodeContainer(), ns.NodeContainer()
    senders.Create(hosts)
    receivers.Create(hosts)
    stack = ns.InternetStackHelper()
    stack.Install(routers)
    stack.Install(senders)
    stack.Install(receivers)

    bottle = ns.PointToPointHelper()
    bottle.SetDeviceAttribute("DataRate", ns.StringValue(f"{int(RATE_MBIT)}Mbps"))
    bottle.SetChannelAttribute("Delay", ns.StringValue(f"{ONE_WAY_MS}ms"))
    bottle.SetQueue("ns3::DropTailQueue", "MaxSize", ns.QueueSizeValue(
        ns.QueueSize(f"{QUEUE_PKTS}p")))
    bdevs = bottle.Install(routers.Get(0), routers.Get(1))
    em = ns.CreateObject[ns.RateErrorModel]()
    em.SetAttribute("ErrorRate", ns.DoubleValue(loss))
    em.SetAttribute("ErrorUnit", ns.StringValue("ERROR_UNIT_PACKET"))
    em.SetAttribute("RanVar", ns.StringValue("ns3::UniformRandomVariable[Min=0.0|Max=1.0]"))
    bdevs.Get(1).SetAttribute("ReceiveErrorModel", ns.PointerValue(em))

    access = ns.PointToPointHelper()
    access.SetDeviceAttribute("DataRate", ns.StringValue(ACCESS_RATE))
    access.SetChannelAttribute("Delay", ns.StringValue("0ms"))
    access.SetQueue("ns3::DropTailQueue", "MaxSize", ns.QueueSizeValue(
        ns.QueueSize("100000p")))
    addr = ns.Ipv4AddressHelper()
    addr.SetBase(ns.Ipv4Address("10.255.0.0"), ns.Ipv4Mask("255.255.255.0"))
    addr.Assign(bdevs)
    ns.TrafficControlHelper().Uninstall(bdevs)
    recv_addrs = []
    for i in range(hosts):
        sdev = access.Install(senders.Get(i), routers.Get(0))
        rdev = access.Install(routers.Get(1), receivers.Get(i))
        addr.SetBase(ns.Ipv4Address(f"10.1.{i}.0"), ns.Ipv4Mask("255.255.255.0"))
        addr.Assign(sdev)
        addr.SetBase(ns.Ipv4Address(f"10.2.{i}.0"), ns.Ipv4Mask("255.255.255.0"))
        recv_addrs.append(addr.Assign(rdev).GetAddress(1))
    ns.Ipv4GlobalRoutingHelper.PopulateRoutingTables()

    sinks = []
    apps = ns.ApplicationContainer()
    any_addr = ns.InetSocketAddress(ns.Ipv4Address.GetAny(), 9).ConvertTo()
    for i in range(hosts):
        sink_apps = ns.PacketSinkHelper("ns3::TcpSocketFactory", any_addr).Install(
            receivers.Get(i))
        sink_apps.Start(ns.Seconds(0.0))
        sinks.append(sink_apps.Get(0).GetObject[ns.PacketSink]())
    for f in range(flows):
        i = f % hosts
        bulk = ns.BulkSendHelper("ns3::TcpSocketFactory",
                                 ns.InetSocketAddress(recv_addrs[i], 9).ConvertTo())
        bulk.SetAttribute("MaxBytes", ns.UintegerValue(0))
        bulk.SetAttribute("SendSize", ns.UintegerValue(SEGMENT * 32))
        apps.Add(bulk.Install(senders.Get(i)))
    # start spread over the first 10 ms, as hosts would (no synchronized slow starts)
    start = ns.CreateObject[ns.UniformRandomVariable]()
    for f in range(flows):
        apps.Get(f).SetStartTime(ns.Seconds(start.GetValue(0.0, 0.01)))

    t_built = time.perf_counter()
    ns.Simulator.Stop(ns.Seconds(warm_s))
    ns.Simulator.Run()
    rx0 = sum(s.GetTotalRx() for s in sinks)
    ns.Simulator.Stop(ns.Seconds(sim_s - warm_s))
    ns.Simulator.Run()
    rx1 = sum(s.GetTotalRx() for s in sinks)
    t_end = time.perf_counter()
    ns.Simulator.Destroy()
    out = dict(params)
    out.update({
        "goodput_mbit": (rx1 - rx0) * 8 / (sim_s - warm_s) / 1e6,
        "warmup_goodput_mbit": rx0 * 8 / warm_s / 1e6,
        "hosts": hosts,
        "wall_import_s": round(t_import, 2),
        "wall_build_s": round(t_built - t0 - t_import, 2),
        "wall_sim_s": round(t_end - t_built, 2),
        "sim_packets": round(rx1 / SEGMENT),
    })
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------- the project side

def _setup(venv: Path) -> int:
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", NS3_PIN],
                   check=True)
    print(f"ns-3 ready in {venv}")
    return 0


def model_mbit(flows: int, loss: float, cc: str) -> float:
    sys.path.insert(0, str(ROOT))
    from testbed.rules.tcploss import bulk_goodput_mbit
    return bulk_goodput_mbit(flows, RATE_MBIT, RTT_MS, loss, WINDOW_BYTES, cc)


def sim_seconds(flows: int, loss: float, cc: str, grid: dict) -> float:
    """Simulated time for a point: the packet budget at the model's rate, clamped."""
    pkts_s = model_mbit(flows, loss, cc) * 1e6 / 8 / SEGMENT
    return round(min(grid["max_sim"], max(grid["min_sim"], grid["budget_pkts"] / pkts_s)), 2)


def _run_one(venv: Path, params: dict) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).resolve()),
                           "--worker"], input=json.dumps(params), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ns-3 worker failed for {params}: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def _write_json(path: Path, meta: dict, runs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    key = lambda r: (r["flows"], r["loss"], r["cc"], r["seed"])  # noqa: E731
    tmp.write_text(json.dumps({"meta": meta, "runs": sorted(runs, key=key)}, indent=1) + "\n")
    os.replace(tmp, path)


def meta_block(grid_name: str, grid: dict) -> dict:
    return {
        "what": "ns-3.44 bulk TCP goodput vs testbed.rules.tcploss.bulk_goodput_mbit "
                "(bench/bench_packet_level.py)",
        "grid": grid_name, "rate_mbit": RATE_MBIT, "rtt_ms": RTT_MS,
        "window_bytes": WINDOW_BYTES, "segment_bytes": SEGMENT, "queue_packets": QUEUE_PKTS,
        "del_ack_count": DEL_ACK_COUNT, "min_rto_ms": 200, "initial_cwnd": 10, "sack": True,
        "flows_per_host": FLOWS_PER_HOST, "access": ACCESS_RATE,
        "loss_where": "RateErrorModel ERROR_UNIT_PACKET on the bottleneck's receiving device",
        "measure": "PacketSink bytes after warm_s (sim_s / 3) over sim_s - warm_s",
        "budget_pkts": grid["budget_pkts"], "sim_clamp_s": [grid["min_sim"], grid["max_sim"]],
    }


def table(runs: list[dict]) -> list[str]:
    """The table rows (markdown), one a point, against the current model."""
    points: dict[tuple, list[dict]] = {}
    for r in runs:
        points.setdefault((r["flows"], r["loss"], r["cc"]), []).append(r)
    lines = ["| flows | loss | cc | model Mbit/s | ns-3 Mbit/s (mean) | ns-3 min..max | seeds "
             "| model vs ns-3 | sim s | wall s per run |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (flows, loss, cc), rs in sorted(points.items()):
        got = [r["goodput_mbit"] for r in rs]
        mean = sum(got) / len(got)
        model = model_mbit(flows, loss, cc)
        err = (model - mean) / mean * 100 if mean > 0 else math.inf
        walls = [r.get("wall_s", 0.0) for r in rs]
        lines.append(f"| {flows} | {loss * 100:g}% | {cc} | {model:.0f} | {mean:.0f} | "
                     f"{min(got):.0f}..{max(got):.0f} | {len(rs)} | {err:+.1f}% | "
                     f"{rs[0]['sim_s']:g} | {sum(walls) / len(walls):.0f} |")
    return lines


def remodel(path: Path) -> list[str]:
    data = json.loads(Path(path).read_text())
    return table(data["runs"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help="make the ns-3 venv and exit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--full", action="store_true", help="the full grid (slow)")
    parser.add_argument("--seeds", type=int, help="seeds a point (default: 1 quick, 3 full)")
    parser.add_argument("--jobs", type=int, default=2, help="ns-3 runs at once")
    parser.add_argument("--cc", nargs="+", default=["cubic", "reno"], choices=CC_TYPES)
    parser.add_argument("--flows", nargs="+", type=int, help="only these flow counts")
    parser.add_argument("--out", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--remodel", type=Path, metavar="JSON",
                        help="reprint the table from a JSON of runs, current model, no ns-3")
    args = parser.parse_args(argv)
    if args.worker:
        return _worker()
    if args.setup:
        return _setup(args.venv)
    if args.remodel:
        print("\n".join(remodel(args.remodel)))
        return 0
    if not (args.venv / "bin" / "python").exists():
        print(f"no ns-3 venv at {args.venv}: run with --setup first", file=sys.stderr)
        return 2
    grid_name, grid = ("full", FULL) if args.full else ("quick", QUICK)
    seeds = args.seeds or grid["seeds"]
    jobs = []
    for flows, loss in grid["points"]:
        if args.flows and flows not in args.flows:
            continue
        for cc in args.cc:
            sim = sim_seconds(flows, loss, cc, grid)
            for seed in range(1, seeds + 1):
                jobs.append({"flows": flows, "loss": loss, "cc": cc, "seed": seed,
                             "sim_s": sim, "warm_s": round(sim / 3, 3)})
    # the cheapest first: an interrupted grid has then covered the most points (the JSON is
    # rewritten after each run)
    jobs.sort(key=lambda j: j["sim_s"] * model_mbit(j["flows"], j["loss"], j["cc"]) * j["flows"])
    meta = meta_block(grid_name, grid)
    runs: list[dict] = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(_run_one, args.venv, j) for j in jobs]
        for fut in as_completed(futures):
            out = fut.result()
            runs.append(out)
            _write_json(args.out, meta, runs)
            print(f"  {out['flows']} flows, {out['loss'] * 100:g}%, {out['cc']}, seed "
                  f"{out['seed']}: {out['goodput_mbit']:.0f} Mbit/s "
                  f"(sim {out['sim_s']} s, wall {out['wall_s']} s)", file=sys.stderr,
                  flush=True)
    meta["wall_total_s"] = round(time.perf_counter() - t0, 1)
    _write_json(args.out, meta, runs)
    print("\n".join(table(runs)))
    print(f"\n{len(runs)} runs, {meta['wall_total_s']} s wall with {args.jobs} at once; "
          f"raw figures in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
