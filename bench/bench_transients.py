#!/usr/bin/env python3
"""Benchmark: does a scaled (or time-dilated) WAN keep TCP's transients? Prints figures only.

`scale: S` divides the link rate, each host's TCP buffers and the trainer's messages by S: a
steady window-limited flow then takes the real time for a message, but slow start does not scale
(the initial window stays 10 segments), so the first message after a connection opens, or after
an idle gap, may be faster than on the real link. `time_scale: T` instead runs everything T times
slower (delays x T, rates / T, bytes and buffers kept), so packet counts and round trips are the
real ones; figures are divided back by T. This benchmark measures both against the real link.

Each row sends N messages (one pipeline activation each: the scenario's profile activation bytes
/ S; 33.5 MB for two_dc's target model) with traffic.burst between the hosts of a two-DC network
whose link is the real link (default: topologies/two_dc.yaml's, 20 ms one way, 100 Mbit/s x 100 =
10 Gbit/s) divided by S (and dilated by T), over K TCP connections, with an idle gap between
messages (1 s and 50 ms by default: the gaps a pipeline has), congestion control per socket.
Printed, in REAL time (measured / T):

    first      the first message's transfer (connection fresh: slow start), ms
    later      the other messages: min / median / max, ms
    vs S=1     error % of first and of the later median against the scale-1 row (the real link)
    goodput pred  K x 0.73 x tcp_rmem max / RTT, capped by rate x 1448/1514 (the window limit)
    predicted  a later message under that limit, counted in whole round trips: one window of
               goodput x RTT per RTT, the last byte one way after its round starts (plus that
               round's serialisation); `ss model`: the same for the first message, the window
               starting at 10 segments per connection and doubling per RTT up to the limit

Before the rows of a network whose flows would need >= 1 Gbit/s, an iperf3 probe (8 flows, 3 s)
checks what this machine's delay line can carry at that rate; rows it cannot carry are marked.

    sudo .venv/bin/python bench/bench_transients.py [--quick] [--scenario topologies/two_dc.yaml]
         [--scales 1,10,100] [--cc cubic,bbr] [--connections 1,4] [--gaps-s 1,0.05]
         [--time-scales 10] [--time-scale-scales 1,10] [--messages 8] [--time-scale-messages 5]
         [--out results]
Writes results/bench-transients-<time>/bench.json and prints `results: PATH` last.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.run.calibrate import TCP_PAYLOAD_FRACTION, measure_goodput  # noqa: E402
from testbed.spec.scenario import TCP_MSS_BYTES  # noqa: E402
from testbed.spec.errors import ScenarioError, TestbedError  # noqa: E402
from testbed.emulation.network import REPO_ROOT, Network  # noqa: E402
from testbed.emulation.results import new_run_dir, provenance, write_json  # noqa: E402
from testbed.spec.scenario import (RCV_WINDOW_FRACTION, REAL_TCP_RMEM_MAX_BYTES, Scenario,  # noqa: E402
                              load_scenario, parse_scenario)
from traffic import burst  # noqa: E402
from testbed.spec.timescale import TimeScale  # noqa: E402

# Default message: one activation of two_dc's target model (width 4096 x seq 2048 x micro-batch 2
# x bf16 = 33,554,432 bytes), used when the scenario names no profile to derive it from.
DEFAULT_MESSAGE_BYTES = 33_554_432
INITIAL_WINDOW_SEGMENTS = 10
PROBE_FLOWS, PROBE_SECONDS = 8, 3.0
PROBE_MIN_MBIT = 1000.0      # probe a network whose rows need at least this much goodput
BASE_PORT = 7100
# Measured earlier by hand (a plain socket pair over this testbed, K 1, a message every 1 s):
# (scale, cc) -> (first message ms, later messages ms)
HAND_MEASURED = {(1, "cubic"): ("608", "368-408"), (10, "cubic"): ("485", "366-405"),
                 (100, "cubic"): ("363", "363"), (1, "bbr"): ("633", "318"),
                 (100, "bbr"): ("374", "327")}
DC_A, DC_B = "bya", "byb"    # names no test uses


@dataclass(frozen=True, kw_only=True, slots=True)
class RealLink:
    """The real (unscaled) WAN link and message the rows emulate."""

    delay_ms: float          # one way
    rate_mbit: float
    message_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Case:
    scale: float
    time_scale: float
    cc: str
    connections: int
    gap_s: float             # real-time idle gap (the network sees gap_s x time_scale)

    @property
    def dilation(self) -> TimeScale:
        return TimeScale(self.time_scale)

    def key(self) -> tuple:
        return (self.cc, self.connections, self.gap_s)

    def label(self) -> str:
        t = f" T{self.time_scale:g}" if self.time_scale != 1 else ""
        return (f"S{self.scale:g}{t} {self.cc} K{self.connections} "
                f"gap {self.gap_s * 1e3:g} ms")


@dataclass(kw_only=True, slots=True)
class Row:
    case: Case
    message_bytes: int       # what was sent (real / scale)
    rmem_max_bytes: int      # receiver host's tcp_rmem max
    predicted_goodput_mbit: float   # real time
    predicted_ms: float             # steady message, real time
    slow_start_model_ms: float      # first message, real time
    transfers_ms: list[float] = field(default_factory=list)   # real time, in message order
    probe_mbit: float | None = None  # what the probe carried (emulated), if probed
    feasible: bool = True
    error: str = ""

    @property
    def first_ms(self) -> float | None:
        return self.transfers_ms[0] if self.transfers_ms else None

    @property
    def later_ms(self) -> list[float]:
        return self.transfers_ms[1:]


# ---- set-up -------------------------------------------------------------------------------------
def supports_time_scale() -> bool:
    return "time_scale" in {f.name for f in fields(Scenario)}


def real_link(scenario: Scenario) -> RealLink:
    """The scenario's first WAN link and message, undone from its scale (rates are emulated)."""
    link = scenario.wan[0]
    return RealLink(delay_ms=link.delay_ms, rate_mbit=link.rate_mbit * scenario.scale,
                    message_bytes=message_bytes(scenario))


