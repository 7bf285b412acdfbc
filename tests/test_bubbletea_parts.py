"""BubbleTea's pure parts: the scenario section, the admission rule, the load split, the metrics.

- the controller never admits a request whose prediction plus guard does not fit (hypothesis);
- FIFO first fit, requeue keeps the place, expiry at the deadline (counted, not dropped);
- `bubbletea:` and decode_hosts are validated with one-line errors naming the field;
- the load is split over DCs in proportion to their training hosts;
- the metrics see an overlap, a GPU wait, and attribute unused bubble time by cause.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.rules.admission import Admission, chunk_end, make_pending
from testbed.rules.prefill_profile import PrefillProfile
from testbed.spec.bubbletea import BubbleTeaConfig
from testbed.rules.bubbletea_figures import bubbletea_metrics
from testbed.features.bubbletea.plan import make_requests
from testbed.spec.errors import ScenarioError
from testbed.spec.scenario import parse_scenario
from testbed.spec.timescale import TimeScale
from testbed.plans.topo import make_plan

MS = 1_000_000


def bridge_interfaces(plan) -> list[str]:
    """Every bridge, then every bridge's ports (each in its bridge's namespace)."""
    return [*plan.bridges.values(),
            *(p for dc in plan.scenario.dcs for p in plan.bridge_ports(dc.name))]


def pending(i: int, pred_ms: float, arrival_ns: int = 0, deadline_ms: float = 1000.0,
            guard_ms: float = 2.0):
    return make_pending(id=f"r{i}", seq=i, t_arrival_ns=arrival_ns, target_tokens=100,
                        output_tokens=1, deadline_ms=deadline_ms,
                        predict_ms=lambda n: pred_ms, guard_ms=lambda p: guard_ms, time_scale=TimeScale())


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(preds=st.lists(st.floats(0.1, 100.0), min_size=0, max_size=12),
       now_ms=st.floats(0.0, 50.0), length_ms=st.floats(0.0, 150.0),
       guard_ms=st.floats(0.0, 10.0))
def test_admission_never_admits_what_does_not_fit(preds, now_ms, length_ms, guard_ms):
    q = Admission()
    for i, p in enumerate(preds):
        q.arrive(pending(i, p, guard_ms=guard_ms))
    now, end = int(now_ms * MS), int((now_ms + length_ms) * MS)
    pick = q.pick(now, end)
    if pick.request is not None:
        r = pick.request
        assert now + r.predicted_ns + r.guard_ns <= end
        assert pick.not_after_ns == end - r.guard_ns
        # best fit (nobody is urgent at now <= 50 ms of a 1 s deadline): no queued request
        # that fits is longer
        rest = q.drain()
        assert len(rest) == len(preds) - 1
        assert all(x.predicted_ns <= r.predicted_ns for x in rest
                   if now + x.predicted_ns + x.guard_ns <= end)
    else:
        assert len(q) == len(preds)
        assert pick.reason == ("no_request" if not preds else pick.reason)
        assert pick.reason in ("no_request", "none_fitted", "guard")


@pytest.mark.unit
def test_chunk_cost_rule():
    """A chunk costs the whole prompt's increment, never less than its own length alone, so the
    chunks of a prompt cost at least its whole prefill."""
    prof = PrefillProfile.load()
    assert prof.chunk_ms(0, 3000) == prof.prefill_ms(3000)
    assert prof.chunk_ms(4000, 4100) == prof.prefill_ms(100) == prof.prefill_ms(128)
    assert prof.chunk_ms(4000, 8000) == pytest.approx(prof.prefill_ms(8000)
                                                      - prof.prefill_ms(4000))
    assert prof.chunk_ms(4000, 8000) > prof.prefill_ms(4000)      # attention over the prefix
    for cuts in ([1000], [128, 256, 4000], list(range(500, 8192, 500))):
        bounds = list(zip([0] + cuts, cuts + [8192]))
        assert sum(prof.chunk_ms(a, b) for a, b in bounds) >= prof.prefill_ms(8192) - 1e-9
    with pytest.raises(ValueError):
        prof.chunk_ms(100, 100)


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(done=st.integers(0, 8000), extra=st.integers(1, 8192), room_ms=st.floats(0.0, 300.0),
       min_tokens=st.integers(1, 512))
def test_chunk_end_is_the_largest_chunk_that_fits(done, extra, room_ms, min_tokens):
    prof = PrefillProfile.load()
    target = min(8192, done + extra)
    if target <= done:
        return
    def cost(a, b):
        ms = prof.chunk_ms(a, b)
        return int((ms + 1.0 + 0.05 * ms) * MS)
    room = int(room_ms * MS)
    end = chunk_end(done, target, room, cost, min_tokens)
    if end is None:
        assert cost(done, target) > room
        assert done + min_tokens > target - min_tokens or cost(done, done + min_tokens) > room
        return
    assert done < end <= target and cost(done, end) <= room
    if end < target:      # neither the chunk nor the rest under min_tokens, and it is the largest
        assert end - done >= min_tokens and target - end >= min_tokens
        assert end == target - min_tokens or cost(done, end + 1) > room


@pytest.mark.unit
def test_take_for_chunk_takes_the_oldest_long_enough_request():
    prof = PrefillProfile.load()
    cost = lambda a, b: int(prof.chunk_ms(a, b) * MS)          # noqa: E731
    q = Admission()
    for i, tokens in enumerate([200, 3000, 6000]):
        q.arrive(make_pending(id=f"r{i}", seq=i, t_arrival_ns=0, target_tokens=tokens,
                              output_tokens=1, deadline_ms=1000.0, predict_ms=prof.prefill_ms,
                              guard_ms=lambda p: 0.0, time_scale=TimeScale()))
    assert q.take_for_chunk(0, int(prof.prefill_ms(128) * MS) - 1, cost, 128) is None
    assert q.pick(0, int(20 * MS)).request.id == "r0"      # the 200-token one fits whole
    r, end = q.take_for_chunk(0, int(20 * MS), cost, 128)
    assert r.id == "r1" and 128 <= end < 3000 and cost(0, end) <= 20 * MS < cost(0, end + 1)
    assert [x.id for x in q.drain()] == ["r2"]


@pytest.mark.unit
def test_admission_fifo_requeue_guard_and_expiry():
    q = Admission()
    q.arrive(pending(0, 30.0))
    q.arrive(pending(1, 5.0))
    q.arrive(pending(2, 5.0))
    first = q.pick(0, 20 * MS)             # r0 (32 ms with guard) does not fit; r1 does
    assert first.request.id == "r1" and first.not_after_ns == 18 * MS
    q.requeue(first.request)               # back at its place, before r2
    assert q.pick(0, 20 * MS).request.id == "r1"
    assert q.pick(0, 31 * MS).request.id == "r2"
    assert q.pick(0, 31 * MS).reason == "guard"       # r0 fits 31 ms only without its guard
    assert q.pick(0, 29 * MS).reason == "none_fitted"
    assert q.pick(0, 40 * MS).request.id == "r0"
    assert q.pick(0, 40 * MS).reason == "no_request"
    # best fit, unless a request has waited half its deadline
    q.arrive(pending(4, 5.0, arrival_ns=0, deadline_ms=100.0))
    q.arrive(pending(5, 20.0, arrival_ns=0, deadline_ms=100.0))
    assert q.pick(10 * MS, 60 * MS).request.id == "r5"
    q.arrive(pending(5, 20.0, arrival_ns=0, deadline_ms=100.0))
    assert q.pick(50 * MS, 100 * MS).request.id == "r4"     # r4 waited 50 of its 100 ms
    assert q.drain()[0].id == "r5"
    q.arrive(pending(3, 5.0, arrival_ns=0, deadline_ms=100.0))
    assert q.expire(99 * MS) == [] and [r.id for r in q.expire(100 * MS)] == ["r3"]
    assert len(q) == 0


@pytest.mark.unit
def test_config_defaults_and_errors():
    cfg = BubbleTeaConfig.from_dict({"load": {"trace": "code", "rate_multiplier": 20}})
    assert cfg.load.kind == "replay" and cfg.guard_for_ms(100.0) == pytest.approx(7.0)
    assert cfg.arrival_bound and cfg.arrival_margin_ms == 8.0
    assert BubbleTeaConfig.from_dict({"load": {"poisson_per_s": 5}}).load.kind == "poisson"
    for c in (cfg, BubbleTeaConfig.from_dict({"load": {"poisson_per_s": 5}})):
        assert BubbleTeaConfig.from_settings(c.to_dict()) == c
    for bad, field in (({"load": {"trace": "chat"}}, "bubbletea.load.trace"),
                       ({"guard_ms": -1}, "bubbletea.guard_ms"),
                       ({"kv_fraction": 2}, "bubbletea.kv_fraction"),
                       ({"model": {"n_embd": 30, "n_head": 4}}, "bubbletea.model.n_head"),
                       ({"load": {"poisson_per_s": 5, "rate_multiplier": 2}},
                        "bubbletea.load.rate_multiplier"),
                       ({"speed": 1}, "bubbletea.speed"),
                       ({"arrival_bound": 1}, "bubbletea.arrival_bound"),
                       ({"arrival_margin_ms": -1}, "bubbletea.arrival_margin_ms")):
        with pytest.raises(ScenarioError) as err:
            BubbleTeaConfig.from_dict(bad)
        assert err.value.field == field and "\n" not in str(err.value)


def scenario(**extra):
    doc = {"name": "bt", "dcs": [{"name": "a", "hosts": 2, "decode_hosts": 1},
                                 {"name": "b", "hosts": 1, "decode_hosts": 2}],
           "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 10}],
           "systems": ["atlas+bubbletea", "atlas"], "bubbletea": {}}
    doc.update(extra)
    return parse_scenario(doc)


@pytest.mark.unit
def test_decode_hosts_are_hosts_that_never_train():
    sc = scenario()
    assert sc.host_names() == ["a-h1", "a-h2", "b-h1"]
    assert sc.decode_host_names() == ["a-d1", "b-d1", "b-d2"]
    plan = make_plan(sc.emulated())
    d = {h.name: (h.ip, h.role) for h in plan.hosts}
    assert d["a-d1"] == ("10.1.0.101", "decode") and d["b-d2"] == ("10.2.0.102", "decode")
    assert d["a-h2"] == ("10.1.0.2", "train")
    assert "b-s-eth4" in bridge_interfaces(plan)       # gateway + 1 training + 2 decode
    with pytest.raises(ScenarioError) as err:
        scenario(dcs=[{"name": "a", "hosts": 2, "decode_hosts": -1},
                      {"name": "b", "hosts": 1}])
    assert err.value.field == "dcs[0].decode_hosts"
    with pytest.raises(ScenarioError) as err:
        scenario(systems=["bubbletea"])
    assert err.value.field == "systems[0]" and "+bubbletea" in str(err.value)


@pytest.mark.unit
def test_load_split_follows_training_hosts():
    cfg = BubbleTeaConfig.from_dict({"load": {"poisson_per_s": 50, "window_s": 20,
                                              "lengths": "code"}})
    out = make_requests(cfg, "profile", {"us": 4, "eu": 2})
    n_us, n_eu = len(out["per_dc"]["us"]), len(out["per_dc"]["eu"])
    assert out["kept"] == n_us + n_eu and out["refused"] == 0
    assert abs(n_us - 2 * n_eu) <= 2
    assert all(r["target_tokens"] + r["output_tokens"] <= 8192
               for rs in out["per_dc"].values() for r in rs)
    ids = [r["id"] for rs in out["per_dc"].values() for r in rs]
    assert len(set(ids)) == len(ids)


def span(name, host, t0_ms, t1_ms, it=1, stage=0):
    return {"name": name, "host": host, "stage": stage, "replica": 0, "iteration": it,
            "t_start_ns": int(t0_ms * MS), "t_end_ns": int(t1_ms * MS)}


@pytest.mark.unit
def test_metrics_utilization_overlap_wait_and_unused_causes():
    # three iterations of one host: compute 0-10, 50-60 (it 0), 100-110, 150-160 (it 1),
    # 200-210, 250-260 (it 2); iterations 1-2 are measured: window 100 ms .. 300 ms
    spans = []
    for it in range(3):
        spans += [span("F", "h", 100 * it, 100 * it + 10, it),
                  span("B", "h", 100 * it + 50, 100 * it + 60, it)]
    spans.append(span("GPU_WAIT", "h", 148, 150, 1))
    records = [
        # gap 110-150: a prefill 115-148 (dispatch 5 ms, then guard 2 ms at its end)
        {"name": "PREFILL", "host": "h", "t_start_ns": 115 * MS, "t_end_ns": 148 * MS,
         "target_tokens": 1000},
        {"name": "BUBBLE", "host": "h", "t_idle_ns": 110 * MS, "t_pred_end_ns": 150 * MS,
         "end": "guard", "dispatched": ["r1"]},
        # gap 160-200: notice, no request
        {"name": "BUBBLE", "host": "h", "t_idle_ns": 160 * MS, "t_pred_end_ns": 200 * MS,
         "end": "no_request", "dispatched": []},
        # gap 210-250: no notice; gap 260-300 ... the window ends at 300 (last iteration's end
        # is 260, so the window is 100 .. 100 + 100 + 60)
        # an overlapping prefill (must be flagged): 205-212 crosses F at 200-210
        {"name": "PREFILL", "host": "h", "t_start_ns": 205 * MS, "t_end_ns": 212 * MS,
         "target_tokens": 10},
        {"name": "REQUEST", "id": "r1", "outcome": "served", "t_arrival_ns": 100 * MS,
         "t_prefill_start_ns": 115 * MS, "t_first_token_ns": 148 * MS},
        {"name": "REQUEST", "id": "r2", "outcome": "expired", "t_arrival_ns": 100 * MS},
        {"name": "KV_SEND", "t_start_ns": 148 * MS, "t_end_ns": 158 * MS, "bytes": 1},
    ]
    m = bubbletea_metrics(spans, records, time_scale=TimeScale())
    assert m["window_s"] == pytest.approx(0.16)
    assert m["overlap"]["count"] == 1 and m["overlap"]["ms"] == pytest.approx(5.0)
    assert m["gpu_wait"]["count"] == 1 and m["gpu_wait"]["total_ms"] == pytest.approx(2.0)
    assert m["training_only"] == pytest.approx(40 / 160)
    assert m["gpu_utilization"] == pytest.approx((40 + 33 + 7) / 160)
    pf = m["prefill"]
    assert pf["ttft_ms"]["p50"] == pytest.approx(48.0) and pf["deadline_misses"] == 1
    assert pf["kv_transfer_ms"]["p50"] == pytest.approx(10.0)
    share = m["unused_bubble"]["share_by_cause"]
    # unused: dispatch 5, guard 2, no_request 40, not_predicted 38 (212-250)
    total = 5 + 2 + 40 + 38
    assert share["dispatch"] == pytest.approx(5 / total)
    assert share["guard"] == pytest.approx(2 / total)
    assert share["no_request"] == pytest.approx(40 / total)
    assert share["not_predicted"] == pytest.approx(38 / total)


@pytest.mark.unit
def test_a_bubble_that_outlasts_its_prediction_takes_the_next_longer_gap():
    from testbed.host.notices import Bubble
    b = Bubble(t_idle_ns=0, t_pred_end_ns=38 * MS, iteration=3, op=2,
               gaps_ns=[38 * MS, 77 * MS, 96 * MS], t_first_pred_end_ns=38 * MS)
    assert b.extend(39 * MS, 1 * MS) and b.t_pred_end_ns == 77 * MS and b.extended == 1
    assert b.extend(76.5 * MS, 1 * MS) and b.t_pred_end_ns == 96 * MS   # 77 is within margin
    assert not b.extend(97 * MS, 1 * MS) and b.t_pred_end_ns == 96 * MS


@pytest.mark.unit
def test_notices_parse_by_kind_and_refuse_malformed_ones():
    from testbed.host.notices import parse_notice
    b = parse_notice({"kind": "bubble", "host": "h1", "t_idle_ns": 5, "t_pred_end_ns": 9,
                      "iteration": 3, "op": 2, "gaps_ns": [9, 4], "awaits": [1, 3, 0],
                      "pending": True, "wire_ns": 7, "made_ns": 6, "spread_ns": 2})
    assert (b.kind, b.t_idle_ns, b.t_pred_end_ns, b.gaps_ns, b.awaits) == \
        ("bubble", 5, 9, [4, 9], (1, 3, 0))
    assert (b.pending, b.wire_ns, b.made_ns, b.spread_ns, b.end_min_ns) == (True, 7, 6, 2, None)
    old = parse_notice({"kind": "bubble", "host": "h1", "t_idle_ns": 5,
                        "t_pred_end_ns": 9})   # no bound fields
    assert (old.awaits, old.pending, old.wire_ns, old.made_ns) == (None, False, None, None)
    assert parse_notice({"kind": "busy", "host": "h1", "busy_ns": 12}).kind == "busy"
    a = parse_notice({"kind": "arrival", "host": "h1", "t_idle_ns": 5, "end_min_ns": 30,
                      "end_max_ns": 33})
    assert (a.kind, a.t_idle_ns, a.end_min_ns, a.end_max_ns) == ("arrival", 5, 30, 33)
    o = parse_notice({"kind": "output", "host": "h1", "awaits": [2, 3, 1], "end_min_ns": 40})
    assert (o.kind, o.awaits, o.end_min_ns) == ("output", (2, 3, 1), 40)
    # a kind reads only its own fields
    assert parse_notice({"kind": "busy", "host": "h1", "busy_ns": 3, "awaits": "junk"}).kind == \
        "busy"
    for bad in ({}, {"kind": "busy", "host": 3, "busy_ns": 1},
                {"kind": "output", "host": "h1", "end_min_ns": 4},
                {"kind": "arrival", "host": "h1", "end_min_ns": 4},
                {"kind": "output", "host": "h1", "awaits": [1, 2], "end_min_ns": 4},
                {"kind": "output", "host": "h1", "awaits": "123", "end_min_ns": 4},
                {"kind": "bubble", "host": "h1", "t_idle_ns": 1, "t_pred_end_ns": 2,
                 "maker": [1, 2, 3]},
                {"kind": "bubble", "host": "h1", "t_idle_ns": "x", "t_pred_end_ns": 2},
                {"kind": "bubble", "host": "h1", "t_idle_ns": float("inf"), "t_pred_end_ns": 2},
                {"host": "h1", "busy_ns": 1},                        # no kind
                {"kind": "idle", "host": "h1", "busy_ns": 1},        # an unknown kind
                {"kind": ["busy"], "host": "h1", "busy_ns": 1}):
        with pytest.raises((KeyError, TypeError, ValueError, OverflowError)):
            parse_notice(bad)


@pytest.mark.unit
def test_arrival_bound_rolls_while_nothing_is_heard_then_holds():
    from testbed.host.notices import Bubble
    margin = 2 * MS
    b = Bubble(t_idle_ns=0, t_pred_end_ns=30 * MS, iteration=3, op=1, pending=True,
               wire_ns=50 * MS, made_ns=20 * MS, awaits=(2, 3, 1))
    assert b.end_ns(0, margin) == 68 * MS               # made (20) + wire (50) - margin, > 30
    assert b.end_ns(10 * MS, margin) == 78 * MS         # it rolls with now
    b.made = True
    b.raise_end_min(40 * MS)                            # its op began at 20: made at 40
    assert b.end_ns(15 * MS, margin) == 88 * MS         # first byte >= 40, then 50 of wire
    assert b.end_ns(60 * MS, margin) == 108 * MS        # not begun by 60: >= 60 + 50
    b.pending = False
    b.raise_end_min(115 * MS)                           # first byte at 65: in >= 115
    assert b.end_ns(70 * MS, margin) == b.end_ns(90 * MS, margin) == 113 * MS
    assert b.t_bound_end_ns == 113 * MS                 # the latest it gave
    b.raise_end_min(20 * MS)                            # a lower bound never lowers it
    assert b.end_min_ns == 115 * MS
    # a begun message's expected end cuts a longer prediction (never below the bound)
    late = Bubble(t_idle_ns=0, t_pred_end_ns=90 * MS, iteration=3, op=1, end_min_ns=40 * MS,
                  end_max_ns=45 * MS)
    assert late.end_ns(20 * MS, margin) == 45 * MS and late.t_cap_end_ns == 45 * MS
    late.end_max_ns = 30 * MS                           # an estimate under the bound: the bound
    assert late.end_ns(20 * MS, margin) == 38 * MS
    assert Bubble(t_idle_ns=0, t_pred_end_ns=30 * MS, iteration=3, op=1,
                  end_max_ns=45 * MS).end_ns(0, margin) == 30 * MS   # never lengthens
    plain = Bubble(t_idle_ns=0, t_pred_end_ns=30 * MS, iteration=3, op=1)
    assert plain.end_ns(10 * MS, margin) == 30 * MS and plain.t_bound_end_ns == 0
    short = Bubble(t_idle_ns=0, t_pred_end_ns=30 * MS, iteration=3, op=1, pending=True,
                   wire_ns=1 * MS)                      # a wire time under the margin
    assert short.end_ns(40 * MS, margin) == 30 * MS     # says nothing: never past now


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(made_start_ms=st.floats(0, 200), hold_ms=st.floats(0, 60), wait_ms=st.floats(0, 100),
       wire_ms=st.floats(0, 80), slower_ms=st.floats(0, 40), pred_ms=st.floats(1, 300),
       latency_ms=st.floats(0, 2), same_dc=st.booleans(), asks=st.lists(st.floats(0, 1),
                                                                        max_size=20))
def test_arrival_bound_never_passes_the_message(made_start_ms, hold_ms, wait_ms, wire_ms,
                                                slower_ms, pred_ms, latency_ms, same_dc, asks):
    """A message made by an op of `hold` that starts at made_start, sent after it and some wait
    (the WAN slot), whose bytes take at least their wire time (more when slower): with every
    notice heard within the margin, the end admission sees, past the prediction, is never later
    than the last byte."""
    from testbed.host.notices import Bubble
    margin = 2 * MS
    made_end = made_start_ms + hold_ms
    first = made_end + wait_ms
    last = first + wire_ms + slower_ms
    b = Bubble(t_idle_ns=0, t_pred_end_ns=int(pred_ms * MS), iteration=3, op=1, pending=True,
               wire_ns=int(wire_ms * MS), made_ns=int(hold_ms * MS) if same_dc else None)
    heard_made, heard_first = made_start_ms + latency_ms, first + latency_ms
    for now_ms in sorted(x * last for x in asks):
        if same_dc and now_ms >= heard_made and not b.made:
            b.made = True
            b.raise_end_min(int(made_end * MS))
        if now_ms >= heard_first and b.pending:
            b.pending = False
            b.raise_end_min(int((first + wire_ms) * MS))
        end = b.end_ns(int(now_ms * MS), margin)
        if end > b.t_pred_end_ns:
            assert end <= last * MS + 1, (now_ms, end / MS, last)


@pytest.mark.loopback
def test_controller_takes_output_notices_before_or_after_the_bubble(tmp_path):
    from testbed.host.notices import parse_notice
    ctl = make_controller(tmp_path)
    try:
        margin = ctl.arrival_margin_ns
        assert margin == 8 * MS                         # wall clock: not x time_scale
        with ctl.cv:
            # the neighbour began the op making B1 of iteration 3 before a-h1 went idle
            ctl._on_notice(parse_notice({"kind": "output", "host": "a-h1", "awaits": [2, 3, 1],
                                         "end_min_ns": 90 * MS}))
            ctl._on_notice(parse_notice({"kind": "bubble", "host": "a-h1", "t_idle_ns": 10 * MS,
                                         "t_pred_end_ns": 40 * MS, "awaits": [2, 3, 1],
                                         "pending": True, "wire_ns": 1 * MS,
                                         "made_ns": 50 * MS, "spread_ns": 3 * MS}))
            b = ctl.bubbles["a-h1"]
            assert b.made and b.end_min_ns == 90 * MS and ctl.pending_bounds["a-h1"] == {}
            assert b.end_max_ns == 93 * MS       # made at 90: expected in by 90 + 3
            assert ctl.end_of(b, 20 * MS) == 91 * MS - margin     # made at 90, then 1 of wire
            ctl._on_notice(parse_notice({"kind": "arrival", "host": "a-h1", "t_idle_ns": 10 * MS,
                                         "end_min_ns": 95 * MS, "end_max_ns": 97 * MS}))
            assert not b.pending and b.end_max_ns == 97 * MS   # its first byte came
            assert ctl.end_of(b, 93 * MS) == 95 * MS - margin
            # the next bubble: its output notice comes while it is open
            ctl._on_notice(parse_notice({"kind": "bubble", "host": "a-h1", "t_idle_ns": 200 * MS,
                                         "t_pred_end_ns": 230 * MS, "awaits": [2, 3, 2],
                                         "pending": True, "wire_ns": 1 * MS,
                                         "made_ns": 50 * MS}))
            b2 = ctl.bubbles["a-h1"]
            assert b.closed and b2 is not b and not b2.made
            assert ctl.end_of(b2, 210 * MS) == 261 * MS - margin   # not made yet: rolling
            ctl._on_notice(parse_notice({"kind": "output", "host": "a-h1", "awaits": [2, 3, 9],
                                         "end_min_ns": 300 * MS}))  # another message's: kept
            assert b2.end_min_ns is None and (2, 3, 9) in ctl.pending_bounds["a-h1"]
            ctl._on_notice(parse_notice({"kind": "output", "host": "a-h1", "awaits": [2, 3, 2],
                                         "end_min_ns": 250 * MS}))
            assert b2.made and ctl.end_of(b2, 215 * MS) == 251 * MS - margin
            assert b2.end_max_ns is None         # no history of spreads: no estimate
            ctl._on_notice(parse_notice({"kind": "busy", "host": "a-h1", "busy_ns": 252 * MS}))
            assert b2.closed and ctl.bubbles["a-h1"] is None
            # stale output notices (two iterations back) go when a bubble is announced
            ctl._on_notice(parse_notice({"kind": "bubble", "host": "a-h1", "t_idle_ns": 400 * MS,
                                         "t_pred_end_ns": 430 * MS, "iteration": 5}))
            assert (2, 3, 9) not in ctl.pending_bounds["a-h1"]
        off = make_controller(tmp_path, arrival_bound=False)
        try:
            with off.cv:
                off._on_notice(parse_notice({"kind": "bubble", "host": "a-h1", "t_idle_ns": 0,
                                             "t_pred_end_ns": 30 * MS, "pending": True,
                                             "wire_ns": 50 * MS}))
                assert off.end_of(off.bubbles["a-h1"], 0) == 30 * MS   # the prediction only
        finally:
            close_controller(off)
    finally:
        close_controller(ctl)


@pytest.mark.loopback
def test_controller_counts_the_notices_it_never_got(tmp_path):
    ctl = make_controller(tmp_path, hosts=("a-h1", "a-h2"))
    try:
        with ctl.cv:
            for sender, seq in ((("10.0.0.1", 5000), 0), (("10.0.0.1", 5000), 1),
                                (("10.0.0.2", 5000), 0), (("10.0.0.1", 5000), 4),
                                (("10.0.0.1", 5000), 3), (("10.0.0.2", 5000), 1),
                                (("10.0.0.2", 5000), 5)):
                ctl._count_lost(sender, seq)
        # .1: 2 (3 came late), .2: 2, 3, 4 (numbers are per sender, whatever host they name)
        assert ctl.counts["notices_lost"] == 2 + 3
    finally:
        close_controller(ctl)


@pytest.mark.loopback
def test_hostile_notices_are_refused_and_the_agent_lives_on(tmp_path):
    """A running controller (its threads, its UDP socket, a fake prefill server on loopback):
    a bubble notice ending 10^30 ns from now, a notice numbered 10^18, a 5000-digit integer, a
    2000-character host, and a good notice from an address that is no training host of the DC
    are refused and counted; the host's agent still fills the next real bubble."""
    import json
    import socket
    import threading
    import time
    from prefill.controller import Controller, ControllerSpec, Endpoint
    from prefill.wire import recv_msg, send_msg
    with socket.create_server(("127.0.0.1", 0)) as fake:     # a-h1's prefill server
        fake.settimeout(10)
        (tmp_path / "requests.json").write_text(json.dumps(
            [{"id": "r1", "arrival_s": 0.5, "target_tokens": 128, "output_tokens": 4}]))
        spec = ControllerSpec(dc="a", host="a-d1", ip="127.0.0.1", notice_port=0,
                              records_path=str(tmp_path / "ctl.jsonl"),
                              requests_path=str(tmp_path / "requests.json"),
                              prefill_servers=[Endpoint(host="a-h1", ip="127.0.0.1",
                                                        port=fake.getsockname()[1])],
                              decode_servers=[Endpoint(host="a-d1", ip="127.0.0.1", port=9)],
                              bubbletea=BubbleTeaConfig().to_dict(), connect_timeout_s=5.0)
        ctl = Controller(spec)
        addr = ctl._sock.getsockname()
        runner = threading.Thread(target=ctl.run, daemon=True)
        runner.start()
        try:
            conn, _ = fake.accept()
            conn.settimeout(10)
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            stranger.bind(("127.0.0.2", 0))
            now = time.time_ns()
            udp.sendto(json.dumps({"kind": "bubble", "host": "a-h1", "t_idle_ns": now,
                                   "t_pred_end_ns": 10**30, "seq": 7}).encode(), addr)
            time.sleep(0.3)                      # an OverflowError here would kill the agent
            for raw in (json.dumps({"kind": "busy", "host": "a-h1", "busy_ns": now,
                                    "seq": 10**18}).encode(),
                        b'{"kind": "busy", "host": "a-h1", "busy_ns": 1' + b"0" * 5000 + b"}",
                        json.dumps({"kind": "busy", "host": "h" * 2000, "busy_ns": now}).encode()):
                udp.sendto(raw, addr)
            good = {"kind": "bubble", "host": "a-h1", "t_idle_ns": time.time_ns(),
                    "t_pred_end_ns": time.time_ns() + 5 * 10**9, "seq": 0}
            stranger.sendto(json.dumps(good).encode(), addr)
            time.sleep(0.1)
            udp.sendto(json.dumps(good).encode(), addr)
            msg = recv_msg(conn, max_payload_bytes=0, max_pad_bytes=0)
            assert msg.header["type"] == "prefill" and msg.header["id"] == "r1", msg.header
            send_msg(conn, {"ok": False, "id": "r1", "error": "test", "retry": False})
        finally:
            ctl.stop.set()
            runner.join(15)
        assert not runner.is_alive()
    assert ctl.counts["notices_lost"] == 0
    assert ctl.counts["notices_refused"] >= 5 and ctl.counts["notices"] == 1, ctl.counts
    assert not ctl.died
    summary = [json.loads(x) for x in (tmp_path / "ctl.jsonl").read_text().splitlines()][-1]
    assert summary["name"] == "SUMMARY" and summary["threads_died"] == 0


