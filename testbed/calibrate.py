"""Calibration: measure every WAN link of a built network with real tools, compare with config.

One job: for each link a<->b, between the first host of a and the first host of b:
  - rtt_ms:             mean ping RTT on the idle path, after an ARP warm-up (2 x delay_ms)
  - goodput_mbit:       iperf3 TCP goodput with N parallel flows, at the receiver, steady state
                        (median of 1 s intervals from 2 s on; see traffic.iperf)
  - goodput_reverse_mbit: the same, b -> a (the rate is per direction)
  - goodput_1flow_mbit: one flow (with `scale`, window-limited: advertised window / RTT)
  - rtt_loaded_ms:      mean ping RTT while a kernel-paced TCP load runs at LOAD_FRACTION of the
                        rate in the same direction (the delay line must hold its delay under
                        load; queueing from overdriving the link is left out on purpose)
Goodput is TCP payload; HTB counts Ethernet frames, so the ceiling at MTU 1500 is
1448/1514 = 95.6% of the configured rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from testbed.errors import TestbedError
from testbed.network import Network, scaled_tcp_rmem_max_bytes
from testbed.scenario import RCV_WINDOW_FRACTION
from testbed.topo import WanPlan
from traffic import iperf, ping

LOAD_FRACTION = 0.9          # paced load for rtt_loaded_ms, as a fraction of rate_mbit
TCP_PAYLOAD_FRACTION = 1448 / 1514
BASE_PORT = 5201


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    seconds: float = 6.0     # per iperf3 test, after a 1 s omitted warm-up; goodput is over the
                             # receiver's intervals from 2 s on (so seconds >= 2)
    streams: int = 4
    ping_count: int = 21
    ping_interval_s: float = 0.1


def predicted_goodput_mbit(net: Network, w: WanPlan, streams: int) -> float:
    """Expected goodput of `streams` flows: the link's TCP ceiling, or with `scale` the sum of
    the flows' window limits if that is lower."""
    cap = w.link.rate_mbit * TCP_PAYLOAD_FRACTION
    one = predicted_1flow_mbit(net, w)
    return cap if one is None else min(cap, streams * one)


def predicted_1flow_mbit(net: Network, w: WanPlan) -> float | None:
    """With `scale`, one TCP flow has at most the advertised window (the payload share of the
    scaled receive buffer) in flight per RTT: goodput = window / RTT, capped by the link."""
    rmem_max = scaled_tcp_rmem_max_bytes(net.scenario.scale)
    if rmem_max is None:
        return None
    rtt_s = 2 * w.link.delay_ms / 1e3
    window_bytes = rmem_max * RCV_WINDOW_FRACTION
    window_mbit = window_bytes * 8 / rtt_s / 1e6 if rtt_s > 0 else float("inf")
    return min(window_mbit, w.link.rate_mbit * TCP_PAYLOAD_FRACTION)


def measure_link(net: Network, w: WanPlan, settings: Settings, port: int) -> dict[str, Any]:
    src = net.plan.hosts_in(w.link.a)[0]
    dst = net.plan.hosts_in(w.link.b)[0]
    idle = _ping(net, src.name, dst.ip, settings)
    multi = measure_goodput(net, src.name, dst.name, port, settings.seconds, streams=settings.streams)
    net.check()
    reverse = measure_goodput(net, dst.name, src.name, port, settings.seconds,
                              streams=settings.streams)
    net.check()
    single = measure_goodput(net, src.name, dst.name, port, settings.seconds)
    net.check()
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
                     "streams": settings.streams, "retransmits": multi.retransmits,
                     "ping_loss_pct": round(idle.loss_pct, 1),
                     "goodput_intervals_mbit": list(multi.intervals_mbit)},
        "predicted": {"rtt_ms": 2 * w.link.delay_ms,
                      "goodput_max_mbit": round(w.link.rate_mbit * TCP_PAYLOAD_FRACTION, 2),
                      "goodput_mbit": round(predicted_goodput_mbit(net, w, settings.streams), 2),
                      "goodput_reverse_mbit": round(predicted_goodput_mbit(net, w, settings.streams), 2),
                      "goodput_1flow_mbit": round(predicted_goodput_mbit(net, w, 1), 2)},
        "samples": {"rtt_ms": list(idle.samples_ms), "rtt_loaded_ms": list(loaded.samples_ms)},
    }


