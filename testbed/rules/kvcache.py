"""BubbleTea's KV-cache hand-off from a prefill GPU to a decode server in its DC: how many bytes
a request's message carries, and when each message is in, given the host links it crosses.
Pure: no kernel, no torch. The prefill server pads its messages with `kv_target_bytes`
(prefill/server.py); the model (testbed.predict.bubbletea) times them with
`kv_transfers`.

Bytes (profile mode, the emulation's count rule): the target model's KV cache for the prompt
(testbed.rules.prefill_profile.kv_cache_bytes) x kv_fraction / scale, or the real small model's
cache if that is larger (it is sent whole, never cut): 2 (K and V) x n_layer x min(tokens,
context) x n_embd x 4 bytes (float32). The message's JSON header (about 200 bytes) is left out.

Transfer: the controller names the decode server (round robin over its DC's decode servers, one
per dispatched message: prefill/controller.py); the prefill server sends its
messages to one decode server in order over one persistent TCP connection, each after the
previous one's ack (prefill/kv.py). A message crosses the prefill host's link up
and the decode host's link down (both inside the DC, shaped at the DC's `rate_mbit`; no WAN).
Concurrent messages share those links max-min fairly (testbed.rules.fairshare: TCP's fair share),
each at most at the lower of its two links' rates, and move their wire bytes (payload x
1514 / 1448: HTB counts Ethernet frames). A message's time is from the start of its send (after
its connection's previous ack) to its last byte in; the ack's way back and the window are not
timed (inside a DC the configured delay is 0, so the connection's windows never bind). Links
with no rate (unshaped veths) take no time.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Hashable, Mapping, Sequence

from testbed.rules.fairshare import max_min_rates
from testbed.spec.scenario import ETH_FRAME_BYTES, TCP_MSS_BYTES

if TYPE_CHECKING:
    from testbed.rules.prefill_profile import PrefillProfile

WIRE_PER_PAYLOAD = ETH_FRAME_BYTES / TCP_MSS_BYTES
FLOAT32_BYTES = 4


def kv_target_bytes(profile: "PrefillProfile", target_tokens: int, kv_fraction: float,
                    scale: float) -> int:
    """The bytes a profile-mode KV message is padded to: the target model's cache x kv_fraction
    / scale."""
    return int(profile.kv_cache_bytes(target_tokens) * kv_fraction / scale)


def real_kv_bytes(model: Mapping[str, int], target_tokens: int) -> int:
    """The real small model's KV cache of a request (its last `context` tokens, float32)."""
    tokens = min(target_tokens, model["context"])
    return 2 * model["n_layer"] * tokens * model["n_embd"] * FLOAT32_BYTES


def kv_message_bytes(profile: "PrefillProfile", model: Mapping[str, int], target_tokens: int,
                     kv_fraction: float, scale: float) -> int:
    """A request's KV message, payload and padding (module docstring)."""
    return max(real_kv_bytes(model, target_tokens),
               kv_target_bytes(profile, target_tokens, kv_fraction, scale))


@dataclass(slots=True)
class KvSend:
    """One KV message: ready when its prefill ends, from a prefill host to a decode host."""
    t_ready_ns: int
    src: str
    dst: str
    bytes: int
    t_start_ns: int = -1          # set by kv_transfers: its send began
    t_end_ns: int = -1            # its last byte is in


@dataclass(slots=True)
class _Flow:
    send: KvSend
    links: tuple[Hashable, ...]
    cap_mbit: float
    left_bits: float
    weight: float = 1.0
    rate_mbit: float = 0.0
    at_ns: float = 0.0            # left_bits as of this time
    conn: tuple[str, str] = field(default=("", ""))


def kv_transfers(sends: Sequence[KvSend], rate_mbit: Mapping[str, float | None]) -> None:
    """Sets every send's t_start_ns and t_end_ns (module docstring); rate_mbit: each host's
    link rate (None: unshaped)."""
    queues: dict[tuple[str, str], list[KvSend]] = {}
    for s in sorted(sends, key=lambda s: s.t_ready_ns):
        queues.setdefault((s.src, s.dst), []).append(s)
    if not queues:
        return
    t0 = min(s.t_ready_ns for s in sends)         # times relative to it (floats keep ns)
    nxt = {c: 0 for c in queues}
    # idle connections with a message left, by when it can begin: (time, order, connection)
    order = {c: i for i, c in enumerate(queues)}
    waiting = [(q[0].t_ready_ns - t0, order[c], c) for c, q in queues.items()]
    heapq.heapify(waiting)
    active: list[_Flow] = []
    links: dict[Hashable, float] = {}
    for (src, dst) in queues:
        for key, host in (("up", src), ("down", dst)):
            if rate_mbit.get(host) is not None:
                links[(key, host)] = float(rate_mbit[host])

    def start_ready(t: float) -> None:
        while waiting and waiting[0][0] <= t:
            begin, _, c = heapq.heappop(waiting)
            s = queues[c][nxt[c]]
            nxt[c] += 1
            s.t_start_ns = t0 + round(begin)
            on = tuple(k for k in (("up", s.src), ("down", s.dst)) if k in links)
            if not on or s.bytes <= 0:
                s.t_end_ns = s.t_start_ns
                queue_next(c, begin)
                continue
            active.append(_Flow(send=s, links=on, cap_mbit=min(links[k] for k in on),
                                left_bits=s.bytes * WIRE_PER_PAYLOAD * 8, at_ns=begin, conn=c))

    def queue_next(c: tuple[str, str], free_at: float) -> None:
        if nxt[c] < len(queues[c]):
            heapq.heappush(waiting, (max(queues[c][nxt[c]].t_ready_ns - t0, free_at),
                                     order[c], c))

    while True:
        t = waiting[0][0] if waiting else float("inf")
        if not active:
            if t == float("inf"):
                return
            start_ready(t)
            continue
        max_min_rates(active, links, {k for f in active for k in f.links})
        ends = [f.at_ns + f.left_bits * 1e3 / f.rate_mbit for f in active]   # Mbit/s = bit/us
        step = min(min(ends), t)
        left = []
        for f, end in zip(active, ends):
            if end <= step + 0.5:
                f.send.t_end_ns = t0 + round(end)
                queue_next(f.conn, end)
            else:
                f.left_bits -= (step - f.at_ns) * f.rate_mbit / 1e3
                f.at_ns = step
                left.append(f)
        active[:] = left
        start_ready(step)
