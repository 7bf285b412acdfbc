"""How long one message takes over one path, alone: a round-trip model of window-limited TCP.

One job: a single transfer's time. Pure, no kernel. The message of `payload_bytes` is striped
over K connections (trainer.stripes: min(K, bytes / 4 KiB) stripes of equal size). Each
connection sends, per round trip, at most its window: the receive window the testbed's hosts
advertise (testbed.systems.window_bytes) or, in slow start after an idle gap (Linux's
tcp_slow_start_after_idle, on by default), its congestion window, which restarts at
INITIAL_WINDOW_SEGMENTS full segments and doubles every round trip up to the receive window.
The stripes' data leave together, so every connection needs the same number of rounds n; the
last byte arrives

    one_way_ms + (n - 1) x rtt_ms + (the last round's wire bytes, all stripes) x 8 / rate

and never before the whole message's wire bytes at the path's rate (the rate-bound case, when K
windows per round trip exceed the path's bandwidth-delay product):

    one_way_ms + wire bytes x 8 / rate.

Wire bytes are payload x 1514 / 1448 (testbed.slotplan). This fits the measured steady
transfers of bench/bench_connections.py within 5% (README: 1503 / 707 / 313 / 127 ms predicted
at K = 1 / 2 / 4 / 8, 100 ms one way, 336 KB, window 45 KB, against 1502 / 706 / 314 / 128 ms).
Not modelled: loss and retransmission, delayed ACKs, pacing, and the receive window's own
growth on a fresh connection (the testbed's connections are warm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.scenario import TCP_MSS_BYTES
from testbed.slotplan import WIRE_BYTES_PER_PAYLOAD_BYTE
from trainer.stripes import stripe_count

INITIAL_WINDOW_SEGMENTS = 10      # Linux's initial congestion window (RFC 6928)


@dataclass(frozen=True, kw_only=True, slots=True)
class PathSpec:
    """A routed path as one TCP connection sees it (configured values)."""
    rate_mbit: float          # the bottleneck rate
    one_way_ms: float         # delay there
    rtt_ms: float             # there and back
    window_bytes: float       # receive window per connection
    connections: int = 1      # K


def rounds_needed(stripe_bytes: float, window_bytes: float, slow_start: bool) -> tuple[int, float]:
    """(round trips n, bytes sent in the last one) for one connection's stripe."""
    if stripe_bytes <= 0:
        return 0, 0.0
    if not slow_start:
        n = max(1, math.ceil(round(stripe_bytes / window_bytes, 9)))
        return n, stripe_bytes - (n - 1) * window_bytes
    cwnd = min(window_bytes, INITIAL_WINDOW_SEGMENTS * TCP_MSS_BYTES)
    sent, n = 0.0, 0
    while True:
        n += 1
        if sent + cwnd >= stripe_bytes - 1e-9:
            return n, stripe_bytes - sent
        sent += cwnd
        cwnd = min(window_bytes, 2 * cwnd)


def transfer_ms(payload_bytes: int, path: PathSpec, slow_start: bool = False) -> float:
    """The last byte's arrival after the first is sent (module docstring)."""
    if payload_bytes <= 0:
        return 0.0
    k = stripe_count(payload_bytes, path.connections)
    stripe = payload_bytes / k
    wire_per_payload = WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / (path.rate_mbit * 1e3)  # ms per byte
    n, last = rounds_needed(stripe, path.window_bytes, slow_start)
    by_window = path.one_way_ms + (n - 1) * path.rtt_ms + k * last * wire_per_payload
    by_rate = path.one_way_ms + payload_bytes * wire_per_payload
    return max(by_window, by_rate)


def rate_limit_mbit(path: PathSpec, payload_bytes: int) -> float:
    """The most a steady transfer of this message gets from its windows: K x window / RTT (in
    wire Mbit/s), or the path's rate if that is lower."""
    k = stripe_count(payload_bytes, path.connections)
    if path.rtt_ms <= 0:
        return path.rate_mbit
    window_mbit = k * path.window_bytes * WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / path.rtt_ms / 1e3
    return min(path.rate_mbit, window_mbit)
