"""Calibration: measure every WAN link of a built network with real tools, compare with config.

One job: for each link a<->b, between the first host of a and the first host of b:
  - rtt_ms:             mean ping RTT on the idle path, after an ARP warm-up (2 x delay_ms)
  - goodput_mbit:       iperf3 TCP goodput with N parallel flows, at the receiver, steady state
                        (median of 1 s intervals from 2 s on; see testbed.emulation.tools.iperf)
  - goodput_reverse_mbit: the same, b -> a (the rate is per direction)
  - goodput_1flow_mbit: one flow (with `scale`, window-limited: advertised window / RTT)
  - rtt_loaded_ms:      mean ping RTT while a kernel-paced TCP load runs at LOAD_FRACTION of the
                        rate in the same direction (the delay line must hold its delay under
                        load; queueing from overdriving the link is left out on purpose)
Goodput is TCP payload; HTB counts Ethernet frames, so the ceiling at MTU 1500 is
1448/1514 = 95.6% of the configured rate. Every iperf3 sender runs the scenario's
congestion_control (-C). On a lossy link one reno flow is expected at the Mathis et al. (1997)
rate, MSS / RTT x sqrt(3/2) / sqrt(p); cubic and bbr are reported beside that figure.

Paths: for every ordered DC pair, a ping between the pairs' first hosts checks that its traffic
takes the planned path (`testbed.plans.routing`): RTT = the path's delay there and back, and the reply's
TTL counts the gateways it crossed.

time_scale T: the network runs T times slower (testbed.spec.scenario.Scenario.emulated); every figure
here is measured against the emulated link, then reported in real time (times / T, rates x T).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from testbed.emulation import wanstats
from testbed.spec.errors import TestbedError
from testbed.emulation.network import Network, scaled_tcp_rmem_max_bytes
from testbed.plans.routing import Path, dc_paths
from testbed.spec.scenario import ETH_FRAME_BYTES, RCV_WINDOW_FRACTION, TCP_MSS_BYTES
from testbed.plans.topo import WanPlan
from testbed.emulation.tools import iperf, ping
from testbed.spec.timescale import TimeScale

LOAD_FRACTION = 0.9          # paced load for rtt_loaded_ms, as a fraction of rate_mbit
TCP_PAYLOAD_FRACTION = TCP_MSS_BYTES / ETH_FRAME_BYTES
MATHIS_C = math.sqrt(3 / 2)
RTT_ABS_TOL_MS = 0.5          # the network issue's idle-RTT target: max(0.5 ms, 2%)
RTT_REL_TOL = 0.02
BASE_PORT = 5201


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    seconds: float = 6.0     # per iperf3 test, after a 1 s omitted warm-up; goodput is over the
                             # receiver's intervals from 2 s on, or from 1 s for seconds < 3
                             # (iperf.steady_cut_s), so seconds >= 2
    streams: int = 4
    ping_count: int = 21
    ping_interval_s: float = 0.1
    check_paths: bool = True  # ping every ordered DC pair along its planned path


def predicted_goodput_mbit(net: Network, w: WanPlan, streams: int) -> float:
    """Expected goodput of `streams` flows: the link's TCP ceiling, or with `scale` the sum of
    the flows' window limits if that is lower."""
    cap = w.link.rate_mbit * TCP_PAYLOAD_FRACTION
    return min(cap, streams * predicted_1flow_mbit(net, w))


def predicted_1flow_mbit(net: Network, w: WanPlan) -> float:
    """One TCP flow has at most the advertised window (the payload share of the real server's
    receive buffer, divided by `scale`) in flight per RTT: goodput = window / RTT, capped by
    the link; with loss and reno, by the Mathis rate too."""
    rmem_max = scaled_tcp_rmem_max_bytes(net.scenario.scale)
    rtt_s = 2 * w.link.delay_ms / 1e3
    window_bytes = rmem_max * RCV_WINDOW_FRACTION
    window_mbit = window_bytes * 8 / rtt_s / 1e6 if rtt_s > 0 else float("inf")
    best = min(window_mbit, w.link.rate_mbit * TCP_PAYLOAD_FRACTION)
    mathis = mathis_mbit(w.link.delay_ms, w.link.loss_pct)
    if mathis is not None and net.scenario.congestion_control == "reno":
        best = min(best, mathis)
    return best


