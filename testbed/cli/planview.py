"""`run_testbed.py plan`: what each system would do on a scenario, as text or one JSON document.

One job: gather and format the plan (testbed.plans.placement, testbed.plans.systems, testbed.features.temporal.plan) per
system: the DC and host of every stage replica, the WAN links each stage boundary crosses and
with how many TCP connections, which stages' all-reduce crosses the WAN, and the WAN sharing
plan. Pure: no root, no network, no Mininet, no torch.

The text writes replicas, pipelines and hosts as ranges (testbed.spec.ranges: `r0-249
usw-h[1-250] (usw)`), so that 10,000 GPUs take a screen, not megabytes; `--full` lists every
one. The JSON has every host; it leaves out each link's slot-by-slot `order` (its `messages`
give the same order, one entry per message instead of one per slot) unless `--full`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from testbed.spec.errors import ScenarioError
from testbed.spec.cluster import load_cluster, scenario_placement
from testbed.spec.links import LinkDir, hops
from testbed.spec.ranges import host_list, number_ranges, split_host
from testbed.plans.placement import Placement, place_for_system
from testbed.plans.routing import dc_paths
from testbed.spec.scenario import Scenario, load_scenario
from testbed.features.temporal.plan import SlotPlan, plan_slots
from testbed.plans.systems import connections_for
from testbed.spec.systems import System, get_system

if TYPE_CHECKING:
    from testbed.spec.training import TrainConfig

POLICY_NOTES = {"scenario-order": "hosts filled DC by DC in scenario order",
                "atlas": "all replicas of a stage in one DC, largest DCs first",
                "dp-across-dcs": "each pipeline in one DC, replicas spread over DCs"}


STEPPED = re.compile(r"\d-\d+/\d")      # a range with a step, testbed.spec.ranges
STEPS_NOTE = "(a-b/s in a range: from a to b in steps of s; --full lists every host)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """Stage boundary s -> s+1 for the pipelines that share one DC pair."""

    boundary: int
    pipelines: tuple[int, ...]
    src_dc: str
    dst_dc: str
    forward: tuple[str, ...]    # routed DCs of the activations (src ... dst); () inside a DC
    backward: tuple[str, ...]   # routed DCs of the gradients (dst ... src)
    connections: int            # K per transfer, on every link of the path

    @property
    def wan(self) -> bool:
        return self.src_dc != self.dst_dc

    def to_dict(self) -> dict:
        def hop(dcs: tuple[str, ...]) -> list[str]:
            return [str(d) for d in hops(dcs)]

        return {"boundary": self.boundary, "pipelines": list(self.pipelines),
                "src_dc": self.src_dc, "dst_dc": self.dst_dc, "wan": self.wan,
                "forward_links": hop(self.forward), "backward_links": hop(self.backward),
                "connections": self.connections}


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemPlan:
    system: System
    placement: Placement
    routes: tuple[Route, ...]
    slots: SlotPlan
    bubbletea: dict | None = None     # +bubbletea systems: where the prefill side runs, load
    idle_dcs: tuple[tuple[str, int], ...] = ()   # (DC, hosts) of the DCs no stage is placed in

    def to_dict(self, full: bool = False) -> dict:
        s = self.system
        return {"system": s.name, "placement_policy": s.placement, "connections": s.connections,
                "wan_sharing": s.wan_sharing, "fill_bubbles": s.fill_bubbles,
                "placement": self.placement.to_dict(),
                "boundaries": [r.to_dict() for r in self.routes],
                "slot_plan": self.slots.to_dict(order=full), "bubbletea": self.bubbletea,
                "idle_dcs": {dc: hosts for dc, hosts in self.idle_dcs}}

    def lines(self, full: bool = False) -> list[str]:
        """The text (module docstring): ranges, or every replica and host with full."""
        s, pl = self.system, self.placement
        how = {"policy": POLICY_NOTES[pl.policy], "pinned-dcs": "stages pinned to DCs by "
               "training.placement", "pinned-hosts": "hosts given by training.placement"}[pl.source]
        out = [f"{s.name}: placement {pl.policy} ({how}), connections {s.connections}, "
               f"WAN sharing {s.wan_sharing}, all-reduce {s.allreduce}"]
        for st, row in enumerate(pl.hosts):
            pieces = ([f"r{r} {h} ({pl.stage_dcs[st][r]})" for r, h in enumerate(row)] if full
                      else replica_ranges(row, pl.stage_dcs[st]))
            out.append(f"  stage {st}: " + ", ".join(pieces))
        for dc, n in self.idle_dcs:
            out.append(f"  {dc}: no stage ({n} host{'' if n == 1 else 's'} idle for training)")
        hosts = (lambda hs: ", ".join(hs)) if full else host_list
        for rt in self.routes:
            pipes = ",".join(map(str, rt.pipelines)) if full else number_ranges(rt.pipelines)
            head = f"  s{rt.boundary}->s{rt.boundary + 1} pipelines {pipes}: "
            if not rt.wan:
                out.append(head + f"inside {rt.src_dc}")
                continue
            fwd = ", ".join(map(str, hops(rt.forward)))
            line = head + (f"{LinkDir(rt.src_dc, rt.dst_dc)} over {fwd} (K={rt.connections} "
                           "connections per transfer)")
            if rt.backward != tuple(reversed(rt.forward)):
                back = ", ".join(map(str, hops(rt.backward)))
                line += f"; gradients back over {back}"
            out.append(line)
        wan_ar = allreduce_pieces(pl, full)
        how_ar = ("" if not wan_ar else " (a flat ring, one connection a hop)"
                  if s.allreduce == "ring" else " (hierarchical: each DC's ring, one leader per "
                  "DC across with the system's K, a broadcast inside)")
        out.append("  all-reduce over the WAN: " + ("; ".join(wan_ar) if wan_ar else "none")
                   + how_ar)
        out += ["  " + line for line in self.slots.summary_lines(full)]
        if self.bubbletea is not None:
            bt = self.bubbletea
            about = "about " if bt["expected"] else ""
            for dc, d in bt["dcs"].items():
                out.append(f"  bubbletea {dc}: prefill on {hosts(d['prefill'])}; decode on "
                           f"{hosts(d['decode'])}; controller on {d['controller']}; "
                           f"{about}{d['requests']} requests")
            out.append(f"  bubbletea load: {about}{bt['kept']} requests "
                       f"({bt['offered_per_s']:.1f}/s over {bt['duration_s']:g} s), "
                       f"{bt['refused']} refused, {bt['truncated']} truncated to "
                       f"{bt['context_tokens']} tokens"
                       + (" (expected counts: too many to draw for a plan)" if about else ""))
        return out


def allreduce_pieces(pl: Placement, full: bool) -> list[str]:
    """The stages whose all-reduce crosses the WAN, each with its DCs; without full, stages with
    the same DCs go together (`stages 0-19 (usw, use)`)."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for st, x in enumerate(pl.allreduce_across_wan()):
        if x:
            groups.setdefault(tuple(dict.fromkeys(pl.stage_dcs[st])), []).append(st)
    if full:
        return [f"stage {st} ({', '.join(dict.fromkeys(pl.stage_dcs[st]))})"
                for st, x in enumerate(pl.allreduce_across_wan()) if x]
    return [f"stage{'s' * (len(sts) > 1)} {number_ranges(sts)} ({', '.join(dcs)})"
            for dcs, sts in groups.items()]


