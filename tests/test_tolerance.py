"""tests/tolerance.py, the fidelity asserts' helper: what passes, what fails, and that a
failure shows every sample, the target and the tolerance."""

from __future__ import annotations

import pytest

from tests.tolerance import assert_within, retried, within

pytestmark = pytest.mark.unit


def test_every_sample_inside_by_default():
    assert_within([0.98, 1.0, 1.02], 1.0, rel=0.05)
    with pytest.raises(AssertionError) as err:
        assert_within([0.98, 1.0, 1.2], 1.0, rel=0.05, what="close() s")
    text = str(err.value)
    assert text.startswith("close() s: target 1 +- 0.05 (rel 0.05, abs 0): 2 of 3 inside, 3 needed")
    for line in ("[0] 0.98 (-0.02)", "[1] 1 (+0)", "[2] 1.2 (+0.2)  outside"):
        assert line in text, text


def test_the_larger_of_rel_and_abs():
    assert_within([0.0], 0.0, rel=0.1, abs=0.01)
    assert_within([10.4], 10.0, rel=0.01, abs=0.5)          # abs wins
    assert_within([10.4], 10.0, rel=0.05, abs=0.01)         # rel wins
    assert not within([10.6], 10.0, rel=0.05, abs=0.5)[0]


def test_share_and_center():
    ms = [21.5, 21.7, 21.6, 30.0]                            # one stalled op
    assert not within(ms, 21.6, rel=0.1)[0]
    assert_within(ms, 21.6, rel=0.1, share=0.75)
    assert not within(ms, 21.6, rel=0.1, share=0.8)[0]      # 4 x 0.8 rounds up to 4
    assert_within(ms, 21.6, rel=0.05, center="median")
    ok, report = within(ms, 21.6, rel=0.05, center="mean")
    assert not ok and "mean 23.7" in report and "[3] 30 (+8.4)  outside" in report


def test_a_side_of_its_own():
    """A deadline of 0.3 s: at most 0.05 s early, up to 1.7 s late."""
    assert_within([0.3, 0.31, 1.9], 0.3, below=0.05, above=1.7)
    ok, report = within([0.24, 2.1], 0.3, below=0.05, above=1.7)
    assert not ok and report.startswith("target 0.3 -0.05/+1.7 (rel 0, abs 0): 0 of 2 inside")
    assert_within([0.96, 2.9], 1.0, rel=0.05, above=2.0)    # the other side from rel
    assert not within([0.94], 1.0, rel=0.05, above=2.0)[0]


def test_no_samples_and_bad_tolerances_are_refused():
    with pytest.raises(AssertionError, match="no samples"):
        assert_within([], 1.0, rel=0.1)
    for kw in ({"rel": -1}, {"below": -0.1}, {"share": 0}, {"share": 1.5}, {"center": "mode"}):
        with pytest.raises(ValueError):
            within([1.0], 1.0, **kw)


def test_retried_stops_at_the_first_accepted_try():
    seen = []
    results = retried(lambda i: seen.append(i) or 10 * i, ok=lambda x: x >= 10, tries=3)
    assert results == [0, 10] and seen == [0, 1]


def test_retried_gives_every_try_when_none_is_accepted():
    assert retried(lambda i: i, ok=lambda x: False, tries=3) == [0, 1, 2]
    assert retried(lambda i: i, ok=lambda x: True, tries=3) == [0]
    with pytest.raises(ValueError, match="tries"):
        retried(lambda i: i, ok=lambda x: True, tries=0)