def message_bytes(scenario: Scenario) -> int:
    """One activation of the scenario's target model (its profile), real size, else the default."""
    if not scenario.training or "profile" not in scenario.training:
        return DEFAULT_MESSAGE_BYTES
    from testbed.spec.training import TrainConfig
    from testbed.spec.profiles import find_block
    cfg = TrainConfig.from_dict(scenario.training)
    if cfg.profile is None:
        return DEFAULT_MESSAGE_BYTES
    return int(find_block(cfg.profile)["activation_bytes"])


def two_dc(real: RealLink, scale: float, time_scale: float) -> Scenario:
    """Two DCs, one host each, joined by the real link divided by scale (and dilated by
    time_scale: the testbed does that, from the scenario field)."""
    data: dict[str, Any] = {
        "name": f"bench_transients_s{scale:g}_t{time_scale:g}",
        "scale": scale,
        "dcs": [{"name": DC_A, "hosts": 1}, {"name": DC_B, "hosts": 1}],
        "wan": [{"between": [DC_A, DC_B], "delay_ms": real.delay_ms,
                 "rate_mbit": real.rate_mbit / scale}]}
    if time_scale != 1:
        data["time_scale"] = time_scale
    return parse_scenario(data)


# ---- predictions (real time) ------------------------------------------------------------------
def predicted_goodput_mbit(real: RealLink, case: Case, rmem_max_bytes: int) -> float:
    """K windows (the advertised share of the receive buffer) per RTT, capped by the link's TCP
    payload rate; real time (a dilated network has T x the RTT and 1/T the rate: same ratio)."""
    rtt_s = 2 * real.delay_ms / 1e3
    window_mbit = case.connections * RCV_WINDOW_FRACTION * rmem_max_bytes * 8 / rtt_s / 1e6
    return min(window_mbit, real.rate_mbit / case.scale * TCP_PAYLOAD_FRACTION)