@pytest.mark.loopback
def test_an_agent_whose_idle_connection_was_closed_sends_on_a_new_one(tmp_path):
    """A prefill server closes idle connections at its cap (prefill/service.py):
    the host's agent, finding its connection closed at the next bubble, sends the request on
    a new connection instead of counting the host down."""
    import json
    import socket
    import threading
    import time
    from prefill.controller import Controller, ControllerSpec, Endpoint
    from prefill.wire import recv_msg, send_msg
    with socket.create_server(("127.0.0.1", 0)) as fake:     # a-h1's prefill server
        fake.settimeout(10)
        (tmp_path / "requests.json").write_text(json.dumps(
            [{"id": "r1", "arrival_s": 0.2, "target_tokens": 128, "output_tokens": 4}]))
        spec = ControllerSpec(dc="a", host="a-d1", ip="127.0.0.1", notice_port=0,
                              records_path=str(tmp_path / "ctl.jsonl"),
                              requests_path=str(tmp_path / "requests.json"),
                              prefill_servers=[Endpoint(host="a-h1", ip="127.0.0.1",
                                                        port=fake.getsockname()[1])],
                              decode_servers=[Endpoint(host="a-d1", ip="127.0.0.1", port=9)],
                              bubbletea=BubbleTeaConfig().to_dict(), connect_timeout_s=5.0)
        ctl = Controller(spec)
        addr = ctl._sock.getsockname()
        runner = threading.Thread(target=ctl.run, daemon=True)
        runner.start()
        try:
            first, _ = fake.accept()
            first.close()                        # the server makes room: the idle one goes
            time.sleep(0.5)
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            good = {"kind": "bubble", "host": "a-h1", "t_idle_ns": time.time_ns(),
                    "t_pred_end_ns": time.time_ns() + 5 * 10**9, "seq": 0}
            udp.sendto(json.dumps(good).encode(), addr)
            conn, _ = fake.accept()
            conn.settimeout(10)
            msg = recv_msg(conn, max_payload_bytes=0, max_pad_bytes=0)
            assert msg.header["type"] == "prefill" and msg.header["id"] == "r1", msg.header
            send_msg(conn, {"ok": False, "id": "r1", "error": "test", "retry": False})
        finally:
            ctl.stop.set()
            runner.join(15)
        assert not runner.is_alive()
    records = [json.loads(x) for x in (tmp_path / "ctl.jsonl").read_text().splitlines()]
    assert not [r for r in records if r["name"] == "HOST_DOWN"], records


