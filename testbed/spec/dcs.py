"""The scenario's DCs and the WAN links between them, as frozen types."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.spec.links import LinkDir, both


@dataclass(frozen=True, kw_only=True, slots=True)
class DataCenter:
    name: str
    hosts: int
    rate_mbit: float | None = None  # intra-DC host link rate; None = unshaped veth
    decode_hosts: int = 0           # BubbleTea decode servers, hosts <dc>-d1.. (not training)


@dataclass(frozen=True, kw_only=True, slots=True)
class WanLink:
    a: str
    b: str
    delay_ms: float     # one way, each direction
    rate_mbit: float    # each direction
    jitter_ms: float = 0.0
    loss_pct: float = 0.0
    queue_bytes: int = 0  # per direction; always >= the bandwidth-delay product unless set lower
    queue_given: bool = False   # the scenario set it (else the default, 2 x BDP)

    @property
    def between(self) -> tuple[str, str]:
        return (self.a, self.b)

    @property
    def directions(self) -> tuple[LinkDir, LinkDir]:
        """a->b, then b->a."""
        return both(self.a, self.b)

    @property
    def bdp_bytes(self) -> int:
        """Bandwidth x round-trip delay, the smallest queue that keeps one link full."""
        return int(self.rate_mbit * 1e6 / 8 * (2 * self.delay_ms + 2 * self.jitter_ms) / 1e3)