def window_model_ms(real: RealLink, case: Case, nbytes: int, goodput_mbit: float,
                    initial_window_bytes: float | None = None) -> float:
    """Message time in whole round trips: each RTT the K connections send one window (at most
    the link's payload rate x RTT); the last byte arrives one way after its round starts, plus
    its round's serialisation at the link rate. initial_window_bytes: start there and double per
    RTT up to the steady window (slow start); None: the steady window from the start."""
    rtt_ms = 2 * real.delay_ms
    rate_bps = real.rate_mbit / case.scale * TCP_PAYLOAD_FRACTION * 1e6
    steady = goodput_mbit * 1e6 / 8 * rtt_ms / 1e3       # bytes per RTT
    window = steady if initial_window_bytes is None else min(initial_window_bytes, steady)
    sent, rounds = 0.0, 0
    while sent + window < nbytes:
        sent += window
        rounds += 1
        window = min(2 * window, steady)
    return rounds * rtt_ms + real.delay_ms + (nbytes - sent) * 8 / rate_bps * 1e3


def predicted_ms(real: RealLink, case: Case, nbytes: int, goodput_mbit: float) -> float:
    """A steady message (window already open)."""
    return window_model_ms(real, case, nbytes, goodput_mbit)


def slow_start_model_ms(real: RealLink, case: Case, nbytes: int, goodput_mbit: float) -> float:
    """First message on fresh connections: K x 10 segments, doubling per RTT."""
    return window_model_ms(real, case, nbytes, goodput_mbit,
                           case.connections * INITIAL_WINDOW_SEGMENTS * TCP_MSS_BYTES)


def estimate_s(real: RealLink, cases: list[Case], messages: int, networks: int) -> float:
    """Rough wall time: each row's modelled transfers and gaps (dilated), plus set-up."""
    total = networks * 8.0   # build, probe, teardown
    for c in cases:
        nbytes = int(real.message_bytes / c.scale)
        g = predicted_goodput_mbit(real, c, int(REAL_TCP_RMEM_MAX_BYTES / c.scale))
        row = (slow_start_model_ms(real, c, nbytes, g)
               + (messages - 1) * predicted_ms(real, c, nbytes, g)) / 1e3
        total += c.dilation.emulated_span(row + (messages - 1) * c.gap_s) + 1.5
    return total


# ---- one network --------------------------------------------------------------------------------
def host_rmem_max(net: Network, host: str) -> int:
    out = net.node(host).cmd("cat /proc/sys/net/ipv4/tcp_rmem")
    return int(out.split()[-1])


def flush_tcp_metrics(net: Network, hosts: list[str]) -> None:
    """Forget cached ssthresh/RTT per destination, so each row's first message starts as on a
    fresh connection to a new peer."""
    for h in hosts:
        net.node(h).cmd("ip tcp_metrics flush all 2>/dev/null")


def probe(net: Network, src: str, dst: str, port: int) -> float:
    """Goodput (emulated Mbit/s) of PROBE_FLOWS iperf3 flows: what the delay line can carry."""
    return measure_goodput(net, src, dst, port, PROBE_SECONDS, streams=PROBE_FLOWS).received_mbit


