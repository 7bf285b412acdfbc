"""Max-min fair rates with per-flow caps over shared links: what TCP flows that share
bottlenecks settle to, as the model's fair-shared links use it.

Progressive filling: every unfrozen flow rises to one level together; a flow freezes at its cap,
or when a link it uses fills. A flow stands for `weight` alike flows, each at its rate. Only the
links in `tight` can fill (a link whose flows' caps sum to no more than its rate never does);
the others are no constraint.
"""

from __future__ import annotations

import heapq
from typing import Collection, Hashable, Mapping, Protocol, Sequence

EPS = 1e-9


class FairFlow(Protocol):
    links: Sequence[Hashable]
    weight: float
    cap_mbit: float
    rate_mbit: float


def max_min_rates(flows: Sequence[FairFlow], link_rate_mbit: Mapping[Hashable, float],
                  tight: Collection[Hashable]) -> None:
    """Sets each flow's rate_mbit (its cap where no tight link holds it back).

    A link fills at the level (free capacity) / (unfrozen weight). The level every unfrozen flow
    rises to together does not change a link's fill level; only a freeze does, and only raises
    it. So the links wait in a heap by fill level, refreshed lazily: an entry is current while
    it equals the link's fill level now. O((flows x links each) log links).
    """
    on_link: dict[Hashable, list[FairFlow]] = {}
    for f in flows:
        f.rate_mbit = -1.0                            # unfrozen
        for l in dict.fromkeys(f.links):
            if l in tight:
                on_link.setdefault(l, []).append(f)
        if all(l not in tight for l in f.links):
            f.rate_mbit = f.cap_mbit                  # only slack links: nothing holds it back
    free = {l: link_rate_mbit.get(l, float("inf")) for l in on_link}
    wsum = {l: float(sum(f.weight for f in fs)) for l, fs in on_link.items()}
    order = {l: i for i, l in enumerate(on_link)}
    fills = [(free[l] / wsum[l], order[l], l) for l in on_link]
    heapq.heapify(fills)
    by_cap = sorted((f for f in flows if f.rate_mbit < 0), key=lambda f: f.cap_mbit)
    ci, left = 0, len(by_cap)

    def freeze(f: FairFlow, level: float) -> None:
        nonlocal left
        f.rate_mbit = level
        left -= 1
        for l in dict.fromkeys(f.links):
            if l not in wsum:
                continue                              # slack: no constraint
            wsum[l] -= f.weight
            free[l] -= f.weight * level
            if wsum[l] > EPS:
                heapq.heappush(fills, (free[l] / wsum[l], order[l], l))

    while left:
        while by_cap[ci].rate_mbit >= 0:
            ci += 1
        while fills and (wsum[fills[0][2]] <= EPS
                         or fills[0][0] != free[fills[0][2]] / wsum[fills[0][2]]):
            heapq.heappop(fills)
        link_level = max(fills[0][0], 0.0) if fills else float("inf")
        cap_level = by_cap[ci].cap_mbit
        if cap_level - link_level <= EPS:             # the next cap comes first (or together)
            level = min(cap_level, link_level)
            while ci < len(by_cap) and (by_cap[ci].rate_mbit >= 0
                                        or by_cap[ci].cap_mbit - level <= EPS):
                if by_cap[ci].rate_mbit < 0:
                    freeze(by_cap[ci], by_cap[ci].cap_mbit if cap_level <= link_level
                           else level)
                ci += 1
        else:                                         # a link fills: its flows stop there
            _, _, full = heapq.heappop(fills)
            for f in on_link[full]:
                if f.rate_mbit < 0:
                    freeze(f, link_level)