def calibrate(net: Network, settings: Settings = Settings(),
              progress: Callable[[str], None] = print) -> dict[str, Any]:
    links = []
    total = len(net.plan.wan)
    for i, w in enumerate(net.plan.wan):
        progress(f"[{i + 1}/{total}] measuring {w.link.a} <-> {w.link.b} "
                 f"({w.link.delay_ms:g} ms, {w.link.rate_mbit:g} Mbit/s)")
        links.append(measure_link(net, w, settings, BASE_PORT + i))
    return {"scenario": net.scenario.name, "backend": net.backend, "scale": net.scenario.scale,
            "settings": {"seconds": settings.seconds, "streams": settings.streams,
                         "ping_count": settings.ping_count, "load_fraction": LOAD_FRACTION},
            "links": links}


def table(doc: dict[str, Any]) -> str:
    """Configured vs measured, with error %, one row per link and quantity. Goodput is also
    compared with what TCP can carry (`expected`: 95.6% of the rate at MTU 1500, or the window
    limit with `scale`)."""
    rows = [("link", "quantity", "configured", "expected", "measured", "error %")]
    for link in doc["links"]:
        name = "<->".join(link["between"])
        c, m, p = link["configured"], link["measured"], link["predicted"]
        rtt = f"{p['rtt_ms']:g}"
        rows.append((name, "rtt_ms", rtt, rtt, f"{m['rtt_ms']:.2f}", _err(m["rtt_ms"], p["rtt_ms"])))
        rows.append((name, "rtt_loaded_ms", rtt, rtt, f"{m['rtt_loaded_ms']:.2f}",
                     _err(m["rtt_loaded_ms"], p["rtt_ms"])))
        for key in ("goodput_mbit", "goodput_reverse_mbit", "goodput_1flow_mbit"):
            rows.append((name, key, f"{c['rate_mbit']:g}", f"{p[key]:.1f}", f"{m[key]:.1f}",
                         _err(m[key], c["rate_mbit"]) + f" ({_err(m[key], p[key])} vs expected)"))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)) for r in rows)


def _err(measured: float, want: float) -> str:
    return f"{100 * (measured - want) / want:+.1f}" if want else "-"


def _ping(net: Network, src: str, dst_ip: str, s: Settings) -> ping.PingResult:
    net.run(src, ping.ping_argv(dst_ip, 2, 0.2), timeout_s=10, name="ping-warmup")  # ARP
    out = net.run(src, ping.ping_argv(dst_ip, s.ping_count, s.ping_interval_s),
                  timeout_s=s.ping_count * s.ping_interval_s + 10, name="ping")
    return ping.parse_ping(out)


def start_iperf_server(net: Network, host: str, port: int):
    """An iperf3 server (one test) in host, returned once it listens on port."""
    proc = net.spawn(host, iperf.server_argv(port), net.run_dir / "logs" / f"{host}-iperf3-s-{port}.log")
    deadline = time.monotonic() + 5
    while not iperf.listening(proc.pid, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.stop()
            raise RuntimeError(f"iperf3 server in {host} did not start: {proc.output()}")
        time.sleep(0.02)
    return proc


def measure_goodput(net: Network, src: str, dst: str, port: int, seconds: float, *,
                    streams: int = 1, rate_mbit: float | None = None) -> iperf.IperfResult:
    """One iperf3 TCP test from host src to host dst (goodput at the receiver, steady state)."""
    server = start_iperf_server(net, dst, port)
    try:
        out = net.run(src, iperf.client_argv(net.host_ip(dst), port, seconds=seconds,
                                             streams=streams, rate_mbit=rate_mbit),
                      timeout_s=seconds + 20, name=f"iperf3-c-P{streams}")
        server.wait(5)
    finally:
        server.stop()
    return iperf.parse_iperf(out)


def _ping_under_load(net: Network, src: str, dst: str, dst_ip: str, port: int, s: Settings,
                     load_mbit: float) -> tuple[ping.PingResult, iperf.IperfResult]:
    """ping while paced TCP flows load the link; returns the ping and the load achieved
    (a load that failed is an error, never a silently idle 'loaded' figure)."""
    server = start_iperf_server(net, dst, port)
    count = max(5, int((s.seconds - 1.0) / s.ping_interval_s))
    try:
        client = net.spawn(src, iperf.client_argv(dst_ip, port, seconds=s.seconds,
                                                  streams=s.streams, rate_mbit=load_mbit),
                           net.run_dir / "logs" / f"{src}-iperf3-load.log")
        time.sleep(1.0)  # let the load reach its rate before sampling
        out = net.run(src, ping.ping_argv(dst_ip, count, s.ping_interval_s),
                      timeout_s=count * s.ping_interval_s + 10, name="ping-loaded")
        rc = client.wait(s.seconds + 20)
    finally:
        server.stop()
    if rc != 0:
        raise TestbedError(f"the load for rtt_loaded_ms ({src} -> {dst}) failed with exit code "
                           f"{rc}: {client.output(400)}")
    return ping.parse_ping(out), iperf.parse_iperf(client.output(10_000_000))
