"""The model's TCP: a channel's connections across messages (testbed.rules.tcpchannel), random
loss (testbed.rules.tcploss), the steady state that keeps `predict`'s cost flat in iterations
(testbed.predict.steady), and the settings `predict` names as not modelled. Pure."""

from __future__ import annotations

import io
import math
import random
import time
from pathlib import Path

import pytest

from testbed.cli.planview import load_training
from testbed.cli.ticker import Ticker
from testbed.predict import steady
from testbed.predict.predict import predict
from testbed.predict.transfer import PathSpec, transfer_ms
from testbed.predict.unmodelled import unmodelled
from testbed.rules.tcpchannel import Channel, ChannelSpec
from testbed.rules.tcploss import bulk_goodput_mbit, recovery_ms, window_under_loss
from testbed.spec.scenario import TCP_MSS_BYTES, load_scenario, parse_scenario
from testbed.spec.systems import get_system

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parent.parent


def spec(**kw) -> ChannelSpec:
    base = dict(rate_mbit=100, one_way_ms=100, rtt_ms=200, window_bytes=45_900, connections=4)
    return ChannelSpec(**{**base, **kw})


# -- a channel's connections across messages ---------------------------------------------------

def test_a_fresh_channel_is_the_one_message_round_model():
    """Warm, or restarting slow start: a channel's first message takes transfer_ms's time."""
    rng = random.Random(1)
    for _ in range(300):
        rate, ow = rng.choice([10, 100, 1000]), rng.choice([1, 20, 100])
        w, k = rng.choice([12_288, 45_900, 200_000]), rng.choice([1, 4, 16])
        payload, slow = rng.choice([5_000, 168_000, 3_000_000]), rng.random() < 0.5
        path = PathSpec(rate_mbit=rate, one_way_ms=ow, rtt_ms=2 * ow, window_bytes=w,
                        connections=k)
        got = Channel(spec(rate_mbit=rate, one_way_ms=ow, rtt_ms=2 * ow, window_bytes=w,
                           connections=k), warm=not slow).send(0.0, payload)
        assert got == pytest.approx(transfer_ms(payload, path, slow_start=slow), rel=1e-12)


def test_a_message_waits_for_the_windows_its_predecessor_holds():
    """K = 4 windows of 45.9 kB carry one 168 kB message in one round; a second sent 10 ms
    later finds them full and leaves a round trip after the first (the old model gave both
    their own windows)."""
    ch = Channel(spec())
    first = ch.send(0.0, 168_000)
    second = ch.send(10.0, 168_000)
    assert first == pytest.approx(100 + 168_000 * 1514 / 1448 * 8 / 1e5)
    assert 10.0 + second == pytest.approx(200.0 + first, rel=1e-9)
    # sent after the first's acknowledgements, the windows are free again
    assert Channel(spec()).send(0.0, 168_000) == pytest.approx(ch.send(1000.0, 168_000))


def test_a_state_seen_before_sends_as_it_did_then():
    """Channel.memo: a message sent with nothing in flight, in a state the channel has seen,
    takes the time it took then and leaves the same state: against a channel that remembers
    nothing, over random sends, restarts and loss."""
    rng = random.Random(7)
    for _ in range(40):
        s = spec(connections=rng.choice([1, 4, 40]), loss=rng.choice([0.0, 0.005]),
                 slow_start_after_idle=rng.random() < 0.5, rto_ms=400)
        remembers, forgets = Channel(s), Channel(s)
        now = 0.0
        for _ in range(12):
            now += rng.choice([0.0, 50.0, 250.0, 900.0, 3000.0])
            payload = rng.choice([20_000, 168_000, 2_000_000])
            forgets.memo.clear()
            assert remembers.send(now, payload) == pytest.approx(forgets.send(now, payload),
                                                                 rel=1e-9)
        assert [c.cwnd for c in remembers.conns] == pytest.approx(
            [c.cwnd for c in forgets.conns], rel=1e-9)


