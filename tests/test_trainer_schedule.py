"""Schedule tables, the bubble formula and the compute-only timeline (testbed.rules.pipeline's
simulator in its simplest case), checked against the dependency rule written as a plain loop.
Pure; no processes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.rules.pipeline import compute_only
from testbed.rules.schedule import bubble_fraction, parse_action, schedule_table

simulate = compute_only

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


def reference_timeline(table, f_ms, b_ms, comm_ms, opt_ms):
    """The compute-only rule as a plain loop, the way it reads: each stage runs its row in order;
    an op starts at max(stage free, input ready + comm_ms); the last stage's B(m) needs its own
    F(m); an optimizer step (when > 0) ends each row. -> ({(stage, action): (start, end)},
    window, per-stage compute in row order)."""
    P = len(table)
    done, free, pos, spans = {}, [0.0] * P, [0] * P, {}
    while any(pos[s] < len(table[s]) for s in range(P)):
        progressed = False
        for s in range(P):
            while pos[s] < len(table[s]):
                kind, mb = parse_action(table[s][pos[s]])
                if kind == "F":
                    dep, delay, dur = (done.get(("F", s - 1, mb)), comm_ms, f_ms[s]) if s else (0.0, 0.0, f_ms[s])
                elif s < P - 1:
                    dep, delay, dur = done.get(("B", s + 1, mb)), comm_ms, b_ms[s]
                else:
                    dep, delay, dur = done.get(("F", s, mb)), 0.0, b_ms[s]
                if dep is None:
                    break
                start = max(free[s], dep + delay)
                free[s] = start + dur
                done[(kind, s, mb)] = free[s]
                spans[(s, table[s][pos[s]])] = (start, free[s])
                pos[s] += 1
                progressed = True
        assert progressed, "deadlock"
    for s in range(P):
        if opt_ms[s] > 0:
            spans[(s, "OPT")] = (free[s], free[s] + opt_ms[s])
    compute = [0.0] * P
    for s in range(P):
        for a in [*table[s], "OPT"]:
            if (s, a) in spans:
                compute[s] += spans[(s, a)][1] - spans[(s, a)][0]
    window = max(e for _, e in spans.values()) - min(b for b, _ in spans.values())
    return spans, window, compute


durations = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b"]), st.integers(1, 8), st.integers(1, 16), st.data(),
       st.sampled_from([0.0, 0.1, 0.5, 1 / 3]))
def test_compute_only_is_the_plain_rule_bit_for_bit(name, P, M, data, comm_ms):
    """The event-driven simulator (the model's) in its compute-only case gives exactly, bit for
    bit, what the plain loop gives: the planner's timeline and the model's are one computation."""
    f = data.draw(st.lists(durations, min_size=P, max_size=P))
    b = data.draw(st.lists(durations, min_size=P, max_size=P))
    o = data.draw(st.lists(st.one_of(st.just(0.0), durations), min_size=P, max_size=P))
    table = schedule_table(name, P, M)
    got = compute_only(table, f, b, comm_ms=comm_ms, opt_ms=o)
    spans, window, compute = reference_timeline(table, f, b, comm_ms, o)
    assert {(op.stage, op.action): (op.start_ms, op.end_ms) for op in got.ops} == spans
    assert len(got.ops) == len(spans)
    assert got.window_ms == window and got.compute_ms == compute
    assert got.bubble == [1.0 - c / window for c in compute]
