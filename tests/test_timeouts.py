"""testbed.timeouts: a run's limits come from the model's prediction, not a fixed 600 s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from testbed.planview import load_training
from testbed.scenario import load_scenario
from testbed.systems import get_system
from testbed.timeouts import DEFAULT_PEER_S, DEFAULT_RUN_S, MIN_RUN_S, timeouts_for

REPO = Path(__file__).resolve().parent.parent


def test_limits_follow_the_predicted_iteration_time():
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    cfg = load_training(sc)
    slow = timeouts_for(sc, cfg, get_system("baseline"))        # ~20 s per iteration
    fast = timeouts_for(sc, cfg, get_system("atlas"))           # ~0.4 s
    assert slow.source == fast.source == "model"
    assert slow.run_s == pytest.approx(3 * cfg.iterations * slow.predicted_iteration_s + 120)
    assert slow.run_s > fast.run_s == MIN_RUN_S
    assert slow.peer_s == pytest.approx(3 * slow.predicted_iteration_s) and slow.peer_s > 60
    assert fast.peer_s == 60
    longer = dataclasses.replace(cfg, iterations=40)
    assert timeouts_for(sc, longer, get_system("baseline")).run_s > slow.run_s


def test_measured_mode_and_the_flag():
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    measured = dataclasses.replace(load_training(sc), compute="measured", profile=None)
    t = timeouts_for(sc, measured, get_system("baseline"))
    assert (t.run_s, t.peer_s, t.predicted_iteration_s) == (DEFAULT_RUN_S, DEFAULT_PEER_S, None)
    flagged = timeouts_for(sc, load_training(sc), get_system("baseline"), flag_s=30)
    assert (flagged.run_s, flagged.source) == (30, "flag") and flagged.peer_s <= 30
