"""Cross-traffic as a feature (geodc.features.base): the plan (geodc.features.cross.plan) and its
run handle (geodc.features.cross.run)."""

from __future__ import annotations

from geodc.features.base import Feature, SystemJob
from geodc.features.cross import plan as cross_plan
from geodc.features.cross.run import CrossHandle


def _plan(job: SystemJob) -> cross_plan.CrossPlan | None:
    return cross_plan.plan(job.scenario)


FEATURE = Feature(name="cross", plan=_plan, start=CrossHandle)
