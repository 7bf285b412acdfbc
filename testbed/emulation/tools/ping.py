"""ping between emulated hosts: argv, and parsing of its output into RTT figures.

One job: ping. Starting it inside a host is `testbed.emulation.network.Network.spawn`'s; what the figures
mean for a link is `testbed.run.calibrate`'s. iputils ping prints each reply with 3 significant
digits (0.1 ms at 10-99 ms, 1 ms above), so the figures come from its summary line, which has
microseconds; run a short warm-up ping first so ARP on the path is not in the figures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SUMMARY_RE = re.compile(r"= ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) ms")
_COUNT_RE = re.compile(r"(\d+) packets transmitted, (\d+) received")
_TIME_RE = re.compile(r"icmp_seq=(\d+) .*time=([0-9.]+) ms")
_TTL_RE = re.compile(r"ttl=(\d+)")


@dataclass(frozen=True, kw_only=True, slots=True)
class PingResult:
    sent: int
    received: int
    min_ms: float
    avg_ms: float
    max_ms: float
    mdev_ms: float
    samples_ms: tuple[float, ...]   # per reply, at ping's printed precision
    ttls: tuple[int, ...] = ()      # per reply: 64 minus the routers it crossed on the way back

    @property
    def loss_pct(self) -> float:
        return 100.0 * (1 - self.received / self.sent) if self.sent else 0.0


def ping_argv(dst_ip: str, count: int, interval_s: float = 0.1) -> list[str]:
    return ["ping", "-n", "-c", str(count), "-i", f"{interval_s:g}", dst_ip]


def parse_ping(text: str) -> PingResult:
    """Raises ValueError when no reply came back."""
    summary = _SUMMARY_RE.search(text)
    counts = _COUNT_RE.search(text)
    if not summary or not counts or int(counts.group(2)) == 0:
        raise ValueError(f"ping got no replies: {text.strip()[-300:]}")
    mn, avg, mx, mdev = (float(summary.group(i)) for i in range(1, 5))
    samples = sorted((int(m.group(1)), float(m.group(2))) for m in _TIME_RE.finditer(text))
    return PingResult(sent=int(counts.group(1)), received=int(counts.group(2)), min_ms=mn,
                      avg_ms=avg, max_ms=mx, mdev_ms=mdev, samples_ms=tuple(ms for _, ms in samples),
                      ttls=tuple(int(m.group(1)) for m in _TTL_RE.finditer(text)))


def reply_ttl(result: PingResult) -> int | None:
    """The replies' TTL if they all agree (one return path), else None."""
    return result.ttls[0] if result.ttls and len(set(result.ttls)) == 1 else None
