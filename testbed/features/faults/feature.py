"""Faults as a feature (testbed.features.base): the plan (testbed.features.faults.plan) and its run
handle (testbed.features.faults.run)."""

from __future__ import annotations

from testbed.features.base import Feature, SystemJob
from testbed.features.faults import plan as faults_plan
from testbed.features.faults.run import FaultsHandle


def _plan(job: SystemJob) -> faults_plan.FaultsPlan | None:
    return faults_plan.plan(job.scenario, job.system)


FEATURE = Feature(name="faults", plan=_plan, start=FaultsHandle)
