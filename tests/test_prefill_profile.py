"""The prefill time and KV-cache model from the H200 profile's prefill_stack."""

from __future__ import annotations

import pytest

from testbed.rules.prefill_profile import PrefillProfile

pytestmark = pytest.mark.unit


def test_measured_points_are_returned_exactly_and_kv_matches_the_profile():
    p = PrefillProfile.load()
    assert (p.width, p.layers, p.max_tokens) == (4096, 32, 8192)
    assert p.prefill_ms(1024) == 22.222 and p.prefill_ms(8192) == 202.53
    assert p.kv_cache_bytes(1024) == 536870912        # the profile's own figure


def test_between_points_linear_and_monotone():
    p = PrefillProfile.load()
    assert p.prefill_ms(1536) == pytest.approx((22.222 + 44.541) / 2)
    times = [p.prefill_ms(n) for n in range(1, 8193, 97)]
    assert all(a <= b for a, b in zip(times, times[1:]))
    assert p.prefill_ms(5) == p.prefill_ms(128) == 5.518     # launch-bound floor


def test_beyond_the_profile_is_refused():
    p = PrefillProfile.load()
    with pytest.raises(ValueError, match="beyond the profiled 8192"):
        p.prefill_ms(8193)
    with pytest.raises(ValueError):
        p.prefill_ms(0)
