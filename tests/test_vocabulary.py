"""The shared vocabulary (geodc.spec.timescale, geodc.spec.links): conversions bit for bit the
expressions they replace, link directions round-trip through their string form."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geodc.spec.links import LinkDir, both, hops
from geodc.spec.timescale import TimeScale

factors = st.floats(min_value=1.0, max_value=100.0, allow_nan=False)
values = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(factors, values)
def test_conversions_are_the_hand_written_expressions_bit_for_bit(t: float, x: float) -> None:
    ts = TimeScale(t)
    assert ts.emulated_span(x) == x * t and ts.emulated_rate(x) == x / t
    assert ts.real_span(x) == x / t and ts.real_rate(x) == x * t
    # there and back is the value (to rounding: one multiply and one divide)
    assert math.isclose(ts.real_span(ts.emulated_span(x)), x, rel_tol=1e-15, abs_tol=1e-300)


def test_time_scale_bounds_and_identity() -> None:
    assert not TimeScale().dilated and TimeScale(6).dilated and str(TimeScale(6)) == "6"
    for bad in (0.5, 0.0, 101.0, float("nan")):
        with pytest.raises(ValueError, match="outside 1..100"):
            TimeScale(bad)


dc = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)


@given(dc, dc)
def test_link_directions_round_trip_and_name_both_ends(a: str, b: str) -> None:
    d = LinkDir(a, b)
    assert str(d) == f"{a}->{b}" and LinkDir.parse(str(d)) == d and d.reverse == LinkDir(b, a)
    assert both(a, b) == (d, d.reverse)
    assert {d: 1}[LinkDir(a, b)] == 1          # hashable, equal by value


@given(st.lists(st.tuples(dc, dc), min_size=2, max_size=8))
def test_link_directions_sort_as_their_strings_do(pairs: list[tuple[str, str]]) -> None:
    dirs = [LinkDir(a, b) for a, b in pairs]
    assert [str(d) for d in sorted(dirs)] == sorted(str(d) for d in dirs)


def test_hops_and_refused_strings() -> None:
    assert hops(["a", "b", "c"]) == [LinkDir("a", "b"), LinkDir("b", "c")] and hops(["a"]) == []
    for bad in ("east", "->west", "east->", "a->b->c"):
        with pytest.raises(ValueError, match="not a link direction"):
            LinkDir.parse(bad)
