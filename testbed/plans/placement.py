"""Where each pipeline stage replica runs: P stages x D replicas onto a scenario's hosts (pure).

One job: a `Placement` (the DC and the host of every stage replica) from a scenario and a policy,
or ScenarioError saying how many hosts are missing and where. One host = one GPU = one worker.
Host names are those of `Scenario.host_names()`: "<dc>-h<i>", i from 1.

Policies (testbed.plans.systems names which one each system uses):

- scenario-order: workers in stage-major order (s0r0, s0r1, ..., s1r0, ...) fill the hosts DC
  by DC in scenario order (testbed.plans.workers.plan_placement's default). Where the counts do not line
  up, a stage's replicas are split over two DCs: the baseline's behaviour, kept on purpose.
- atlas: Atlas's Algorithm 1 as the Sailor planner reimplements it. DCs sorted by host count,
  most first (ties: scenario order); each in turn takes min(stages left, floor(hosts / D))
  consecutive stages, all D replicas of a stage in that DC (hosts in index order). So the
  all-reduce of every stage stays inside a DC and only activations/gradients cross the WAN.
- dp-across-dcs: the contrast Atlas avoids. Pipeline (replica) r lives wholly inside one DC,
  pipelines assigned round-robin (scenario order) over the DCs that still have P free hosts, so
  each stage's D replicas are spread over DCs and its gradient all-reduce crosses the WAN.

Pins (the scenario's `training.placement`):
- a list of P DC names (`[east, east, west]`): stage s's D replicas on the next free hosts of
  that DC, for scenario-order and atlas (`place(..., pinned=...)`); dp-across-dcs ignores it.
- a list of P lists of D host names: an explicit full placement (`from_hosts`), again for every
  policy but dp-across-dcs. `place_for_system` picks among these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from testbed.spec.errors import ScenarioError, shown

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario
    from testbed.spec.systems import System
    from testbed.spec.training import TrainConfig

POLICIES = ("scenario-order", "atlas", "dp-across-dcs")
SOURCES = ("policy", "pinned-dcs", "pinned-hosts")


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    policy: str
    stage_dcs: tuple[tuple[str, ...], ...]   # stage_dcs[stage][replica]: that replica's DC
    hosts: tuple[tuple[str, ...], ...]       # hosts[stage][replica]: "<dc>-h<i>"
    source: str = "policy"                   # "policy" | "pinned-dcs" | "pinned-hosts"

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"placement source {self.source!r} is not one of {SOURCES}")

    @property
    def stages(self) -> int:
        return len(self.hosts)

    @property
    def replicas(self) -> int:
        return len(self.hosts[0]) if self.hosts else 0

    def boundaries(self) -> tuple[tuple[tuple[str, str], ...], ...]:
        """[s][r] = (src_dc, dst_dc) of the boundary stage s -> s+1 in pipeline r (P-1 rows)."""
        return tuple(tuple((self.stage_dcs[s][r], self.stage_dcs[s + 1][r])
                           for r in range(self.replicas))
                     for s in range(self.stages - 1))

    def allreduce_across_wan(self) -> tuple[bool, ...]:
        """Per stage: do its replicas span several DCs (so its gradient all-reduce crosses the
        WAN)?"""
        return tuple(len(set(row)) > 1 for row in self.stage_dcs)

    def dcs_used(self) -> tuple[str, ...]:
        seen: list[str] = []
        for row in self.stage_dcs:
            for dc in row:
                if dc not in seen:
                    seen.append(dc)
        return tuple(seen)

    def to_dict(self) -> dict:
        return {"policy": self.policy, "source": self.source,
                "stage_dcs": [list(row) for row in self.stage_dcs],
                "hosts": [list(row) for row in self.hosts],
                "allreduce_across_wan": list(self.allreduce_across_wan())}


def host_dc(host: str) -> str:
    """'east-h3' -> 'east' (DC names hold no '-')."""
    return host.rsplit("-h", 1)[0]


def place(scenario: "Scenario", stages: int, replicas: int, policy: str,
          pinned: tuple[str, ...] | None = None, field_prefix: str = "training") -> Placement:
    """Place stages x replicas workers by `policy` (module docstring); `pinned` (one DC per
    stage) overrides scenario-order and atlas and is ignored by dp-across-dcs."""
    if stages < 1 or replicas < 1:
        raise ValueError(f"need stages >= 1 and replicas >= 1, got {stages}, {replicas}")
    if policy not in POLICIES:
        raise ScenarioError("placement", f"{shown(policy)} is not a placement policy",
                            f"use one of {', '.join(POLICIES)}")
    if policy == "dp-across-dcs":
        return _dp_across_dcs(scenario, stages, replicas, field_prefix)
    if pinned is not None:
        return _pinned(scenario, stages, replicas, policy, tuple(pinned), field_prefix)
    if policy == "atlas":
        return _atlas(scenario, stages, replicas, field_prefix)
    return _scenario_order(scenario, stages, replicas, field_prefix)


def from_hosts(scenario: "Scenario", hosts: Sequence[Sequence[str]], policy: str,
               field: str = "training.placement") -> Placement:
    """An explicit hosts[stage][replica] grid, checked against the scenario's hosts."""
    known = scenario.host_names()
    seen: set[str] = set()
    for s, row in enumerate(hosts):
        for r, host in enumerate(row):
            if host not in known:
                raise ScenarioError(f"{field}[{s}][{r}]",
                                    f"host {shown(host)} is not in the topology",
                                    f"use one of: {', '.join(known)}")
            if host in seen:
                raise ScenarioError(f"{field}[{s}][{r}]", f"host {shown(host)} is used twice",
                                    "place one worker per host (one host = one GPU)")
            seen.add(host)
    grid = tuple(tuple(row) for row in hosts)
    return Placement(policy=policy, source="pinned-hosts", hosts=grid,
                     stage_dcs=tuple(tuple(host_dc(h) for h in row) for row in grid))