def run_case(net: Network, case: Case, messages: int, port: int, folder: Path, row: Row) -> None:
    """One row: a receiver in byb-h1, a sender in bya-h1; row.transfers_ms from its records."""
    src, dst = f"{DC_A}-h1", f"{DC_B}-h1"
    ts = case.dilation
    out = folder / f"recv-{case.cc}-k{case.connections}-gap{case.gap_s:g}.jsonl"
    out.unlink(missing_ok=True)
    timeout_s = ts.emulated_span(messages * (3 * row.slow_start_model_ms / 1e3 + case.gap_s)) + 60
    gap_s = ts.emulated_span(case.gap_s)   # what the network sees
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    common = ["--port", str(port), "--connections", str(case.connections),
              "--messages", str(messages), "--bytes", str(row.message_bytes), "--cc", case.cc,
              "--timeout-s", f"{timeout_s:.0f}"]
    flush_tcp_metrics(net, [src, dst])
    recv = net.spawn(dst, [sys.executable, "-m", "traffic.burst", "recv", *common,
                           "--bind", net.host_ip(dst), "--out", str(out)],
                     folder / "logs" / f"{dst}-burst-recv.log",
                     env=env)
    try:
        deadline = time.monotonic() + 30
        while "READY" not in recv.output():
            if recv.poll() is not None or time.monotonic() > deadline:
                raise TestbedError(f"burst receiver did not start: {recv.output()[-300:]}")
            time.sleep(0.02)
        sender = net.spawn(src, [sys.executable, "-m", "traffic.burst", "send", *common,
                                 "--host", net.host_ip(dst), "--gap-s", f"{gap_s:g}"],
                           folder / "logs" / f"{src}-burst-send.log", env=env)
        try:
            rc = sender.wait(timeout_s + 10)
        finally:
            sender.stop()
        if rc != 0:
            raise TestbedError(f"burst sender exited with {rc}: {sender.output()[-300:]}")
        if recv.wait(30) != 0:
            raise TestbedError(f"burst receiver failed: {recv.output()[-300:]}")
    finally:
        recv.stop()
    net.check()
    records = burst.read_records(out)
    if ([r.msg for r in records] != list(range(messages))
            or any(r.bytes != row.message_bytes for r in records)):
        raise TestbedError(f"burst records incomplete in {out}")
    row.transfers_ms = [round(ts.real_span(r.transfer_ms), 2) for r in records]


def run_network(real: RealLink, scale: float, time_scale: float, cases: list[Case],
                messages: int, run_dir: Path, do_probe: bool, counter: list[int],
                total: int) -> list[Row]:
    scenario = two_dc(real, scale, time_scale)
    ts = TimeScale(time_scale)
    folder = run_dir / scenario.name
    nbytes = int(real.message_bytes / scale)
    rows: list[Row] = []
    with Network(scenario, folder) as net:
        rmem = host_rmem_max(net, f"{DC_B}-h1")
        link = net.plan.wan[0].link
        print(f"network S{scale:g} T{time_scale:g}: emulated link {link.delay_ms:g} ms, "
              f"{link.rate_mbit:g} Mbit/s; message {nbytes:,} B; receiver tcp_rmem max "
              f"{rmem:,} B; built in {net.timings_s['up']:.1f} s", flush=True)
        for case in cases:
            g = predicted_goodput_mbit(real, case, rmem)
            rows.append(Row(case=case, message_bytes=nbytes, rmem_max_bytes=rmem,
                            predicted_goodput_mbit=round(g, 1),
                            predicted_ms=round(predicted_ms(real, case, nbytes, g), 1),
                            slow_start_model_ms=round(
                                slow_start_model_ms(real, case, nbytes, g), 1)))
        need_mbit = ts.emulated_rate(max(r.predicted_goodput_mbit for r in rows))  # emulated
        if do_probe and need_mbit >= PROBE_MIN_MBIT:
            got = probe(net, f"{DC_A}-h1", f"{DC_B}-h1", BASE_PORT - 1)
            print(f"  probe: {PROBE_FLOWS} iperf3 flows carry {got:.0f} Mbit/s of "
                  f"{link.rate_mbit * TCP_PAYLOAD_FRACTION:.0f} (TCP payload of the rate); "
                  f"rows need up to {need_mbit:.0f}", flush=True)
            for r in rows:
                r.probe_mbit = round(got, 1)
                r.feasible = got >= ts.emulated_rate(0.9 * r.predicted_goodput_mbit)
        for row in rows:
            counter[0] += 1
            case = row.case
            t0 = time.monotonic()
            try:
                run_case(net, case, messages, BASE_PORT + counter[0], folder, row)
            except TestbedError as exc:
                row.error = str(exc)
                print(f"  [{counter[0]}/{total}] {case.label()}: FAILED: {exc}", flush=True)
                continue
            later = row.later_ms
            spread = (f"later {min(later):.0f} / {statistics.median(later):.0f} / "
                      f"{max(later):.0f} ms" if later else "no later messages")
            print(f"  [{counter[0]}/{total}] {case.label()}: first {row.first_ms:.0f} ms, "
                  f"{spread} (predicted {row.predicted_ms:.0f}, ss model "
                  f"{row.slow_start_model_ms:.0f}) in {time.monotonic() - t0:.0f} s", flush=True)
    return rows