@pytest.mark.loopback
def test_a_controller_thread_that_dies_marks_its_host_down(tmp_path):
    ctl = make_controller(tmp_path)
    try:
        def boom(server):
            raise OverflowError("timeout value is too large")
        ctl.host_agent = boom
        t = ctl._guarded("agent-a-h1", ctl.host_agent, ctl.spec.prefill_servers[0])
        t.start()
        t.join(5)
        assert ctl.dead_hosts == {"a-h1"} and "OverflowError" in ctl.died[0]
        from testbed.host.notices import parse_notice
        with ctl.cv:
            ctl._on_notice(parse_notice({"kind": "bubble", "host": "a-h1", "t_idle_ns": 0,
                                         "t_pred_end_ns": MS}))
        assert ctl.bubbles["a-h1"].reason == "host_down"
    finally:
        close_controller(ctl)
    import json
    records = [json.loads(x) for x in open(ctl.spec.records_path)]
    assert any(r["name"] == "THREAD_DIED" and r["host"] == "a-h1" for r in records)


def make_controller(tmp_path, hosts=("a-h1",), **settings):
    """A real Controller (its UDP socket bound on loopback) whose threads are not started: the
    tests feed it notices by hand."""
    import json as _json
    from prefill.controller import Controller, ControllerSpec, Endpoint
    (tmp_path / "requests.json").write_text(_json.dumps([]))
    spec = ControllerSpec(dc="a", host="a-d1", ip="127.0.0.1", notice_port=0,
                          records_path=str(tmp_path / f"records-{len(settings)}.jsonl"),
                          requests_path=str(tmp_path / "requests.json"),
                          prefill_servers=[Endpoint(host=h, ip="127.0.0.1", port=9)
                                           for h in hosts],
                          decode_servers=[Endpoint(host="a-d1", ip="127.0.0.1", port=9)],
                          bubbletea=BubbleTeaConfig(**settings).to_dict(), time_scale=4.0)
    return Controller(spec)


