"""How long one message takes over one path, alone: a round-trip model of window-limited TCP.

One job: a single transfer's time. Pure, no kernel. The message of `payload_bytes` is striped
over K connections (testbed.rules.stripes: min(K, bytes / 4 KiB) stripes of equal size). Each
connection sends, per round trip, at most its window: the receive window the testbed's hosts
advertise (testbed.plans.systems.window_bytes) or, in slow start after an idle gap (Linux's
tcp_slow_start_after_idle, on by default), its congestion window, which restarts at
INITIAL_WINDOW_SEGMENTS full segments and doubles every round trip up to the receive window.
Each round trip a connection sends one window (the last round what is left), and the rounds'
data meet in the bottleneck's FIFO queue: round 1 of every connection is written at once, one
connection's window after another; a later round of connection c is released as the ACKs of
its previous round come back, so it starts one RTT after that round started to leave the
bottleneck, or when the bottleneck is free, whichever is later. The last byte arrives one way
after the last chunk has left:

    for each round r, for each connection c (in that order):
        start[c] = max(release (0 in round 1, else start[c] of round r-1 + rtt), free)
        free = start[c] + (the chunk's wire bytes) x 8 / rate
    arrival = one_way_ms + free

A message whose stripes fit one window each therefore takes its wire bytes at the path's rate;
a window-limited one (n - 1) round trips plus the last round; and between them a connection's
later round waits for its own ACKs behind the other connections' windows. Measured steady
transfers on the testbed (traffic.burst, scale 100, 100 Mbit/s, window 45.9 kB, a message
every 60 ms):
- 168 kB at 5 ms one way: K = 3: 22.5 ms, here 23.5 (the earlier rule, "n - 1 round trips
  or the rate, whichever is longer", said 19.0); K = 1: 36.4, here 37.5; K = 6 and 11: 18.4,
  here 19.0;
- 336 kB at 100 ms one way (bench/bench_connections.py): 1502 / 706 / 314 / 128 ms at
  K = 1 / 2 / 4 / 8, here 1501 / 706 / 315 / 128.

Wire bytes are payload x 1514 / 1448 (testbed.features.temporal.plan).
Not modelled: loss and retransmission, delayed ACKs, pacing, and the receive window's own
growth on a fresh connection (the testbed's connections are warm).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from testbed.spec.scenario import TCP_MSS_BYTES
from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE
from testbed.rules.stripes import stripe_count
from testbed.rules.tcpchannel import INITIAL_WINDOW_SEGMENTS



@dataclass(frozen=True, kw_only=True, slots=True)
class PathSpec:
    """A routed path as one TCP connection sees it (configured values)."""
    rate_mbit: float          # the bottleneck rate
    one_way_ms: float         # delay there
    rtt_ms: float             # there and back
    window_bytes: float       # receive window per connection
    connections: int = 1      # K


def round_sizes(stripe_bytes: float, window_bytes: float, slow_start: bool) -> list[float]:
    """The bytes one connection's stripe sends in each round trip: a window each time (in slow
    start INITIAL_WINDOW_SEGMENTS segments first, doubling up to the window), the last round
    what is left."""
    if stripe_bytes <= 0:
        return []
    if not slow_start:
        n = max(1, math.ceil(round(stripe_bytes / window_bytes, 9)))
        return [window_bytes] * (n - 1) + [stripe_bytes - (n - 1) * window_bytes]
    cwnd = min(window_bytes, INITIAL_WINDOW_SEGMENTS * TCP_MSS_BYTES)
    sizes, sent = [], 0.0
    while sent + cwnd < stripe_bytes - 1e-9:
        sizes.append(cwnd)
        sent += cwnd
        cwnd = min(window_bytes, 2 * cwnd)
    return sizes + [stripe_bytes - sent]


def rounds_needed(stripe_bytes: float, window_bytes: float, slow_start: bool) -> tuple[int, float]:
    """(round trips n, bytes sent in the last one) for one connection's stripe."""
    sizes = round_sizes(stripe_bytes, window_bytes, slow_start)
    return (len(sizes), sizes[-1]) if sizes else (0, 0.0)


def transfer_ms(payload_bytes: int, path: PathSpec, slow_start: bool = False) -> float:
    """The last byte's arrival after the first is sent (module docstring)."""
    if payload_bytes <= 0:
        return 0.0
    k = stripe_count(payload_bytes, path.connections)
    ms_per_byte = WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / (path.rate_mbit * 1e3)
    sizes = round_sizes(payload_bytes / k, path.window_bytes, slow_start)
    if len(sizes) == 1:                    # one round: the whole message at the rate
        return path.one_way_ms + payload_bytes * ms_per_byte
    free, starts = 0.0, [0.0] * k
    for r, size in enumerate(sizes):
        for c in range(k):
            start = free if r == 0 else max(starts[c] + path.rtt_ms, free)
            starts[c] = start
            free = start + size * ms_per_byte
    return path.one_way_ms + free


def one_round(payload_bytes: int, path: PathSpec) -> bool:
    """Whether the whole message leaves in its first round trip with steady windows: every
    stripe fits its connection's window (so it enters the bottleneck queue as one burst)."""
    if payload_bytes <= 0:
        return True
    k = stripe_count(payload_bytes, path.connections)
    return rounds_needed(payload_bytes / k, path.window_bytes, slow_start=False)[0] == 1


def rate_limit_mbit(path: PathSpec, payload_bytes: int) -> float:
    """The most a steady transfer of this message gets from its windows: K x window / RTT (in
    wire Mbit/s), or the path's rate if that is lower."""
    k = stripe_count(payload_bytes, path.connections)
    if path.rtt_ms <= 0:
        return path.rate_mbit
    window_mbit = k * path.window_bytes * WIRE_BYTES_PER_PAYLOAD_BYTE * 8 / path.rtt_ms / 1e3
    return min(path.rate_mbit, window_mbit)
