"""Which WAN links carry the traffic between each pair of DCs (pure: no kernel, no Mininet).

One job: a next hop per (DC, destination DC), and the path that hop-by-hop forwarding then
follows. Two policies (the scenario's `routing` field):

- `direct` (default): two DCs that a `wan` entry joins always talk over that link, even when a
  detour through a third DC has less delay (real WAN paths break the triangle inequality, and a
  configured link must carry its pair's traffic). A pair with no link of its own goes over the
  lowest total one-way delay path whose every gateway forwards consistently: computed per
  destination by Dijkstra outwards from the DCs linked to it, whose routes are fixed.
- `shortest-delay`: every pair takes the lowest total one-way delay path (plain Dijkstra), so a
  slow direct link may carry nothing at all.

Forwarding is per gateway and per destination subnet, so a path is what following each gateway's
own next hop gives; `paths()` walks exactly that, which is also what the kernel will do.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Mapping

from testbed.spec.names import ROUTING_POLICIES

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario



@dataclass(frozen=True, kw_only=True, slots=True)
class Edge:
    a: str
    b: str
    delay_ms: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Path:
    src: str
    dst: str
    dcs: tuple[str, ...]       # src, ..., dst
    delay_ms: float            # one way, sum over the links

    @property
    def hops(self) -> int:
        return len(self.dcs) - 1

    def describe(self) -> str:
        how = "direct" if self.hops == 1 else f"via {', '.join(self.dcs[1:-1])}"
        return f"{self.src} -> {self.dst}: {how}, {self.hops} WAN hop{'s' * (self.hops != 1)}, " \
               f"{self.delay_ms:g} ms one way"


def next_hops(nodes: Iterable[str], edges: Iterable[Edge],
              policy: str = "direct") -> dict[tuple[str, str], str]:
    """(DC, destination DC) -> the neighbouring DC it forwards to."""
    if policy not in ROUTING_POLICIES:
        raise ValueError(f"routing policy {policy!r}: use one of {', '.join(ROUTING_POLICIES)}")
    nodes = list(nodes)
    adj: dict[str, dict[str, float]] = {n: {} for n in nodes}
    for e in edges:
        adj[e.a][e.b] = e.delay_ms
        adj[e.b][e.a] = e.delay_ms
    hops: dict[tuple[str, str], str] = {}
    for dst in nodes:
        # Dijkstra towards dst. Under `direct`, dst's neighbours are settled on their own link
        # and never relaxed, so nobody routes around a configured link.
        fixed = set(adj[dst]) if policy == "direct" else set()
        dist: dict[str, float] = {dst: 0.0}
        parent: dict[str, str] = {}
        heap: list[tuple[float, str]] = [(0.0, dst)]
        for n in sorted(fixed):
            dist[n], parent[n] = adj[dst][n], dst
            heapq.heappush(heap, (dist[n], n))
        done: set[str] = set()
        while heap:
            d, u = heapq.heappop(heap)
            if u in done:
                continue
            done.add(u)
            for v, delay in sorted(adj[u].items()):
                if v == dst or v in fixed or v in done:
                    continue
                if d + delay < dist.get(v, float("inf")):
                    dist[v], parent[v] = d + delay, u
                    heapq.heappush(heap, (dist[v], v))
        for n, p in parent.items():
            hops[(n, dst)] = p
    return hops


def paths(nodes: Iterable[str], edges: Iterable[Edge], policy: str = "direct") -> list[Path]:
    """Every ordered DC pair's path, by following each DC's next hop (scenario order). Per
    destination, a DC's path is itself followed by its next hop's (built once per DC); the
    delay is summed hop by hop from the source."""
    nodes, edges = list(nodes), list(edges)
    delay: dict[tuple[str, str], float] = {}
    for e in edges:
        delay[(e.a, e.b)] = delay[(e.b, e.a)] = e.delay_ms
    hops = next_hops(nodes, edges, policy)
    towards: dict[str, dict[str, tuple[str, ...]]] = {}
    for dst in nodes:
        known: dict[str, tuple[str, ...]] = {dst: (dst,)}
        for src in nodes:
            chain, n = [], src
            while n not in known:
                chain.append(n)
                n = hops[(n, dst)]
                if len(chain) > len(nodes):
                    raise AssertionError(f"routing loop from {src} to {dst}: {chain}")
            tail = known[n]
            for c in reversed(chain):
                tail = (c,) + tail
                known[c] = tail
        towards[dst] = known
    out = []
    for src in nodes:
        for dst in nodes:
            if src == dst:
                continue
            dcs = towards[dst][src]
            total = 0.0
            for hop in zip(dcs, dcs[1:]):
                total += delay[hop]
            out.append(Path(src=src, dst=dst, dcs=dcs, delay_ms=total))
    return out


def edges_of(scenario: "Scenario") -> list[Edge]:
    return [Edge(a=link.a, b=link.b, delay_ms=link.delay_ms) for link in scenario.wan]


def dc_paths(scenario: "Scenario") -> list[Path]:
    """The path every ordered DC pair's traffic takes in a scenario (configured delays).
    Computed once per set of DCs, links and policy (planning asks for it thousands of times)."""
    return list(_routed(*_routing_key(scenario)))


def path_table(scenario: "Scenario") -> Mapping[tuple[str, str], Path]:
    """dc_paths by (source DC, destination DC); the same table for the same network. The last
    scenario asked about is remembered by identity (a Scenario is frozen), so the thousands of
    look-ups one plan makes skip building and hashing the network's key."""
    global _last_table
    last = _last_table
    if last is not None and last[0] is scenario:
        return last[1]
    table = _table(*_routing_key(scenario))
    _last_table = (scenario, table)
    return table


_last_table: tuple["Scenario", Mapping[tuple[str, str], Path]] | None = None


def _routing_key(scenario: "Scenario") -> tuple[tuple[str, ...], tuple[Edge, ...], str]:
    return (tuple(dc.name for dc in scenario.dcs), tuple(edges_of(scenario)), scenario.routing)


@lru_cache(maxsize=32)
def _routed(nodes: tuple[str, ...], edges: tuple[Edge, ...], policy: str) -> tuple[Path, ...]:
    return tuple(paths(nodes, edges, policy))


@lru_cache(maxsize=32)
def _table(nodes: tuple[str, ...], edges: tuple[Edge, ...],
           policy: str) -> Mapping[tuple[str, str], Path]:
    return MappingProxyType({(p.src, p.dst): p for p in _routed(nodes, edges, policy)})