def mathis_mbit(delay_ms: float, loss_pct: float) -> float | None:
    """Mathis et al. (1997): a loss-limited reno flow's goodput, MSS / RTT x sqrt(3/2) / sqrt(p)
    (p: the data packets' loss probability, here the link's loss_pct per direction)."""
    if loss_pct <= 0 or delay_ms <= 0:
        return None
    rtt_s = 2 * delay_ms / 1e3
    return TCP_MSS_BYTES * 8 / rtt_s * MATHIS_C / math.sqrt(loss_pct / 100) / 1e6


def measure_link(net: Network, w: WanPlan, settings: Settings, port: int) -> dict[str, Any]:
    src = net.plan.hosts_in(w.link.a)[0]
    dst = net.plan.hosts_in(w.link.b)[0]
    idle = _ping(net, src.name, dst.ip, settings)
    ts = net.scenario.dilation  # settings are in real time; the network runs T times slower
    multi = measure_goodput(net, src.name, dst.name, port, settings.seconds,
                            streams=settings.streams, ts=ts)
    net.check()
    reverse = measure_goodput(net, dst.name, src.name, port, settings.seconds,
                              streams=settings.streams, ts=ts)
    net.check()
    if settings.streams == 1:
        single = multi           # the same measurement: one flow a -> b
    else:
        single = measure_goodput(net, src.name, dst.name, port, settings.seconds, ts=ts)
        net.check()
    mathis = mathis_mbit(w.link.delay_ms, w.link.loss_pct)
    loaded, load = _ping_under_load(net, src.name, dst.name, dst.ip, port, settings,
                                    load_mbit=LOAD_FRACTION * w.link.rate_mbit * TCP_PAYLOAD_FRACTION)
    net.check()
    return {
        "between": [w.link.a, w.link.b],
        "hosts": [src.name, dst.name],
        "configured": {"delay_ms": w.link.delay_ms, "rate_mbit": w.link.rate_mbit,
                       "jitter_ms": w.link.jitter_ms, "loss_pct": w.link.loss_pct,
                       "queue_bytes": w.link.queue_bytes},
        "measured": {"rtt_ms": idle.avg_ms, "rtt_min_ms": idle.min_ms, "rtt_mdev_ms": idle.mdev_ms,
                     "rtt_loaded_ms": loaded.avg_ms, "rtt_loaded_mdev_ms": loaded.mdev_ms,
                     "goodput_mbit": round(multi.received_mbit, 2),
                     "goodput_reverse_mbit": round(reverse.received_mbit, 2),
                     "load_mbit": round(load.received_mbit, 2),
                     "goodput_1flow_mbit": round(single.received_mbit, 2),
                     "congestion_control": single.congestion_control,
                     "streams": settings.streams, "retransmits": multi.retransmits,
                     "ping_loss_pct": round(idle.loss_pct, 1),
                     "goodput_intervals_mbit": list(multi.intervals_mbit)},
        "predicted": {"rtt_ms": 2 * w.link.delay_ms,
                      "goodput_max_mbit": round(w.link.rate_mbit * TCP_PAYLOAD_FRACTION, 2),
                      "goodput_mbit": round(predicted_goodput_mbit(net, w, settings.streams), 2),
                      "goodput_reverse_mbit": round(predicted_goodput_mbit(net, w, settings.streams), 2),
                      "goodput_1flow_mbit": round(predicted_goodput_mbit(net, w, 1), 2),
                      "mathis_mbit": None if mathis is None else round(mathis, 3)},
        "samples": {"rtt_ms": list(idle.samples_ms), "rtt_loaded_ms": list(loaded.samples_ms)},
    }


