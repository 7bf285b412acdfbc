"""The `faults:` section (testbed.spec.faults): parsed, checked, ordered; and the restore events a
fault with for_s gets (testbed.features.faults.run.events_of). Pure: no root."""

from __future__ import annotations

import pytest

from testbed.spec.errors import ScenarioError
from testbed.spec.faults import events_of
from testbed.spec.scenario import parse_scenario
from testbed.spec.timescale import TimeScale

pytestmark = pytest.mark.unit

BASE = {"name": "f",
        "dcs": [{"name": "a", "hosts": 2, "decode_hosts": 1}, {"name": "b", "hosts": 1}],
        "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100}]}


def faults(*items):
    return parse_scenario(dict(BASE, faults=list(items))).faults


def test_every_kind_parses_in_time_order_and_a_trace_is_rate_steps():
    got = faults({"kind": "crash", "process": "decode", "host": "a-d1", "at_s": 9},
                 {"kind": "link_down", "link": ["b", "a"], "at_s": 3, "for_s": 1.5},
                 {"kind": "rate_trace", "link": ["a", "b"], "at_s": 4,
                  "steps": [[0, 50], [2.5, 100]]},
                 {"kind": "delay", "link": ["a", "b"], "at_s": 5, "delay_ms": 30, "jitter_ms": 2},
                 {"kind": "loss", "link": ["a", "b"], "at_s": 0, "loss_pct": 5, "for_s": 1})
    assert [(f.label, f.kind, f.at_s) for f in got] == [
        ("faults[4]", "loss", 0.0), ("faults[1]", "link_down", 3.0),
        ("faults[2].steps[0]", "rate", 4.0), ("faults[3]", "delay", 5.0),
        ("faults[2].steps[1]", "rate", 6.5), ("faults[0]", "crash", 9.0)]
    assert got[1].link == ("a", "b")          # the wan section's order, however it was named
    assert got[2].rate_mbit == 50 and got[4].rate_mbit == 100
    assert got[3].delay_ms == 30 and got[3].jitter_ms == 2
    assert got[5].process == "decode" and got[5].host == "a-d1"
    assert got[1].describe() == "faults[1] (link down a<->b at 3 s for 1.5 s)"
    assert got[3].describe() == "faults[3] (delay 30 ms +-2 a<->b at 5 s)"


def test_restore_events_follow_faults_with_for_s():
    evs = events_of(faults({"kind": "link_down", "link": ["a", "b"], "at_s": 3, "for_s": 2},
                           {"kind": "delay", "link": ["a", "b"], "at_s": 4, "delay_ms": 30},
                           {"kind": "loss", "link": ["a", "b"], "at_s": 5, "loss_pct": 1,
                            "for_s": 1}))
    assert [(e.fault.kind, e.restore, e.at_s) for e in evs] == [
        ("link_down", False, 3.0), ("delay", False, 4.0), ("link_down", True, 5.0),
        ("loss", False, 5.0), ("loss", True, 6.0)]
    assert evs[2].describe().startswith("restore after faults[0]")


def test_time_scale_scales_figures_not_times():
    f = faults({"kind": "delay", "link": ["a", "b"], "at_s": 4, "delay_ms": 30, "jitter_ms": 1},
               {"kind": "rate", "link": ["a", "b"], "at_s": 5, "rate_mbit": 60})
    d, r = (x.scaled(TimeScale(10)) for x in f)
    assert (d.at_s, d.delay_ms, d.jitter_ms) == (4, 300, 10)
    assert (r.at_s, r.rate_mbit) == (5, 6)


@pytest.mark.parametrize("item, field, fix", [
    ({"kind": "melt", "at_s": 1}, "faults[0].kind", "use one of link_down"),
    ({"kind": "link_down", "at_s": 1}, "faults[0].link", "needs it"),
    ({"kind": "link_down", "link": ["a", "c"], "at_s": 1}, "faults[0].link", "name the two ends"),
    ({"kind": "link_down", "link": "a-b", "at_s": 1}, "faults[0].link", "use link: [dc1, dc2]"),
    ({"kind": "link_down", "link": ["a", "b"], "at_s": -1}, "faults[0].at_s", "use a number"),
    ({"kind": "link_down", "link": ["a", "b"], "at_s": float("nan")}, "faults[0].at_s", "use a number"),
    ({"kind": "link_down", "link": ["a", "b"], "at_s": 1, "for_s": 0}, "faults[0].for_s", "use a number"),
    ({"kind": "link_down", "link": ["a", "b"], "at_s": 1, "rate_mbit": 5}, "faults[0].rate_mbit",
     "use at_s, for_s, link"),
    ({"kind": "delay", "link": ["a", "b"], "at_s": 1, "delay_ms": 5, "jitter_ms": 6},
     "faults[0].jitter_ms", "use jitter_ms <= delay_ms"),
    ({"kind": "rate", "link": ["a", "b"], "at_s": 1, "rate_mbit": 0}, "faults[0].rate_mbit", "use a number"),
    ({"kind": "loss", "link": ["a", "b"], "at_s": 1, "loss_pct": 101}, "faults[0].loss_pct", "use a number"),
    ({"kind": "rate_trace", "link": ["a", "b"], "at_s": 1, "steps": []}, "faults[0].steps", "e.g."),
    ({"kind": "rate_trace", "link": ["a", "b"], "at_s": 1, "steps": [[1, 5], [1, 6]]},
     "faults[0].steps[1][0]", "increasing time"),
    ({"kind": "rate_trace", "link": ["a", "b"], "at_s": 1, "steps": [[1, 5, 3]]},
     "faults[0].steps[0]", "[t_s, rate_mbit]"),
    ({"kind": "crash", "process": "gpu", "host": "a-h1", "at_s": 1}, "faults[0].process", "use one of"),
    ({"kind": "crash", "process": "decode", "host": "b-d1", "at_s": 1}, "faults[0].host", "a-d1"),
    ({"kind": "crash", "process": "delayline", "host": "a-h1", "at_s": 1}, "faults[0].host", "a-gw"),
    ({"kind": "crash", "process": "trainer", "host": "a-h9", "at_s": 1}, "faults[0].host", "a-h1, a-h2"),
    ("crash", "faults[0]", "write kind"),
])
def test_bad_faults_name_the_field_and_the_fix(item, field, fix):
    with pytest.raises(ScenarioError) as err:
        faults(item)
    assert err.value.field == field and fix in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_faults_must_be_a_list():
    with pytest.raises(ScenarioError, match="^faults: must be a list"):
        parse_scenario(dict(BASE, faults={"kind": "link_down"}))


def test_recorded_figures_are_in_configured_units_with_time_scale():
    """With time_scale 10 the delay lines get 10x the delay; the record says the fault's own
    (configured) figures, and a restore the link's."""
    from types import SimpleNamespace

    from testbed.features.base import Clock
    from testbed.features.faults.run import FaultRunner
    from testbed.plans.topo import make_plan
    sc = parse_scenario(dict(BASE, time_scale=10, faults=[
        {"kind": "delay", "link": ["a", "b"], "at_s": 1, "delay_ms": 40, "jitter_ms": 2,
         "for_s": 1}]))
    net = SimpleNamespace(plan=make_plan(sc.emulated()), backend="delayline")
    runner = FaultRunner(net, sc.faults, Clock(sc.dilation))
    sent = []
    runner._set_figures = lambda w, figures: (sent.append(figures), (1.0, None))[1]
    records = []
    for ev in runner.events:
        rec = {}
        runner._apply(ev, rec)
        records.append(rec["figures"])
    assert sent == [{"delay_ms": 400, "jitter_ms": 20}, {"delay_ms": 100, "jitter_ms": 0}]
    assert records == [{"delay_ms": 40, "jitter_ms": 2}, {"delay_ms": 10, "jitter_ms": 0}]
