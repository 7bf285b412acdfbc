"""Everything `run` checks before it builds anything, and all that `validate` checks. Pure: no
root, no kernel, no Mininet, no torch (so `validate` runs with only the scenario's packages).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from testbed.features.bubbletea import plan as bubbletea
from testbed.features.faults.plan import check as check_faults
from testbed.spec.errors import ScenarioError
from testbed.plans.placement import place_for_system
from testbed.rules.memory import check_memory
from testbed.spec.scenario import Scenario, load_scenario, parse_scenario
from testbed.spec.systems import get_system

if TYPE_CHECKING:
    from testbed.spec.sweep import Point
    from testbed.spec.training import TrainConfig


def load_run(scenario_path: str, *, systems: list[str] | None = None,
             iterations: int | None = None) -> tuple[Scenario, "TrainConfig", list[str]]:
    """Everything `run` checks before building anything (also what `validate` checks):
    the scenario, its training section against its hosts, the systems asked for, and that
    each system can be placed on the scenario's hosts. A scenario with a sweep: its first
    point (testbed.spec.sweep; `validate` checks them all)."""
    scenario = load_scenario(scenario_path)
    if scenario.sweep:
        from testbed.spec.sweep import expand
        scenario = parse_scenario(expand(dict(scenario.raw))[0].doc, path=scenario.path)
    return check_run(scenario, systems=systems, iterations=iterations)


def check_run(scenario: Scenario, *, systems: list[str] | None = None,
              iterations: int | None = None) -> tuple[Scenario, "TrainConfig", list[str]]:
    """load_run's checks of a loaded scenario."""
    from testbed.spec.training import TrainConfig, validate_against_hosts

    scenario.check_emulable()
    if scenario.training is None:
        raise ScenarioError("training", f"{scenario.path or scenario.name} has no training "
                            "section", "add one (see topologies/two_dc.yaml) or use the "
                            "calibrate command")
    training = dict(scenario.training)
    if iterations is not None:
        training["iterations"] = iterations
    cfg = TrainConfig.from_dict(training)
    check_memory(cfg)
    validate_against_hosts(cfg, len(scenario.host_names()), scenario.host_names())
    field = "--systems" if systems else "systems"
    systems = list(systems or scenario.systems)
    for i, name in enumerate(systems):
        system = get_system(name, f"{field}[{i}]")   # testbed.plans.systems: what `run` can train
        if system.fill_bubbles and cfg.tp > 1:
            raise ScenarioError("training.tp", f"{cfg.tp} with {name}: the emulation's prefill "
                                "servers hold one GPU's profiled prefill time",
                                "set tp: 1 to run BubbleTea, or predict it (the model splits "
                                "prefill over the TP group)")
        placement = place_for_system(scenario, cfg, system)
        if cfg.tp > 1 and any(placement.allreduce_across_wan()):
            raise ScenarioError("training.tp", f"{cfg.tp} with {name}, whose all-reduce crosses "
                                "the WAN: the emulation builds one of the TP group's rails, "
                                "and the others would share that WAN link",
                                "set tp: 1 to run it, or predict it (the model counts every "
                                "rail on the WAN)")
        if system.fill_bubbles:
            bubbletea.check(scenario, placement, name)
        check_faults(scenario, system)
    if len(set(systems)) != len(systems):
        raise ScenarioError(field, f"{','.join(systems)} names a system twice", "name each once")
    return scenario, cfg, systems


def check_points(points: list[Point], *, systems: list[str] | None = None,
                 iterations: int | None = None) -> list[tuple["TrainConfig", list[str]]]:
    """What `run` checks, for every point's scenario (with run's --systems and --iterations):
    each point's training config and systems; ScenarioError names the point."""
    out = []
    for p in points:
        try:
            _, cfg, names = check_run(parse_scenario(p.doc), systems=systems,
                                      iterations=iterations)
        except ScenarioError as exc:
            raise ScenarioError(f"sweep point {p.index} ({json.dumps(p.values)})", str(exc),
                                "change the sweep's values") from None
        out.append((cfg, names))
    return out
