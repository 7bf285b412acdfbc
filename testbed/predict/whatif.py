"""The what-if table's figures: a scenario as given, then changed one setting at a time
(testbed.predict.variants), each predicted (testbed.predict.predict) for the systems the table
compares, with Atlas's speedup over the baseline beside the paper's "up to 17x", BubbleTea's
GPU utilization beside its "up to 94%", and per row a reason made from the figures
(testbed.predict.binding: which resource binds each system). Pure: no root, no torch, no network.

Systems: baseline (Varuna's design), multitcp, hierarchical (multitcp with a geo-aware
all-reduce: where no stage's replicas span DCs it is multitcp, and multitcp's figures are taken
for it) and atlas on every row, Atlas's speedup against the baseline and against the fastest of
the others (`best_other`); atlas+bubbletea where the scenario has a
`bubbletea:` section, on the row as given and on the request-rate row only (it costs seconds at
paper scale, and no other setting is about the requests). BubbleTea is saturated where fewer
than IN_TIME of the requests are served by their TTFT deadline (the queue grows: they miss it,
or still wait when the simulated run ends). The request-rate row offers
SATURATION x the requests/s the as-given row's bubbles would hold if all their idle time were
prefill at the rate they served (served x (1 - training share) / prefill share), to two
significant figures: a rate past saturation, where the GPU utilization stops growing. The
deadline row is BubbleTea at the highest offered rate found whose requests meet the TTFT
deadline (at most 1% past it: its p99), between the row as given and the saturation row
(`deadline_row`): the GPU utilization a deployment that keeps its deadline gets. The row as
given also predicts atlas-concurrent, for the gain's waterfall (Row.waterfall). The request-rate
rows change only the requests, so each process simulates BubbleTea's training once for them
(`_SIMULATED`, testbed.predict.predict.simulate_once: an equal model's figures, not recomputed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from testbed.plans.placement import place_for_system
from testbed.predict.binding import Bound, binding, bounds
from testbed.predict.predict import predict
from testbed.predict.rowpool import rows_pool
from testbed.predict.variants import (Variant, as_given, changed_fields, request_rate_variant,
                                    round_rate, variants)
from testbed.spec.errors import ScenarioError
from testbed.spec.systems import get_system

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario

SYSTEMS = ("baseline", "multitcp", "hierarchical", "atlas")
# the gain from the baseline (Varuna's design) to Atlas one mechanism at a time, on the row as
# given: K connections, then Atlas's placement, then temporal sharing
WATERFALL = (("baseline", "the baseline (Varuna's design)"),
             ("multitcp", "K connections"),
             ("atlas-concurrent", "Atlas's placement"),
             ("atlas", "temporal sharing"))
BUBBLETEA = "atlas+bubbletea"
PAPER_SPEEDUP = 17.0            # "up to 17x": Atlas's training time against the baseline's
PAPER_GPU_UTILIZATION = 0.94    # "up to 94%": GPU utilization with BubbleTea
SATURATION = 1.15
IN_TIME = 0.95                  # fewer requests than this share served by the TTFT: saturated
DEADLINE_SHARE = 0.99           # a load meets the deadline: this share served within the TTFT
DEADLINE_STEPS = 3              # geometric bisection steps between a rate that meets it and one
                                # that does not


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemFigures:
    name: str
    iteration_s: float | None = None
    error: str | None = None             # the system cannot run this variant (placement)
    bound: Bound | None = None           # the binding resource (testbed.predict.binding)
    bounds: tuple[Bound, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_s": self.iteration_s, "error": self.error,
                "bound": None if self.bound is None else self.bound.to_dict(),
                "bounds": [b.to_dict() for b in self.bounds]}


@dataclass(frozen=True, kw_only=True, slots=True)
class BubbleTeaFigures:
    gpu_utilization: float
    training_only: float
    prefill_share: float
    offered_per_s: float
    served_per_s: float
    requests: int                        # requests with an outcome in the simulated run
    in_time: int                         # of them served by their TTFT deadline
    deadline_misses: int                 # of them late or expired
    queued: int                          # of them still waiting when the simulated run ended
    deadline_ms: float
    unused: dict[str, float]             # the unused bubble's share by cause
    training_slowdown: float = 0.0       # iteration time with prefill / without - 1 (GPU waits)
    training_slowdown_h200: float = 0.0  # with an H200's slower op after a prefill too

    @property
    def saturated(self) -> bool:
        """More requests than the bubbles hold: the queue grows, and they miss the TTFT or
        are still waiting at the end."""
        return self.in_time < IN_TIME * self.requests

    @property
    def capacity_per_s(self) -> float | None:
        """Requests/s the bubbles would hold if all their idle time were prefill."""
        if self.prefill_share <= 0:
            return None
        return self.served_per_s * (1 - self.training_only) / self.prefill_share

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__} | {
            "saturated": self.saturated, "capacity_per_s": self.capacity_per_s,
            "reaches_paper": self.gpu_utilization >= PAPER_GPU_UTILIZATION}


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    key: str
    label: str
    fields: tuple[str, ...]              # the fields its setting owns
    changed: tuple[str, ...]             # the fields its document changes (a subset)
    doc: dict[str, Any]                  # the derived scenario document
    systems: dict[str, SystemFigures]
    bubbletea: BubbleTeaFigures | None = None
    bubbletea_error: str | None = None
    error: str | None = None             # the change makes no valid scenario
    reason: str = ""
    seconds: float = 0.0                 # the model's time for this row

    def waterfall(self) -> list[tuple[str, str, float | None, float | None]]:
        """(system, mechanism added, iteration s, gain over the step before) from the baseline
        to Atlas (WATERFALL), where the row has them (the row as given)."""
        if self.key != "as_given" or "atlas-concurrent" not in self.systems:
            return []
        out, before = [], None
        for name, what in WATERFALL:
            x = self.systems[name].iteration_s
            gain = None if before is None or x is None else before / x
            out.append((name, what, x, gain))
            before = x
        return out

    def best_other(self) -> tuple[str, float] | None:
        """(the fastest of the table's other systems on this row, Atlas's speedup over it; of
        equal ones the first in SYSTEMS, the simpler)."""
        atlas = self.systems.get("atlas")
        others = [(f.iteration_s, SYSTEMS.index(n), n) for n, f in self.systems.items()
                  if n in SYSTEMS and n != "atlas" and f.iteration_s is not None]
        if atlas is None or atlas.iteration_s is None or not others:
            return None
        t, _, name = min(others)
        return name, t / atlas.iteration_s

    @property
    def speedup(self) -> float | None:
        base, atlas = (self.systems.get(n) for n in ("baseline", "atlas"))
        if base is None or atlas is None or None in (base.iteration_s, atlas.iteration_s):
            return None
        return base.iteration_s / atlas.iteration_s

    def to_dict(self) -> dict[str, Any]:
        x = self.speedup
        return {"key": self.key, "label": self.label, "fields": list(self.fields),
                "changed": list(self.changed), "error": self.error,
                "systems": {n: f.to_dict() for n, f in self.systems.items()},
                "speedup": x, "paper_speedup": PAPER_SPEEDUP,
                "reaches_paper_speedup": None if x is None else x >= PAPER_SPEEDUP,
                "bubbletea": None if self.bubbletea is None else self.bubbletea.to_dict(),
                "bubbletea_error": self.bubbletea_error,
                "paper_gpu_utilization": PAPER_GPU_UTILIZATION,
                "reason": self.reason, "seconds": self.seconds,
                "waterfall": [{"system": n, "adds": w, "iteration_s": x, "gain": g}
                              for n, w, x, g in self.waterfall()],
                "best_other": None if self.best_other() is None else dict(
                    zip(("system", "atlas_speedup"), self.best_other()))}


@dataclass(frozen=True, kw_only=True, slots=True)
class WhatIf:
    scenario: str
    path: str
    stages: int
    replicas: int
    tp: int = 1                          # GPUs a host stands for (tensor parallelism)
    scale: float
    rows: list[Row] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def gpus(self) -> int:
        return self.stages * self.replicas * self.tp

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "path": self.path, "gpus": self.gpus,
                "stages": self.stages, "replicas": self.replicas, "scale": self.scale,
                "systems": list(SYSTEMS), "bubbletea_system": BUBBLETEA,
                "paper": {"speedup": PAPER_SPEEDUP, "gpu_utilization": PAPER_GPU_UTILIZATION},
                "seconds": self.seconds, "rows": [r.to_dict() for r in self.rows]}


def whatif(scenario: "Scenario", progress: Callable[[str], None] | None = None,
           workers: int = 1) -> WhatIf:
    """The table's rows for `scenario` (module docstring). ScenarioError if it has a sweep or
    no training the model can predict. progress(text): told which row is being predicted, or
    has been. workers > 1: the rows as given and changed are predicted in that many processes
    at once (testbed.predict.rowpool; the same rows as one by one), the request-rate row as soon
    as the first row is (it starts from that row's figures)."""
    from testbed.spec.training import TrainConfig
    if scenario.sweep:
        raise ScenarioError("sweep", "the what-if changes one scenario, not a sweep",
                            "give a scenario without a sweep: section")
    if scenario.training is None:
        raise ScenarioError("training", f"{scenario.path or scenario.name} has no training "
                            "section", "add one (see topologies/two_dc.yaml)")
    cfg = TrainConfig.from_dict(scenario.training)
    if cfg.compute != "profile":
        raise ScenarioError("training.compute", "the model needs profile mode (measured op "
                            "times are not known before a run)", "set compute: profile")
    t0 = time.perf_counter()
    _SIMULATED.clear()
    doc = dict(scenario.raw)
    with_bt = scenario.bubbletea is not None
    todo = [as_given(doc), *variants(doc)]
    with rows_pool(workers if len(todo) > 1 else 1) as pool:
        pending = [pool.submit(row_task, (doc, v, scenario.path, with_bt and i == 0, None))
                   for i, v in enumerate(todo)]
        rows: list[Row] = []
        for i, job in enumerate(pending):
            rows.append(job.get())
            if progress is not None:
                progress(f"{i + 1} of {len(pending)} rows: {todo[i].label}")
            bt = rows[0].bubbletea if i == 0 else None
            if bt is not None and bt.capacity_per_s:
                # the request-rate row starts from the first row's figures; the others go on
                target = round_rate(SATURATION * bt.capacity_per_s)
                v = request_rate_variant(doc, bt.offered_per_s, target, "to saturation")
                pending.append(pool.submit(row_task, (doc, v, scenario.path, True, rows[0])))
                todo.append(v)
        by_key = {r.key: r for r in rows}
        if "request_rate" in by_key and by_key["as_given"].bubbletea is not None:
            row = deadline_row(doc, scenario.path, by_key["as_given"], by_key["request_rate"])
            if row is not None:
                rows.append(row)
                if progress is not None:
                    progress(f"{len(rows)} of {len(rows)} rows: {row.label}")
    return WhatIf(scenario=scenario.name, path=scenario.path,
                  stages=cfg.stages, replicas=cfg.replicas, tp=cfg.tp,
                  scale=scenario.scale, rows=rows, seconds=time.perf_counter() - t0)


def meets_deadline(bt: "BubbleTeaFigures | None") -> bool:
    """Not saturated (the queue does not grow) and at most 1 - DEADLINE_SHARE of the requests
    past the TTFT deadline (the p99 meets it); those still queued when the simulated run ends,
    their deadline not yet past, are not counted either way."""
    if bt is None or bt.saturated:
        return False
    decided = bt.requests - bt.queued
    return decided > 0 and bt.deadline_misses <= (1 - DEADLINE_SHARE) * decided


def deadline_row(doc: dict, path: str, given: Row, saturated: Row) -> Row | None:
    """BubbleTea at the highest offered rate found whose requests meet the TTFT deadline
    (DEADLINE_SHARE within it): a geometric bisection of DEADLINE_STEPS between the highest
    rate tried that meets it (the row as given, else a quarter of its rate) and the lowest that
    does not (the saturation row); training's figures as given. None where even a quarter of
    the offered rate misses it."""
    assert given.bubbletea is not None and saturated.bubbletea is not None
    offered = given.bubbletea.offered_per_s

    def at(rate: float) -> Row:
        v = request_rate_variant(doc, offered, rate, "at the deadline")
        return _row(doc, v, path, True, given)

    if meets_deadline(saturated.bubbletea):
        return None                     # the saturation row itself meets it: nothing to find
    lo_rate, lo = (offered, given) if meets_deadline(given.bubbletea) else (None, None)
    if lo is None:
        lo_rate = round_rate(offered / 4)
        lo = at(lo_rate)
        if not meets_deadline(lo.bubbletea):
            return None
    hi_rate = saturated.bubbletea.offered_per_s
    for _ in range(DEADLINE_STEPS):
        mid = round_rate((lo_rate * hi_rate) ** 0.5)
        if mid <= lo_rate or mid >= hi_rate:
            break
        row = at(mid)
        if meets_deadline(row.bubbletea):
            lo_rate, lo = mid, row
        else:
            hi_rate = mid
    label = (f"request rate at the deadline (p99 TTFT within it; "
             f"{lo_rate:,.0f} /s meets it, {hi_rate:,.0f} /s does not)")
    return replace(lo, key="deadline_rate", label=label)


def row_task(task: tuple[dict, Variant, str, bool, "Row | None"]) -> Row:
    """One row from (base document, variant, path, with BubbleTea, the row it is compared
    with): what a worker computes."""
    return _row(*task)


def _row(base_doc: dict, v: Variant, path: str, with_bt: bool, base: Row | None = None) -> Row:
    from testbed.spec.scenario import parse_scenario
    from testbed.spec.training import TrainConfig
    t0 = time.perf_counter()
    changed = tuple(sorted(changed_fields(base_doc, v.doc)))
    try:
        sc = parse_scenario(v.doc, path=path)
        cfg = TrainConfig.from_dict(sc.training)
    except ScenarioError as exc:
        return Row(key=v.key, label=v.label, fields=v.fields, changed=changed, doc=v.doc,
                   systems={}, error=str(exc),
                   reason=f"the change makes no valid scenario: {exc}")
    if base is not None and changed and all(f.startswith("bubbletea.load.") for f in changed):
        systems = base.systems      # only BubbleTea's requests changed: training's figures stay
    else:
        names = SYSTEMS + (("atlas-concurrent",) if v.key == "as_given" else ())
        systems = {}
        for name in names:
            systems[name] = (replace(systems["multitcp"], name=name)
                             if name == "hierarchical" and _as_multitcp(sc, cfg)
                             else _system(sc, cfg, name))
    bt, bt_error = None, None
    if with_bt:
        try:
            bt = _bubbletea(sc, cfg)
        except ScenarioError as exc:
            bt_error = str(exc)
    row = Row(key=v.key, label=v.label, fields=v.fields, changed=changed, doc=v.doc,
              systems=systems, bubbletea=bt, bubbletea_error=bt_error)
    return _with_reason(row, base, time.perf_counter() - t0)


def _as_multitcp(sc: "Scenario", cfg) -> bool:
    """hierarchical runs as multitcp here: no stage's replicas span DCs in its placement."""
    try:
        placement = place_for_system(sc, cfg, get_system("hierarchical"))
    except ScenarioError:
        return True                     # the same error as multitcp's
    return not any(placement.allreduce_across_wan())


def _system(sc: "Scenario", cfg, name: str) -> SystemFigures:
    system = get_system(name)
    try:
        placement = place_for_system(sc, cfg, system)
        p = predict(sc, cfg, system)
    except ScenarioError as exc:
        return SystemFigures(name=name, error=str(exc))
    found = tuple(bounds(sc, cfg, system, placement, p))
    return SystemFigures(name=name, iteration_s=p.iteration_time_s, bounds=found,
                         bound=binding(found, p.iteration_time_s))


# the training simulations of BubbleTea's predictions in this process, by model: the
# request-rate rows change only the requests, so they simulate the training once
# (testbed.predict.predict.simulate_once); emptied at each `whatif`
_SIMULATED: dict = {}


def _bubbletea(sc: "Scenario", cfg) -> BubbleTeaFigures:
    bt = predict(sc, cfg, get_system(BUBBLETEA), simulated=_SIMULATED).bubbletea
    pf = bt["prefill"]
    return BubbleTeaFigures(
        gpu_utilization=bt["gpu_utilization"], training_only=bt["training_only"],
        prefill_share=bt["prefill_share"], offered_per_s=bt["load"].get("offered_per_s", 0.0),
        served_per_s=pf["requests_per_s"], requests=sum(pf["outcomes"].values()),
        in_time=pf["outcomes"].get("served", 0), deadline_misses=pf["deadline_misses"],
        queued=pf["outcomes"].get("unserved", 0), deadline_ms=sc.bubbletea.ttft_deadline_ms,
        unused=dict(bt["unused_bubble"]["share_by_cause"]),
        training_slowdown=bt["training_slowdown"],
        training_slowdown_h200=bt["training_slowdown_h200"])


def _with_reason(row: Row, base: Row | None, seconds: float) -> Row:
    """The row with its one-line reason: per system (alike ones together) what binds it, and
    BubbleTea's load against its bubbles."""
    parts = []
    same = base is not None and all(
        base.systems[n].iteration_s == f.iteration_s for n, f in row.systems.items())
    if same:
        parts.append("iteration times as given")
    else:
        groups: dict[str, list[str]] = {}
        for name, f in row.systems.items():
            groups.setdefault(f.error if f.bound is None else f.bound.text, []).append(name)
        parts += [f"{', '.join(names)}: {text}" for text, names in groups.items()]
    if row.bubbletea_error:
        parts.append(f"BubbleTea: {row.bubbletea_error}")
    elif row.bubbletea is not None:
        parts.append(bubbletea_reason(row.bubbletea))
    return replace(row, reason="; ".join(parts), seconds=seconds)


def bubbletea_reason(bt: BubbleTeaFigures) -> str:
    """Saturated or not, from the served and offered rates, and where the idle time is left."""
    causes = sorted(((c, v) for c, v in bt.unused.items() if v >= 0.005), key=lambda kv: -kv[1])
    idle = ", ".join(f"{c} {v:.0%}" for c, v in causes[:2]) or "none"
    late = bt.requests - bt.in_time
    share = late / bt.requests if bt.requests else 0.0
    counts = (f"{late:,} of {bt.requests:,} requests ({share:.0%}) not served within the "
              f"{bt.deadline_ms / 1e3:g} s TTFT ({bt.deadline_misses:,} missed it, "
              f"{bt.queued:,} still queued)")
    rates = f"{bt.served_per_s:,.0f} of {bt.offered_per_s:,.0f} requests/s served"
    if bt.saturated:
        return f"BubbleTea saturated: {rates}, {counts}; idle left: {idle}"
    cap = bt.capacity_per_s
    return (f"BubbleTea below saturation: {rates}"
            + (f" (the bubbles hold about {cap:,.0f}/s)" if cap else "")
            + f", {counts}; idle left: {idle}")
