#!/usr/bin/env python3
"""Benchmark: how close to their deadlines the testbed's timeouts fire, on loopback, no root.
The wall-clock fidelity figures the loopback tests used to assert (they now assert order, state
and bounds load cannot break); here each is measured over several trials and checked against
its target with tests/tolerance.py, every sample printed:

    close cut        Channel.close(1 s) on a peer that stops reading (K = 1 and 3): its timeout,
                     then the cut (tests/test_transport_close.py)
    close gate       Channel.close(0.3 s) with the sender stuck in its slot gate: the timeout
                     and CLOSE_GRACE_S for the stuck sender, not the gate's 10 s
    close quiet      Channel.close(5 s) after everything was received: the peer's half-close,
                     not the timeout
    wire header      wire.recv_msg(header_deadline_s=0.3) on a trickling peer
                     (tests/test_prefill_wire.py)
    server header    a prefill server process on a trickled header: wire.HEADER_DEADLINE_S
                     (tests/test_prefill_servers.py)
    arbiter stall    a granted slot arbiter client that goes silent loses its slot at its
                     deadline, about stall_s (tests/test_wanshare.py)

Exit 1 if a figure is outside its tolerance. Timing on a shared 2-core machine: run it alone.

    .venv/bin/python bench/bench_deadlines.py [--trials 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from prefill import wire  # noqa: E402
from trainer.transport import (CLOSE_GRACE_S, KIND_ACT, Listener,  # noqa: E402
                                              connect)
from tests.tolerance import within  # noqa: E402

SMALL_BUF = 64 << 10


@contextlib.contextmanager
def silent_peer(k: int, gate=None):
    """A connect()ed channel of K connections whose peer accepts them and never reads."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUF)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    ch = connect("127.0.0.1", server.getsockname()[1], hello="s0r0", peer="s1r0", timeout_s=5,
                 connections=k, gate=gate)
    for s in ch.socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUF)
    conns = [server.accept()[0] for _ in range(k)]
    try:
        yield ch
    finally:
        for s in conns:
            s.close()
        server.close()


def close_cut(k: int) -> float:
    with silent_peer(k) as ch:
        ch.send(KIND_ACT, 7, 3, torch.ones(1000), pad_to_bytes=64 << 20)
        time.sleep(0.2)
        t0 = time.monotonic()
        try:
            ch.close(timeout_s=1)
        except ConnectionError:
            pass
        else:
            raise AssertionError("close() of a half-sent message raised nothing")
        return time.monotonic() - t0


def close_gate() -> float:
    hold = threading.Event()

    @contextlib.contextmanager
    def gate(wire_bytes):
        hold.wait(10)
        yield

    with silent_peer(1, gate=gate) as ch:
        ch.send(KIND_ACT, 2, 5, torch.ones(4))
        ch.send(KIND_ACT, 2, 6, torch.ones(4))
        t0 = time.monotonic()
        try:
            ch.close(timeout_s=0.3)
        except ConnectionError:
            pass
        took = time.monotonic() - t0
        hold.set()
        ch._sender.join(5)
        return took


def close_quiet() -> float:
    lst = Listener("127.0.0.1", 0)
    got = {}
    t = threading.Thread(target=lambda: got.update(ch=lst.accept("s0r0", timeout_s=10)))
    t.start()
    a = connect("127.0.0.1", lst.sock.getsockname()[1], hello="s0r0", peer="s1r0", timeout_s=10)
    t.join(10)
    b = got["ch"]
    try:
        for mb in range(4):
            a.send(KIND_ACT, 0, mb, torch.randn(300_000), pad_to_bytes=4 << 20)
        for mb in range(4):
            b.recv(KIND_ACT, 0, mb, timeout_s=10)
        closer = threading.Thread(target=b.close, args=(5,))
        closer.start()
        t0 = time.monotonic()
        a.close(timeout_s=5)
        took = time.monotonic() - t0
        closer.join(10)
        return took
    finally:
        lst.close()


def wire_header() -> float:
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    b.settimeout(5.0)
    try:
        t0 = time.monotonic()
        a.sendall(wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 7)[:3])
        try:
            wire.recv_msg(b, max_payload_bytes=1 << 20, max_pad_bytes=1 << 24,
                          header_deadline_s=0.3)
        except wire.WireError as exc:
            assert "header deadline" in str(exc), exc
        else:
            raise AssertionError("no header deadline")
        return time.monotonic() - t0
    finally:
        a.close()
        b.close()


