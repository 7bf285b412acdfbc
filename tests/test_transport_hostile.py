"""A hostile peer of the stage-to-stage transport (trainer/transport.py) and its neighbours, on
loopback with real sockets: a frame header claiming 16 GiB, partial messages that never end, a
message the channel does not expect, more messages than a run can have unread, a hello that
trickles in while the real peer waits, a hello claiming a huge name, and the listening addresses
of the gloo store (trainer/dp.py) and the slot client's sink (trainer/slotclient.py). Memory is
measured in a child process under RLIMIT_AS (VmHWM before and after), so a receiver that
allocates what a header claims fails there fast instead of taking this machine's memory. The
hypothesis fuzzers feed headers and hellos of any bytes and any integers: every one gives
FrameError (or a message, or None while a hello is incomplete) and a channel that says so."""

from __future__ import annotations

import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer import transport
from trainer.transport import (HEADER, KIND_ACT, KIND_GRAD, MAGIC, MAX_DIMS, Expect, Expected,
                               FrameError, Listener, connect, hello_frame, parse_hello)

REPO = Path(__file__).resolve().parent.parent
PEER = "s0r0"
SHAPE = (2, 16, 32)                  # a worker's boundary: micro-batch, sequence, width
EXPECT = Expect({KIND_ACT: Expected(torch.float32, SHAPE, 4 * 2 * 16 * 32)}, iterations=4,
                micro_batches=2)


def header(*, kind=KIND_ACT, code=0, ndim=1, it=0, mb=0, payload=0, pad=0, shape=(0, 0, 0, 0),
           offset=0, length=0, index=0, count=1) -> bytes:
    return HEADER.pack(MAGIC, kind, code, ndim, 0, it, mb, payload, pad, *shape, offset, length,
                       index, count)


# -- memory: a child process under RLIMIT_AS --------------------------------------------------

CHILD = r"""
import json, resource, socket, sys
from trainer import transport
from trainer.transport import HEADER, KIND_ACT, MAGIC, Listener, hello_frame
import torch

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

def frame(mb, payload):
    n = payload // 4
    return HEADER.pack(MAGIC, KIND_ACT, 0, 1, 0, 0, mb, payload, 0, n, 0, 0, 0, 0, payload, 0, 1)

def attack(case):
    lst = Listener("127.0.0.1", 0)
    k = 8 if case == "partial" else 1
    peers = [socket.create_connection(lst.sock.getsockname(), timeout=5) for _ in range(k)]
    for i, peer in enumerate(peers):
        peer.sendall(hello_frame("s0r0", i, k))
    kw = {"connections": k}
    if case == "expected":
        kw["expect"] = transport.Expect(
            {KIND_ACT: transport.Expected(torch.float32, (2, 16, 32), 4096)}, 4, 2)
    ch = lst.accept("s0r0", timeout_s=5, **kw)
    before = status("VmHWM:")
    if case in ("16gib", "expected"):
        peers[0].sendall(frame(0, 1 << 34))           # 84 bytes claiming 16 GiB
    else:                   # "partial": a header of 64 MiB on each of 8 connections, no bytes
        for mb, peer in enumerate(peers):
            peer.sendall(frame(mb, 64 << 20))
    error = cause = None
    try:
        ch.recv(KIND_ACT, 0, 0, timeout_s=1)
    except (ConnectionError, TimeoutError) as exc:
        error, cause = str(exc), type(exc.__cause__).__name__
    return {"hwm_delta": status("VmHWM:") - before, "error": error, "cause": cause}

resource.setrlimit(resource.RLIMIT_AS, (status("VmSize:") + (2 << 30),) * 2)
# the partial case first: VmHWM only grows, so each case's delta is its own
print(json.dumps({case: attack(case) for case in ("partial", "16gib", "expected")}))
"""