def measure_path(net: Network, there: Path, back: Path, settings: Settings) -> dict[str, Any]:
    """ping between the first hosts of there.src and there.dst: RTT (median reply) against the
    planned path's delay there and back, and the gateways crossed (from the reply's TTL)
    against back's."""
    src = net.plan.hosts_in(there.src)[0]
    dst = net.plan.hosts_in(there.dst)[0]
    r = _ping(net, src.name, dst.ip, settings)
    want_ms = there.delay_ms + back.delay_ms
    tol_ms = max(RTT_ABS_TOL_MS, RTT_REL_TOL * want_ms)
    ttl = ping.reply_ttl(r)
    gateways = None if ttl is None else 64 - ttl
    # Judged on the median reply (one scheduling hiccup on a busy machine cannot move it).
    median_ms = statistics.median(r.samples_ms) if r.samples_ms else r.avg_ms
    ok = abs(median_ms - want_ms) <= tol_ms and gateways == back.hops + 1
    return {"from": there.src, "to": there.dst, "hosts": [src.name, dst.name],
            "path": list(there.dcs), "return_path": list(back.dcs), "hops": there.hops,
            "predicted": {"rtt_ms": want_ms, "tolerance_ms": tol_ms,
                          "gateways_back": back.hops + 1},
            "measured": {"rtt_ms": median_ms, "rtt_avg_ms": r.avg_ms, "rtt_min_ms": r.min_ms,
                         "rtt_max_ms": r.max_ms, "gateways_back": gateways},
            "ok": ok}


def calibrate(net: Network, settings: Settings = Settings(),
              progress: Callable[[str], None] = print) -> dict[str, Any]:
    links = []
    total = len(net.plan.wan)
    net.wan_stats()  # counts from here on
    for i, w in enumerate(net.plan.wan):
        progress(f"[{i + 1}/{total}] measuring {w.link.a} <-> {w.link.b} "
                 f"({w.link.delay_ms:g} ms, {w.link.rate_mbit:g} Mbit/s emulated)")
        link = measure_link(net, w, settings, BASE_PORT + i)
        # What the delay lines counted on this link while it was measured (both directions).
        stats = net.wan_stats()
        link["wan"] = {d: stats[d] for d in map(str, w.link.directions) if d in stats}
        underlay = net.underlay_of(w.index)
        if underlay is not None:   # across servers: the underlay is part of every figure
            link["underlay"] = underlay
        links.append(link)
    planned = {(p.src, p.dst): p for p in dc_paths(net.plan.scenario)}
    paths = []
    if settings.check_paths:
        progress(f"checking the paths of {len(planned)} DC pairs")
        paths = [measure_path(net, p, planned[(p.dst, p.src)], settings) for p in planned.values()]
        net.check()
    doc = {"scenario": net.scenario.name, "backend": net.backend, "scale": net.scenario.scale,
           "time_scale": net.scenario.time_scale, "routing": net.scenario.routing,
           "congestion_control": dict(net.congestion_control),
           "settings": {"seconds": settings.seconds, "streams": settings.streams,
                        "ping_count": settings.ping_count, "load_fraction": LOAD_FRACTION},
           "links": links, "paths": paths,
           "wan_warnings": wanstats.warnings({d: s for link in links for d, s in link["wan"].items()},
                                             net.plan.scenario.wan)}
    return to_real_time(doc, net.scenario.dilation)


_TIME_KEYS = ("delay_ms", "jitter_ms", "rtt_ms", "rtt_avg_ms", "rtt_min_ms", "rtt_max_ms", "rtt_mdev_ms",
              "rtt_loaded_ms", "rtt_loaded_mdev_ms", "tolerance_ms")
_RATE_KEYS = ("rate_mbit", "goodput_mbit", "goodput_reverse_mbit", "load_mbit",
              "goodput_1flow_mbit", "goodput_max_mbit", "mathis_mbit", "goodput_intervals_mbit")


