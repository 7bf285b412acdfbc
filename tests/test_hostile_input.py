"""Hostile or broken input (hypothesis): the scenario loader (its faults and cross_traffic
sections too), BubbleTea's wire parser and the
trainer's frame-header check take arbitrary input and give a valid result or their own clear
error, never another exception or a hang."""

from __future__ import annotations

import json
import socket
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefill import wire
from testbed.spec.errors import ScenarioError
from testbed.spec.scenario import Scenario, parse_scenario
from trainer import transport

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10**12, 10**12)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                  max_size=6),
    max_leaves=25)
VALID = {"name": "h", "dcs": [{"name": "ha", "hosts": 1}, {"name": "hb", "hosts": 1}],
         "wan": [{"between": ["ha", "hb"], "delay_ms": 5, "rate_mbit": 20}],
         "systems": ["baseline"],
         "training": {"stages": 2, "replicas": 1, "micro_batches": 2, "iterations": 2},
         "faults": [{"kind": "crash", "process": "trainer", "host": "ha-h1", "at_s": 1},
                    {"kind": "rate_trace", "link": ["ha", "hb"], "at_s": 0,
                     "steps": [[0, 5], [1, 10]]}],
         "cross_traffic": [{"from": "ha", "to": "hb", "kind": "udp", "stop_s": 3,
                            "rate_trace": [[0, 5], [1, 10]]}]}
FIELD_PATHS = [("name",), ("scale",), ("time_scale",), ("backend",), ("routing",),
               ("connections",), ("systems",), ("dcs",), ("wan",), ("sweep",),
               ("description",), ("tcp_slow_start_after_idle",), ("predict_only",),
               ("dcs", 0, "name"), ("dcs", 0, "hosts"), ("dcs", 1, "rate_mbit"),
               ("wan", 0, "between"), ("wan", 0, "delay_ms"), ("wan", 0, "rate_mbit"),
               ("wan", 0, "queue"), ("wan", 0, "loss_pct"), ("bubbletea",), ("faults",),
               ("faults", 0), ("faults", 0, "link"), ("faults", 0, "at_s"),
               ("faults", 0, "host"), ("faults", 1, "steps"), ("faults", 1, "kind"),
               ("cross_traffic",), ("cross_traffic", 0), ("cross_traffic", 0, "rate_trace"),
               ("cross_traffic", 0, "from"), ("cross_traffic", 0, "stop_s"),
               ("cross_traffic", 0, "kind")]


def _load(doc) -> None:
    try:
        assert isinstance(parse_scenario(doc), Scenario)
    except ScenarioError as exc:
        assert str(exc) and "\n" not in str(exc)


@pytest.mark.unit
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JSONISH)
def test_scenario_loader_takes_anything(doc):
    _load(doc)


@pytest.mark.unit
@settings(max_examples=400, deadline=None)
@given(st.sampled_from(FIELD_PATHS), JSONISH)
def test_scenario_loader_takes_any_value_in_any_field(path, value):
    doc = json.loads(json.dumps(VALID))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _load(doc)


def _roundtrip(data: bytes):
    """recv_msg over a real socket pair, the peer writing data and closing."""
    a, b = socket.socketpair()
    a.settimeout(2.0)
    writer = threading.Thread(target=lambda: (b.sendall(data), b.close()))
    writer.start()
    try:
        return wire.recv_msg(a, max_payload_bytes=1 << 16, max_pad_bytes=1 << 16)
    finally:
        writer.join(2)
        a.close()


@pytest.mark.loopback
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.builds(
    lambda h, rest: wire.PREFIX.pack(wire.MAGIC, wire.VERSION, len(h)) + h + rest,
    st.binary(max_size=80) | JSONISH.map(lambda d: json.dumps(d).encode()),
    st.binary(max_size=100)))
def test_wire_parser_takes_any_bytes(data):
    try:
        msg = _roundtrip(data)
    except (wire.WireError, wire.PeerClosed) as exc:
        assert str(exc)
        return
    assert msg is None or isinstance(msg.header, dict)


@pytest.mark.unit
@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=transport.HEADER.size, max_size=transport.HEADER.size),
       st.integers(1, 16))
def test_frame_header_check_takes_any_header(raw, connections):
    (magic, kind, code, ndim, _, iteration, mb, payload, pad, *rest) = \
        transport.HEADER.unpack(raw)
    shape = rest[:transport.MAX_DIMS]
    offset, length, index, count = rest[transport.MAX_DIMS:]
    try:
        transport._check_header(magic, kind, code, ndim, iteration, mb, payload, pad, shape,
                                offset, length, index, count, connections)
    except transport.FrameError as exc:
        assert str(exc)
        return
    # accepted: everything the receiver allocates from it is within its limits
    assert payload <= transport.MAX_PAYLOAD_BYTES and count <= connections
    assert offset + length <= payload + pad and ndim <= transport.MAX_DIMS


@pytest.mark.unit
def test_a_valid_scenario_still_loads():
    assert parse_scenario(json.loads(json.dumps(VALID))).name == "h"
    assert struct.calcsize("!4sHI") == wire.PREFIX.size