def place_for_system(scenario: "Scenario", cfg: "TrainConfig", system: "System",
                     field_prefix: str = "training") -> Placement:
    """The placement `system` runs with under cfg: dp-across-dcs always by its own rule; the
    others an explicit host grid if the scenario gives one, else their policy with any DC pin."""
    if system.placement == "dp-across-dcs":
        return place(scenario, cfg.stages, cfg.replicas, system.placement,
                     field_prefix=field_prefix)
    if cfg.placement is not None:
        return from_hosts(scenario, cfg.placement, system.placement, f"{field_prefix}.placement")
    return place(scenario, cfg.stages, cfg.replicas, system.placement, cfg.placement_dcs,
                 field_prefix)


# ---------------------------------------------------------------------------------------------

def _free_hosts(scenario: "Scenario") -> dict[str, list[str]]:
    """DC -> its host names in index order (scenario order of DCs)."""
    return {dc.name: [f"{dc.name}-h{i}" for i in range(1, dc.hosts + 1)] for dc in scenario.dcs}


def _build(policy: str, hosts: list[list[str]], source: str = "policy") -> Placement:
    grid = tuple(tuple(row) for row in hosts)
    return Placement(policy=policy, source=source, hosts=grid,
                     stage_dcs=tuple(tuple(host_dc(h) for h in row) for row in grid))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _shortfall(free: dict[str, int], units: int, unit_size: int) -> list[tuple[str, int]]:
    """The fewest hosts to add so that `units` more blocks of `unit_size` hosts, each inside one
    DC, fit: complete the DCs with the most free hosts first (one block each, ties in the given
    order), the rest as whole blocks on the first of them. [(dc, hosts to add)]."""
    order = sorted(free, key=lambda dc: -free[dc])
    add: dict[str, int] = {}
    for dc in order[:units]:
        if free[dc] > 0 or not add:
            add[dc] = unit_size - free[dc]
    extra = units - len(add)
    first = next(iter(add))
    add[first] += extra * unit_size
    return [(dc, n) for dc, n in add.items() if n > 0]


def _describe_adds(adds: list[tuple[str, int]]) -> str:
    return " and ".join(f"{_plural(n, 'host')} to {dc}" for dc, n in adds)


def _scenario_order(scenario: "Scenario", stages: int, replicas: int,
                    field_prefix: str) -> Placement:
    ordered = scenario.host_names()
    need = stages * replicas
    if need > len(ordered):
        raise ScenarioError(f"{field_prefix}.stages",
                            f"scenario-order placement: {stages} stages x {replicas} replicas = "
                            f"{need} workers but the topology has {len(ordered)} hosts "
                            f"({need - len(ordered)} missing)",
                            f"add {_plural(need - len(ordered), 'host')} to any DC, or lower "
                            "stages or replicas")
    return _build("scenario-order", [ordered[s * replicas:(s + 1) * replicas]
                                     for s in range(stages)])


