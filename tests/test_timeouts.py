"""testbed.plans.timeouts: a run's limits come from the model's prediction, not a fixed 600 s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from testbed.predict.predict import predict
from testbed.cli.planview import load_training
from testbed.spec.scenario import load_scenario
from testbed.spec.systems import get_system
from testbed.plans.timeouts import DEFAULT_PEER_S, DEFAULT_RUN_S, MIN_RUN_S, timeouts_for

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


def limits(sc, cfg, system: str, flag_s=None):
    """As a run derives them: from the model's prediction of the run (profile mode)."""
    pred = (predict(sc, cfg, get_system(system), cfg.iterations).iteration_time_s
            if cfg.compute == "profile" else None)
    return timeouts_for(cfg, pred, flag_s)


def test_limits_follow_the_predicted_iteration_time():
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    cfg = load_training(sc)
    slow = limits(sc, cfg, "baseline")        # ~20 s per iteration
    fast = limits(sc, cfg, "atlas")           # ~0.4 s
    assert slow.source == fast.source == "model"
    assert slow.run_s == pytest.approx(3 * cfg.iterations * slow.predicted_iteration_s + 120)
    assert slow.run_s > fast.run_s == MIN_RUN_S
    assert slow.peer_s == pytest.approx(3 * slow.predicted_iteration_s) and slow.peer_s > 60
    assert fast.peer_s == 60
    longer = dataclasses.replace(cfg, iterations=40)
    assert limits(sc, longer, "baseline").run_s > slow.run_s


def test_measured_mode_and_the_flag():
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    measured = dataclasses.replace(load_training(sc), compute="measured", profile=None)
    t = limits(sc, measured, "baseline")
    assert (t.run_s, t.peer_s, t.predicted_iteration_s) == (DEFAULT_RUN_S, DEFAULT_PEER_S, None)
    flagged = limits(sc, load_training(sc), "baseline", flag_s=30)
    assert (flagged.run_s, flagged.source) == (30, "flag") and flagged.peer_s <= 30
