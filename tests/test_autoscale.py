"""time_scale: auto (issue 25 part 1): the spec accepts it, the pure chooser picks T."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geodc.predict.autoscale import (OVERRUN_BOUND, RHO_MAX, Load, Op, choose, cpu_load,
                                     overrun_fraction, would_hold)
from geodc.spec.errors import ScenarioError
from geodc.spec.scenario import load_scenario, parse_scenario
from geodc.spec.timescale import MAX_TIME_SCALE

TRIANGLE = {"name": "t", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
            "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100}]}


def _load(cpu_ms: float, hold_ms: float, workers: int = 4, cores: int = 2,
          pps: float = 0.0) -> Load:
    ops = tuple(Op(s, k, cpu_ms * f, hold_ms * f, 8) for s in range(2)
                for k, f in (("F", 1.0), ("B", 2.0), ("OPT", 0.1)))
    per_iter = sum(op.hold_ms * op.per_iteration for op in ops) / 1000.0 / workers * 2
    return Load(ops=ops, cores=cores, iteration_s=per_iter, workers=workers, delay_line_pps=pps)


@pytest.mark.unit
def test_spec_accepts_auto_and_names_the_field_otherwise():
    sc = parse_scenario(dict(TRIANGLE, time_scale="auto"))
    assert sc.time_scale_auto and sc.time_scale == 1.0
    assert parse_scenario(dict(TRIANGLE, time_scale=6)).time_scale == 6.0
    assert not parse_scenario(TRIANGLE).time_scale_auto
    for bad in ("fast", 0.5, 101, True, float("nan"), None):
        with pytest.raises(ScenarioError, match=r"^time_scale: .*a number 1\.\.100 or auto"):
            parse_scenario(dict(TRIANGLE, time_scale=bad))


@pytest.mark.unit
def test_light_load_picks_one_and_overloaded_picks_more():
    assert choose(_load(cpu_ms=0.1, hold_ms=10.0)).time_scale == 1.0
    c = choose(_load(cpu_ms=10.0, hold_ms=3.0))
    assert c.time_scale > 1.0 and c.held
    assert c.rho <= RHO_MAX and c.overrun_fraction <= OVERRUN_BOUND
    assert any("safety factor" in r for r in c.reasons)


@pytest.mark.unit
def test_delay_line_packets_alone_can_need_dilation():
    assert choose(_load(0.01, 10.0, pps=2e6)).time_scale > 1.0      # 4 s of CPU per s on 2 cores
    assert choose(_load(0.01, 10.0, pps=1e4)).time_scale == 1.0


@pytest.mark.unit
def test_impossible_load_caps_at_the_kernels_limit():
    c = choose(_load(cpu_ms=1000.0, hold_ms=0.01))
    assert c.time_scale == MAX_TIME_SCALE and not c.held


@pytest.mark.unit
@settings(max_examples=60, deadline=None)
@given(cpu=st.floats(0.01, 50.0), hold=st.floats(0.1, 50.0), workers=st.integers(1, 64),
       cores=st.integers(1, 16), pps=st.floats(0.0, 1e6))
def test_chosen_t_is_the_smallest_that_holds(cpu, hold, workers, cores, pps):
    load = _load(cpu, hold, workers, cores, pps)
    c = choose(load)
    assert 1.0 <= c.time_scale <= MAX_TIME_SCALE
    if c.held:
        assert cpu_load(load, c.time_scale) <= RHO_MAX
        assert overrun_fraction(load, c.time_scale) <= OVERRUN_BOUND
        if c.time_scale > 1.0:      # the next smaller candidate does not hold
            assert (cpu_load(load, 1.0) > RHO_MAX or overrun_fraction(load, 1.0) > OVERRUN_BOUND)
    # more dilation never makes it worse
    assert overrun_fraction(load, 2 * c.time_scale if c.time_scale < 50 else 100) \
        <= overrun_fraction(load, c.time_scale) + 1e-12


@pytest.mark.unit
def test_would_hold_rises_with_measured_overruns():
    load = _load(cpu_ms=10.0, hold_ms=3.0)
    t = choose(load).time_scale
    assert would_hold(load, 0.0, t) == t
    assert would_hold(load, 0.30, t) > t


@pytest.mark.unit
def test_two_dc_scenario_file_is_still_a_number():
    sc = load_scenario("topologies/two_dc.yaml")
    assert not sc.time_scale_auto
