"""BubbleTea's plan for one +bubbletea system, with no network: which hosts run the prefill side,
and the request load split over the DCs that train (testbed.features.bubbletea.run starts it; the
predictor and `plan` read it). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from testbed.plans.systems import arrival_bounds_hold
from testbed.spec.errors import ScenarioError

# `plan` draws a Poisson load as `run` would up to this many requests (about 1 s); above it, the
# expected counts (drawing 10^6 takes about 10 s, and a predict_only load may be far larger)
PLAN_DRAW_LIMIT = 100_000

if TYPE_CHECKING:
    from testbed.plans.placement import Placement
    from testbed.spec.bubbletea import BubbleTeaConfig
    from testbed.spec.scenario import Scenario
    from testbed.spec.systems import System


@dataclass(frozen=True, kw_only=True, slots=True)
class BubbleTeaPlan:
    """The feature's plan (testbed.features.bubbletea.feature) for one +bubbletea system: its
    settings, and whether the arrival bound is used: "on", "off" (not asked for) or "off: why"
    (asked for, but bytes can come faster than the configured rates: why_not)."""

    name: ClassVar[str] = "bubbletea"
    config: "BubbleTeaConfig"
    arrival: str
    why_not: str | None

    def to_dict(self) -> dict:
        return {"settings": self.config.to_dict(), "arrival_bound": self.arrival}


def plan(scenario: "Scenario", placement: "Placement", system: "System") -> BubbleTeaPlan | None:
    """The plan of a +bubbletea system (checked: check), or None for any other."""
    if not system.fill_bubbles:
        return None
    cfg = check(scenario, placement, system.name)
    why_not = arrival_bounds_hold(scenario)
    arrival = "off" if not cfg.arrival_bound else "on" if why_not is None else f"off: {why_not}"
    return BubbleTeaPlan(config=cfg, arrival=arrival, why_not=why_not)


def check(scenario: "Scenario", placement: "Placement", system_name: str) -> "BubbleTeaConfig":
    """The settings a +bubbletea system runs with, or ScenarioError naming what is missing."""
    if scenario.bubbletea is None:
        raise ScenarioError("bubbletea", f"{system_name} needs the scenario's bubbletea section",
                            "add bubbletea: {load: {trace: conv, rate_multiplier: 20}} "
                            "(see topologies/atlas_bubbletea.yaml)")
    for i, dc in enumerate(scenario.dcs):
        if dc.name in placement.dcs_used() and dc.decode_hosts < 1:
            raise ScenarioError(f"dcs[{i}].decode_hosts", f"DC {dc.name!r} trains under "
                                f"{system_name} but has no decode host",
                                "set decode_hosts: 1 (or more) on it")
    return scenario.bubbletea


def hosts_by_dc(placement: "Placement") -> dict[str, list[str]]:
    """The training hosts of each DC that trains (DCs in order of first use)."""
    out: dict[str, list[str]] = {dc: [] for dc in placement.dcs_used()}
    for hosts, dcs in zip(placement.hosts, placement.stage_dcs):
        for host, dc in zip(hosts, dcs):
            out[dc].append(host)
    return out


def make_requests(cfg: "BubbleTeaConfig", compute: str, dcs: dict[str, int]) -> dict[str, Any]:
    """The load, fitted to the context and split over dcs ({dc: training hosts}) by smooth
    weighted round robin: request i goes to the DC most behind its share."""
    from testbed.features.bubbletea import load as loadmod

    trace = loadmod.load_trace(cfg.load.trace)
    if cfg.load.kind == "replay":
        reqs = loadmod.replay(trace, rate_multiplier=cfg.load.rate_multiplier,
                              start_s=cfg.load.start_s, window_s=cfg.load.window_s)
    else:
        reqs = loadmod.poisson(rate_per_s=cfg.load.poisson_per_s, duration_s=cfg.load.window_s,
                               lengths=trace, seed=cfg.load.seed)
    context = context_tokens(cfg, compute)
    kept, refused = loadmod.fit_context(reqs, max_context_tokens=context, rule=cfg.context_rule)
    total = sum(dcs.values())
    share = {dc: dcs[dc] / total for dc in dcs}
    credit = {dc: 0.0 for dc in dcs}
    per_dc: dict[str, list[dict]] = {dc: [] for dc in dcs}
    for r in kept:
        for dc in dcs:
            credit[dc] += share[dc]
        dc = max(dcs, key=credit.__getitem__)
        credit[dc] -= 1.0
        per_dc[dc].append({"id": f"r{r.index}", "arrival_s": r.arrival_s,
                           "target_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
                           "truncated_from": r.truncated_from})
    duration_s = (cfg.load.window_s / cfg.load.rate_multiplier if cfg.load.kind == "replay"
                  else cfg.load.window_s)
    return {"per_dc": per_dc, "context_tokens": context, "rule": cfg.context_rule,
            "offered_per_s": len(kept) / duration_s, "duration_s": duration_s,
            "requests": len(reqs), "kept": len(kept), "refused": len(refused),
            "truncated": sum(r.truncated_from is not None for r in kept),
            "load": {"kind": cfg.load.kind, "trace": cfg.load.trace,
                     "rate_multiplier": cfg.load.rate_multiplier,
                     "poisson_per_s": cfg.load.poisson_per_s, "window_s": cfg.load.window_s,
                     "start_s": cfg.load.start_s}}


def context_tokens(cfg: "BubbleTeaConfig", compute: str) -> int:
    """The longest request that fits: the profiled context in profile mode, else the model's."""
    from testbed.rules.prefill_profile import PrefillProfile
    return (PrefillProfile.load(cfg.profile).max_tokens if compute == "profile"
            else cfg.model["context"])