def replica_ranges(hosts: Sequence[str], dcs: Sequence[str]) -> list[str]:
    """One stage's replicas as `r0-249 usw-h[1-250] (usw)` pieces: DC by DC (in order of first
    use), each DC's replicas cut into runs in which the replica index and the host number both
    advance by a fixed step (testbed.spec.ranges); a replica that fits no run stands alone."""
    by_dc: dict[str, list[int]] = {}
    for r, dc in enumerate(dcs):
        by_dc.setdefault(dc, []).append(r)
    out = []
    for dc, reps in by_dc.items():
        keys = [split_host(hosts[r]) for r in reps]
        i = 0
        while i < len(reps):
            j = i
            prefix, num = keys[i]
            if num is not None and i + 1 < len(reps) and keys[i + 1][0] == prefix \
                    and keys[i + 1][1] is not None and keys[i + 1][1] > num:
                dr, dh = reps[i + 1] - reps[i], keys[i + 1][1] - num
                while (j + 1 < len(reps) and keys[j + 1][0] == prefix
                       and reps[j + 1] - reps[j] == dr and keys[j + 1][1] == keys[j][1] + dh):
                    j += 1
                if j == i + 1 and (dr != 1 or dh != 1):
                    j = i      # two alone read better than a stepped pair
            run = reps[i:j + 1]
            out.append(f"r{number_ranges(run)} {host_list([hosts[r] for r in run])} ({dc})")
            i = j + 1
    return out


