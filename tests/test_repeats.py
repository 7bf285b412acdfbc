"""testbed.run.repeats: a system's repeats as one block, the headline figures their means, the
spread beside them, the model's comparison made again against the means."""

from __future__ import annotations

import pytest

from testbed.run.repeats import combine

pytestmark = pytest.mark.unit


def block(iteration_s: float, bubble: float) -> dict:
    return {"iteration_time_s": iteration_s, "tokens_per_s": 1000 / iteration_s,
            "bubble_fraction": bubble, "gpu_utilization": 1 - bubble,
            "pipeline_bubble_fraction": bubble, "stages": [{"stage": 0}],
            "model": {"predicted": {"iteration_time_s": 2.0, "bubble_fraction": 0.5,
                                    "gpu_utilization": 0.5},
                      "measured": {"iteration_time_s": iteration_s, "bubble_fraction": bubble,
                                   "gpu_utilization": 1 - bubble, "allreduce_ms": [1.0]},
                      "error": {"iteration_time_rel": 2.0 / iteration_s - 1,
                                "bubble_fraction_abs": 0.5 - bubble,
                                "gpu_utilization_abs": bubble - 0.5},
                      "targets": {"iteration_time_rel": 0.10, "bubble_fraction_abs": 0.05},
                      "within_target": False}}


def test_the_mean_with_its_spread_and_the_model_against_it():
    out = combine([block(2.4, 0.52), block(1.6, 0.48), block(2.0, 0.50)], ["a", "r2/a", "r3/a"])
    assert out["iteration_time_s"] == pytest.approx(2.0)
    rep = out["repeats"]
    assert rep["n"] == 3 and rep["folders"] == ["a", "r2/a", "r3/a"] and rep["others_from"] == "a"
    it = rep["iteration_time_s"]
    assert it["values"] == [2.4, 1.6, 2.0] and it["stdev"] == pytest.approx(0.4)
    assert (it["min"], it["max"]) == (1.6, 2.4)
    assert out["bubble_fraction"] == pytest.approx(0.50)
    model = out["model"]
    assert model["error"]["iteration_time_rel"] == pytest.approx(0.0)
    assert model["measured"]["iteration_time_s"] == pytest.approx(2.0)
    assert model["measured"]["allreduce_ms"] == [1.0]      # the first repeat's, as said
    assert model["within_target"] is True
    assert out["stages"] == [{"stage": 0}]


def test_one_repeat_has_no_stdev():
    assert combine([block(2.0, 0.5)], ["a"])["repeats"]["iteration_time_s"]["stdev"] is None


def test_a_figure_point_carries_the_range_over_repeats_and_the_models_speedup():
    from testbed.analysis.series import _speedup
    base = combine([block(3.0, 0.5), block(4.0, 0.5)], ["baseline", "r2/baseline"])
    atlas = combine([block(1.0, 0.5), block(2.0, 0.5)], ["atlas", "r2/atlas"])
    y = _speedup(base, atlas)
    assert y["speedup"] == pytest.approx(3.5 / 1.5)
    assert (y["speedup_lo"], y["speedup_hi"]) == (pytest.approx(3.0 / 2.0), pytest.approx(4.0))
    assert y["model_speedup"] == pytest.approx(1.0)     # both predicted 2.0 s
    assert "speedup_lo" not in _speedup(block(3.0, 0.5), block(1.0, 0.5))
