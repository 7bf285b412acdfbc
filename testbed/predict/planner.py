"""The planner's question: given the scenario's DCs (their GPUs) and WAN links, which DCs should
train and how many stages should each hold? Pure, no root.

One job: enumerate every assignment of the P stages to DCs (each stage's D replicas in one DC,
as Atlas places them; a DC must have D x its stages' hosts), predict each with the Atlas system's
connections and WAN sharing (testbed.predict.predict), and rank by predicted iteration time. P stages over
N DCs is N^P assignments; more than MAX_OPTIONS is refused with the count.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import TYPE_CHECKING

from testbed.predict.predict import Prediction, predict
from testbed.spec.errors import ScenarioError
from testbed.spec.systems import get_system

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario
    from testbed.spec.training import TrainConfig

MAX_OPTIONS = 20_000


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Option:
    stage_dcs: tuple[str, ...]
    prediction: Prediction

    @property
    def stages_per_dc(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for dc in self.stage_dcs:
            out[dc] = out.get(dc, 0) + 1
        return out


def plan_options(scenario: "Scenario", cfg: "TrainConfig", system: str = "atlas") -> list[Option]:
    """Every feasible stage -> DC assignment, fastest first."""
    dcs = [dc.name for dc in scenario.dcs]
    P, D = cfg.stages, cfg.replicas
    count = len(dcs) ** P
    if count > MAX_OPTIONS:
        raise ScenarioError("training.stages", f"{count} stage-to-DC assignments to compare "
                            f"(more than {MAX_OPTIONS})", "predict fewer stages or DCs")
    hosts = {dc.name: dc.hosts for dc in scenario.dcs}
    sysm = get_system(system)
    out = []
    for combo in itertools.product(dcs, repeat=P):
        if any(combo.count(dc) * D > hosts[dc] for dc in set(combo)):
            continue
        pinned = dataclasses.replace(cfg, placement=None, placement_dcs=combo)
        out.append(Option(stage_dcs=combo, prediction=predict(scenario, pinned, sysm)))
    return sorted(out, key=lambda o: o.prediction.iteration_time_s)


def plan_text(scenario: "Scenario", options: list[Option], top: int) -> str:
    lines = [f"{scenario.name}: {len(options)} feasible stage-to-DC assignments (Atlas's K "
             f"connections and temporal WAN sharing), fastest first:",
             f"{'stages in':<40} {'per DC':<24} {'iteration s':>11} {'GPU util':>8}"]
    for o in options[:top]:
        per = ", ".join(f"{dc} {n}" for dc, n in o.stages_per_dc.items())
        lines.append(f"{', '.join(o.stage_dcs):<40} {per:<24} "
                     f"{o.prediction.iteration_time_s:>11.3f} "
                     f"{o.prediction.gpu_utilization:>8.3f}")
    return "\n".join(lines)