def close_controller(ctl) -> None:
    ctl._sock.close()
    ctl.log.close()


@pytest.mark.loopback
def test_bounds_chain_through_the_maker_in_its_bubble_but_predictions_do_not(tmp_path):
    from testbed.host.notices import parse_notice
    ctl = make_controller(tmp_path, hosts=("a-h1", "a-h2"))
    m = ctl.arrival_margin_ns
    try:
        with ctl.cv:
            # a-h1 waits for B1 of iteration 3, made by a-h2's op 4 (hold 50), 1 ms of wire
            ctl._on_notice(parse_notice({"kind": "bubble", "host": "a-h1", "t_idle_ns": 0,
                                         "t_pred_end_ns": 30 * MS, "awaits": [2, 3, 1],
                                         "pending": True, "wire_ns": MS, "made_ns": 50 * MS,
                                         "maker": ["a-h2", 3, 4]}))
            b1 = ctl.bubbles["a-h1"]
            assert b1.maker == ("a-h2", 3, 4)
            assert ctl.end_of(b1, 10 * MS) == 61 * MS - m        # a-h2 not idle: from now
            # a-h2 sits in the bubble before op 4 of iteration 3, waiting for a WAN message
            # of 60 ms of wire; its prediction (200) is not a bound and is not chained
            ctl._on_notice(parse_notice({"kind": "bubble", "host": "a-h2", "t_idle_ns": 5 * MS,
                                         "t_pred_end_ns": 200 * MS, "iteration": 3, "op": 4,
                                         "awaits": [2, 3, 1], "pending": True,
                                         "wire_ns": 60 * MS}))
            # a-h2 starts op 4 no sooner than 10 + 60 - m; then 50 of hold and 1 of wire
            assert ctl.end_of(b1, 10 * MS) == 10 * MS + 60 * MS - m + 51 * MS - m
            # another op's bubble of a-h2 says nothing about this one
            ctl.bubbles["a-h2"].op = 2
            assert ctl.end_of(b1, 10 * MS) == 61 * MS - m
            ctl.bubbles["a-h2"].op = 4
            # a-h2's message arrives (first byte at 40: in at 100): a-h2 starts >= 100 - m
            ctl._on_notice(parse_notice({"kind": "arrival", "host": "a-h2", "t_idle_ns": 5 * MS,
                                         "end_min_ns": 100 * MS}))
            assert ctl.end_of(b1, 50 * MS) == 100 * MS - m + 51 * MS - m
            # a-h2 starts op 4 at 101: its output notice; no more chaining
            ctl._on_notice(parse_notice({"kind": "busy", "host": "a-h2", "busy_ns": 101 * MS}))
            ctl._on_notice(parse_notice({"kind": "output", "host": "a-h1", "awaits": [2, 3, 1],
                                         "end_min_ns": 151 * MS}))
            assert ctl.end_of(b1, 110 * MS) == 152 * MS - m
    finally:
        close_controller(ctl)