def test_a_copied_connection_has_every_field_and_its_own_chunks():
    """_Connection.copy and Channel.copy set their fields one by one (no __init__): every
    field, none shared but the numbers (and the channel's memo)."""
    from dataclasses import fields
    from testbed.rules.tcpchannel import _Connection
    ch = Channel(spec(loss=0.01), loss_events=True)
    for now in (0.0, 5.0, 700.0):
        ch.send(now, 2_000_000)
    for c in ch.conns:
        twin = c.copy()
        for f in fields(_Connection):
            assert getattr(twin, f.name) == getattr(c, f.name), f.name
        assert twin.chunks is not c.chunks
    twin = ch.copy()        # the channel: every attribute, its own connections
    assert vars(twin).keys() == vars(ch).keys()
    assert all(twin.conns[i] is not c for i, c in enumerate(ch.conns))


def two_dcs(*, hosts: int, delay_ms: float, rate_mbit: float, systems: list[str],
            replicas: int, micro_batches: int, micro_batch: int, schedule: str, n_layer: int,
            iterations: int = 3, **extra) -> dict:
    """A predict-only scenario: 2 stages over 2 DCs of `hosts` hosts (1 Gbit/s host links)
    joined by one WAN link, K = 4, the H200 profile at width 2048."""
    return {"name": "two_dcs", "scale": 100, "predict_only": True, "connections": 4, **extra,
            "dcs": [{"name": n, "hosts": hosts, "rate_mbit": 1000} for n in ("a", "b")],
            "wan": [{"between": ["a", "b"], "delay_ms": delay_ms, "rate_mbit": rate_mbit}],
            "systems": systems,
            "training": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16,
                                   "vocab_size": 64},
                         "stages": 2, "replicas": replicas, "micro_batches": micro_batches,
                         "micro_batch_size": micro_batch, "schedule": schedule,
                         "iterations": iterations, "compute": "profile",
                         "profile": {"file": "h200-transformer.json", "width": 2048,
                                     "seq": 2048, "micro_batch": micro_batch,
                                     "n_layer": n_layer}}}


def test_under_temporal_slots_a_lone_pipeline_keeps_its_windows_warm():
    """One pipeline on 100 ms (D = 1): Atlas's slots never make a message wait for another
    pipeline, so Atlas takes multitcp's time (the channel timed from the slot, which starts at
    the send); timed as a fresh channel per message (slow start after every idle gap past the
    RTO) it was 55% slower than the emulation (docs/model_grid.md, D1_d100: 1.378 s against
    0.894 s measured; now 0.890 s)."""
    doc = two_dcs(hosts=1, delay_ms=100, rate_mbit=100, systems=["multitcp", "atlas"],
                  replicas=1, micro_batches=4, micro_batch=2, schedule="1f1b", n_layer=24,
                  iterations=4)
    sc = parse_scenario(doc, "two_dcs.yaml")
    cfg = load_training(sc)
    atlas = predict(sc, cfg, get_system("atlas")).iteration_time_s
    multitcp = predict(sc, cfg, get_system("multitcp")).iteration_time_s
    assert atlas == pytest.approx(multitcp, rel=0.01)


def test_a_fold_whose_trains_wait_for_their_own_acknowledgements_is_not_used(monkeypatch):
    """57 GPipe pipelines over one 80 ms, 50 Mbit/s link under Atlas's slots: a pipeline's
    backward messages queue behind each other and wait in their slots for their own
    acknowledgements, where depends on each one's place in the queue, which a folded train
    does not know (in 4 parts it was 8.2% slow, in 8, 16, 32 parts 3.3%, 1.1%, 0.0%): the fold
    is refined until two in turn agree within 0.5%, here every replica simulated."""
    import testbed.predict.predict as mp
    doc = two_dcs(hosts=59, delay_ms=80, rate_mbit=50, systems=["atlas"], replicas=57,
                  micro_batches=8, micro_batch=1, schedule="gpipe", n_layer=32,
                  tcp_slow_start_after_idle=False)
    sc = parse_scenario(doc, "two_dcs.yaml")
    cfg = load_training(sc)
    got = predict(sc, cfg, get_system("atlas"))
    assert got.simulated_replicas == 57
    monkeypatch.setattr(mp, "FOLD_ABOVE_REPLICAS", 10**9)
    assert got.iteration_time_s == predict(sc, cfg, get_system("atlas")).iteration_time_s


