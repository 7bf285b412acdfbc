"""The stage-to-stage transport striped over K TCP connections (trainer/transport.py), on
loopback with real sockets and real tensors: exact reassembly for K 1..8, stripes arriving in any
order on any connection, a connection lost mid-message, bad headers, the gate, the hello checks,
and K per boundary in the launcher's plan."""

import contextlib
import random
import socket
import threading
import time
import tracemalloc

import pytest
import torch

from trainer.transport import (HEADER, KIND_ACT, KIND_GRAD, MAGIC, MAX_DIMS, MIN_STRIPE_BYTES,
                               FrameError, Listener, _DTYPE_CODE, connect, hello_frame,
                               stripe_plan)

PEER = "s0r0"        # the connecting side's name (its hello)
LISTENER_PEER = "s1r0"


@contextlib.contextmanager
def channel_pair(k: int, on_sent=None, gate=None):
    """(sender, receiver): a connect()ed channel and the channel its Listener accepted."""
    lst = Listener("127.0.0.1", 0)
    port = lst.sock.getsockname()[1]
    got = {}
    t = threading.Thread(target=lambda: got.update(
        ch=lst.accept(PEER, timeout_s=10, connections=k)))
    t.start()
    a = connect("127.0.0.1", port, hello=PEER, peer=LISTENER_PEER, timeout_s=10,
                on_sent=on_sent, connections=k, gate=gate)
    t.join(10)
    b = got["ch"]
    try:
        yield a, b
    finally:
        closer = threading.Thread(target=b.close, args=(5,))   # both at once: each close
        closer.start()                                        # waits for the other's
        try:
            a.close(timeout_s=5)
        finally:
            closer.join(10)
            lst.close()


@contextlib.contextmanager
def raw_peer(k: int, order=None):
    """A Listener's channel (K connections) whose peer is k raw sockets, in connection index
    order (connected in `order`): frames are then written by hand."""
    lst = Listener("127.0.0.1", 0)
    port = lst.sock.getsockname()[1]
    socks: dict[int, socket.socket] = {}
    for i in (order or range(k)):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(hello_frame(PEER, i, k))
        socks[i] = s
    ch = lst.accept(PEER, timeout_s=5, connections=k)
    try:
        yield ch, [socks[i] for i in range(k)]
    finally:
        for s in socks.values():
            s.close()
        ch.close(timeout_s=2)
        lst.close()


def frames(kind: int, it: int, mb: int, tensor: torch.Tensor, pad_to: int, k: int,
           **override) -> list[bytes]:
    """The stripe frames (header + bytes) the sender would write for one message."""
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    pad = max(0, pad_to - len(data))
    body = data + bytes(pad)
    plan = stripe_plan(len(body), k)
    shape = list(tensor.shape) + [0] * (MAX_DIMS - tensor.dim())
    out = []
    for i, (off, n) in enumerate(plan):
        f = dict(kind=kind, code=_DTYPE_CODE[tensor.dtype], ndim=tensor.dim(), it=it, mb=mb,
                 payload=len(data), pad=pad, shape=shape, offset=off, length=n, index=i,
                 count=len(plan))
        f.update(override)
        out.append(header(**f) + body[off:off + n])
    return out


def header(*, kind=KIND_ACT, code=0, ndim=1, it=0, mb=0, payload=0, pad=0, shape=(0, 0, 0, 0),
           offset=0, length=0, index=0, count=1) -> bytes:
    return HEADER.pack(MAGIC, kind, code, ndim, 0, it, mb, payload, pad, *shape, offset, length,
                       index, count)