def server_header(trials: int, folder: Path) -> list[float]:
    from prefill.decoder import InferenceConfig
    from prefill.server import PrefillSpec
    from testbed.run.launch import free_base_port
    from tests.test_prefill_servers import Server
    base = free_base_port(2, "127.0.0.1")
    spec = PrefillSpec(host="h1", dc="dc0", ip="127.0.0.1", port=base, compute="measured",
                       model=InferenceConfig(seed=3).to_dict(), connect_timeout_s=2.0,
                       ack_timeout_s=10.0, decode_servers=[{"ip": "127.0.0.1", "port": base + 1}],
                       gpu_lock_path=str(folder / "gpu" / "h1.lock"),
                       records_path=str(folder / "h1.jsonl"))
    proc = Server("prefill.server", spec, folder)
    try:
        proc.wait_listening(time.monotonic() + 60)
        out = []
        for _ in range(trials):
            with socket.create_connection(("127.0.0.1", base), timeout=30) as sock:
                sock.settimeout(wire.HEADER_DEADLINE_S + 5)
                t0 = time.monotonic()
                sock.sendall(wire.PREFIX.pack(wire.MAGIC, wire.VERSION, 100)[:3])
                msg = wire.recv_msg(sock, max_payload_bytes=0, max_pad_bytes=0)
                out.append(time.monotonic() - t0)
                assert "header deadline" in msg.header["error"], msg.header
        return out
    finally:
        proc.stop()


def arbiter_stall(folder: Path) -> tuple[float, float]:
    """(how long the waiter waited behind the silent client, the arbiter's stall_s)."""
    from trainer.slotclient import SlotClient
    from tests.test_wanshare import start_fake_arbiter
    arb, share, port, stop = start_fake_arbiter(folder, {0: ["127.0.0.1"], 1: ["127.0.0.1"]})
    try:
        silent = socket.create_connection(("127.0.0.1", port))
        silent.sendall(b"REQ sa->sb 0 5000\n")
        assert silent.recv(100).startswith(b"GRANT ")
        waiter = SlotClient("127.0.0.1", port, "sa->sb", 1, timeout_s=3)
        t0 = time.monotonic()
        with waiter.gate(100):
            took = time.monotonic() - t0
            share.sent[1] += 200
        waiter.close()
        silent.close()
        return took, arb.spec.stall_s
    finally:
        stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", type=Path, help="write every sample and verdict here")
    args = ap.parse_args(argv)
    n = args.trials
    rows = []   # (figure, samples, target, tolerance kwargs)
    for k in (1, 3):
        rows.append((f"close cut, K={k} (s)", [close_cut(k) for _ in range(n)], 1.0,
                     {"below": 0.0, "above": 2.0}))
    rows.append(("close gate (s)", [close_gate() for _ in range(n)], 0.3 + CLOSE_GRACE_S,
                 {"below": 0.0, "above": 1.7}))
    rows.append(("close quiet (s)", [close_quiet() for _ in range(n)], 0.0, {"above": 2.0}))
    rows.append(("wire header 0.3 s (s)", [wire_header() for _ in range(n)], 0.3,
                 {"below": 0.0, "above": 1.7}))
    with tempfile.TemporaryDirectory(prefix="bench-deadlines-") as tmp:
        rows.append((f"server header {wire.HEADER_DEADLINE_S:g} s (s)",
                     server_header(max(1, n // 2), Path(tmp)), wire.HEADER_DEADLINE_S,
                     {"below": 0.0, "above": 3.0}))
        stall = []
        for i in range(n):
            folder = Path(tmp) / f"arb{i}"
            folder.mkdir()
            took, stall_s = arbiter_stall(folder)
            stall.append(took)
        rows.append((f"arbiter stall {stall_s:g} s (s)", stall, stall_s,
                     {"below": 0.2 * stall_s, "above": 1.5}))
    failed = 0
    doc = []
    print("| figure | target | median | max | verdict |\n|---|---|---|---|---|")
    for what, samples, target, tol in rows:
        ok, report = within(samples, target, **tol)
        failed += not ok
        s = sorted(samples)
        print(f"| {what} | {target:g} | {s[len(s) // 2]:.3f} | {s[-1]:.3f} | "
              f"{'ok' if ok else 'OUTSIDE'} |")
        doc.append({"figure": what, "target": target, "tolerance": tol, "samples": samples,
                    "ok": ok, "report": report})
    for row in doc:
        if not row["ok"]:
            print(f"\n{row['figure']}: {row['report']}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
