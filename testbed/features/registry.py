"""The features there are, in the order a run starts them and reads their results, and the
order it stops them (testbed.run.systemrun). A new feature is one folder (testbed.features.base)
and one entry here.

Start order: the slot arbiters and captures first, then BubbleTea's processes (both must be up
before the trainers), then cross-traffic's receivers and the faults' netlink sockets; t = 0
(the run's clock) comes once all are up, and each handle's `begin` then starts what runs on
it. The results come in this order too (it is the order of their blocks in metrics.json).

Stop order (STOP_ORDER) is not the reverse: what acts on the WAN on the run's clock (the
tenants' flows, the faults and the wire's sampler) stops first, as soon as training ends, so
that nothing is scheduled onto a network being taken apart and cross-traffic's cut-short flows
are ended while the links are as the run left them; then temporal sharing (its captures, then
its arbiters put the plain HTB tree back); BubbleTea last: its controllers take up to
REPLY_GRACE_S to record what stayed unserved, and its handle reads what died and the CPU time
used just before.
"""

from __future__ import annotations

from typing import Sequence

from testbed.features.base import (Clock, Feature, FeatureHandle, FeaturePlan, MetricsBlock,
                                 RunContext, SystemJob)
from testbed.features.bubbletea.feature import FEATURE as BUBBLETEA
from testbed.features.cross.feature import FEATURE as CROSS
from testbed.features.faults.feature import FEATURE as FAULTS
from testbed.features.temporal.feature import FEATURE as TEMPORAL

FEATURES: tuple[Feature, ...] = (TEMPORAL, BUBBLETEA, CROSS, FAULTS)
STOP_ORDER: tuple[str, ...] = ("cross", "faults", "temporal", "bubbletea")

assert sorted(STOP_ORDER) == sorted(f.name for f in FEATURES)


def plan_all(job: SystemJob) -> list[tuple[Feature, FeaturePlan]]:
    """Every feature's plan for the job, in FEATURES order, leaving out those it runs without
    (pure: each plan's checks fail here, before a network is built)."""
    out = []
    for feature in FEATURES:
        plan = feature.plan(job)
        if plan is not None:
            out.append((feature, plan))
    return out


class Running:
    """The started features of one system's run: start() in FEATURES order, then t = 0 and
    every handle's begin(); stop() once each, in STOP_ORDER (idempotent, every handle stopped
    even if one raises, the last error going on); results() once the network is down."""

    def __init__(self) -> None:
        self.handles: list[FeatureHandle] = []
        self._stopped: set[int] = set()
        self.clock: Clock | None = None

    def start(self, plans: list[tuple[Feature, FeaturePlan]], ctx: RunContext) -> None:
        self.clock = ctx.clock
        for feature, plan in plans:
            self.handles.append(feature.start(plan, ctx))
        ctx.clock.start()
        for h in self.handles:
            h.begin()

    def stop(self) -> None:
        rank = {name: i for i, name in enumerate(STOP_ORDER)}
        self._stop_each(sorted((h for h in self.handles if id(h) not in self._stopped),
                               key=lambda h: rank[h.name]))

    def _stop_each(self, handles: list[FeatureHandle]) -> None:
        """Today's nested try/finally: each stops whatever the ones before it raised."""
        if not handles:
            return
        try:
            self._stopped.add(id(handles[0]))
            handles[0].stop()
        finally:
            self._stop_each(handles[1:])

    def clock_reading(self) -> float | None:
        """Configured seconds since t = 0 (3 decimals): when a failure was seen, on the clock
        the faults' and cross-traffic's times are on; None when no such feature runs (or
        before t = 0)."""
        if self.clock is None or not self.clock.started or not any(h.clocked
                                                                   for h in self.handles):
            return None
        return round(self.clock.now_s(), 3)

    def blame(self, error: str) -> str:
        """error, prefixed by what a feature did that likely caused it (the faults applied
        before it), as one clear lead."""
        lead = next((x for x in (h.blame() for h in self.handles) if x), None)
        return error if lead is None else f"{lead}: {error}"

    def results(self, *, partial: bool, spans: Sequence[dict] = ()) -> list[MetricsBlock]:
        """Every handle's metrics block, in FEATURES order (the network down: stop() was)."""
        return [b for b in (h.results(partial=partial, spans=spans) for h in self.handles)
                if b is not None]
