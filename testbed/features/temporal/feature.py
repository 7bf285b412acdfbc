"""Temporal WAN sharing as a feature (testbed.features.base): the slot plan
(testbed.features.temporal.plan) of a system that shares the WAN in time, and its arbiters and
captures (testbed.features.temporal.run)."""

from __future__ import annotations

from testbed.features.base import Feature, SystemJob
from testbed.features.temporal.plan import TemporalPlan, plan_slots
from testbed.features.temporal.run import start_feature


def _plan(job: SystemJob) -> TemporalPlan | None:
    if not job.system.temporal:
        return None
    return TemporalPlan(slots=plan_slots(job.scenario, job.cfg, job.placement, job.system))


FEATURE = Feature(name="temporal", plan=_plan, start=start_feature)
