"""BubbleTea as a feature (geodc.features.base): the plan (geodc.features.bubbletea.plan) of a
+bubbletea system and its prefill side (geodc.features.bubbletea.run)."""

from __future__ import annotations

from geodc.features.base import Feature, SystemJob
from geodc.features.bubbletea.plan import BubbleTeaPlan, plan
from geodc.features.bubbletea.run import BubbleTeaHandle


def _plan(job: SystemJob) -> BubbleTeaPlan | None:
    return plan(job.scenario, job.placement, job.system)


FEATURE = Feature(name="bubbletea", plan=_plan, start=BubbleTeaHandle)