def routes_of(scenario: Scenario, placement: Placement, system: System) -> tuple[Route, ...]:
    paths = {(p.src, p.dst): p.dcs for p in dc_paths(scenario)}
    out = []
    for s, row in enumerate(placement.boundaries()):
        groups: dict[tuple[str, str], list[int]] = {}
        for r, pair in enumerate(row):
            groups.setdefault(pair, []).append(r)
        for (a, b), pipes in groups.items():
            out.append(Route(boundary=s, pipelines=tuple(pipes), src_dc=a, dst_dc=b,
                             forward=paths.get((a, b), ()), backward=paths.get((b, a), ()),
                             connections=connections_for(scenario, system, a, b)))
    return tuple(out)


def plan_system(scenario: Scenario, cfg: "TrainConfig", system: System) -> SystemPlan:
    placement = place_for_system(scenario, cfg, system)
    bt = None
    if system.fill_bubbles:
        from testbed.features.bubbletea.plan import bubbletea_plan
        bt = bubbletea_plan(scenario, cfg.compute, placement, system.name)
    used = {dc for row in placement.stage_dcs for dc in row}
    return SystemPlan(system=system, placement=placement,
                      routes=routes_of(scenario, placement, system),
                      slots=plan_slots(scenario, cfg, placement, system), bubbletea=bt,
                      idle_dcs=tuple((dc.name, dc.hosts) for dc in scenario.dcs
                                     if dc.name not in used))


def resolve_systems(scenario: Scenario, names: Sequence[str] | None) -> list[System]:
    names = list(names) if names else list(scenario.systems)
    out = []
    for i, name in enumerate(names):
        out.append(get_system(name, f"systems[{i}]"))
    return out


def load_training(scenario: Scenario) -> "TrainConfig":
    """The scenario's training section, checked: its stages fit on the profile's GPU
    (testbed.rules.memory)."""
    from testbed.rules.memory import check_memory
    from testbed.spec.training import TrainConfig  # torch-free
    if scenario.training is None:
        raise ScenarioError("training", f"{scenario.path or scenario.name} has no training "
                            "section", "add one (see topologies/two_dc.yaml)")
    cfg = TrainConfig.from_dict(scenario.training)
    check_memory(cfg)
    return cfg


def plan_document(scenario: Scenario, cfg: "TrainConfig", plans: Sequence[SystemPlan],
                  full: bool = False) -> dict:
    return {"scenario": scenario.name, "path": scenario.path, "scale": scenario.scale,
            "time_scale": scenario.time_scale, "routing": scenario.routing,
            "connections": scenario.connections,
            "training": {"stages": cfg.stages, "replicas": cfg.replicas,
                         "micro_batches": cfg.micro_batches, "schedule": cfg.schedule,
                         "compute": cfg.compute},
            "systems": {p.system.name: p.to_dict(full) for p in plans}}


def plan_text(scenario: Scenario, cfg: "TrainConfig", plans: Sequence[SystemPlan],
              full: bool = False) -> str:
    out = [f"{scenario.path or scenario.name}: P={cfg.stages} stages x D={cfg.replicas} "
           f"replicas, M={cfg.micro_batches} ({cfg.schedule}, {cfg.compute}), scale "
           f"{scenario.scale:g}, connections {scenario.connections}"
           + (f"; rates and windows below as emulated (the real link's are {scenario.scale:g}x; "
              f"show gives both)" if scenario.scale != 1 else "")]
    body = [line for p in plans for line in p.lines(full)]
    if not full and any(STEPPED.search(line) for line in body):
        out.append(STEPS_NOTE)
    return "\n".join(out + body)


def plan_command(path: str, systems: Sequence[str] | None = None, as_json: bool = False,
                 full: bool = False, cluster: str | None = None) -> str:
    """What `run_testbed.py plan` prints (module docstring; full: every host and slot; cluster:
    a cluster file, whose placement on servers is shown, under `servers` with --json). Raises
    ScenarioError on bad input."""
    scenario = load_scenario(path)
    cfg = load_training(scenario)
    spec = placement = None
    if cluster is not None:
        spec = load_cluster(cluster)
        placement = scenario_placement(spec, scenario)
    plans = [plan_system(scenario, cfg, s) for s in resolve_systems(scenario, systems)]
    if as_json:
        doc = plan_document(scenario, cfg, plans, full)
        if placement is not None:
            doc["servers"] = placement.to_dict(spec)
        return json.dumps(doc, indent=1)
    text = plan_text(scenario, cfg, plans, full)
    if placement is not None:
        text += "\n" + "\n".join(placement.lines(spec))
    return text
