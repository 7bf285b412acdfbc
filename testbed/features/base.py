"""The contract every feature keeps (temporal sharing, BubbleTea, faults, cross-traffic: one
folder each under testbed/features/), so that testbed.run.systemrun runs them all the same way.

A feature is a `Feature`: `plan(job)` is pure (no network: the same inputs plan/show/predict
have) and gives the feature's FeaturePlan for one system, or None where the system runs
without it; `start(plan, ctx)` puts the plan into effect on the running network and gives its
FeatureHandle:

    begin()                 t = 0 (ctx.clock has just started, the trainers come next): what runs
                            on the run's clock starts now (a `clocked` handle's schedule)
    worker_extras(slot)     what the feature adds to one training worker's spec: one typed
                            object (testbed/host/extras.py) or None
    stop()                  idempotent; called when training ends or fails, before the network
                            goes down
    blame()                 what the feature did that likely caused a failure (a lead that
                            prefixes the error), or None
    results(partial, spans) once the network is down: its MetricsBlock, or None. partial: the
                            run stopped early (no spans; a block that still means something then,
                            or None); else spans are the trainers' merged records

Each folder: plan.py (pure), run.py (the handle, which makes its metrics block), metrics.py
(its lines in a run's summary, where it has its own), feature.py (the Feature, tying them
together: the only module that imports both plan and run). The
features never import each other; what two of them share lives here (the Clock) or below
(spec, plans, host). The list of features and their start and stop orders is
testbed.features.registry.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping, Protocol, Sequence, TypeVar

from testbed.spec.timescale import TimeScale

if TYPE_CHECKING:
    from testbed.emulation.network import Network
    from testbed.host.extras import WorkerExtras
    from testbed.plans.placement import Placement
    from testbed.plans.workers import WorkerSlot
    from testbed.spec.scenario import Scenario
    from testbed.spec.systems import System
    from testbed.spec.training import TrainConfig


class Clock:
    """The run's t = 0 (just before the trainers are spawned) on the wall and monotonic clocks,
    and its time scale: every feature that acts on a schedule (faults, cross-traffic) reads this
    one, so their times are the same times. Times it gives are configured seconds (what the
    scenario says), elapsed times emulated ones (what the network runs)."""

    def __init__(self, time_scale: TimeScale = TimeScale()) -> None:
        self.time_scale = time_scale
        self.wall0 = 0.0          # time.time() at t = 0
        self.mono0 = 0.0          # time.monotonic() at t = 0
        self.started = False

    def start(self) -> None:
        """t = 0 is now."""
        self.wall0, self.mono0 = time.time(), time.monotonic()
        self.started = True

    def elapsed(self) -> float:
        """Emulated (wall) seconds since t = 0."""
        return time.monotonic() - self.mono0

    def now_s(self) -> float:
        """Configured seconds since t = 0."""
        return self.time_scale.real_span(time.monotonic() - self.mono0)

    def at_wall(self, t_wall: float) -> float:
        """A time.time() stamp (e.g. the kernel's, from a delay line) in configured seconds
        since t = 0."""
        return self.time_scale.real_span(t_wall - self.wall0)


@dataclass(frozen=True, kw_only=True, slots=True)
class SystemJob:
    """What a feature plans from: one system's run of the scenario (cfg with the placement's
    hosts in it)."""

    scenario: "Scenario"
    cfg: "TrainConfig"
    placement: "Placement"
    system: "System"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunContext:
    """What a feature starts with: the job, the running network, the system's folder, the
    progress lines and the run's one clock."""

    job: SystemJob
    net: "Network"
    sys_dir: Path
    progress: Callable[[str], None]
    clock: Clock


class FeaturePlan(Protocol):
    """A feature's plan for one system (pure, as plan/show/predict read it)."""

    name: str

    def to_dict(self) -> dict: ...


@dataclass(frozen=True, kw_only=True)
class MetricsBlock:
    """What a feature adds to a system's metrics.json: `value` under `key`, and where the
    system-wide parts take more: wan_links (per link direction "a->b", merged into metrics'
    wan_links), warnings (appended to wan_warnings), spans (more spans for the timeline and
    trace.json, e.g. the prefills) and the iteration the timeline draws."""

    key: str
    value: Any
    wan_links: Mapping[str, dict] = field(default_factory=dict)
    warnings: Sequence[str] = ()
    spans: Sequence[dict] | None = None
    iteration: int | None = None


class FeatureHandle:
    """A started feature (module docstring). The defaults do nothing; a handle overrides what
    its feature does."""

    name: str = ""
    clocked: bool = False         # it acts on the run's clock (begin starts its schedule)

    def begin(self) -> None:
        pass

    def worker_extras(self, slot: "WorkerSlot") -> "WorkerExtras | None":
        return None

    def stop(self) -> None:
        raise NotImplementedError

    def blame(self) -> str | None:
        return None

    def results(self, *, partial: bool, spans: Sequence[dict] = ()) -> MetricsBlock | None:
        return None


P = TypeVar("P")


@dataclass(frozen=True, kw_only=True, slots=True)
class Feature(Generic[P]):
    """One feature: its name, its pure plan and how it starts (module docstring)."""

    name: str
    plan: Callable[[SystemJob], P | None]
    start: Callable[[P, RunContext], FeatureHandle]
