"""How a message is cut into stripes over K TCP connections (pure; no torch, so the planner
and `plan` use the same rule as the transport).

    n = min(K, max(1, total // MIN_STRIPE_BYTES))

stripes of a message of `total` bytes (payload + pad): every stripe carries at least
MIN_STRIPE_BYTES, a message below twice that goes on one connection, and the bytes are split
evenly and contiguously (the first total % n stripes one byte longer). 4 KiB: stripes must stay
near or below a connection's window for K to matter (at scale 100 a host's window is 46 KB and
an activation 168-336 KB, so a larger minimum would leave connections unused:
bench/bench_connections.py measured K=8 no faster than K=4 with a 64 KiB minimum), and a
stripe's 84-byte header is still 2% of it at most.
"""

from __future__ import annotations

MIN_STRIPE_BYTES = 4 * 1024


def stripe_count(total_bytes: int, connections: int) -> int:
    """Stripes (and so connections used) for a message of total_bytes over `connections`."""
    return min(connections, max(1, total_bytes // MIN_STRIPE_BYTES))


def stripe_plan(total_bytes: int, connections: int) -> list[tuple[int, int]]:
    """(offset, length) of each stripe: the rule of the module docstring."""
    n = stripe_count(total_bytes, connections)
    base, extra = divmod(total_bytes, n)
    out, offset = [], 0
    for i in range(n):
        length = base + (1 if i < extra else 0)
        out.append((offset, length))
        offset += length
    return out