def to_real_time(doc: dict[str, Any], ts: TimeScale) -> dict[str, Any]:
    """A calibration measured on a network dilated by ts, in real-time figures: every time
    divided by it, every rate multiplied (in place; returns doc)."""
    if not ts.dilated:
        return doc
    # One factor per kind, each value times it: a time is x * (1 / T), as it always was, not
    # ts.real_span(x) = x / T (which may differ in the last bit).
    per_time, per_rate = ts.real_span(1), ts.real_rate(1)
    for item in doc["links"] + doc["paths"]:
        for block in ("configured", "measured", "predicted", "samples"):
            d = item.get(block, {})
            for key, value in d.items():
                if value is None or isinstance(value, (bool, str)):
                    continue
                f = per_time if key in _TIME_KEYS else per_rate if key in _RATE_KEYS else None
                if f is None:
                    continue
                d[key] = [x * f for x in value] if isinstance(value, list) else value * f
    doc["figures"] = (f"real time: measured on a network {ts}x slower, divided back; "
                      "the delay lines' counters (links[].wan: lateness, arrival lag, interval) "
                      "stay in emulated time")
    return doc


def table(doc: dict[str, Any]) -> str:
    """Configured vs measured, with error %, one row per link and quantity. Goodput is also
    compared with what TCP can carry (`expected`: 95.6% of the rate at MTU 1500, or the window
    limit with `scale`)."""
    rows = [("link", "quantity", "configured", "expected", "measured", "error %")]
    for link in doc["links"]:
        name = "<->".join(link["between"])
        c, m, p = link["configured"], link["measured"], link["predicted"]
        rtt = f"{p['rtt_ms']:g}"
        u = link.get("underlay")
        if u is not None:
            rows.append((name, "underlay_rtt_ms", f"{u['servers'][0]}<->{u['servers'][1]}",
                         f"added {2 * u['added_delay_ms']:.3f}", f"{u['rtt_ms']:.3f}",
                         f"jitter {u['jitter_ms']:.3f}"))
        rows.append((name, "rtt_ms", rtt, rtt, f"{m['rtt_ms']:.2f}", _err(m["rtt_ms"], p["rtt_ms"])))
        rows.append((name, "rtt_loaded_ms", rtt, rtt, f"{m['rtt_loaded_ms']:.2f}",
                     _err(m["rtt_loaded_ms"], p["rtt_ms"])))
        for key in ("goodput_mbit", "goodput_reverse_mbit", "goodput_1flow_mbit"):
            rows.append((name, key, f"{c['rate_mbit']:g}", f"{p[key]:.1f}", f"{m[key]:.1f}",
                         _err(m[key], c["rate_mbit"]) + f" ({_err(m[key], p[key])} vs expected)"))
        if p.get("mathis_mbit") is not None:  # one flow on a lossy link vs Mathis (reno)
            rows.append((name, f"1flow_vs_mathis ({m.get('congestion_control') or '?'})",
                         f"loss {c['loss_pct']:g}%", f"{p['mathis_mbit']:.2f}",
                         f"{m['goodput_1flow_mbit']:.2f}",
                         _err(m["goodput_1flow_mbit"], p["mathis_mbit"])))
    return _columns(rows)


def paths_table(doc: dict[str, Any]) -> str:
    """One row per ordered DC pair: the path its traffic takes, expected and measured RTT."""
    rows = [("from", "to", "path", "hops", "expected rtt_ms", "measured rtt_ms", "gateways back",
             "check")]
    for p in doc["paths"]:
        pr, m = p["predicted"], p["measured"]
        rows.append((p["from"], p["to"], " > ".join(p["path"]), str(p["hops"]),
                     f"{pr['rtt_ms']:g} +-{pr['tolerance_ms']:.2g}", f"{m['rtt_ms']:.2f}",
                     f"{m['gateways_back']} (want {pr['gateways_back']})",
                     "ok" if p["ok"] else "MISMATCH"))
    return _columns(rows)


def _columns(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip()
                     for r in rows)


def _err(measured: float, want: float) -> str:
    return f"{100 * (measured - want) / want:+.1f}" if want else "-"


