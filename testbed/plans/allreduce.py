"""How a stage's gradient all-reduce runs over its replicas' DCs (pure).

One job: the plan of one stage's all-reduce that the workers run (testbed.plans.workers puts it
in their specs) and the model times (testbed.predict.predict), so the two cannot disagree on it.

    ring          one ring over the D replicas in rank order (PyTorch DDP's: gloo's or NCCL's
                  ring), one connection a hop: a stage split over DCs runs its ring over the WAN
                  (the baseline, Varuna's design)
    hierarchical  where the replicas span DCs (geo-aware, as NCCL does inside and across nodes):
                  1. the replicas of each DC all-reduce inside it (a ring);
                  2. one leader per DC (its lowest rank) all-reduces across the DCs: the buffer
                     in K parts, each part a ring of the leaders over its own connections, all K
                     at once, so each hop between DCs carries K connections;
                  3. each leader broadcasts the sum inside its DC (gloo's binomial tree:
                     ceil(log2 n) rounds of the whole buffer).
                  A stage in one DC is a plain ring (steps 2 and 3 have nothing to do).

K across is the most connections the system gives any hop of the leaders' ring (its
`connections_for`; the K parts are process groups, each with one connection a hop, so every
hop gets the same K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True, kw_only=True, slots=True)
class Hierarchy:
    """One stage's hierarchical all-reduce: groups[i] the replica ranks in dcs[i] (DCs in the
    order their lowest rank comes; ranks ascending), connections the K of the leaders' ring."""

    dcs: tuple[str, ...]
    groups: tuple[tuple[int, ...], ...]
    connections: int

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(g[0] for g in self.groups)

    def group_of(self, rank: int) -> tuple[int, ...]:
        return next(g for g in self.groups if rank in g)

    def leader_ring(self) -> list[tuple[str, str]]:
        """(from DC, to DC) of each hop of the leaders' ring."""
        G = len(self.dcs)
        return [(self.dcs[i], self.dcs[(i + 1) % G]) for i in range(G)]


def hierarchy(stage_dcs: Sequence[str], k_of: Callable[[str, str], int]) -> Hierarchy | None:
    """The hierarchical plan of a stage whose replica r is in stage_dcs[r] (module docstring);
    k_of(a, b): the system's connections from DC a to DC b. None where the replicas share one
    DC (a plain ring)."""
    order: list[str] = []
    members: dict[str, list[int]] = {}
    for r, dc in enumerate(stage_dcs):
        if dc not in members:
            order.append(dc)
            members[dc] = []
        members[dc].append(r)
    if len(order) < 2:
        return None
    G = len(order)
    k = max(k_of(order[i], order[(i + 1) % G]) for i in range(G))
    return Hierarchy(dcs=tuple(order), groups=tuple(tuple(members[dc]) for dc in order),
                     connections=max(1, k))


def broadcast_rounds(n: int) -> int:
    """Rounds of gloo's binomial-tree broadcast over n ranks (each sends the whole buffer)."""
    return math.ceil(math.log2(n)) if n > 1 else 0
