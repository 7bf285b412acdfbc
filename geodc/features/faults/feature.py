"""Faults as a feature (geodc.features.base): the plan (geodc.features.faults.plan) and its run
handle (geodc.features.faults.run)."""

from __future__ import annotations

from geodc.features.base import Feature, SystemJob
from geodc.features.faults import plan as faults_plan
from geodc.features.faults.run import FaultsHandle


def _plan(job: SystemJob) -> faults_plan.FaultsPlan | None:
    return faults_plan.plan(job.scenario, job.system)


FEATURE = Feature(name="faults", plan=_plan, start=FaultsHandle)