def _atlas(scenario: "Scenario", stages: int, replicas: int, field_prefix: str) -> Placement:
    free = _free_hosts(scenario)
    order = sorted(scenario.dcs, key=lambda dc: -dc.hosts)   # stable: ties keep scenario order
    rows: list[list[str]] = []
    for dc in order:
        take = min(stages - len(rows), dc.hosts // replicas)
        for _ in range(take):
            rows.append(free[dc.name][:replicas])
            del free[dc.name][:replicas]
    if len(rows) < stages:
        left = stages - len(rows)
        adds = _shortfall({dc.name: len(free[dc.name]) for dc in order}, left, replicas)
        missing = sum(n for _, n in adds)
        raise ScenarioError(f"{field_prefix}.stages",
                            f"atlas placement: {stages} stages x {replicas} replicas (all replicas "
                            f"of a stage in one DC) need {_plural(missing, 'more host')}: the DCs "
                            f"hold only {_plural(len(rows), 'stage')}",
                            f"add {_describe_adds(adds)}, or lower stages or replicas")
    return _build("atlas", rows)


def _pinned(scenario: "Scenario", stages: int, replicas: int, policy: str,
            pinned: tuple[str, ...], field_prefix: str) -> Placement:
    field = f"{field_prefix}.placement"
    names = [dc.name for dc in scenario.dcs]
    if len(pinned) != stages:
        raise ScenarioError(field, f"{len(pinned)} DCs for {stages} stages",
                            f"give one DC per stage ({stages} names)")
    for s, dc in enumerate(pinned):
        if dc not in names:
            raise ScenarioError(f"{field}[{s}]", f"{shown(dc)} is not a DC",
                                f"use one of {', '.join(names)}")
    short = []
    for dc in names:
        need = pinned.count(dc) * replicas
        have = scenario.dc(dc).hosts
        if need > have:
            short.append((dc, need - have, need, have))
    if short:
        what = "; ".join(f"{dc} has {have} hosts but its {need // replicas} pinned stages x "
                         f"{replicas} replicas need {need} ({need - have} missing)"
                         for dc, _, need, have in short)
        raise ScenarioError(field, what,
                            f"add {_describe_adds([(dc, n) for dc, n, _, _ in short])}, or pin "
                            "fewer stages there")
    free = _free_hosts(scenario)
    rows = []
    for dc in pinned:
        rows.append(free[dc][:replicas])
        del free[dc][:replicas]
    return _build(policy, rows, source="pinned-dcs")


def _dp_across_dcs(scenario: "Scenario", stages: int, replicas: int,
                   field_prefix: str) -> Placement:
    free = _free_hosts(scenario)
    names = [dc.name for dc in scenario.dcs]
    pipelines: list[list[str]] = []      # pipelines[r] = hosts of stages 0..P-1
    i = 0
    while len(pipelines) < replicas:
        fits = [dc for dc in names if len(free[dc]) >= stages]
        if not fits:
            break
        # round-robin: the next DC after the last one used (scenario order) that still fits
        dc = next(names[(i + k) % len(names)] for k in range(len(names))
                  if names[(i + k) % len(names)] in fits)
        i = names.index(dc) + 1
        pipelines.append(free[dc][:stages])
        del free[dc][:stages]
    if len(pipelines) < replicas:
        left = replicas - len(pipelines)
        adds = _shortfall({dc: len(free[dc]) for dc in names}, left, stages)
        missing = sum(n for _, n in adds)
        raise ScenarioError(f"{field_prefix}.replicas",
                            f"dp-across-dcs placement: {replicas} pipelines of {stages} stages "
                            f"(each wholly in one DC) need {_plural(missing, 'more host')}: the "
                            f"DCs hold only {_plural(len(pipelines), 'pipeline')}",
                            f"add {_describe_adds(adds)}, or lower stages or replicas")
    used = {host_dc(p[0]) for p in pipelines}
    if replicas > 1 and len(used) < 2:
        only = next(iter(used))
        others = {dc.name: dc.hosts for dc in scenario.dcs if dc.name != only}
        if not others:
            raise ScenarioError(f"{field_prefix}.replicas",
                                "dp-across-dcs placement needs at least two DCs",
                                "add a DC, or use another system")
        best = max(others, key=lambda dc: others[dc])  # ties: scenario order
        raise ScenarioError(f"{field_prefix}.replicas",
                            f"dp-across-dcs placement: only {only} can hold a pipeline of "
                            f"{stages} hosts, so no stage's replicas would cross the WAN",
                            f"add {_plural(stages - others[best], 'host')} to {best}, or lower "
                            "stages")
    return _build("dp-across-dcs", [[pipelines[r][s] for r in range(replicas)]
                                    for s in range(stages)])
