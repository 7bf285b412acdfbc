"""The model (model/): closed forms, hand-solvable cases, monotonicity, every shipped scenario,
and a committed emulated run. Pure: no root, no network."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from testbed.rules.pipeline import PipelineModel, Route, simulate
from testbed.predict.predict import predict
from testbed.predict.transfer import INITIAL_WINDOW_SEGMENTS, PathSpec, rounds_needed, transfer_ms
from testbed.cli.planview import load_training
from testbed.spec.scenario import TCP_MSS_BYTES, load_scenario
from testbed.features.temporal.plan import WIRE_BYTES_PER_PAYLOAD_BYTE as WF
from testbed.spec.systems import SYSTEMS, get_system
from testbed.rules.schedule import bubble_fraction, schedule_table
from testbed.spec.links import LinkDir

REPO = Path(__file__).resolve().parent.parent


# -- one transfer ----------------------------------------------------------------------------

@pytest.mark.unit
def test_transfer_window_limited_rounds():
    """336 KB, window 45 KB, 100 ms one way: 8 rounds on one connection, 2 on four."""
    w = 45_000.0
    path = PathSpec(rate_mbit=100, one_way_ms=100, rtt_ms=200, window_bytes=w, connections=1)
    last = 336_000 - 7 * w
    assert transfer_ms(336_000, path) == pytest.approx(100 + 7 * 200 + last * WF * 8 / 1e5)
    # four: round 2 of the last connection leaves one RTT after its window, which queued
    # behind the other three windows
    four = dataclasses.replace(path, connections=4)
    assert transfer_ms(336_000, four) == pytest.approx(
        100 + 3 * w * WF * 8 / 1e5 + 200 + (336_000 / 4 - w) * WF * 8 / 1e5)


@pytest.mark.unit
def test_transfer_between_window_and_rate_limits():
    """K windows a little over the bandwidth-delay product (3 x 45.9 kB against 125 kB at 5 ms
    one way, 100 Mbit/s): the rate would say 19.0 ms; the third connection's second round waits
    for its own ACKs, one RTT after its window left behind the other two (measured on the
    testbed: 22.5 ms)."""
    w = 45_927.0
    path = PathSpec(rate_mbit=100, one_way_ms=5, rtt_ms=10, window_bytes=w, connections=3)
    stripe = 167_772 / 3
    by_hand = 5 + 2 * w * WF * 8 / 1e5 + 10 + (stripe - w) * WF * 8 / 1e5
    assert transfer_ms(167_772, path) == pytest.approx(by_hand)
    assert by_hand > 5 + 167_772 * WF * 8 / 1e5 + 4          # 4.5 ms over the rate's time
    six = dataclasses.replace(path, connections=6)            # one round: the rate
    assert transfer_ms(167_772, six) == pytest.approx(5 + 167_772 * WF * 8 / 1e5)


@pytest.mark.unit
def test_transfer_rate_bound_and_slow_start():
    fat = PathSpec(rate_mbit=10, one_way_ms=5, rtt_ms=10, window_bytes=1e9, connections=1)
    assert transfer_ms(1_000_000, fat) == pytest.approx(5 + 1e6 * WF * 8 / 1e4)
    # slow start: 10, 20, 40 segments, then the window: rounds by hand
    iw = INITIAL_WINDOW_SEGMENTS * TCP_MSS_BYTES
    assert rounds_needed(iw, 1e9, True) == (1, iw)
    assert rounds_needed(iw + 1, 1e9, True) == (2, 1)
    assert rounds_needed(7 * iw, 1e9, True) == (3, 4 * iw)
    assert rounds_needed(7 * iw, 2 * iw, True) == (4, 2 * iw)     # 1 + 2 + 2 + 2 windows
    slim = PathSpec(rate_mbit=1000, one_way_ms=50, rtt_ms=100, window_bytes=2 * iw)
    assert transfer_ms(7 * iw, slim, slow_start=True) == pytest.approx(
        50 + 3 * 100 + 2 * iw * WF * 8 / 1e6)
    assert transfer_ms(7 * iw, slim, slow_start=True) > transfer_ms(7 * iw, slim)


# -- the pipeline -----------------------------------------------------------------------------
AB = LinkDir("a", "b")      # a link id the model keeps (predict turns it into "a->b")


def _local(P: int, M: int, f: float, b: float, schedule: str = "gpipe", D: int = 1,
           routes: dict | None = None, sharing: str = "concurrent",
           rates: dict | None = None) -> PipelineModel:
    inside = Route(links=(), solo_ms=0.0)
    fwd = {(s, r): (routes or {}).get((s, r), inside) for s in range(P - 1) for r in range(D)}
    return PipelineModel(table=schedule_table(schedule, P, M), replicas=D,
                         forward_ms=[f] * P, backward_ms=[b] * P, opt_ms=[0.0] * P,
                         allreduce_ms=[0.0] * P, forward_routes=fwd,
                         backward_routes={k: inside for k in fwd}, link_rate_mbit=rates or {},
                         sharing=sharing)


@pytest.mark.unit
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P,M", [(2, 4), (3, 8), (4, 4)])
def test_no_wan_gives_the_textbook_bubble(schedule, P, M):
    ops = simulate(_local(P, M, 10.0, 20.0, schedule), 1).ops
    window = max(o.end_ms for o in ops) - min(o.start_ms for o in ops)
    assert window == pytest.approx((M + P - 1) * 30.0)
    for s in range(P):
        busy = sum(o.end_ms - o.start_ms for o in ops if o.stage == s)
        assert 1 - busy / window == pytest.approx(bubble_fraction(P, M))


def _arrivals(sharing: str) -> list[float]:
    """Two pipelines' first activations, ready at once on one 100 Mbit/s link, 10 ms one way,
    each 125 kB of wire bytes (10 ms alone at the link's rate)."""
    wire = 125_000.0
    route = Route(links=(AB,), solo_ms=10.0 + 10.0, one_way_ms=10.0, wire_bytes=wire)
    m = _local(2, 1, 5.0, 5.0, D=2, routes={(0, 0): route, (0, 1): route},
               sharing=sharing, rates={AB: 100.0})
    ops = simulate(m, 1).ops
    return sorted(o.start_ms for o in ops if o.stage == 1 and o.name == "F")


@pytest.mark.unit
def test_one_link_fair_versus_temporal_by_hand():
    # fair: both at 50 Mbit/s, data through at 5 + 20, arriving at 35
    assert _arrivals("concurrent") == pytest.approx([35.0, 35.0])
    # temporal: one after the other at the full rate: 5 + 10 + 10, then 10 later
    assert _arrivals("temporal") == pytest.approx([25.0, 35.0])


def _arrivals_with_queue(sharing: str, queue_bytes: float) -> list[float]:
    """_arrivals' two activations, bursts of 125 kB each (one round trip), at a link whose
    queue holds queue_bytes, 20 ms round trip."""
    from dataclasses import replace
    route = Route(links=(AB,), solo_ms=20.0, one_way_ms=10.0, wire_bytes=125_000.0,
                  burst=True, rtt_ms=20.0)
    m = replace(_local(2, 1, 5.0, 5.0, D=2, routes={(0, 0): route, (0, 1): route},
                       sharing=sharing, rates={AB: 100.0}), link_queue_bytes={AB: queue_bytes})
    result = simulate(m, 1)
    got = sorted(o.start_ms for o in result.ops if o.stage == 1 and o.name == "F")
    return got, sum(result.link_drops.get(AB, {}).values())


@pytest.mark.unit
def test_a_burst_past_the_queue_drops_and_is_sent_again_by_hand():
    # a queue for both bursts: first come, first served, as without a limit
    assert _arrivals_with_queue("concurrent", 250_000.0) == (pytest.approx([25.0, 35.0]), 0)
    # 150 kB: the second finds 125 kB ahead and keeps 25 kB of its own; the 100 kB lost go
    # again a round trip after it was sent (5 + 20), 8 ms at the rate, arriving 25 + 8 + 10
    got, lost = _arrivals_with_queue("concurrent", 150_000.0)
    assert got == pytest.approx([25.0, 43.0]) and lost == pytest.approx(100_000.0)
    # temporal slots: one burst in the queue at a time, nothing lost
    assert _arrivals_with_queue("temporal", 150_000.0) == (pytest.approx([25.0, 35.0]), 0)
    # a queue below one burst: each slot lasts through its resend (20 ms + 25 kB at the rate)
    got, lost = _arrivals_with_queue("temporal", 100_000.0)
    assert got == pytest.approx([47.0, 69.0 + 10.0]) and lost == pytest.approx(50_000.0)


# -- scenarios --------------------------------------------------------------------------------

SHIPPED = sorted(p for p in (REPO / "topologies").glob("*.yaml"))


@pytest.mark.unit
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_scenario_and_system_predicts(path):
    sc = load_scenario(path)
    if sc.training is None:
        pytest.skip("network-only scenario: nothing to predict")
    cfg = load_training(sc)
    if cfg.compute != "profile":
        pytest.skip("measured mode: op times are not known before a run")
    for name in SYSTEMS:
        try:
            p = predict(sc, cfg, get_system(name))
        except Exception as exc:   # infeasible placements are refused, with the field named
            assert "add" in str(exc) or "host" in str(exc), exc
            continue
        assert p.iteration_time_s > 0 and 0 <= p.bubble_fraction < 1
        assert all(0 <= u <= 1.0 + 1e-6 for u in p.wan_utilization.values())


def _with(sc, delay_ms=None, connections=None):
    wan = tuple(dataclasses.replace(w, delay_ms=delay_ms) if delay_ms is not None else w
                for w in sc.wan)
    return dataclasses.replace(sc, wan=wan, **({} if connections is None
                                               else {"connections": connections}))


@pytest.mark.unit
@pytest.mark.parametrize("system", ["baseline", "multitcp", "atlas"])
def test_monotone_in_delay_and_connections(system):
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    cfg = load_training(sc)
    sysm = get_system(system)
    times = [predict(_with(sc, delay_ms=d), cfg, sysm).iteration_time_s
             for d in (5, 20, 40, 80, 150)]
    # more delay, never faster; more K, never slower: each within 1%, because the connections
    # persist across messages (testbed.rules.tcpchannel): a shorter RTO restarts the windows of
    # connections idle between iterations more often (atlas at 5 ms one way is 0.5% slower than
    # at 20), and a connection's window after a restart grows back by what it carried
    assert all(b >= a * (1 - 0.01) for a, b in zip(times, times[1:]))
    if system != "baseline":
        ks = [predict(_with(sc, connections=k), cfg, sysm).iteration_time_s
              for k in (1, 2, 4, 8, 16)]
        assert all(b <= a * (1 + 0.01) for a, b in zip(ks, ks[1:]))


@pytest.mark.unit
def test_prediction_beside_a_committed_emulated_run():
    """docs/bubbletea's committed x40 run: Atlas on atlas_bubbletea, measured on this machine."""
    doc = json.loads((REPO / "docs" / "bubbletea" / "atlas_bubbletea-x40-metrics.json")
                     .read_text())
    measured = doc["systems"]["atlas"]
    sc = load_scenario(REPO / "topologies" / "atlas_bubbletea.yaml")
    p = predict(sc, load_training(sc), get_system("atlas"))
    assert p.iteration_time_s == pytest.approx(measured["iteration_time_s"], rel=0.10)
    assert abs(p.bubble_fraction - measured["bubble_fraction"]) <= 0.05


@pytest.mark.unit
def test_predict_command(capsys):
    from run_testbed import main
    assert main(["predict", str(REPO / "topologies" / "atlas_paper.yaml")]) == 0
    out = capsys.readouterr().out
    assert "baseline" in out and "atlas" in out and "1.00x" in out
    assert main(["predict", str(REPO / "topologies" / "atlas_paper.yaml"), "--json",
                 "--systems", "baseline,atlas"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["system"] for s in doc["systems"]] == ["baseline", "atlas"]
    assert doc["systems"][1]["speedup"] > 10       # placement keeps the all-reduce in one DC
    assert main(["predict", str(REPO / "topologies" / "atlas_paper.yaml"), "--systems",
                 "nope"]) == 2
    assert "systems[0]" in capsys.readouterr().err


@pytest.mark.unit
@pytest.mark.parametrize("system", ["baseline", "multitcp", "temporal", "atlas", "dp-across-dcs"])
def test_prediction_beside_the_committed_atlas_paper_run(system):
    """docs/atlas's committed run of every system on atlas_paper. Atlas's iteration time is the
    known miss of that older run (-13%; the reference runs below hold it to 10%): only its bubble
    and WAN use are held to the targets here."""
    doc = json.loads((REPO / "docs" / "atlas" / "atlas_paper-metrics.json").read_text())
    measured = doc["systems"][system]
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    p = predict(sc, load_training(sc), get_system(system))
    if system != "atlas":
        assert p.iteration_time_s == pytest.approx(measured["iteration_time_s"], rel=0.10)
        for link, v in measured["wan_links"].items():
            if v.get("training_bytes"):
                assert p.wan_utilization[link] == pytest.approx(v["utilization"], abs=0.01)
    assert abs(p.bubble_fraction - measured["bubble_fraction"]) <= 0.05


REFERENCE_RUNS = sorted(p.parent for p in (REPO / "results" / "reference").rglob(
    "scenario.resolved.yaml"))
# The paper's testbed (3 DCs, D = 2, K connections): multitcp and atlas run 9-23% slower than
# the model, the gap of the model grid's D >= 2 rows (docs/model.md); strict, so that closing
# the gap turns this red until the mark goes
KNOWN_MISSES = ("paper_testbed-", "sweep_paper_testbed-")
REFERENCE_PARAMS = [pytest.param(p, marks=pytest.mark.xfail(
    strict=True, reason="issue 36: the model is 9-23% fast on D >= 2 pipelines with K "
    "connections")) if p.name.startswith(KNOWN_MISSES) else p for p in REFERENCE_RUNS]


@pytest.mark.unit
@pytest.mark.parametrize("run_dir", REFERENCE_PARAMS, ids=lambda p: p.name)
def test_every_committed_reference_run_is_within_the_targets(run_dir):
    """results/reference (scripts/make_reference.py): every shipped training scenario and sweep
    point, every system, measured on this 2-core VM. The model as it is now (the run
    recorded the model of its own commit beside its measurement), on the run's resolved
    scenario, is within the targets: iteration time within 10%, bubble fraction within 0.05, and WAN
    utilization within 0.05 where training crossed the link."""
    doc = json.loads((run_dir / "metrics.json").read_text())
    sc = load_scenario(run_dir / "scenario.resolved.yaml")
    cfg = load_training(sc)
    assert doc["systems"], run_dir
    for name, measured in doc["systems"].items():
        p = predict(sc, cfg, get_system(name))
        assert p.iteration_time_s == pytest.approx(measured["iteration_time_s"], rel=0.10), name
        assert abs(p.bubble_fraction - measured["bubble_fraction"]) <= 0.05, name
        for link, v in measured["wan_links"].items():
            if v.get("training_bytes"):
                assert p.wan_utilization[link] == pytest.approx(v["utilization"], abs=0.05), \
                    (name, link)


@pytest.mark.unit
def test_planner_ranks_stage_to_dc_assignments(capsys):
    """atlas_paper: 12 of 27 assignments fit (asia's 2 hosts take one stage of D = 2, eu's 3
    one); the fastest is Algorithm 1's (stages 0-1 in us, 2 in eu)."""
    from testbed.predict.planner import plan_options
    from run_testbed import main
    sc = load_scenario(REPO / "topologies" / "atlas_paper.yaml")
    options = plan_options(sc, load_training(sc))
    assert len(options) == 12
    times = [o.prediction.iteration_time_s for o in options]
    assert times == sorted(times)
    assert options[0].stage_dcs == ("us", "us", "eu")
    assert all(o.stage_dcs.count("asia") <= 1 and o.stage_dcs.count("eu") <= 1
               for o in options)
    assert main(["predict", str(REPO / "topologies" / "atlas_paper.yaml"), "--plan", "3"]) == 0
    out = capsys.readouterr().out
    assert "12 feasible" in out and out.count("\n") == 5     # title, header, 3 options


@pytest.mark.unit
@pytest.mark.parametrize("system", ["baseline", "atlas"])
def test_folding_alike_replicas(system, monkeypatch):
    """D = 12 (above the folding threshold): under fair sharing folding is exact; under
    temporal sharing it waits for the last slot of the class, so it is never faster."""
    import testbed.predict.predict as mp
    sc = load_scenario(REPO / "topologies" / "two_dc.yaml")
    sc = dataclasses.replace(sc, dcs=tuple(dataclasses.replace(dc, hosts=12) for dc in sc.dcs))
    cfg = dataclasses.replace(load_training(sc), replicas=12, placement=None,
                              placement_dcs=None)
    folded = mp.predict(sc, cfg, get_system(system))
    assert len(mp.build(sc, cfg, get_system(system)).weights) < 12
    monkeypatch.setattr(mp, "FOLD_ABOVE_REPLICAS", 100)
    exact = mp.predict(sc, cfg, get_system(system))
    if system == "baseline":
        assert folded.iteration_time_s == pytest.approx(exact.iteration_time_s, rel=1e-6)
        assert folded.bubble_fraction == pytest.approx(exact.bubble_fraction, abs=1e-6)
    else:
        assert folded.iteration_time_s >= exact.iteration_time_s * (1 - 1e-9)
    for link, u in exact.wan_utilization.items():
        assert folded.wan_utilization[link] * folded.iteration_time_s == pytest.approx(
            u * exact.iteration_time_s, rel=1e-6)     # the same bytes


@pytest.mark.unit
def test_paper_scale_scenarios_are_for_the_model_only(tmp_path):
    from run_testbed import main
    from testbed.spec.errors import ScenarioError
    from testbed.features.checks import load_run
    paper = sorted((REPO / "topologies" / "paper").glob("*.yaml"))
    assert paper
    for path in paper:
        sc = load_scenario(path)
        assert sc.predict_only and sum(dc.hosts for dc in sc.dcs) > 1000
        with pytest.raises(ScenarioError, match="predict_only"):
            load_run(str(path))
        p = predict(sc, load_training(sc), get_system("baseline"))
        assert p.iteration_time_s > 0
        assert main(["validate", str(path)]) == 0
    big = {"name": "big", "dcs": [{"name": "a", "hosts": 500}], "wan": []}
    bad = tmp_path / "big.yaml"
    bad.write_text(json.dumps(big))
    assert main(["validate", str(bad)]) == 2          # over 99 hosts without predict_only


@pytest.mark.unit
def test_predict_only_scenarios_may_use_more_connections_up_to_nccls(tmp_path, capsys):
    """16 connections is the emulator's limit (sender threads on 2 cores); the model's is what
    NCCL's socket transport opens between two GPUs (64), per GPU of a tensor-parallel host;
    `connections: auto` past it is capped and says so."""
    from run_testbed import main
    from testbed.plans.systems import capped_connections, scenario_connections
    doc = {"name": "wide", "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 2}],
           "wan": [{"between": ["a", "b"], "delay_ms": 80, "rate_mbit": 100000}],
           "connections": 64}
    path = tmp_path / "wide.yaml"
    path.write_text(json.dumps(doc))
    assert main(["validate", str(path)]) == 2
    assert "connections" in capsys.readouterr().err
    path.write_text(json.dumps(dict(doc, predict_only=True)))
    assert load_scenario(path).connections == 64
    path.write_text(json.dumps(dict(doc, predict_only=True, connections=65)))
    assert main(["validate", str(path)]) == 2
    assert "NCCL's socket transport" in capsys.readouterr().err
    path.write_text(json.dumps(dict(doc, predict_only=True, connections="auto")))
    # 100 Gbit/s x 160 ms over Linux's default window: 436 windows, capped at 64
    sc = load_scenario(path)
    assert scenario_connections(sc, "a", "b") == 64
    [line] = capped_connections(sc)
    assert line.startswith("connections auto capped at 64 (NCCL's socket transport")
    assert "2 DC pairs would need more windows to fill their paths, up to 436" in line
    path.write_text(json.dumps(dict(doc, connections="auto")))
    assert scenario_connections(load_scenario(path), "a", "b") == 16


@pytest.mark.unit
def test_slow_start_after_idle_off_in_the_scenario_and_the_model(tmp_path, capsys):
    from run_testbed import main
    from testbed.predict.predict import build
    tuned = load_scenario(REPO / "topologies" / "paper" / "gpt70b_3dc.yaml")
    assert not tuned.tcp_slow_start_after_idle          # its hosts are WAN-tuned
    cfg = load_training(tuned)
    sc = dataclasses.replace(tuned, tcp_slow_start_after_idle=True)
    atlas = get_system("atlas")
    wan = [r for r in build(tuned, cfg, atlas).forward_routes.values() if r.links]
    assert wan and all(r.solo_idle_ms is None for r in wan)
    default = [r for r in build(sc, cfg, atlas).forward_routes.values() if r.links]
    assert all(r.solo_idle_ms >= r.solo_ms for r in default)
    assert any(r.solo_idle_ms > r.solo_ms for r in default)
    assert (predict(tuned, cfg, atlas).iteration_time_s
            <= predict(sc, cfg, atlas).iteration_time_s)
    doc = dict(json.loads(json.dumps(tuned.raw)), tcp_slow_start_after_idle="no")
    path = tmp_path / "bad.yaml"
    path.write_text(json.dumps(doc))
    assert main(["validate", str(path)]) == 2
    assert "tcp_slow_start_after_idle" in capsys.readouterr().err


@pytest.mark.loopback   # pure, but seconds of paper-scale predictions: too slow for the unit ring
def test_paper_whatif_bench_prints_the_table(capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("whatif", REPO / "bench" / "bench_paper_whatif.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpt7b_2dc: what if") and "| as given |" in out
    assert "paper: up to 17x" in out and "paper: up to 94%" in out
    assert "| request rate to saturation" in out and "| DC sizes not whole stages" in out


@pytest.mark.unit
def test_predict_a_sweep_gives_every_point(capsys):
    from run_testbed import main
    path = str(REPO / "topologies" / "sweep_delay.yaml")
    assert main(["predict", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["values"] for p in doc["points"]] == [{"wan.delay_ms": d} for d in (5, 20, 40)]
    base = [p["systems"][0]["iteration_time_s"] for p in doc["points"]]
    assert base == sorted(base)                  # baseline: more delay, slower
    assert main(["predict", path]) == 0
    assert capsys.readouterr().out.count("sweep point") == 3


@pytest.mark.unit
def test_bursts_share_a_link_first_come_first_served():
    """Two one-round messages (each stripe within its window) on a concurrent link queue at the
    bottleneck in the order sent: the first arrives as if alone, the second one data time later
    (as temporal), where two multi-round flows share the link fairly."""
    wire = 125_000.0
    burst = Route(links=(AB,), solo_ms=20.0, one_way_ms=10.0, wire_bytes=wire, burst=True)
    m = _local(2, 1, 5.0, 5.0, D=2, routes={(0, 0): burst, (0, 1): burst},
               sharing="concurrent", rates={AB: 100.0})
    got = sorted(o.start_ms for o in simulate(m, 1).ops if o.stage == 1 and o.name == "F")
    assert got == pytest.approx([25.0, 35.0])
    # one of them not a burst: the link stays fair for both
    m = _local(2, 1, 5.0, 5.0, D=2, routes={(0, 0): burst,
                                           (0, 1): dataclasses.replace(burst, burst=False)},
               sharing="concurrent", rates={AB: 100.0})
    got = sorted(o.start_ms for o in simulate(m, 1).ops if o.stage == 1 and o.name == "F")
    assert got == pytest.approx([35.0, 35.0])


@pytest.mark.unit
def test_one_round_is_a_stripe_within_its_window():
    from testbed.predict.transfer import one_round
    path = PathSpec(rate_mbit=100, one_way_ms=20, rtt_ms=40, window_bytes=45_927, connections=11)
    assert one_round(335_544, path)                     # 11 stripes of 30.5 kB
    assert not one_round(335_544, dataclasses.replace(path, connections=3))   # 112 kB each


@pytest.mark.unit
def test_what_the_emulation_added_is_reported_beside_the_errors():
    from testbed.analysis.model_check import emulation_overheads, summary_line
    from testbed.features.temporal.run import slot_overheads_ms
    ms = 1_000_000
    # two slots of 125,000 link-layer bytes at 100 Mbit/s (10 ms each): the first held 13 ms,
    # the second asked during it and was granted 2 ms after it ended, held 12 ms
    slots = [{"t_request": 0, "t_grant": 0, "t_end": 13 * ms, "expected_bytes": 125_000},
             {"t_request": 5 * ms, "t_grant": 15 * ms, "t_end": 27 * ms,
              "expected_bytes": 125_000},
             {"t_request": 40 * ms, "t_grant": 40 * ms, "t_end": 54 * ms,
              "expected_bytes": 125_000}]     # asked after the link went idle: no hand-over
    over, handover = slot_overheads_ms(slots, 100.0)
    assert over == pytest.approx(3.0) and handover == pytest.approx(2.0)
    metrics = {"compute_overruns": {"count": 4, "total_ms": 30.0}, "iterations_averaged": [1, 2, 3],
               "time_scale": 2.0, "iterations": 4,
               "allreduce": [{"measured_ms": 75.0}, {"measured_ms": 67.0}],
               "wan_links": {"a->b": {"slot_over_wire_ms_median": over,
                                      "handover_ms_median": handover, "slots": 32},
                             "b->a": {"packets": 10}}}
    e = emulation_overheads(metrics, [67.0, 67.0])
    assert e["compute_overrun_ms_per_iteration"] == pytest.approx(10.0)
    assert e["allreduce_over_model_ms"] == pytest.approx([8.0, 0.0])
    assert e["wan_slots"] == {"a->b": {"over_wire_ms": 1.5, "handover_ms": 1.0,
                                       "per_iteration": 8.0}}     # real time: / time_scale
    check = {"predicted": {"iteration_time_s": 0.5, "bubble_fraction": 0.5,
                           "gpu_utilization": 0.5},
             "measured": {"iteration_time_s": 0.6, "bubble_fraction": 0.5,
                          "gpu_utilization": 0.5},
             "error": {"iteration_time_rel": -1 / 6, "bubble_fraction_abs": 0.0},
             "within_target": False, "emulation": e}
    line = summary_line(check)
    assert ("the emulation added 10.0 ms per iteration of compute past its holds (4 ops), "
            "all-reduce +8.0..8.0 ms, a->b slots +1.5 ms held and 1.0 ms hand-over each "
            "(8 per iteration)") in line


@pytest.mark.unit
def test_a_queue_set_below_the_summed_bursts_drops_first_come_first_served_not_in_slots():
    """Four pipelines' messages as one-round-trip bursts over one link: with the queue set to
    two of the four bursts they put in at once, multitcp drops and its messages arrive later
    than with the default queue (the all-reduce inside the DCs still sets the iteration);
    atlas's slots queue one burst at a time and drop nothing."""
    import testbed.predict.predict as mp
    from testbed.features.temporal.plan import message_payload_bytes
    from testbed.spec.scenario import parse_scenario
    raw = dict(load_scenario(REPO / "topologies" / "two_dc.yaml").raw)
    raw["dcs"] = [dict(dc, hosts=4) for dc in raw["dcs"]]
    raw["training"] = dict(raw["training"], replicas=4)
    raw["connections"] = 8                  # 8 windows hold a message: one round trip
    deep = parse_scenario(raw, "deep.yaml")
    cfg = load_training(deep)
    burst = message_payload_bytes(cfg, deep.scale)[0] * WF
    raw["wan"] = [dict(raw["wan"][0], queue=int(2 * burst / 1500))]
    shallow = parse_scenario(raw, "shallow.yaml")
    multitcp, atlas = get_system("multitcp"), get_system("atlas")
    assert predict(deep, cfg, multitcp).wan_drop_packets == {}
    dropped = predict(shallow, cfg, multitcp)
    assert dropped.wan_drop_packets
    # the resent bytes come a round trip later: the next stage's forwards start later

    def forwards_start(sc) -> float:
        ops = simulate(mp.build(sc, cfg, multitcp), 2).ops
        return sum(o.start_ms for o in ops if o.stage == 1 and o.name == "F")
    assert forwards_start(shallow) > forwards_start(deep)
    assert predict(shallow, cfg, atlas).wan_drop_packets == {}
