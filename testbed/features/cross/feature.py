"""Cross-traffic as a feature (testbed.features.base): the plan (testbed.features.cross.plan) and its
run handle (testbed.features.cross.run)."""

from __future__ import annotations

from testbed.features.base import Feature, SystemJob
from testbed.features.cross import plan as cross_plan
from testbed.features.cross.run import CrossHandle


def _plan(job: SystemJob) -> cross_plan.CrossPlan | None:
    return cross_plan.plan(job.scenario)


FEATURE = Feature(name="cross", plan=_plan, start=CrossHandle)