def cases():
    g = torch.Generator().manual_seed(0)
    big = torch.randn(300, 1000, generator=g)                                  # 1.2 MB
    return [
        ("f32 big, no pad", big, 0),
        ("bf16 small, padded to 1 MB", torch.randn(3, 5, generator=g).to(torch.bfloat16), 1 << 20),
        ("f32 400 kB padded to 1 MB", torch.randn(100_000, generator=g), 1_000_000),
        ("i64 4-d", torch.randint(-2**40, 2**40, (7, 5, 40, 50), generator=g), 0),
        ("f16 odd size, pad odd", torch.randn(33_333, 3, generator=g).half(), 555_555),
        ("f64 tiny", torch.randn(2, 3, generator=g).double(), 0),
        ("empty", torch.empty(0, 7), 0),
        ("empty, padded", torch.empty(0), 300_000),
    ]


# -- the stripe rule --------------------------------------------------------------------------

@pytest.mark.unit
def test_stripe_plan_tiles_the_message():
    for total in (0, 1, MIN_STRIPE_BYTES - 1, MIN_STRIPE_BYTES, 2 * MIN_STRIPE_BYTES - 1,
                  2 * MIN_STRIPE_BYTES, 5 * MIN_STRIPE_BYTES + 3, 33_554_432 // 100, 10**7):
        for k in range(1, 9):
            plan = stripe_plan(total, k)
            assert len(plan) == min(k, max(1, total // MIN_STRIPE_BYTES))
            assert plan[0][0] == 0 and sum(n for _, n in plan) == total
            assert all(o1 + n1 == o2 for (o1, n1), (o2, _) in zip(plan, plan[1:]))
            assert max(n for _, n in plan) - min(n for _, n in plan) <= 1
            if len(plan) > 1:
                assert min(n for _, n in plan) >= MIN_STRIPE_BYTES
    assert stripe_plan(0, 4) == [(0, 0)]


# -- round trips ------------------------------------------------------------------------------

@pytest.mark.loopback
@pytest.mark.parametrize("k", range(1, 9))
def test_striped_round_trip_is_exact(k):
    sent = []
    items = cases()
    with channel_pair(k, on_sent=sent.append) as (a, b):
        for mb, (_, tensor, pad_to) in enumerate(items):
            a.send(KIND_ACT, 3, mb, tensor, pad_to_bytes=pad_to)
        for mb, (what, tensor, pad_to) in reversed(list(enumerate(items))):
            got = b.recv(KIND_ACT, 3, mb, timeout_s=10)
            payload = tensor.numel() * tensor.element_size()
            assert got.tensor.dtype == tensor.dtype and got.tensor.shape == tensor.shape, what
            assert torch.equal(got.tensor, tensor), what
            assert got.payload_bytes == payload, what
            assert got.pad_bytes == max(0, pad_to - payload), what
            assert got.stripes == len(stripe_plan(max(payload, pad_to), k)), what
            assert got.t_first_ns <= got.t_last_ns
            b.send(KIND_GRAD, 3, mb, got.tensor, pad_to_bytes=pad_to)   # and back
        for mb, (what, tensor, _) in enumerate(items):
            assert torch.equal(a.recv(KIND_GRAD, 3, mb, timeout_s=10).tensor, tensor), what
    # one record per message, in order, never two messages on the wire at once
    assert [(r.kind, r.microbatch) for r in sent] == [(KIND_ACT, mb) for mb in range(len(items))]
    for r, (_, tensor, pad_to) in zip(sent, items):
        payload = tensor.numel() * tensor.element_size()
        assert (r.payload_bytes, r.pad_bytes) == (payload, max(0, pad_to - payload))
        assert r.stripes == len(stripe_plan(r.payload_bytes + r.pad_bytes, k))
        assert r.t_enqueue_ns <= r.t_start_ns <= r.t_end_ns
    assert all(r1.t_end_ns <= r2.t_start_ns for r1, r2 in zip(sent, sent[1:]))


@pytest.mark.loopback
@pytest.mark.parametrize("k", [2, 4, 8])
def test_stripes_arriving_shuffled_on_any_connection(k):
    rng = random.Random(k)
    items = [(mb, tensor, pad_to) for mb, (_, tensor, pad_to) in enumerate(cases())]
    # every stripe of every message, each on a random connection, all in a random order
    work = [(rng.randrange(k), f) for mb, tensor, pad_to in items
            for f in frames(KIND_ACT, 1, mb, tensor, pad_to, k)]
    rng.shuffle(work)
    with raw_peer(k, order=rng.sample(range(k), k)) as (ch, socks):
        writers = []
        for i, s in enumerate(socks):   # one writer per connection, so none blocks another
            mine = [f for c, f in work if c == i]
            writers.append(threading.Thread(target=lambda s=s, mine=mine: [s.sendall(f)
                                                                          for f in mine]))
            writers[-1].start()
        for mb, tensor, _ in rng.sample(items, len(items)):
            got = ch.recv(KIND_ACT, 1, mb, timeout_s=10)
            assert got.tensor.dtype == tensor.dtype and torch.equal(got.tensor, tensor)
        for t in writers:
            t.join(5)


@pytest.mark.loopback
def test_arrival_is_seen_at_the_first_stripe_header_once_per_message():
    """`arrival()` and `on_arrival` (BubbleTea's arrival bound): nothing before any byte; at the
    first stripe's header, one call with the message's whole size, however many stripes; the
    message complete once all are in; nothing once it is taken."""
    tensor = torch.arange(10_000, dtype=torch.float32)             # 40 kB + 60 kB of padding
    f = frames(KIND_ACT, 7, 2, tensor, 100_000, 4)
    seen = []
    with raw_peer(4) as (ch, socks):
        ch.on_arrival = seen.append
        assert ch.arrival(KIND_ACT, 7, 2) is None
        t0 = time.time_ns()
        socks[2].sendall(f[2][:HEADER.size + 10])                   # stripe 2 starts first
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.001)
        a = ch.arrival(KIND_ACT, 7, 2)
        assert a is not None and not a.complete
        assert (a.kind, a.iteration, a.microbatch, a.total_bytes) == (KIND_ACT, 7, 2, 100_000)
        assert t0 <= a.t_first_ns <= time.time_ns()
        assert seen == [a]                                          # the same facts, once
        socks[2].sendall(f[2][HEADER.size + 10:])
        for i in (0, 1, 3):
            socks[i].sendall(f[i])
        deadline = time.monotonic() + 5
        while not ch.arrival(KIND_ACT, 7, 2).complete and time.monotonic() < deadline:
            time.sleep(0.001)
        done = ch.arrival(KIND_ACT, 7, 2)
        assert done.complete and (done.t_first_ns, done.total_bytes) == (a.t_first_ns, 100_000)
        got = ch.recv(KIND_ACT, 7, 2, timeout_s=5)
        assert torch.equal(got.tensor, tensor) and got.t_first_ns == a.t_first_ns
        assert ch.arrival(KIND_ACT, 7, 2) is None                   # taken
        assert len(seen) == 1
        socks[0].sendall(frames(KIND_GRAD, 7, 3, tensor, 0, 1)[0])  # another message: a call
        done = ch.recv(KIND_GRAD, 7, 3, timeout_s=5)
        assert [(x.kind, x.microbatch, x.total_bytes) for x in seen] == \
            [(KIND_ACT, 2, 100_000), (KIND_GRAD, 3, 40_000)]
        assert seen[1].t_first_ns == done.t_first_ns


# -- a connection lost mid-message --------------------------------------------------------------

def _reset(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


@pytest.mark.loopback
@pytest.mark.parametrize("how", ["reset", "closed mid-frame", "closed between frames"])
def test_a_lost_connection_fails_recv_at_once(how):
    tensor = torch.arange(100_000, dtype=torch.float32)        # 400 kB: 4 stripes on K=4
    f = frames(KIND_ACT, 0, 0, tensor, 0, 4)
    with raw_peer(4) as (ch, socks):
        for i in (0, 1, 3):
            socks[i].sendall(f[i])
        if how != "closed between frames":
            socks[2].sendall(f[2][:HEADER.size + 1000])
        time.sleep(0.1)
        t0 = time.monotonic()
        if how == "reset":
            _reset(socks[2])
        else:
            socks[2].close()
        with pytest.raises(ConnectionError, match=f"connection 2 of 4 to {PEER}") as exc:
            ch.recv(KIND_ACT, 0, 0, timeout_s=30)
        assert time.monotonic() - t0 < 2
        assert PEER in str(exc.value)


@pytest.mark.loopback
def test_the_peer_closing_between_messages_is_reported_as_closed():
    with channel_pair(3) as (a, b):
        big = torch.randn(200_000)
        a.send(KIND_ACT, 0, 0, big)
        closer = threading.Thread(target=a.close, args=(5,))   # waits for b's half-close
        closer.start()
        assert torch.equal(b.recv(KIND_ACT, 0, 0, timeout_s=10).tensor, big)
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match="closed before sending F1"):
            b.recv(KIND_ACT, 0, 1, timeout_s=30)
        assert time.monotonic() - t0 < 2
        b.close(timeout_s=5)
        closer.join(5)


# -- bad headers ------------------------------------------------------------------------------

HUGE_SHAPE = (64 << 20, 0, 0, 0)        # 64 Mi float32: a 256 MiB payload
HUGE = 256 << 20

BAD = {
    "offset beyond total": (2, [(0, header(payload=HUGE, shape=HUGE_SHAPE, offset=HUGE - 10,
                                           length=20, count=2))], "beyond"),
    "huge count": (2, [(0, header(payload=8, shape=(2, 0, 0, 0), length=8, count=3))],
                   "stripe count 3"),
    "index not below count": (2, [(0, header(payload=8, shape=(2, 0, 0, 0), length=8, index=2,
                                             count=2))], "index 2"),
    "mismatched totals": (2, [(0, header(payload=8, pad=8, shape=(2, 0, 0, 0), length=8,
                                         count=2) + bytes(8)),
                              (1, header(payload=HUGE, pad=8, shape=HUGE_SHAPE, offset=8,
                                         length=8, index=1, count=2))], "disagrees"),
    "duplicate stripe": (2, [(0, header(payload=16, shape=(4, 0, 0, 0), length=8, count=2)
                              + bytes(8)),
                             (1, header(payload=16, shape=(4, 0, 0, 0), length=8, count=2))],
                         "duplicate stripe 0"),
    "overlapping stripes": (3, [(0, header(payload=24, shape=(6, 0, 0, 0), length=12, count=3)
                                 + bytes(12)),
                                (1, header(payload=24, shape=(6, 0, 0, 0), offset=8, length=8,
                                           index=1, count=3))], "overlaps"),
    "stripes leave a hole": (2, [(0, header(payload=16, shape=(4, 0, 0, 0), length=4, count=2)
                                  + bytes(4)),
                                 (1, header(payload=16, shape=(4, 0, 0, 0), offset=8, length=8,
                                            index=1, count=2))], "cover 12 of its 16"),
    "payload not shape x dtype": (1, [(0, header(payload=HUGE, shape=(3, 0, 0, 0),
                                                 length=HUGE))], "does not match"),
    "payload over the limit": (1, [(0, header(payload=1 << 40, shape=(1 << 38, 0, 0, 0),
                                              length=1 << 40))], "payload over"),
}


@pytest.mark.loopback
@pytest.mark.parametrize("name", BAD)
def test_a_bad_header_is_an_error_without_a_big_allocation(name):
    k, writes, match = BAD[name]
    tracemalloc.start()
    try:
        with raw_peer(k) as (ch, socks):
            for conn, data in writes:
                socks[conn].sendall(data)
                time.sleep(0.05)      # in this order
            with pytest.raises(ConnectionError, match=match) as exc:
                ch.recv(KIND_ACT, 0, 0, timeout_s=5)
            assert isinstance(exc.value.__cause__, FrameError)
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{name}: {peak} bytes allocated"


# -- the gate ---------------------------------------------------------------------------------

@pytest.mark.loopback
def test_the_gate_wraps_every_stripe_of_each_message():
    k = 3
    calls = []      # (wire_bytes, t_enter, t_exit)
    hold = threading.Event()

    @contextlib.contextmanager
    def gate(wire_bytes):
        hold.wait(10)
        t = time.time_ns()
        yield
        calls.append((wire_bytes, t, time.time_ns()))

    # the receiving end is raw: it counts every byte that arrives after the hellos
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    counted = [0] * k
    firsts = [0] * k

    def count(sock, i):
        n = len(hello_frame(PEER, i, k))
        got = b""
        while len(got) < n:
            got += sock.recv(n - len(got))
        while data := sock.recv(1 << 20):
            if not counted[i]:
                firsts[i] = time.time_ns()
            counted[i] += len(data)

    conns = []

    def accept_all():
        for _ in range(k):
            s, _ = server.accept()
            head = s.recv(len(hello_frame(PEER, 0, k)), socket.MSG_PEEK)
            conns.append(s)
            threading.Thread(target=count, args=(s, int.from_bytes(head[4:6], "big"))).start()

    t = threading.Thread(target=accept_all)
    t.start()
    sent = []
    ch = connect("127.0.0.1", server.getsockname()[1], hello=PEER, peer="counter",
                 timeout_s=5, connections=k, gate=gate, on_sent=sent.append)
    t.join(5)
    msgs = [(torch.randn(100_000), 0), (torch.ones(2), 1_000_000), (torch.empty(0), 0)]
    for mb, (tensor, pad_to) in enumerate(msgs):
        ch.send(KIND_ACT, 0, mb, tensor, pad_to_bytes=pad_to)
    time.sleep(0.3)
    assert calls == [] and sum(counted) == 0      # the gate holds: nothing on the wire
    t_release = time.time_ns()
    hold.set()
    expect = []
    for tensor, pad_to in msgs:
        total = max(tensor.numel() * tensor.element_size(), pad_to)
        expect.append(len(stripe_plan(total, k)) * HEADER.size + total)
    deadline = time.monotonic() + 5
    while sum(counted) < sum(expect) and time.monotonic() < deadline:
        time.sleep(0.01)
    for s in conns:
        s.shutdown(socket.SHUT_WR)
    ch.close(timeout_s=5)
    for s in conns:
        s.close()
    server.close()
    assert [c[0] for c in calls] == expect                       # once per message
    assert sum(counted) == sum(expect)                           # wire_bytes is what was sent
    assert min(f for f in firsts if f) >= t_release
    for (_, t_in, t_out), rec in zip(calls, sent):              # written inside the gate
        assert t_in <= rec.t_start_ns <= rec.t_end_ns <= t_out
    assert all(c1[2] <= c2[1] for c1, c2 in zip(calls, calls[1:]))   # one message at a time


@pytest.mark.loopback
def test_a_failing_gate_fails_the_channel():
    def gate(wire_bytes):
        raise RuntimeError("no slot")

    with channel_pair(2, gate=gate) as (a, b):
        a.send(KIND_ACT, 0, 0, torch.ones(3))
        deadline = time.monotonic() + 5
        while a._tx_error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(ConnectionError, match="no slot"):
            a.send(KIND_ACT, 0, 1, torch.ones(3))
        with pytest.raises(ConnectionError):       # the peer hears of it at once
            b.recv(KIND_ACT, 0, 0, timeout_s=5)
        b.sock.shutdown(socket.SHUT_WR)     # so a's close need not wait for b's
        for s in b.socks[1:]:
            s.shutdown(socket.SHUT_WR)
        with pytest.raises(ConnectionError, match="no slot"):
            a.close(timeout_s=2)            # the pair's exit closes it again: a no-op


# -- hellos -----------------------------------------------------------------------------------

@pytest.mark.loopback
def test_hello_checks_index_and_k():
    lst = Listener("127.0.0.1", 0)
    port = lst.sock.getsockname()[1]

    def raw(index, k, name=PEER):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(hello_frame(name, index, k))
        return s

    socks = [raw(0, 3), raw(0, 2), raw(2, 2), raw(0, 2), raw(1, 2)]   # wrong K, ok, bad index,
    try:                                                                # duplicate, ok
        ch = lst.accept(PEER, timeout_s=5, connections=2)
        try:
            assert len(ch.socks) == 2
            socks[4].sendall(frames(KIND_ACT, 0, 0, torch.ones(4), 0, 2)[0])   # on connection 1
            assert torch.equal(ch.recv(KIND_ACT, 0, 0, timeout_s=5).tensor, torch.ones(4))
        finally:
            ch.close(timeout_s=0.5)
        for i in (0, 2, 3):        # rejected: closed by the listener
            socks[i].settimeout(5)
            try:
                assert socks[i].recv(1) == b""
            except ConnectionResetError:
                pass
        extra = [raw(0, 3), raw(1, 2), raw(1, 2)]
        with pytest.raises(TimeoutError, match=r"1 of its 2 connections came.*K=3, expected "
                                               r"K=2.*index 1 twice"):
            lst.accept(PEER, timeout_s=0.5, connections=2)
        socks += extra
    finally:
        for s in socks:
            s.close()
        lst.close()


@pytest.mark.loopback
def test_connect_with_another_k_is_refused_by_name():
    lst = Listener("127.0.0.1", 0)
    port = lst.sock.getsockname()[1]
    ch = connect("127.0.0.1", port, hello=PEER, peer=LISTENER_PEER, timeout_s=5, connections=2)
    try:
        with pytest.raises(TimeoutError, match=f"{PEER} did not connect.*K=2, expected K=3"):
            lst.accept(PEER, timeout_s=0.5, connections=3)
    finally:
        lst.close()
        ch.close(timeout_s=1)     # the listener closed both: nothing to wait for
    with pytest.raises(ValueError, match="connections"):
        connect("127.0.0.1", port, hello=PEER, peer=LISTENER_PEER, timeout_s=1, connections=0)


# -- K per boundary in the launcher's plan ------------------------------------------------------

@pytest.mark.unit
def test_plan_workers_sets_k_per_boundary(tmp_path):
    from testbed.spec.training import TrainConfig
    from testbed.plans.workers import HostInfo, WorkerSetup, plan_workers
    from testbed.spec.links import LinkDir
    cfg = TrainConfig.from_dict({"model": {"n_layer": 3, "n_embd": 32, "n_head": 2,
                                           "seq_len": 16, "vocab_size": 64},
                                 "stages": 3, "micro_batches": 2})
    hosts = [HostInfo(name="a-h1", ip="10.1.0.1", dc="a"), HostInfo(name="a-h2", ip="10.1.0.2",
                                                                   dc="a"),
             HostInfo(name="b-h1", ip="10.2.0.1", dc="b")]
    k = {LinkDir(s, d): 1 if s == d else 4 for s in "ab" for d in "ab"}
    specs = plan_workers(cfg, hosts, tmp_path, WorkerSetup(connections=k))
    assert [(s.connections_prev, s.connections_next) for s in specs] == [(1, 1), (1, 4), (4, 1)]
    default = plan_workers(cfg, hosts, tmp_path)
    assert all((s.connections_prev, s.connections_next) == (1, 1) for s in default)
    with pytest.raises(ValueError, match="connections"):
        plan_workers(cfg, hosts, tmp_path,
                     WorkerSetup(connections={LinkDir(s, d): 0 for s in "ab" for d in "ab"}))
