#!/usr/bin/env python3
"""Benchmark: one activation striped over K TCP connections (trainer.transport), steady and after
an idle gap, against the window-limit model. Prints figures only (no asserts).

On a two-DC network (DCs kx and ky, one host each, scale 100, WAN 100 Mbit/s emulated = 10
Gbit/s real; one-way delay 10, 50, 100 ms), a receiver process in ky-h1 and a sender in kx-h1
(python children of this script, spawned in the hosts) open one trainer.transport Channel with
K connections and send one activation of two_dc's target model at scale 100 (33,554,432 / 100
bytes: a small tensor padded to that size) per message:

    steady      5 warm-up messages, then 5 more, each sent as soon as the receiver's 0-byte
                acknowledgement of the previous one arrives (so a message never queues behind
                another, and the connections idle only a one-way delay, far below the RTO);
                the median of those 5
    after idle  then 2 s idle (net.ipv4.tcp_slow_start_after_idle is checked in the hosts:
                1, Linux's default, restarts the window after an RTO of idle), then one message

Transfer time = the receiver's t_last_ns (last byte of the last stripe) - the sender's enqueue
time (Channel.send); both hosts are namespaces of one machine, on one clock. Predicted:

    RTT/2 + bytes x 8 / min(rate, K x window / RTT),  window = tcp_rmem max x RCV_WINDOW_FRACTION

(the receiver host's tcp_rmem max, the scaled real-server buffer; RCV_WINDOW_FRACTION from
testbed/spec/scenario.py): a fluid model. Beside it, `rt model`, the same window counted in whole round
trips (as bench_transients.py): each RTT the K connections send K windows (at most rate x RTT),
the last byte arrives RTT/2 after its round starts plus that round's serialisation; it is what
a message of a few windows actually takes. An MPTCP row is not measured (see the note it
prints).

    sudo .venv/bin/python bench/bench_connections.py [--quick] [--delays 10,50,100]
         [--connections 1,2,4,8] [--cc cubic] [--out results]
Writes results/bench-connections-<time>/bench.json and prints `results: PATH` last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DC_A, DC_B = "kx", "ky"       # names no other bench or test uses
SCALE = 100
RATE_MBIT = 100.0             # emulated (10 Gbit/s real at scale 100)
MESSAGE_BYTES = 33_554_432 // SCALE   # two_dc's activation (4096 x 2048 x 2 x bf16) / scale
BASE_PORT = 7300
SENDER, RECEIVER = "kx-sender", "ky-receiver"


# ---- the two children (run inside the emulated hosts) -------------------------------------------
def child_recv(args: argparse.Namespace) -> int:
    import torch

    from trainer.transport import KIND_ACT, KIND_GRAD, Listener
    lst = Listener(args.ip, args.port, congestion_control=args.cc)
    print("READY", flush=True)
    ch = lst.accept(SENDER, timeout_s=60, connections=args.k)
    try:
        for m in range(args.count):
            got = ch.recv(KIND_ACT, 0, m, timeout_s=120)
            print(json.dumps({"recv": m, "t_first_ns": got.t_first_ns, "t_last_ns": got.t_last_ns,
                              "bytes": got.payload_bytes + got.pad_bytes,
                              "stripes": got.stripes}), flush=True)
            ch.send(KIND_GRAD, 0, m, torch.empty(0))     # the acknowledgement
        ch.close(timeout_s=30)
    finally:
        lst.close()
    return 0


def child_send(args: argparse.Namespace) -> int:
    import torch

    from trainer.transport import KIND_ACT, KIND_GRAD, connect
    records = []
    ch = connect(args.ip, args.port, hello=SENDER, peer=RECEIVER, timeout_s=30,
                 bind_ip=args.bind, on_sent=records.append, congestion_control=args.cc,
                 connections=args.k)
    tensor = torch.ones(16, dtype=torch.bfloat16)
    for m in range(args.count):
        if m == args.count - 1:
            time.sleep(args.idle_s)
        ch.send(KIND_ACT, 0, m, tensor, pad_to_bytes=args.bytes)
        ch.recv(KIND_GRAD, 0, m, timeout_s=120)
    ch.close(timeout_s=30)
    for r in records:
        print(json.dumps({"sent": r.microbatch, "t_enqueue_ns": r.t_enqueue_ns,
                          "t_start_ns": r.t_start_ns, "t_end_ns": r.t_end_ns,
                          "stripes": r.stripes}), flush=True)
    return 0


# ---- the parent ---------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class Row:
    delay_ms: float
    k: int
    rmem_max_bytes: int
    predicted_ms: float
    rt_model_ms: float = 0.0
    transfers_ms: list[float] = field(default_factory=list)   # message order
    stripes: int = 0
    error: str = ""

    def steady(self, warmup: int) -> list[float]:
        return self.transfers_ms[warmup:-1]

    @property
    def after_idle_ms(self) -> float | None:
        return self.transfers_ms[-1] if self.transfers_ms else None


def predicted_ms(delay_ms: float, k: int, nbytes: int, rmem_max: int) -> float:
    from testbed.spec.scenario import RCV_WINDOW_FRACTION
    rtt_s = 2 * delay_ms / 1e3
    window = rmem_max * RCV_WINDOW_FRACTION
    rate_bps = min(RATE_MBIT * 1e6, k * window * 8 / rtt_s)
    return (rtt_s / 2 + nbytes * 8 / rate_bps) * 1e3


def round_trip_model_ms(delay_ms: float, k: int, nbytes: int, rmem_max: int) -> float:
    """The window in whole round trips: K windows (at most rate x RTT) per RTT; the last byte
    arrives one way after its round starts, plus its round's serialisation at the rate."""
    from testbed.spec.scenario import RCV_WINDOW_FRACTION
    rtt_s = 2 * delay_ms / 1e3
    rate_Bps = RATE_MBIT * 1e6 / 8
    per_rtt = min(k * rmem_max * RCV_WINDOW_FRACTION, rate_Bps * rtt_s)
    rounds = max(0, -(-nbytes // int(per_rtt)) - 1)
    return (rounds * rtt_s + rtt_s / 2 + (nbytes - rounds * per_rtt) / rate_Bps) * 1e3


def scenario_for(delay_ms: float):
    from testbed.spec.scenario import parse_scenario
    return parse_scenario({
        "name": f"bench_connections_d{delay_ms:g}", "scale": SCALE,
        "dcs": [{"name": DC_A, "hosts": 1}, {"name": DC_B, "hosts": 1}],
        "wan": [{"between": [DC_A, DC_B], "delay_ms": delay_ms, "rate_mbit": RATE_MBIT}]})


def run_case(net, row: Row, port: int, args: argparse.Namespace, folder: Path) -> None:
    from testbed.spec.errors import TestbedError
    from testbed.emulation.network import REPO_ROOT
    src, dst = f"{DC_A}-h1", f"{DC_B}-h1"
    count = args.warmup + args.messages + 1
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--port", str(port), "--k", str(row.k), "--count", str(count), "--cc", args.cc]
    for h in (src, dst):   # forget cached ssthresh / RTT: every row starts fresh
        net.node(h).cmd("ip tcp_metrics flush all 2>/dev/null")
    recv = net.spawn(dst, me + ["_recv", "--ip", net.host_ip(dst), *common],
                     folder / "logs" / f"{dst}-recv-k{row.k}.log", env=env)
    try:
        deadline = time.monotonic() + 60
        while "READY" not in recv.output():
            if recv.poll() is not None or time.monotonic() > deadline:
                raise TestbedError(f"receiver did not start: {recv.output()[-300:]}")
            time.sleep(0.02)
        send = net.spawn(src, me + ["_send", "--ip", net.host_ip(dst), "--bind", net.host_ip(src),
                                    "--bytes", str(MESSAGE_BYTES), "--idle-s", str(args.idle_s),
                                    *common], folder / "logs" / f"{src}-send-k{row.k}.log",
                         env=env)
        try:
            if send.wait(240) != 0:
                raise TestbedError(f"sender failed: {send.output()[-400:]}")
        finally:
            send.stop()
        if recv.wait(60) != 0:
            raise TestbedError(f"receiver failed: {recv.output()[-400:]}")
    finally:
        recv.stop()
    net.check()
    sent = {d["sent"]: d for d in _json_lines(send.output(1 << 22)) if "sent" in d}
    got = {d["recv"]: d for d in _json_lines(recv.output(1 << 22)) if "recv" in d}
    if sorted(sent) != list(range(count)) or sorted(got) != list(range(count)):
        raise TestbedError(f"records incomplete: sent {sorted(sent)}, received {sorted(got)}")
    if any(got[m]["bytes"] != MESSAGE_BYTES for m in got):
        raise TestbedError("a message arrived with the wrong size")
    row.transfers_ms = [round((got[m]["t_last_ns"] - sent[m]["t_enqueue_ns"]) / 1e6, 2)
                        for m in range(count)]
    row.stripes = got[count - 1]["stripes"]


def _json_lines(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def run_delay(delay_ms: float, ks: list[int], args: argparse.Namespace, run_dir: Path,
              port: list[int]) -> tuple[list[Row], dict[str, str]]:
    from testbed.spec.errors import TestbedError
    from testbed.emulation.network import Network
    scenario = scenario_for(delay_ms)
    folder = run_dir / scenario.name
    rows: list[Row] = []
    with Network(scenario, folder) as net:
        rmem = int(net.node(f"{DC_B}-h1").cmd("cat /proc/sys/net/ipv4/tcp_rmem").split()[-1])
        idle = {h: net.node(h).cmd("cat /proc/sys/net/ipv4/tcp_slow_start_after_idle").strip()
                for h in (f"{DC_A}-h1", f"{DC_B}-h1")}
        print(f"delay {delay_ms:g} ms one way, {RATE_MBIT:g} Mbit/s, scale {SCALE}: receiver "
              f"tcp_rmem max {rmem:,} B; tcp_slow_start_after_idle "
              f"{', '.join(f'{h}={v}' for h, v in idle.items())}; built in "
              f"{net.timings_s['up']:.1f} s", flush=True)
        for k in ks:
            row = Row(delay_ms=delay_ms, k=k, rmem_max_bytes=rmem,
                      predicted_ms=round(predicted_ms(delay_ms, k, MESSAGE_BYTES, rmem), 1),
                      rt_model_ms=round(round_trip_model_ms(delay_ms, k, MESSAGE_BYTES, rmem), 1))
            rows.append(row)
            port[0] += 1
            t0 = time.monotonic()
            try:
                run_case(net, row, port[0], args, folder)
            except (TestbedError, TimeoutError) as exc:
                row.error = str(exc)
                print(f"  K={k}: FAILED: {exc}", flush=True)
                continue
            print(f"  K={k}: steady {statistics.median(row.steady(args.warmup)):.0f} ms, after "
                  f"idle {row.after_idle_ms:.0f} ms, predicted {row.predicted_ms:.0f} ms "
                  f"({row.stripes} stripes; {time.monotonic() - t0:.0f} s)", flush=True)
    return rows, idle


def print_table(delay_ms: float, rows: list[Row], warmup: int) -> None:
    print(f"\none-way delay {delay_ms:g} ms (RTT {2 * delay_ms:g} ms), {MESSAGE_BYTES:,} B per "
          f"message")
    print(f"{'K':>2} {'stripes':>7} | {'steady ms':>9} {'(min-max)':>13} | {'after-idle ms':>13} |"
          f" {'predicted ms':>12} | {'steady/pred':>11} {'idle/pred':>9} | {'rt model':>8} "
          f"{'steady/rt':>9}")
    for r in rows:
        if not r.transfers_ms:
            print(f"{r.k:>2} {'':>7} | FAILED: {r.error[:100]}")
            continue
        st = r.steady(warmup)
        med = statistics.median(st)
        print(f"{r.k:>2} {r.stripes:>7} | {med:>9.1f} {f'({min(st):.0f}-{max(st):.0f})':>13} | "
              f"{r.after_idle_ms:>13.1f} | {r.predicted_ms:>12.1f} | {med / r.predicted_ms:>11.2f} "
              f"{r.after_idle_ms / r.predicted_ms:>9.2f} | {r.rt_model_ms:>8.1f} "
              f"{med / r.rt_model_ms:>9.2f}")


def mptcp_note() -> str:
    try:
        enabled = Path("/proc/sys/net/mptcp/enabled").read_text().strip()
    except OSError:
        enabled = "absent"
    return (f"MPTCP row: not measured (net.mptcp.enabled={enabled}). One host has one address "
            f"and one path here, so more than one subflow needs per-host `ip mptcp endpoint` / "
            f"limits set-up in every namespace, and trainer.transport would need an MPTCP "
            f"socket option path; not simple, so skipped.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("_recv", "_send"):
        cp = argparse.ArgumentParser()
        cp.add_argument("mode")
        cp.add_argument("--ip", required=True)
        cp.add_argument("--bind")
        cp.add_argument("--port", type=int, required=True)
        cp.add_argument("--k", type=int, required=True)
        cp.add_argument("--count", type=int, required=True)
        cp.add_argument("--bytes", type=int, default=MESSAGE_BYTES)
        cp.add_argument("--idle-s", type=float, default=2.0)
        cp.add_argument("--cc", default="cubic")
        cargs = cp.parse_args(argv)
        return child_recv(cargs) if cargs.mode == "_recv" else child_send(cargs)

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delays", default="10,50,100", help="one-way delays, ms")
    ap.add_argument("--connections", default="1,2,4,8", help="K values")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--messages", type=int, default=5, help="steady messages after the warm-up")
    ap.add_argument("--idle-s", type=float, default=2.0)
    ap.add_argument("--cc", default="cubic")
    ap.add_argument("--quick", action="store_true", help="delay 50 ms; K 1 and 4")
    ap.add_argument("--out", default="results")
    args = ap.parse_args(argv)
    if args.quick:
        args.delays, args.connections = "50", "1,4"
    try:
        delays = [float(x) for x in args.delays.split(",") if x.strip()]
        ks = [int(x) for x in args.connections.split(",") if x.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    if not delays or not ks or min(ks) < 1 or args.messages < 1:
        ap.error("give at least one delay and K >= 1, and --messages >= 1")

    from testbed.spec.errors import ScenarioError, TestbedError
    from testbed.emulation.network import scaled_tcp_rmem_max_bytes
    from testbed.emulation.results import new_run_dir, provenance, write_json
    from testbed.spec.scenario import RCV_WINDOW_FRACTION
    run_dir = new_run_dir(Path(args.out), "bench-connections")
    print(f"message {MESSAGE_BYTES:,} B (33,554,432 / {SCALE}); delays {delays} ms; K {ks}; "
          f"{args.warmup} warm-up + {args.messages} steady messages, then {args.idle_s:g} s idle "
          f"and 1 more; cc {args.cc}; expected tcp_rmem max "
          f"{scaled_tcp_rmem_max_bytes(SCALE):,} B", flush=True)
    t0 = time.monotonic()
    doc: dict[str, Any] = {"env": provenance(), "settings": vars(args), "rows": [],
                           "message_bytes": MESSAGE_BYTES, "scale": SCALE,
                           "rate_mbit": RATE_MBIT}
    tables: list[tuple[float, list[Row]]] = []
    port = [BASE_PORT]
    for d in delays:
        try:
            rows, idle = run_delay(d, ks, args, run_dir, port)
            doc.setdefault("slow_start_after_idle", {})[f"{d:g}"] = idle
        except (TestbedError, ScenarioError) as exc:
            print(f"delay {d:g} ms: network failed: {exc}", flush=True)
            rows = [Row(delay_ms=d, k=k, rmem_max_bytes=0, predicted_ms=0, error=str(exc))
                    for k in ks]
        tables.append((d, rows))
        doc["rows"] += [dict(asdict(r), after_idle_ms=r.after_idle_ms,
                             steady_median_ms=(statistics.median(r.steady(args.warmup))
                                               if r.transfers_ms else None)) for r in rows]
    print(f"\nTransfer time of one {MESSAGE_BYTES:,} B message over K connections (trainer."
          f"transport striping), ms: sender's enqueue to the receiver's last byte. steady = median "
          f"of messages {args.warmup + 1}-{args.warmup + args.messages} (each sent when the "
          f"previous one's ack arrives), after-idle = the next one after {args.idle_s:g} s idle."
          f"\npredicted = RTT/2 + bytes x 8 / min(rate, K x window / RTT), window = tcp_rmem max "
          f"x {RCV_WINDOW_FRACTION} (rate {RATE_MBIT:g} Mbit/s; no header overhead); rt model = "
          f"that "
          f"window in whole round trips (K windows, at most rate x RTT, per RTT; the last byte "
          f"RTT/2 after its round starts, plus its serialisation)")
    for d, rows in tables:
        print_table(d, rows, args.warmup)
    print("\n" + mptcp_note())
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    path = write_json(run_dir / "bench.json", doc)
    print(f"wall {doc['wall_s']:.0f} s\nresults: {path}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the network was torn down on the way out
        print("interrupted", file=sys.stderr)
        sys.exit(130)
