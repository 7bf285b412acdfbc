"""Temporal WAN sharing as a feature (geodc.features.base): the slot plan
(geodc.features.temporal.plan) of a system that shares the WAN in time, and its arbiters and
captures (geodc.features.temporal.run)."""

from __future__ import annotations

from geodc.features.base import Feature, SystemJob
from geodc.features.temporal.plan import TemporalPlan, plan_slots
from geodc.features.temporal.run import start_feature


def _plan(job: SystemJob) -> TemporalPlan | None:
    if not job.system.temporal:
        return None
    return TemporalPlan(slots=plan_slots(job.scenario, job.cfg, job.placement, job.system))


FEATURE = Feature(name="temporal", plan=_plan, start=start_feature)
