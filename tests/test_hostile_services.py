"""Hostile input to the services' wire parsers (hypothesis): BubbleTea's framing and request and
KV-header checks (prefill/wire.py, prefill/server.py, prefill/decode_server.py), the controller's
notices (testbed/host/notices.py, prefill/controller.py) and the WAN slot arbiter's lines
(testbed/features/temporal/arbiter.py). JSON text is generated as text, so it holds what json.dumps never writes:
integers past Python's 4300-digit limit, nesting deeper than the recursion limit, 1e999. Every
input is a reply or an error of the parser's own (ignored and counted for notices), never
another exception."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefill import wire
from testbed.host.notices import parse_notice
from prefill.decode_server import check_kv_header
from prefill.decoder import InferenceConfig
from testbed.rules.prefill_profile import PrefillProfile
from prefill.server import RequestError, parse_request
from tests.test_bubbletea_parts import close_controller, make_controller
from tests.test_wanshare import start_fake_arbiter

KEYS = ["type", "id", "prompt", "target_tokens", "max_new_tokens", "decode", "ip", "port",
        "not_after_ns", "t_arrival_ns", "chunk", "start", "end", "payload_bytes", "pad_bytes",
        "shape", "dtype", "prompt_len", "first_token", "kind", "host", "busy_ns", "t_idle_ns",
        "t_pred_end_ns", "iteration", "op", "gaps_ns", "awaits", "pending", "wire_ns",
        "made_ns", "maker", "spread_ns", "end_min_ns", "end_max_ns", "seq"]
HUGE_INT = st.integers(4301, 4400).map(lambda n: "9" * n)
SCALAR = (st.sampled_from(["null", "true", "false", "1e999", "-1e999", "-0", "0.5", "NaN",
                           "Infinity", '"prefill"', '"kv"', '"float32"', '"127.0.0.1"',
                           '"a-h1"', '"bubble"', '"busy"', '"arrival"', '"output"'])
          | st.integers(-2**70, 2**70).map(str) | HUGE_INT | st.text(max_size=20).map(json.dumps))
JSON_TEXT = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
    | st.lists(st.tuples(st.sampled_from(KEYS) | st.text(max_size=6), inner), max_size=6)
    .map(lambda kv: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in kv) + "}"),
    max_leaves=24)
DEEP = st.integers(50, 20000).map(lambda n: '{"id":' + "[" * n + "]" * n + "}")
OBJECT_TEXT = st.lists(st.tuples(st.sampled_from(KEYS), JSON_TEXT), max_size=10).map(
    lambda kv: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in kv) + "}")
MODEL = InferenceConfig(seed=3)
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _loads(text: str):
    """The object json.loads makes of text, or None where it refuses it (as wire does)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _frame(body: bytes) -> bytes:
    return wire.PREFIX.pack(wire.MAGIC, wire.VERSION, len(body)) + body


@pytest.mark.loopback
@FUZZ
@given(OBJECT_TEXT | JSON_TEXT | DEEP, st.integers(0, 200), st.booleans())
def test_wire_takes_any_header_text(text, cut, truncate):
    data = _frame(text.encode())
    if truncate:
        data = data[:max(0, len(data) - cut)]
    a, b = socket.socketpair()
    a.settimeout(2.0)
    writer = threading.Thread(target=lambda: (b.sendall(data), b.close()))
    writer.start()
    try:
        msg = wire.recv_msg(a, max_payload_bytes=1 << 16, max_pad_bytes=1 << 16,
                            header_deadline_s=2.0)
    except (wire.WireError, wire.PeerClosed) as exc:
        assert str(exc) and "\n" not in str(exc) and len(str(exc)) < 400
        return
    finally:
        writer.join(2)
        a.close()
    assert msg is None or isinstance(msg.header, dict)


@pytest.fixture(scope="module")
def profile():
    return PrefillProfile.load()


@pytest.mark.unit
@FUZZ
@given(OBJECT_TEXT, st.booleans())
def test_requests_and_kv_headers_take_any_object(profile, text, profile_mode):
    header = _loads(text)
    if header is None:
        return
    decoders = frozenset({("127.0.0.1", 7000)})
    try:
        parse_request(header, MODEL, profile if profile_mode else None, decoders)
    except RequestError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400, str(exc)
    header.setdefault("payload_bytes", 0)
    try:
        check_kv_header(header, MODEL)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400, str(exc)


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    ctl = make_controller(tmp_path_factory.mktemp("ctl"))
    yield ctl
    close_controller(ctl)


@pytest.mark.loopback
@FUZZ
@given(OBJECT_TEXT | JSON_TEXT | DEEP)
def test_notices_take_any_datagram(controller, text):
    notice = _loads(text)
    if notice is not None:
        try:
            n = parse_notice(notice)
            n.out_of_window(0, 10**12)
        except (KeyError, TypeError, ValueError):
            pass
    before = controller.counts["notices_refused"]
    n, seq = controller._parse(text.encode(), ("127.0.0.1", 5000))
    if n is None:
        assert controller.counts["notices_refused"] == before   # counted by the caller
        return
    with controller.cv:
        if seq is None or controller._count_lost(("127.0.0.1", 5000), seq):
            controller._on_notice(n)
    assert controller.counts["notices_lost"] < 10**6


@pytest.fixture(scope="module")
def arbiter(tmp_path_factory):
    arb, share, port, stop = start_fake_arbiter(tmp_path_factory.mktemp("arb"),
                                                {0: ["127.0.0.1"], 1: ["127.0.0.1"]})
    yield arb, port
    assert stop()


LINE = (st.sampled_from(["REQ sa->sb 0 ", "REQ sa->sb 1 ", "REQ sa-gw-eth1 0 ", "DONE ",
                         "REQ ", "", "HELLO "])
        .flatmap(lambda verb: st.tuples(st.just(verb), HUGE_INT | st.integers(-2**70, 2**70)
                                        .map(str) | st.text(max_size=30)))
        .map(lambda vt: (vt[0] + vt[1]).encode("utf-8", "replace")))


@pytest.mark.loopback
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LINE | st.binary(max_size=300), min_size=1, max_size=3))
def test_arbiter_takes_any_line(arbiter, lines):
    arb, port = arbiter
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(x + b"\n" for x in lines))
        reply = sock.recv(300)
    assert reply == b"" or reply.startswith((b"ERR ", b"GRANT ")), reply
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:   # still serving
        sock.sendall(b"HELLO\n")
        assert sock.recv(300).startswith(b"ERR ")