def _ping(net: Network, src: str, dst_ip: str, s: Settings) -> ping.PingResult:
    ts = net.scenario.dilation
    net.run(src, ping.ping_argv(dst_ip, 2, ts.emulated_span(0.2)), timeout_s=ts.emulated_span(10),
            name="ping-warmup")  # ARP
    interval_s = ts.emulated_span(s.ping_interval_s)
    out = net.run(src, ping.ping_argv(dst_ip, s.ping_count, interval_s),
                  timeout_s=ts.emulated_span(s.ping_count * interval_s + 10), name="ping")
    return ping.parse_ping(out)


def start_iperf_server(net: Network, host: str, port: int):
    """An iperf3 server (one test) in host, returned once it listens on port."""
    proc = net.spawn(host, iperf.server_argv(port), net.run_dir / "logs" / f"{host}-iperf3-s-{port}.log")
    deadline = time.monotonic() + 5
    while not net.listening(host, proc, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"iperf3 server in {host} did not start: {proc.output()}")
        time.sleep(0.02)
    return proc


def measure_goodput(net: Network, src: str, dst: str, port: int, seconds: float, *,
                    streams: int = 1, rate_mbit: float | None = None,
                    congestion_control: str | None = None,
                    ts: TimeScale = TimeScale()) -> iperf.IperfResult:
    """One iperf3 TCP test from host src to host dst (goodput at the receiver, steady state),
    its senders running congestion_control (default: the scenario's). seconds, the warm-up
    (1 s) and the steady-state cut are real time: on a network ts times slower they last that
    much longer (the figures stay emulated: to_real_time converts them)."""
    server = start_iperf_server(net, dst, port)
    try:
        argv = iperf.client_argv(net.host_ip(dst), port, seconds=ts.emulated_span(seconds),
                                 omit_s=ts.emulated_span(1), streams=streams, rate_mbit=rate_mbit,
                                 congestion_control=congestion_control
                                 or net.scenario.congestion_control)
        out = net.run(src, argv,
                      timeout_s=ts.emulated_span(seconds + 20), name=f"iperf3-c-P{streams}")
        server.wait(5)
    finally:
        server.stop()
    return iperf.parse_iperf(out, steady_from_s=ts.emulated_span(iperf.steady_cut_s(seconds)))


def _ping_under_load(net: Network, src: str, dst: str, dst_ip: str, port: int, s: Settings,
                     load_mbit: float) -> tuple[ping.PingResult, iperf.IperfResult]:
    """ping while paced TCP flows load the link; returns the ping and the load achieved
    (a load that failed is an error, never a silently idle 'loaded' figure). Durations in
    s are real time, stretched by the scenario's time_scale here."""
    ts = net.scenario.dilation
    server = start_iperf_server(net, dst, port)
    count = max(5, int((s.seconds - 1.0) / s.ping_interval_s))
    try:
        argv = iperf.client_argv(dst_ip, port, seconds=ts.emulated_span(s.seconds),
                                 omit_s=ts.emulated_span(1), streams=s.streams,
                                 rate_mbit=load_mbit,
                                 congestion_control=net.scenario.congestion_control)
        client = net.spawn(src, argv, net.run_dir / "logs" / f"{src}-iperf3-load.log")
        time.sleep(ts.emulated_span(1.0))  # let the load reach its rate before sampling
        out = net.run(src, ping.ping_argv(dst_ip, count, ts.emulated_span(s.ping_interval_s)),
                      timeout_s=ts.emulated_span(count * s.ping_interval_s + 10),
                      name="ping-loaded")
        rc = client.wait(ts.emulated_span(s.seconds + 20))
    finally:
        server.stop()
    if rc != 0:
        raise TestbedError(f"the load for rtt_loaded_ms ({src} -> {dst}) failed with exit code "
                           f"{rc}: {client.output(400)}")
    steady_from_s = ts.emulated_span(iperf.steady_cut_s(s.seconds))
    return ping.parse_ping(out), iperf.parse_iperf(client.output(10_000_000),
                                                   steady_from_s=steady_from_s)