def test_idle_halves_the_window_once_per_rto_never_below_the_initial():
    """tcp_cwnd_restart: a channel's first message restarts from the initial window (never
    sent: idle since ever, as the model always had it); warmed up (twice the receive window),
    idle 1.5 RTOs halves it once, still the receive window; 3.5 RTOs three times, to the
    initial window: a 42 kB stripe needs two rounds; slow start after idle off: no change."""
    rto = 200 + 200.0
    path = PathSpec(rate_mbit=100, one_way_ms=100, rtt_ms=200, window_bytes=45_900,
                    connections=4)
    slow = transfer_ms(168_000, path, slow_start=True)
    warm = transfer_ms(168_000, path)

    def warmed() -> Channel:
        ch = Channel(spec(rto_ms=rto))
        assert ch.send(0.0, 168_000) == pytest.approx(slow)
        t = 1000.0
        while ch.send(t, 168_000) > warm + 1e-6:     # slow start grows the window back
            t += 250.0
        return ch, t

    ch, t = warmed()
    assert ch.send(t + 1.5 * rto, 168_000) == pytest.approx(warm)
    ch, t = warmed()
    assert ch.send(t + 3.5 * rto, 168_000) > warm + 150
    ch, t = warmed()
    assert ch.send(t + 100 * rto, 168_000) == pytest.approx(slow)
    off = Channel(spec(rto_ms=rto, slow_start_after_idle=False))
    off.send(0.0, 168_000)
    assert off.send(100 * rto, 168_000) == pytest.approx(warm)


# -- a queue's drops ---------------------------------------------------------------------------

@pytest.mark.parametrize("cc, beta", [("reno", 0.5), ("cubic", 0.7)])
def test_a_queue_drop_cuts_the_windows_it_falls_on_once_per_window(cc, beta):
    """Two packets lost from the tail of a K = 4 burst fall on two connections (the last two):
    their windows become beta times what they were, the others keep theirs; a second drop
    before the first one's round trip is over is the same loss event and changes nothing."""
    ch = Channel(spec(congestion_control=cc, slow_start_after_idle=False))
    ch.send(0.0, 168_000)
    assert ch.first_round_bytes == pytest.approx(168_000)    # the whole message in one round
    before = [c.cwnd for c in ch.conns]
    ch.congest(0.0, 2 * TCP_MSS_BYTES)
    after = [c.cwnd for c in ch.conns]
    assert after[:2] == before[:2]
    assert after[2:] == pytest.approx([beta * min(w, 45_900) for w in before[2:]])
    ch.congest(50.0, 4 * TCP_MSS_BYTES)                      # within the same round trip
    assert [c.cwnd for c in ch.conns][2:] == after[2:]
    assert ch.conns[0].cwnd == pytest.approx(beta * min(before[0], 45_900))   # now all four


def test_after_a_queue_drop_the_next_message_takes_another_round():
    """Windows cut by a drop carry the next message in two round trips where the uncut ones
    carried it in one; its first round (what enters the queue at once) is smaller."""
    cut, whole = (Channel(spec(slow_start_after_idle=False)) for _ in range(2))
    for ch in (cut, whole):
        ch.send(0.0, 168_000)
    cut.congest(0.0, 4 * TCP_MSS_BYTES)
    assert cut.send(1000.0, 168_000) == pytest.approx(whole.send(1000.0, 168_000) + 200.0,
                                                      rel=0.05)
    assert cut.first_round_bytes == pytest.approx(4 * 0.7 * 45_900, rel=0.01)   # CUBIC beta
    assert whole.first_round_bytes == pytest.approx(168_000)


# -- random loss -------------------------------------------------------------------------------

def lossy(**kw) -> Channel:
    """A one-connection channel with loss events, WAN-tuned, window 64 segments."""
    base = dict(connections=1, loss=0.001, window_bytes=64 * TCP_MSS_BYTES,
                slow_start_after_idle=False)
    return Channel(spec(**{**base, **kw}), loss_events=True)


@pytest.mark.parametrize("cc, beta", [("reno", 0.5), ("cubic", 0.7)])
def test_a_loss_event_cuts_the_window_by_beta(cc, beta):
    """The packet that makes a connection's expected losses reach one is lost: its window
    (at most the receive window) times beta becomes ssthresh and the window."""
    ch = lossy(congestion_control=cc)
    c = ch.conns[0]
    c.debt = 0.999                          # the next packet is lost
    ch.send(0.0, 10 * TCP_MSS_BYTES)
    assert c.ssthresh == pytest.approx(beta * 64 * TCP_MSS_BYTES)
    assert c.cwnd == pytest.approx(c.ssthresh)
    assert c.debt < 0.02