# ---- report -------------------------------------------------------------------------------------
def _err(value: float | None, ref: float | None) -> str:
    if value is None or ref is None or ref == 0:
        return "-"
    return f"{100 * (value - ref) / ref:+.0f}%"


def print_table(rows: list[Row]) -> None:
    ref: dict[tuple, Row] = {r.case.key(): r for r in rows
                             if r.case.scale == 1 and r.case.time_scale == 1 and r.transfers_ms}
    print(f"{'S':>4} {'T':>3} {'cc':<5} {'K':>2} {'gap ms':>6} | {'first':>6} {'later min':>9} "
          f"{'median':>6} {'max':>6} | {'vs S=1 first':>12} {'median':>6} | {'predicted':>9} "
          f"{'err':>5} {'ss model':>8} | {'goodput pred':>12}")
    for r in rows:
        c = r.case
        head = (f"{c.scale:>4g} {c.time_scale:>3g} {c.cc:<5} {c.connections:>2} "
                f"{c.gap_s * 1e3:>6g} |")
        if not r.transfers_ms:
            print(f"{head} FAILED: {r.error[:100]}")
            continue
        later = r.later_ms
        mn, med, mx = ((min(later), statistics.median(later), max(later)) if later
                       else (None, None, None))
        base = ref.get(c.key())
        base_med = statistics.median(base.later_ms) if base and base.later_ms else None
        is_ref = base is r
        note = "" if r.feasible else f"  CPU-LIMITED (probe {r.probe_mbit:.0f} Mbit/s)"
        vs_first = "ref" if is_ref else _err(r.first_ms, base.first_ms if base else None)
        vs_med = "ref" if is_ref else _err(med, base_med)
        print(f"{head} {r.first_ms:>6.0f} {_f(mn):>9} {_f(med):>6} {_f(mx):>6} | "
              f"{vs_first:>12} {vs_med:>6} | {r.predicted_ms:>9.0f} {_err(med, r.predicted_ms):>5} "
              f"{r.slow_start_model_ms:>8.0f} | {r.predicted_goodput_mbit:>7.0f} Mbit{note}")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="topologies/two_dc.yaml",
                    help="real link: its first WAN link x its scale; message: its profile's")
    ap.add_argument("--scales", default="1,10,100")
    ap.add_argument("--cc", default="cubic,bbr")
    ap.add_argument("--connections", default="1,4")
    ap.add_argument("--gaps-s", default="1,0.05", help="idle gaps between messages, real seconds")
    ap.add_argument("--time-scales", default="10", help="time_scale rows besides T=1 ('' for none)")
    ap.add_argument("--time-scale-scales", default="1,10", help="scales of the time_scale rows")
    ap.add_argument("--messages", type=int, default=8, help="per row (the first is slow start)")
    ap.add_argument("--time-scale-messages", type=int, default=5,
                    help="per time_scale row (each takes T times as long)")
    ap.add_argument("--message-bytes", type=int, default=None, help="real size (default: profile)")
    ap.add_argument("--no-probe", action="store_true", help="skip the iperf3 capacity probe")
    ap.add_argument("--quick", action="store_true",
                    help="scales 1,100; cubic; K 1; gap 1 s; 4 messages; time_scale 10 at scale 1")
    ap.add_argument("--out", default="results")
    args = ap.parse_args()
    if args.quick:
        args.scales, args.cc, args.connections, args.gaps_s = "1,100", "cubic", "1", "1"
        args.messages, args.time_scale_messages, args.time_scale_scales = 4, 4, "1"
    try:
        scenario = load_scenario(args.scenario)
        scales, gaps = _floats(args.scales), _floats(args.gaps_s)
        ks = [int(x) for x in _floats(args.connections)]
        ccs = [c.strip() for c in args.cc.split(",") if c.strip()]
        tscales = [t for t in _floats(args.time_scales) if t != 1]
        ts_scales = _floats(args.time_scale_scales)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        ap.error(str(exc))
    if min(args.messages, args.time_scale_messages) < 2 or not (scales and ccs and ks and gaps):
        ap.error("give at least one scale, cc, connection count and gap, and --messages and "
                 "--time-scale-messages >= 2")
    real = real_link(scenario)
    if args.message_bytes:
        real = RealLink(delay_ms=real.delay_ms, rate_mbit=real.rate_mbit,
                        message_bytes=args.message_bytes)
    networks = [(s, 1.0) for s in scales]
    if tscales and not supports_time_scale():
        print("note: scenarios have no time_scale field yet: time_scale rows left out", flush=True)
        tscales = []
    networks += [(s, t) for t in tscales for s in ts_scales]
    per_net = [Case(scale=s, time_scale=t, cc=cc, connections=k, gap_s=g)
               for (s, t) in networks for cc, k, g in itertools.product(ccs, ks, gaps)]
    total = len(per_net)
    run_dir = new_run_dir(Path(args.out), "bench-transients")
    est_s = sum(estimate_s(real, [c for c in per_net if (c.scale, c.time_scale) == n],
                           args.messages if n[1] == 1 else args.time_scale_messages, 1)
                for n in networks)
    print(f"real link {real.delay_ms:g} ms one way, {real.rate_mbit:g} Mbit/s; message "
          f"{real.message_bytes:,} B; {len(networks)} networks, {total} rows x {args.messages} "
          f"messages ({args.time_scale_messages} with time_scale); estimated {est_s / 60:.0f} min",
          flush=True)
    doc: dict[str, Any] = {"env": provenance(), "real_link": asdict(real),
                           "settings": {"messages": args.messages,
                                        "time_scale_messages": args.time_scale_messages,
                                        "probe": not args.no_probe},
                           "rows": []}
    t0 = time.monotonic()
    counter = [0]
    rows: list[Row] = []
    for s, t in networks:
        cases = [c for c in per_net if c.scale == s and c.time_scale == t]
        try:
            rows += run_network(real, s, t, cases,
                                args.messages if t == 1 else args.time_scale_messages, run_dir,
                                not args.no_probe, counter, total)
        except (TestbedError, ScenarioError) as exc:
            print(f"network S{s:g} T{t:g} failed: {exc}", flush=True)
            rows += [Row(case=c, message_bytes=0, rmem_max_bytes=0, predicted_goodput_mbit=0,
                         predicted_ms=0, slow_start_model_ms=0, error=str(exc)) for c in cases]
    doc["rows"] = [dict(asdict(r), first_ms=r.first_ms) for r in rows]
    print(f"\nTransfer time per message in REAL time (measured / T), ms: first byte sent to last "
          f"byte received. S = scale, T = time_scale, K = connections, gap = idle time between "
          f"messages.\nvs S=1: error against the scale-1, T=1 row of the same cc, K and gap (the "
          f"real link). goodput pred = K x {RCV_WINDOW_FRACTION} x tcp_rmem max / RTT, capped by "
          f"rate x 1448/1514; predicted = a message at that window, in whole round trips; err = "
          f"later median vs predicted; ss model = the first message, window from 10 segments "
          f"per connection doubling per RTT.")
    print_table(rows)
    print("measured earlier by hand (plain socket pair, K 1, a message every 1 s; first / "
          "later ms): " + "; ".join(f"S{k[0]} {k[1]} {v[0]} / {v[1]}"
                                    for k, v in HAND_MEASURED.items()))
    if any(not r.feasible for r in rows):
        print("CPU-LIMITED: this machine's delay line could not carry the rate those rows need "
              "(probe below 90% of it); their times are slower than the real link's would be.")
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
