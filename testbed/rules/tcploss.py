"""TCP under random packet loss, as the model uses it: how large a connection's congestion window
stays on average, and what recovering a lost packet costs a message. Pure, no kernel.

One job: two closed forms that testbed.rules.tcpchannel folds into a message's time, and the
aggregate goodput of many bulk flows that the packet-level cross-check (bench/
bench_packet_level.py) compares against ns-3.

- The window: a connection that loses packets at random with probability p keeps, on average,
  the window of its congestion control's response function (in segments of TCP_MSS_BYTES):
  Reno (Mathis, Semke, Mahdavi and Ott 1997) sqrt(3 / (2 p)); CUBIC (RFC 9438, section 5.1) the
  larger of its Reno-friendly window (the same figure: AIMD with alpha = 3 (1 - beta) / (1 +
  beta)) and (C (3 + beta) / (4 (1 - beta)))^(1/4) (RTT / p)^(3/4), C = 0.4, beta = 0.7, RTT in
  seconds. Timeouts (Padhye, Firoiu, Towsley and Kurose 1998) lower the rate further as p grows:
  a window of W segments per RTT becomes 1 / (RTT / W + T0 min(1, 3 sqrt(3 p / 8)) p (1 + 32 p^2))
  segments a second, T0 the RTO. The window is never above the receive window the hosts
  advertise. The connections of a transfer are persistent (the trainer keeps them for the whole
  run), so the average is what a message meets: its windows carry over from the messages before.
- A lost packet in a message: where a later packet of the same connection follows it, RACK sees
  the loss when that packet is acknowledged, a reordering window (RTT / 4) later, and the resent
  packet arrives RACK_RECOVERY_RTTS round trips late; the last packet of a connection's stripe
  has nothing behind it, so it is resent on a timeout (the tail loss probe waits 1.5 RTT + 200 ms
  with one packet outstanding, capped by the RTO, RTT + tcp_rto_min): RTT + rto_min late. A
  message waits for its slowest stripe; with k stripes of n packets, the expected extra time is
  tail x (1 - (1 - p)^k) + rack x ((1 - p)^k - (1 - p)^(k n)) (some stripe's last packet lost;
  else some other packet lost).
- BBR is not modelled: its rate does not follow a loss response function (it ignores random
  loss up to about 20%); `window_under_loss` refuses it, and testbed.predict.unmodelled names it.
"""

from __future__ import annotations

import math

from testbed.spec.scenario import ETH_FRAME_BYTES, TCP_MSS_BYTES

RENO_FACTOR = 1.5                   # Mathis: W = sqrt(3 / (2 p)) segments
CUBIC_C = 0.4                       # RFC 9438
CUBIC_BETA = 0.7
RACK_RECOVERY_RTTS = 1.25           # a lost packet with data behind it: detected and resent
RTO_MIN_MS = 200.0                  # Linux's tcp_rto_min (the emulation dilates it with time)
MODELLED = ("cubic", "reno")


def path_loss(link_loss_pct: list[float] | tuple[float, ...]) -> float:
    """The probability that a packet is lost on a path of links with these loss_pct."""
    kept = 1.0
    for pct in link_loss_pct:
        kept *= 1.0 - pct / 100.0
    return 1.0 - kept


def window_under_loss(cc: str, rtt_ms: float, loss: float) -> float:
    """The average congestion window (bytes) with random loss probability `loss` (0..1): the
    congestion control's response function, lowered by timeouts (module docstring); inf
    without loss."""
    if cc not in MODELLED:
        raise ValueError(f"congestion control {cc!r} under loss is not modelled "
                         f"(only {', '.join(MODELLED)})")
    if loss <= 0:
        return math.inf
    segments = math.sqrt(RENO_FACTOR / loss)
    if cc == "cubic":
        rtt_s = max(rtt_ms, 1e-3) / 1e3
        k = (CUBIC_C * (3 + CUBIC_BETA) / (4 * (1 - CUBIC_BETA))) ** 0.25
        segments = max(segments, k * (rtt_s / loss) ** 0.75)
    rto_ms = rtt_ms + RTO_MIN_MS
    timeouts = rto_ms * min(1.0, 3 * math.sqrt(3 * loss / 8)) * loss * (1 + 32 * loss ** 2)
    per_rtt = rtt_ms / (rtt_ms / segments + timeouts) if rtt_ms > 0 else segments
    return max(1.0, per_rtt) * TCP_MSS_BYTES


def recovery_ms(loss: float, rtt_ms: float, stripes: int, packets_per_stripe: int) -> float:
    """The expected time a message loses to resending its lost packets (module docstring)."""
    if loss <= 0 or stripes <= 0:
        return 0.0
    kept = 1.0 - loss
    tail = rtt_ms + RTO_MIN_MS
    rack = RACK_RECOVERY_RTTS * rtt_ms
    no_tail = kept ** stripes
    none = kept ** (stripes * max(1, packets_per_stripe))
    return tail * (1.0 - no_tail) + rack * (no_tail - none)


def bulk_goodput_mbit(flows: int, rate_mbit: float, rtt_ms: float, loss: float,
                      window_bytes: float, cc: str) -> float:
    """Aggregate payload goodput (Mbit/s) of `flows` long bulk flows sharing one bottleneck of
    rate_mbit (wire bits, 1514-byte frames of TCP_MSS_BYTES payload) with random loss: each at
    most its window (the receive window, or the loss response's if smaller) per RTT, together at
    most the link's payload rate less what is lost."""
    window = min(window_bytes, window_under_loss(cc, rtt_ms, loss))
    per_flow = window * 8 / rtt_ms / 1e3 if rtt_ms > 0 else math.inf
    link = rate_mbit * TCP_MSS_BYTES / ETH_FRAME_BYTES * (1.0 - loss)
    return min(link, flows * per_flow)