def test_after_a_loss_reno_grows_one_segment_a_round_trip():
    """Congestion avoidance, not slow start: back from 32 segments, a 320-segment message
    takes 9 round trips (32 + 33 + ... + 40), where slow start would double the window each
    round trip and the window before the loss (64) would take 5."""
    ch = lossy(congestion_control="reno")
    c = ch.conns[0]
    c.debt = 0.999
    ch.send(0.0, 10 * TCP_MSS_BYTES)
    solo = ch.send(10_000.0, 320 * TCP_MSS_BYTES)
    rounds = (solo - ch.spec.one_way_ms) / ch.spec.rtt_ms
    assert 8 < rounds < 9.5
    assert 39 * TCP_MSS_BYTES < c.cwnd < 42 * TCP_MSS_BYTES
    fresh = lossy(congestion_control="reno", loss=0.0)
    fresh.send(0.0, 10 * TCP_MSS_BYTES)
    assert fresh.send(10_000.0, 320 * TCP_MSS_BYTES) < ch.spec.rtt_ms * 5.5


def test_loss_events_reach_the_loss_responses_window_on_a_long_transfer():
    """Bulk over many round trips: the connection's average window under periodic losses is
    Reno's deterministic sqrt(3/(2p)) segments within 15% (the loss events' mean-field is the
    response function the average model used)."""
    p = 0.002
    ch = Channel(spec(connections=1, loss=p, congestion_control="reno", rate_mbit=100_000,
                      window_bytes=10_000 * TCP_MSS_BYTES, slow_start_after_idle=False),
                 warm=False, loss_events=True)
    payload = 100_000 * TCP_MSS_BYTES
    solo = ch.send(0.0, payload)
    mean_window = payload / ((solo - ch.spec.one_way_ms) / ch.spec.rtt_ms)
    assert mean_window / TCP_MSS_BYTES == pytest.approx(math.sqrt(1.5 / p), rel=0.15)


@pytest.mark.parametrize("cc,loss", [("cubic", 0.001), ("reno", 0.01)])
def test_loss_events_of_grouped_connections_are_each_connections_own(monkeypatch, cc, loss):
    """Past GROUPS connections a group of alike connections has one state: each of them loses
    on its own packet count, so 64 connections in 16 groups carry what 64 simulated one by one
    do (within 2%; counting a group's packets as one connection's cut the windows 4 times as
    often: 28-44% less)."""
    import testbed.rules.tcpchannel as tcpchannel

    def goodput_mbit(groups: int) -> float:
        monkeypatch.setattr(tcpchannel, "GROUPS", groups)
        spec = ChannelSpec(rate_mbit=10_000, one_way_ms=20, rtt_ms=40, window_bytes=4_592_762,
                           connections=64, loss=loss, congestion_control=cc,
                           slow_start_after_idle=False)
        ch = Channel(spec, loss_events=True)
        t, sent = 0.0, 0
        while t < 5_000:
            t += ch.send(t, 64 << 20)
            sent += 64 << 20
        return sent * 8 / t / 1e3

    grouped, each = goodput_mbit(16), goodput_mbit(64)
    assert grouped == pytest.approx(each, rel=0.02), (grouped, each)


def test_loss_response_functions():
    """Reno: sqrt(3 / (2 p)) segments (less a little for timeouts); CUBIC at least that, and
    its cubic term where RTT / p is large; inf without loss; bbr refused."""
    for p in (1e-4, 1e-3, 1e-2):
        reno = window_under_loss("reno", 40, p) / TCP_MSS_BYTES
        assert 0.8 * math.sqrt(1.5 / p) < reno <= math.sqrt(1.5 / p)
        assert window_under_loss("cubic", 40, p) >= window_under_loss("reno", 40, p)
    assert window_under_loss("cubic", 160, 1e-4) > 2 * window_under_loss("reno", 160, 1e-4)
    assert window_under_loss("reno", 40, 0.0) == math.inf
    with pytest.raises(ValueError, match="bbr"):
        window_under_loss("bbr", 40, 0.01)


