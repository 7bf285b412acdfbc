"""Framing of BubbleTea messages (prefill/wire.py) over real TCP on 127.0.0.1: round trips with
payload and padding, refusals before allocation, garbage, and EOF in and between messages.
How late the header deadline fires is bench/bench_deadlines.py's figure; here, that it fires (and
not the socket's timeout) and never early."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from prefill.wire import (MAGIC, MAX_HEADER_BYTES, PREFIX, VERSION, PeerClosed, WireError,
                          recv_msg, send_msg)

pytestmark = pytest.mark.loopback

LIMITS = {"max_payload_bytes": 1 << 20, "max_pad_bytes": 1 << 24}


@pytest.fixture
def pair():
    """(a, b): the two ends of one TCP connection on loopback; b times out after 5 s."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        a = socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
    b.settimeout(5.0)
    yield a, b
    a.close()
    b.close()


def _raw(header: bytes, magic: bytes = MAGIC, header_len: int | None = None) -> bytes:
    return PREFIX.pack(magic, VERSION, len(header) if header_len is None else header_len) + header


def test_round_trip_with_payload_and_padding(pair):
    a, b = pair
    payload = bytes(range(256)) * 1000
    pad = 5 * (1 << 20) + 123                # several chunks, not a multiple of one
    sent = []
    t = threading.Thread(target=lambda: sent.append(send_msg(a, {"id": "x", "n": [1, 2]},
                                                             payload, pad)))
    t.start()
    msg = recv_msg(b, **LIMITS)
    t.join()
    assert msg.header == {"id": "x", "n": [1, 2], "payload_bytes": len(payload),
                          "pad_bytes": pad}
    assert msg.payload == payload and msg.pad_bytes == pad
    assert msg.t_first_ns <= msg.t_last_ns
    body = json.dumps(msg.header, separators=(",", ":")).encode()
    assert sent == [PREFIX.size + len(body) + len(payload) + pad]
    # a small message without payload on the same connection; then a clean EOF
    assert send_msg(a, {"k": 1}) > PREFIX.size
    assert recv_msg(b, **LIMITS).header == {"k": 1, "payload_bytes": 0, "pad_bytes": 0}
    a.shutdown(socket.SHUT_WR)
    assert recv_msg(b, **LIMITS) is None


def test_oversize_header_refused_before_reading_it(pair):
    a, b = pair
    a.sendall(_raw(b"", header_len=MAX_HEADER_BYTES + 1))   # and nothing after: no read waits
    with pytest.raises(WireError, match="header of 65537 bytes is over 65536") as exc:
        recv_msg(b, **LIMITS)
    assert not exc.value.in_sync
    with pytest.raises(WireError, match="over 65536"):
        send_msg(a, {"x": "y" * MAX_HEADER_BYTES})


def test_oversize_payload_and_padding_refused_before_allocation(pair):
    a, b = pair
    a.sendall(_raw(json.dumps({"id": "big", "payload_bytes": 10**15}).encode()))
    with pytest.raises(WireError, match="payload of 1000000000000000 bytes is over") as exc:
        recv_msg(b, **LIMITS)
    assert exc.value.header["id"] == "big"
    a.sendall(_raw(json.dumps({"pad_bytes": 1 << 25}).encode()))
    with pytest.raises(WireError, match="padding of 33554432 bytes is over"):
        recv_msg(b, **LIMITS)
    a.sendall(_raw(b'{"payload_bytes": -1}'))
    with pytest.raises(WireError, match="payload_bytes is -1"):
        recv_msg(b, **LIMITS)


def test_check_refuses_by_header_and_keeps_the_stream(pair):
    a, b = pair

    def check(h: dict) -> None:
        if h.get("ok") is not True:
            raise ValueError("ok: must be true")

    t = threading.Thread(target=lambda: (send_msg(a, {"ok": False}, b"p" * 1000, 3 << 20),
                                         send_msg(a, {"ok": True}, b"q" * 10)))
    t.start()
    with pytest.raises(WireError, match="ok: must be true") as exc:
        recv_msg(b, **LIMITS, check=check)
    assert exc.value.in_sync
    msg = recv_msg(b, **LIMITS, check=check)
    t.join()
    assert msg.payload == b"q" * 10


def test_garbage(pair):
    a, b = pair
    a.sendall(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(WireError, match="bad magic b'GET '"):
        recv_msg(b, **LIMITS)


@pytest.mark.parametrize("body,match", [(b"{not json", "not JSON"), (b"[1, 2]", "not an object"),
                                        (b"\xff\xfe", "not JSON")])
def test_header_not_a_json_object(pair, body, match):
    a, b = pair
    a.sendall(_raw(body))
    with pytest.raises(WireError, match=match):
        recv_msg(b, **LIMITS)


def test_wrong_version(pair):
    a, b = pair
    a.sendall(PREFIX.pack(MAGIC, VERSION + 1, 2) + b"{}")
    with pytest.raises(WireError, match="wire version 2"):
        recv_msg(b, **LIMITS)


@pytest.mark.parametrize("cut", [3, PREFIX.size + 4, "payload", "padding"])
def test_eof_mid_message(pair, cut):
    a, b = pair
    header = json.dumps({"payload_bytes": 100, "pad_bytes": 50}).encode()
    whole = _raw(header) + b"p" * 100 + bytes(50)
    n = {"payload": len(whole) - 120, "padding": len(whole) - 20}.get(cut, cut)
    a.sendall(whole[:n])
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(PeerClosed, match="peer closed inside"):
        recv_msg(b, **LIMITS)


def test_header_deadline_from_the_first_byte(pair):
    a, b = pair
    t0 = time.monotonic()                          # before the first byte: the deadline's start
    a.sendall(_raw(b'{"k": 1}')[:3])               # then nothing: a trickling peer
    # the deadline, not the socket's 5 s timeout
    with pytest.raises(WireError, match="header deadline passed with 0 of the 7 bytes still "
                                        "due of the message prefix") as exc:
        recv_msg(b, **LIMITS, header_deadline_s=0.3)
    assert time.monotonic() - t0 >= 0.3 and not exc.value.in_sync     # never early
    assert b.gettimeout() == 5.0                   # the socket's own timeout is back


def test_an_integer_past_the_digit_limit_is_a_wire_error(pair):
    a, b = pair
    a.sendall(_raw(b'{"n": 1' + b"0" * 5000 + b"}"))
    with pytest.raises(WireError, match="header is not JSON: Exceeds the limit"):
        recv_msg(b, **LIMITS)
