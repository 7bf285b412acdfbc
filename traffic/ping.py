"""ping between emulated hosts: argv, and parsing of its per-packet output into RTT samples.

One job: ping. Starting it inside a host is `testbed.network.Network.spawn`'s; what the samples
mean for a link is `testbed.calibrate`'s.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

_TIME_RE = re.compile(r"icmp_seq=(\d+) .*time=([0-9.]+) ms")


@dataclass(frozen=True, kw_only=True, slots=True)
class PingResult:
    sent: int
    samples_ms: tuple[float, ...]   # in sequence order, first (ARP-laden) packet dropped

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def min_ms(self) -> float:
        return min(self.samples_ms)

    @property
    def loss_pct(self) -> float:
        return 100.0 * (1 - (len(self.samples_ms) + 1) / self.sent) if self.sent else 0.0


def ping_argv(dst_ip: str, count: int, interval_s: float = 0.1, deadline_s: float | None = None) -> list[str]:
    argv = ["ping", "-n", "-c", str(count), "-i", f"{interval_s:g}", dst_ip]
    if deadline_s is not None:
        argv[1:1] = ["-w", f"{deadline_s:g}"]
    return argv


def parse_ping(text: str, sent: int) -> PingResult:
    """RTT samples from ping's per-packet lines. Raises ValueError when no reply came back."""
    samples = [(int(m.group(1)), float(m.group(2))) for m in _TIME_RE.finditer(text)]
    samples.sort()
    if len(samples) < 2:
        raise ValueError(f"ping got {len(samples)} replies of {sent}: {text.strip()[-300:]}")
    return PingResult(sent=sent, samples_ms=tuple(ms for _, ms in samples[1:]))