def test_recovery_cost_counts_tail_losses_as_timeouts():
    """One stripe of one packet: lost with p, resent after RTT + 200 ms; many packets: almost
    surely one lost, mostly not the tail, so about 1.25 RTT."""
    assert recovery_ms(0.01, 50, 1, 1) == pytest.approx(0.01 * 250)
    assert recovery_ms(0.01, 50, 1, 5000) == pytest.approx(0.99 * 62.5 + 0.01 * 250, rel=1e-3)
    assert recovery_ms(0.0, 50, 4, 100) == 0.0


def test_bulk_goodput_is_the_link_or_the_flows_loss_response():
    many = bulk_goodput_mbit(1024, 10_000, 40, 1e-4, 4.59e6, "cubic")
    assert many == pytest.approx(10_000 * 1448 / 1514 * (1 - 1e-4))
    few = bulk_goodput_mbit(16, 10_000, 40, 1e-2, 4.59e6, "reno")
    assert few == pytest.approx(16 * window_under_loss("reno", 40, 1e-2) * 8 / 40 / 1e3)


# -- steady state ------------------------------------------------------------------------------

def test_steady_state_gives_every_iteration_simulated_figures(monkeypatch):
    """300 iterations from a 16-iteration probe: the same figures as all 300 simulated."""
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    cfg = load_training(sc)
    for name in ("baseline", "atlas"):
        fast = predict(sc, cfg, get_system(name), iterations=300)
        assert fast.simulated_iterations < 300 and fast.steady
        monkeypatch.setattr(steady, "SIMULATE_ALL_UP_TO", 10**9)
        full = predict(sc, cfg, get_system(name), iterations=300)
        monkeypatch.undo()
        assert full.simulated_iterations == 300 and full.steady is None
        assert fast.iteration_time_s == pytest.approx(full.iteration_time_s, rel=1e-6)
        assert fast.bubble_fraction == pytest.approx(full.bubble_fraction, rel=1e-6)
        for link, u in full.wan_utilization.items():
            assert fast.wan_utilization[link] == pytest.approx(u, rel=1e-6)


def test_predict_takes_the_same_time_at_8_and_100000_iterations():
    sc = load_scenario(REPO / "topologies" / "two_dc.yaml")
    cfg = load_training(sc)
    t0 = time.perf_counter()
    few = predict(sc, cfg, get_system("baseline"), iterations=8)
    t1 = time.perf_counter()
    many = predict(sc, cfg, get_system("baseline"), iterations=100_000)
    t2 = time.perf_counter()
    assert many.iterations == 100_000 and many.simulated_iterations <= 64
    assert many.iteration_time_s == pytest.approx(few.iteration_time_s, rel=0.01)
    assert t2 - t1 < 20 * max(t1 - t0, 0.05)     # not 10,000 times longer


def test_weights_stand_the_period_for_the_missing_iterations():
    w = steady._weights(16, 100, 2)
    assert sum(w.values()) - len(w) == 100 - 16
    assert set(w) == {13, 14}


# -- what `predict` says it leaves out ---------------------------------------------------------

def test_unmodelled_settings_are_named():
    doc = {"name": "x", "dcs": [{"name": "a", "hosts": 1}, {"name": "b", "hosts": 1}],
           "wan": [{"between": ["a", "b"], "delay_ms": 20, "rate_mbit": 100, "jitter_ms": 2,
                    "loss_pct": 1, "queue": 200}], "congestion_control": "bbr"}
    lines = unmodelled(parse_scenario(doc, "x.yaml"))
    assert any(line.startswith("jitter_ms (a<->b 2 ms)") for line in lines)
    assert any(line.startswith("queue (a<->b)") for line in lines)
    assert any("bbr" in line for line in lines)
    plain = dict(doc, congestion_control="cubic", wan=[{"between": ["a", "b"], "delay_ms": 20,
                                                        "rate_mbit": 100, "loss_pct": 1}])
    assert unmodelled(parse_scenario(plain, "x.yaml")) == []       # loss is modelled


def test_ticker_is_quiet_at_first_then_says_what_runs():
    out = io.StringIO()
    t = Ticker("predict x", stream=out, after_s=0.0)
    t("baseline (1 of 2 systems)")
    t("atlas (2 of 2 systems)")       # within EVERY_S of the first: not repeated off a terminal
    t.done()
    assert out.getvalue().startswith("predict x: baseline (1 of 2 systems) (")
    assert out.getvalue().count("\n") == 1
    quiet = io.StringIO()
    Ticker("predict x", stream=quiet)("baseline")
    assert quiet.getvalue() == ""