def expected_requests(cfg: "BubbleTeaConfig", compute: str, dcs: dict[str, int]) -> dict[str, Any]:
    """make_requests' figures for a Poisson load as expected values, without drawing it:
    poisson_per_s x window_s requests with the trace's length mix, split over dcs ({dc: training
    hosts}) in proportion (`expected: True`; counts rounded)."""
    from testbed.features.bubbletea import load as loadmod

    trace = loadmod.load_trace(cfg.load.trace)
    context = context_tokens(cfg, compute)
    over = sum(r.prompt_tokens + r.output_tokens > context for r in trace) / len(trace)
    n = cfg.load.poisson_per_s * cfg.load.window_s
    refused = n * over if cfg.context_rule == "refuse" else 0.0
    kept = n - refused
    return {"per_dc": apportion(round(kept), dcs),
            "context_tokens": context, "rule": cfg.context_rule,
            "offered_per_s": kept / cfg.load.window_s, "duration_s": cfg.load.window_s,
            "requests": round(n), "kept": round(kept), "refused": round(refused),
            "truncated": round(n * over) if cfg.context_rule == "truncate" else 0,
            "expected": True,
            "load": {"kind": cfg.load.kind, "trace": cfg.load.trace,
                     "rate_multiplier": cfg.load.rate_multiplier,
                     "poisson_per_s": cfg.load.poisson_per_s, "window_s": cfg.load.window_s,
                     "start_s": cfg.load.start_s}}


def apportion(total: int, weights: dict[str, int]) -> dict[str, int]:
    """total split in proportion to weights, in whole numbers that add up to it (largest
    remainders get the leftovers; ties: first in order)."""
    whole = sum(weights.values())
    exact = {k: total * w / whole for k, w in weights.items()}
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: out[k] - exact[k])[:total - sum(out.values())]:
        out[k] += 1
    return out


def bubbletea_plan(scenario: "Scenario", compute: str, placement: "Placement",
                   system_name: str) -> dict[str, Any]:
    """Where the prefill side of a +bubbletea system runs, and its load (no network): drawn as
    `run` draws it, or, for a Poisson load of over PLAN_DRAW_LIMIT requests, its expected counts
    (expected_requests)."""
    cfg = check(scenario, placement, system_name)
    hosts = hosts_by_dc(placement)
    counts = {dc: len(hs) for dc, hs in hosts.items()}
    if (cfg.load.kind == "poisson"
            and cfg.load.poisson_per_s * cfg.load.window_s > PLAN_DRAW_LIMIT):
        load = expected_requests(cfg, compute, counts)
        per_dc = load["per_dc"]
    else:
        load = make_requests(cfg, compute, counts)
        per_dc = {dc: len(reqs) for dc, reqs in load["per_dc"].items()}
    return {"dcs": {dc: {"prefill": hs, "decode": scenario.decode_host_names(dc),
                         "controller": scenario.decode_host_names(dc)[0],
                         "requests": per_dc[dc]} for dc, hs in hosts.items()},
            "expected": False, **{k: v for k, v in load.items() if k != "per_dc"}}
