"""Schedule tables, the bubble formula and the simulator (pure; no processes)."""

import pytest

from geodc.rules.schedule import (bubble_fraction, parse_action, schedule_table, simulate)

pytestmark = pytest.mark.unit

CASES = [(P, M) for P in (1, 2, 3, 4, 8) for M in (1, 2, 4, 5, 8, 16)]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P, M", CASES)
def test_every_stage_does_each_f_and_b_once_f_before_b(name, P, M):
    table = schedule_table(name, P, M)
    assert len(table) == P
    for row in table:
        assert sorted(row) == sorted([f"F{m}" for m in range(M)] + [f"B{m}" for m in range(M)])
        for m in range(M):
            assert row.index(f"F{m}") < row.index(f"B{m}")
        assert [a for a in row if a[0] == "F"] == [f"F{m}" for m in range(M)]
        assert [a for a in row if a[0] == "B"] == [f"B{m}" for m in range(M)]


@pytest.mark.parametrize("P, M", CASES)
def test_1f1b_respects_dependencies_and_bounds_memory(P, M):
    table = schedule_table("1f1b", P, M)
    sim = simulate(table, 1.0, 2.0, comm_ms=0.1)   # raises on a deadlock
    end = {(op.stage, op.action): op.end_ms for op in sim.ops}
    start = {(op.stage, op.action): op.start_ms for op in sim.ops}
    for s in range(P):
        for m in range(M):
            if s > 0:
                assert start[(s, f"F{m}")] >= end[(s - 1, f"F{m}")] + 0.1 - 1e-9
            if s < P - 1:
                assert start[(s, f"B{m}")] >= end[(s + 1, f"B{m}")] + 0.1 - 1e-9
        in_flight = peak = 0
        for a in table[s]:
            in_flight += 1 if a[0] == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(P - s, M)   # 1F1B keeps at most P-s activations; GPipe keeps M


def test_1f1b_table_for_four_stages():
    table = schedule_table("1f1b", 4, 4)
    assert table[0] == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    assert table[3] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert table[2] == ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P, M", CASES)
@pytest.mark.parametrize("f_ms, b_ms", [(1.0, 1.0), (1.0, 2.0), (3.0, 5.0)])
def test_simulated_bubble_equals_formula_for_uniform_ops(name, P, M, f_ms, b_ms):
    sim = simulate(schedule_table(name, P, M), f_ms, b_ms)
    assert sim.window_ms == pytest.approx((M + P - 1) * (f_ms + b_ms))
    for bubble in sim.bubble:
        assert bubble == pytest.approx(bubble_fraction(P, M))


def test_communication_delay_adds_to_the_bubble():
    clean = simulate(schedule_table("gpipe", 4, 8), 1.0, 2.0)
    slow = simulate(schedule_table("gpipe", 4, 8), 1.0, 2.0, comm_ms=0.5)
    assert slow.mean_bubble > clean.mean_bubble
    # each of the 2 (P-1) pipeline fills crosses 3 links of 0.5 ms
    assert slow.window_ms == pytest.approx(clean.window_ms + 2 * 3 * 0.5)


def test_bubble_formula_values():
    assert bubble_fraction(2, 4) == pytest.approx(0.2)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(1, 8) == 0.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_table("interleaved", 2, 2)
    with pytest.raises(ValueError):
        parse_action("W1")
    assert parse_action("B12") == ("B", 12)
    with pytest.raises(ValueError, match="deadlock"):
        simulate([["F0", "B0"], ["B0", "F0"]], 1.0, 1.0)


def test_durations_as_number_sequence_or_function_agree():
    table = schedule_table("1f1b", 3, 4)
    f, b, o = [1.0, 2.0, 1.5], [2.0, 3.0, 2.5], [0.5, 0.25, 0.75]
    by_seq = simulate(table, f, b, comm_ms=0.2, opt_ms=o)
    by_fn = simulate(table, lambda s: f[s], lambda s: b[s], comm_ms=0.2,
                     opt_ms=lambda s: o[s])
    assert by_fn == by_seq
    assert simulate(table, lambda s: 1.0, lambda s: 2.0) == simulate(table, 1.0, 2.0)
