"""The fair share the model gives flows on shared links is max-min fair with caps, checked by
its definition (feasible; every flow at its cap or on a full link where no flow gets more), and
leaving out the links that cannot fill changes no rate."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings, strategies as st

from testbed.rules.fairshare import max_min_rates

pytestmark = pytest.mark.unit


@dataclass
class Flow:
    links: tuple
    weight: float
    cap_mbit: float
    rate_mbit: float = 0.0


@st.composite
def networks(draw):
    n_links = draw(st.integers(1, 6))
    rates = {l: draw(st.sampled_from([10.0, 25.0, 100.0, 1000.0])) for l in range(n_links)}
    flows = [Flow(links=tuple(draw(st.lists(st.integers(0, n_links - 1), min_size=1,
                                            max_size=3))),
                  weight=draw(st.integers(1, 4)),
                  cap_mbit=draw(st.sampled_from([1.0, 5.0, 20.0, 60.0, 400.0])))
             for _ in range(draw(st.integers(1, 12)))]
    return rates, flows


def tight_links(rates, flows):
    cap_sum = {}
    for f in flows:
        for l in set(f.links):
            cap_sum[l] = cap_sum.get(l, 0.0) + f.weight * f.cap_mbit
    return {l for l, s in cap_sum.items() if s > rates[l] * (1 - 1e-9)}


@settings(max_examples=200, deadline=None)
@given(networks())
def test_rates_are_max_min_fair(net):
    rates, flows = net
    max_min_rates(flows, rates, tight_links(rates, flows))
    load = {l: 0.0 for l in rates}
    for f in flows:
        assert 0 < f.rate_mbit <= f.cap_mbit * (1 + 1e-9)
        for l in set(f.links):
            load[l] += f.weight * f.rate_mbit
    for l, used in load.items():
        assert used <= rates[l] * (1 + 1e-9), f"link {l} carries {used} of {rates[l]}"
    for f in flows:
        if f.rate_mbit >= f.cap_mbit * (1 - 1e-9):
            continue
        # a bottleneck: full, and nobody on it gets more than f
        assert any(load[l] >= rates[l] * (1 - 1e-6)
                   and all(g.rate_mbit <= f.rate_mbit * (1 + 1e-6)
                           for g in flows if l in g.links)
                   for l in f.links), f"{f} is below its cap with no bottleneck"


@settings(max_examples=200, deadline=None)
@given(networks())
def test_slack_links_change_no_rate(net):
    rates, flows = net
    max_min_rates(flows, rates, set(rates))
    every = [f.rate_mbit for f in flows]
    max_min_rates(flows, rates, tight_links(rates, flows))
    for f, r in zip(flows, every):
        assert f.rate_mbit == pytest.approx(r, rel=1e-9), (f, r)