@pytest.fixture(scope="module")
def attacks() -> dict:
    """What each memory attack did in one child (one torch import for all three)."""
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.loopback
def test_a_16_gib_header_is_refused_without_taking_memory(attacks):
    got = attacks["16gib"]
    assert got["cause"] == "FrameError" and "over this channel's cap" in got["error"], got
    assert got["hwm_delta"] < 32 << 20, got


@pytest.mark.loopback
def test_a_header_the_worker_does_not_expect_is_refused_naming_what_it_expects(attacks):
    got = attacks["expected"]
    assert got["cause"] == "FrameError", got
    assert "expected torch.float32 [2, 16, 32], 4096 bytes" in got["error"], got
    assert "connection 0 of 1 to s0r0" in got["error"] and "\n" not in got["error"]
    assert got["hwm_delta"] < 32 << 20, got


@pytest.mark.loopback
def test_partial_messages_hold_only_what_has_arrived(attacks):
    got = attacks["partial"]
    assert got["error"] is not None and "no F0 of iteration 0" in got["error"], got  # waiting
    assert got["hwm_delta"] < 32 << 20, got


# -- what a channel expects -------------------------------------------------------------------

def raw_channel(expect=EXPECT, k=1):
    """(listener, channel, peer sockets): a Listener's channel whose peer writes by hand."""
    lst = Listener("127.0.0.1", 0)
    socks = []
    for i in range(k):
        s = socket.create_connection(lst.sock.getsockname(), timeout=5)
        s.sendall(hello_frame(PEER, i, k))
        socks.append(s)
    return lst, lst.accept(PEER, timeout_s=5, connections=k, expect=expect), socks


def message(it=0, mb=0, tensor=None, pad=0, kind=KIND_ACT) -> bytes:
    tensor = torch.zeros(SHAPE) if tensor is None else tensor
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    shape = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
    return header(kind=kind, code=transport._DTYPE_CODE[tensor.dtype], ndim=tensor.dim(), it=it,
                  mb=mb, payload=len(data), pad=pad, shape=shape, length=len(data) + pad) \
        + data + bytes(pad)


UNEXPECTED = {
    "another dtype": (message(tensor=torch.zeros(SHAPE, dtype=torch.float16)),
                      "float16 [2, 16, 32], 2048 bytes; expected torch.float32"),
    "another shape": (message(tensor=torch.zeros(2, 32, 16)), "float32 [2, 32, 16]"),
    "padded": (message(pad=8), "4104 bytes; expected"),
    "another kind": (message(kind=KIND_GRAD), "kind B not expected"),
    "iteration past the run": (message(it=4), "iteration 4, micro-batch 0; expected iteration"),
    "micro-batch past the run": (message(mb=2), "micro-batch 2; expected"),
}


@pytest.mark.loopback
@pytest.mark.parametrize("name", UNEXPECTED)
def test_a_message_the_channel_does_not_expect_is_refused(name):
    data, match = UNEXPECTED[name]
    lst, ch, (peer,) = raw_channel()
    try:
        peer.sendall(message(mb=1) + data)
        assert ch.recv(KIND_ACT, 0, 1, timeout_s=5).tensor.shape == SHAPE   # the right one
        with pytest.raises(ConnectionError, match=re.escape(match)) as exc:
            ch.recv(KIND_ACT, 3, 0, timeout_s=5)
        assert isinstance(exc.value.__cause__, FrameError)
    finally:
        peer.close()
        ch.close(timeout_s=1)
        lst.close()


@pytest.mark.loopback
def test_more_messages_than_a_run_can_have_unread_are_refused():
    lst, ch, (peer,) = raw_channel()            # M = 2: at most 2M + 2 = 6 held
    try:
        for it in range(4):
            for mb in range(2):
                peer.sendall(message(it, mb))
        with pytest.raises(ConnectionError, match=r"7 messages .* over this channel's cap of 6"):
            ch.recv(KIND_ACT, 9, 0, timeout_s=5)
    finally:
        peer.close()
        ch.close(timeout_s=1)
        lst.close()


