"""Channel.close() never cuts a half-sent message silently (trainer/transport.py), on loopback
with real sockets: a peer that stops reading makes close() raise ConnectionError naming the
peer, the message, its wire bytes written of its total and the queued messages never sent, and
still release the sockets and threads; a close after everything was sent stays quiet.

No wall-clock figures here (how close to its timeout close() returns is bench/bench_deadlines.py's,
with tests/tolerance.py): order and state instead, and bounds load cannot break (close() waits
at least its timeout for a peer that stops reading). pytest's timeout marks stand for "it does
not hang"."""

import contextlib
import re
import socket
import threading
import time

import pytest
import torch

from trainer.transport import HEADER, KIND_ACT, KIND_GRAD, Listener, connect, stripe_plan

pytestmark = pytest.mark.loopback

PEER = "s0r0"            # the connecting side's name (its hello)
SILENT_PEER = "s1r0"     # the peer that accepts and never reads
BIG = 64 << 20           # a 64 MiB message: far more than loopback's socket buffers
SMALL_BUF = 64 << 10


@contextlib.contextmanager
def silent_peer(k: int, gate=None):
    """A connect()ed channel of K connections whose peer accepts them and never reads."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_BUF)   # the accepted inherit it
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    ch = connect("127.0.0.1", server.getsockname()[1], hello=PEER, peer=SILENT_PEER,
                 timeout_s=5, connections=k, gate=gate)
    for s in ch.socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_BUF)
    conns = [server.accept()[0] for _ in range(k)]
    try:
        yield ch
    finally:
        for s in conns:
            s.close()
        server.close()


def wire_bytes(total: int, k: int) -> int:
    """What the sender writes for one message of `total` bytes (payload + pad) on K connections."""
    return len(stripe_plan(total, k)) * HEADER.size + total


def written(text: str) -> tuple[int, int]:
    """(bytes written, wire bytes) out of a close() error."""
    m = re.search(r"had (\d+) of its (\d+) wire bytes written", text)
    assert m, text
    return int(m.group(1)), int(m.group(2))


def assert_released(ch) -> None:
    assert all(s.fileno() == -1 for s in ch.socks)                 # every socket closed
    assert not ch._sender.is_alive()                               # no thread left blocked
    assert not any(t.is_alive() for t in ch._writers)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("k", [1, 3])
def test_a_peer_that_stops_reading_makes_close_raise(k):
    with silent_peer(k) as ch:
        ch.send(KIND_ACT, 7, 3, torch.ones(1000), pad_to_bytes=BIG)
        time.sleep(0.2)                       # the sender is blocked inside the message
        t0 = time.monotonic()
        with pytest.raises(ConnectionError) as exc:
            ch.close(timeout_s=1)
        took = time.monotonic() - t0
        text = str(exc.value)
        assert SILENT_PEER in text
        assert "F3 of iteration 7 (micro-batch 3)" in text
        sent, total = written(text)
        assert total == wire_bytes(BIG, k)
        assert 0 < sent < total
        assert f"of {k} stripes whole" in text
        assert "0 queued messages never sent" in text
        assert took >= 1                      # it waited its whole timeout before cutting
        assert_released(ch)
        ch.close(timeout_s=1)                 # a second close does nothing


def test_close_counts_the_queued_messages_never_sent():
    with silent_peer(2) as ch:
        ch.send(KIND_GRAD, 4, 0, torch.ones(10), pad_to_bytes=BIG)
        for mb in (1, 2, 3):
            ch.send(KIND_GRAD, 4, mb, torch.ones(10))
        time.sleep(0.2)
        with pytest.raises(ConnectionError) as exc:
            ch.close(timeout_s=0.5)
        text = str(exc.value)
        assert "B0 of iteration 4 (micro-batch 0)" in text
        assert "3 queued messages never sent" in text
        sent, total = written(text)
        assert sent < total == wire_bytes(BIG, 2)
        assert_released(ch)


def test_a_message_held_in_its_gate_at_the_deadline_is_reported():
    hold = threading.Event()

    @contextlib.contextmanager
    def gate(wire):
        hold.wait(10)
        yield

    with silent_peer(1, gate=gate) as ch:
        ch.send(KIND_ACT, 2, 5, torch.ones(4))
        ch.send(KIND_ACT, 2, 6, torch.ones(4))
        with pytest.raises(ConnectionError) as exc:
            ch.close(timeout_s=0.3)
        # a sender stuck in its gate is not waited for: close() is back while it still is
        assert not hold.is_set() and ch._sender.is_alive()
        text = str(exc.value)
        assert "F5 of iteration 2 (micro-batch 5) had 0 of its " in text
        assert written(text)[1] == wire_bytes(16, 1)
        assert "1 queued message never sent" in text
        assert all(s.fileno() == -1 for s in ch.socks)
        hold.set()                            # the sender then fails on its closed socket
        ch._sender.join(5)
        assert not ch._sender.is_alive()


@contextlib.contextmanager
def channel_pair(k: int):
    """(sender, receiver): a connect()ed channel and the channel its Listener accepted."""
    lst = Listener("127.0.0.1", 0)
    got = {}
    t = threading.Thread(target=lambda: got.update(ch=lst.accept(PEER, timeout_s=10,
                                                                  connections=k)))
    t.start()
    a = connect("127.0.0.1", lst.sock.getsockname()[1], hello=PEER, peer="s1r0", timeout_s=10,
                connections=k)
    t.join(10)
    try:
        yield a, got["ch"]
    finally:
        lst.close()


@pytest.mark.parametrize("k", [1, 3])
def test_close_after_everything_was_received_is_quiet(k):
    with channel_pair(k) as (a, b):
        sent = {mb: torch.randn(300_000) for mb in range(4)}     # 1.2 MB each
        for mb, tensor in sent.items():
            a.send(KIND_ACT, 0, mb, tensor, pad_to_bytes=4 << 20)
        for mb, tensor in sent.items():
            assert torch.equal(b.recv(KIND_ACT, 0, mb, timeout_s=10).tensor, tensor)
        closer = threading.Thread(target=b.close, args=(5,))   # each close waits for the
        closer.start()                                        # other's half-close
        a.close(timeout_s=5)                                  # raises nothing
        # back because the peer's half-close came (every reader saw it end), not its timeout
        assert not any(t.is_alive() for t in a._readers)
        closer.join(10)
        assert a._inflight is None and a._unsent == 0
        assert_released(a)


def test_close_with_sends_still_going_that_finish_in_time_is_quiet():
    with channel_pair(2) as (a, b):
        for mb in range(3):
            a.send(KIND_ACT, 1, mb, torch.ones(10), pad_to_bytes=8 << 20)
        closer = threading.Thread(target=b.close, args=(10,))
        closer.start()
        a.close(timeout_s=10)                 # drains the queue first, then closes
        closer.join(10)
        assert_released(a)


def test_close_with_nothing_to_send_to_a_silent_peer_is_quiet():
    with silent_peer(2) as ch:
        ch.close(timeout_s=0.5)               # waits for the peer's half-close, then gives up
        assert_released(ch)
