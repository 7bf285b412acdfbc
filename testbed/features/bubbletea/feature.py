"""BubbleTea as a feature (testbed.features.base): the plan (testbed.features.bubbletea.plan) of a
+bubbletea system and its prefill side (testbed.features.bubbletea.run)."""

from __future__ import annotations

from testbed.features.base import Feature, SystemJob
from testbed.features.bubbletea.plan import BubbleTeaPlan, plan
from testbed.features.bubbletea.run import BubbleTeaHandle


def _plan(job: SystemJob) -> BubbleTeaPlan | None:
    return plan(job.scenario, job.placement, job.system)


FEATURE = Feature(name="bubbletea", plan=_plan, start=BubbleTeaHandle)