# -- hellos -----------------------------------------------------------------------------------

@pytest.mark.loopback
def test_a_trickling_hello_does_not_keep_the_real_peer_out():
    lst = Listener("127.0.0.1", 0)
    addr = lst.sock.getsockname()
    stop = threading.Event()
    slow = socket.create_connection(addr, timeout=5)

    def trickle():                              # a hello of a 65535-byte name, 1 byte / 0.2 s
        for b in struct.pack("!4sHHH", MAGIC, 0, 1, 65535) + bytes(30):
            if stop.wait(0.2):
                return
            try:
                slow.send(bytes([b]))
            except OSError:
                return

    t = threading.Thread(target=trickle)
    t.start()
    got = {}
    time.sleep(0.3)
    peer = threading.Thread(target=lambda: got.update(ch=connect(
        *addr, hello=PEER, peer="s1r0", timeout_s=5)))
    peer.start()
    try:
        ch = lst.accept(PEER, timeout_s=4)
        peer.join(5)
        ch.close(timeout_s=1)
        got["ch"].close(timeout_s=1)
    finally:
        stop.set()
        t.join(5)
        slow.close()
        lst.close()
    # accept()'s 4 s is less than the trickler's HELLO_TIMEOUT_S: had the real peer waited
    # behind the trickling hello, accept would have timed out instead
    assert transport.HELLO_TIMEOUT_S > 4 and ch is not None


@pytest.mark.loopback
def test_a_flood_of_silent_connections_does_not_keep_the_real_peer_out():
    lst = Listener("127.0.0.1", 0)
    addr = lst.sock.getsockname()
    got = {}
    accepting = threading.Thread(target=lambda: got.update(ch=lst.accept(PEER, timeout_s=4)))
    accepting.start()
    silent = [socket.create_connection(addr, timeout=5)
              for _ in range(transport.MAX_PENDING_HELLOS + 16)]
    try:
        sender = connect(*addr, hello=PEER, peer="s1r0", timeout_s=3)
        accepting.join(5)
        assert "ch" in got, "the real peer was not accepted behind silent connections"
        got["ch"].close(timeout_s=1)
        sender.close(timeout_s=1)
    finally:
        accepting.join(5)
        for s in silent:
            s.close()
        lst.close()


@pytest.mark.loopback
def test_a_hello_is_dropped_at_its_deadline(monkeypatch):
    monkeypatch.setattr(transport, "HELLO_TIMEOUT_S", 0.3)
    lst = Listener("127.0.0.1", 0)
    silent = socket.create_connection(lst.sock.getsockname(), timeout=5)
    silent.sendall(MAGIC)
    try:
        with pytest.raises(TimeoutError, match=r"rejected: .*\(4 bytes of hello in 0.3 s\)"):
            lst.accept(PEER, timeout_s=1)
        silent.settimeout(2)
        assert silent.recv(1) == b""            # closed by the listener
    finally:
        silent.close()
        lst.close()


@pytest.mark.unit
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=80) | st.builds(
    lambda i, k, n, rest: struct.pack("!4sHHH", MAGIC, i, k, n) + rest,
    st.integers(0, 65535), st.integers(0, 65535), st.integers(0, 65535),
    st.binary(max_size=80)))
def test_hello_parser_takes_any_bytes(data):
    for cut in (len(data), len(data) // 2):     # whole and truncated
        try:
            got = parse_hello(data[:cut], 64)
        except FrameError as exc:
            assert str(exc) and "\n" not in str(exc)
            continue
        if got is not None:
            name, index, k = got
            assert len(name.encode()) <= 64 and 0 <= index < 65536 and 0 <= k < 65536


# -- frames: any header, on a real channel ----------------------------------------------------

U64 = st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 4096, 2**32, 2**34, 2**63, 2**64 - 1])
FIELDS = st.fixed_dictionaries({
    "kind": st.integers(0, 255), "code": st.integers(0, 255), "ndim": st.integers(0, 255),
    "it": st.integers(0, 2**32 - 1) | st.integers(0, 5), "mb": st.integers(0, 2**32 - 1)
    | st.integers(0, 3), "payload": U64, "pad": U64,
    "shape": st.tuples(U64, U64, U64, U64), "offset": U64, "length": U64,
    "index": st.integers(0, 65535), "count": st.integers(0, 65535)})