@pytest.mark.unit
def test_timeline_marks_an_overlap(tmp_path):
    from testbed.analysis.timeline_plot import plot_timeline
    spans = [dict(span("F", f"h{st}", 100 * it + 10 * st, 100 * it + 10 * st + 20, it, st),
                  microbatch=0) for it in range(2) for st in range(2)]
    prefill = [{"name": "PREFILL", "host": "h0", "t_start_ns": 115 * MS, "t_end_ns": 125 * MS}]
    out = plot_timeline(spans, tmp_path / "t.png", iteration=1, extra_spans=prefill)
    assert out.stat().st_size > 10_000


@pytest.mark.unit
def test_run_refuses_bubbletea_without_decode_hosts_or_section(tmp_path):
    import yaml
    from testbed.features.checks import load_run
    training = {"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16,
                          "vocab_size": 64}, "stages": 2, "micro_batches": 2}
    doc = {"name": "bt", "dcs": [{"name": "a", "hosts": 1, "decode_hosts": 1},
                                 {"name": "b", "hosts": 1}],
           "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 10}],
           "systems": ["baseline+bubbletea"], "bubbletea": {}, "training": training}
    path = tmp_path / "bt.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ScenarioError) as err:
        load_run(str(path))
    assert err.value.field == "dcs[1].decode_hosts" and "'b'" in str(err.value)
    del doc["bubbletea"]
    doc["dcs"][1]["decode_hosts"] = 1
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ScenarioError) as err:
        load_run(str(path))
    assert err.value.field == "bubbletea"
    doc["bubbletea"] = {}
    path.write_text(yaml.safe_dump(doc))
    assert load_run(str(path))[2] == ["baseline+bubbletea"]