@pytest.mark.loopback
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FIELDS.map(lambda f: header(**f)) | st.binary(max_size=100), min_size=1,
                max_size=3), st.binary(max_size=200), st.booleans())
def test_a_channel_takes_any_frames(frames, tail, expected):
    lst, ch, (peer,) = raw_channel(EXPECT if expected else None)
    try:
        peer.sendall(b"".join(frames) + tail)
        peer.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 5
        while ch._rx_open and time.monotonic() < deadline:     # the reader ends, and says why
            time.sleep(0.005)
        assert ch._rx_open == 0, "a reader still runs after its peer closed"
        assert ch._rx_error is None or isinstance(ch._rx_error, (FrameError, ConnectionError))
        assert ch._held_bytes <= (EXPECT.held_bytes() if expected else
                                  transport.MAX_HELD_BYTES)
    finally:
        peer.close()
        ch.close(timeout_s=1)
        lst.close()


# -- listening addresses ----------------------------------------------------------------------

def listening(pid: int, port: int) -> list[str]:
    """The local addresses pid's sockets listen on at port (from /proc/PID/net/tcp{,6})."""
    out = []
    for name in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]:
            local, _, state = line.split()[1:4]
            ip, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:
                raw = bytes.fromhex(ip)
                out.append(socket.inet_ntop(socket.AF_INET if name == "tcp" else socket.AF_INET6,
                                            b"".join(raw[i:i + 4][::-1]
                                                     for i in range(0, len(raw), 4))))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STORE = """
import sys, time
from trainer.dp import init_stage_group
init_stage_group("127.0.0.1", "127.0.0.1", int(sys.argv[1]), 0, 1, 10)
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.loopback
@pytest.mark.parametrize("what", ["gloo store", "slot sink"])
def test_servers_listen_on_the_address_their_peer_uses(what):
    port = free_port()
    argv = ([sys.executable, "-c", STORE, str(port)] if what == "gloo store" else
            [sys.executable, "-m", "trainer.slotclient", "sink", "--ip", "127.0.0.1", "--port",
             str(port)])
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.poll() is not None else line
        assert listening(proc.pid, port) == ["127.0.0.1"]
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.unit
def test_each_worker_expects_what_its_neighbours_send(tmp_path):
    from testbed.spec.training import TrainConfig
    from testbed.plans.workers import HostInfo, WorkerSetup, plan_workers
    from trainer.worker import StageWorker
    model = {"n_layer": 3, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64}
    cfg = TrainConfig.from_dict({
        "model": model, "stages": 3, "micro_batches": 2, "micro_batch_size": 2,
        "iterations": 2, "compute": "profile",
        "profile": {"file": "h200-transformer.json", "width": 4096, "seq": 2048,
                    "micro_batch": 1, "n_layer": 32}})
    hosts = [HostInfo(name=f"h{i}", ip="127.0.0.1", dc="a") for i in range(3)]
    specs = plan_workers(cfg, hosts, tmp_path, WorkerSetup(scale=100))
    middle = StageWorker(specs[1])
    payload = 2 * 16 * 32 * 4
    for kind, peer, sender in ((KIND_ACT, specs[1].prev, specs[0]),
                               (KIND_GRAD, specs[1].next, specs[2])):
        assert sender.pad_bytes > payload and peer.pad_bytes == sender.pad_bytes
        want = middle._expect(kind, peer).kinds[kind]
        assert want == Expected(torch.float32, SHAPE, max(payload, sender.pad_bytes))
    middle.log.close()
