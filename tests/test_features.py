"""The features' contract (testbed.features.base) and what crosses between them and the processes:

- BubbleTea's notices: every kind the worker sends is the typed object the controller parses
  back, with its explicit kind on the wire; a datagram without a kind or with an unknown one is
  refused in one line (testbed/host/notices.py);
- a worker's typed extras survive its spec file's JSON, and the worker finds each by its type
  (testbed/host/extras.py, testbed/host/specfiles.py);
- the features stop in today's order (cross-traffic, faults, temporal, BubbleTea), not the
  reverse of their start order, each once, all of them even when one fails;
- run_system's one partial-results path: a run that fails mid-training stops every feature
  before the network goes down and still writes each feature's partial block (cross-traffic's
  and the faults', as the faults' crash test sees them on a real network: test_faults_run.py),
  with the failure's time on the run's one clock and the faults' lead in its error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.features.base import Clock, Feature, FeatureHandle, MetricsBlock
from testbed.features.registry import FEATURES, STOP_ORDER, Running
from testbed.host.extras import (Gate, GateExtras, GpuShareExtras, Inbound, NoticeAddress,
                               extras_from_dict)
from testbed.host.notices import (PARSERS, ArrivalNotice, BubbleNotice, BusyNotice, OutputNotice,
                                encode_notice, parse_notice)
from testbed.host.specfiles import Peer, WorkerSpec
from testbed.spec.errors import TestbedError
from testbed.spec.links import LinkDir
from testbed.spec.timescale import TimeScale

pytestmark = pytest.mark.unit   # fakes for the network and the training: no processes, no sockets

NOTICES = [
    BubbleNotice(host="a-h1", t_idle_ns=10, t_pred_end_ns=50, iteration=3, op=2,
                 gaps_ns=[40, 60], awaits=(1, 3, 0), pending=True, wire_ns=7, made_ns=6,
                 maker=("a-h2", 3, 1), spread_ns=2),
    BubbleNotice(host="a-h1", t_idle_ns=10, t_pred_end_ns=50, iteration=3, op=4, gaps_ns=[40]),
    BubbleNotice(host="a-h1", t_idle_ns=10, t_pred_end_ns=50, iteration=3, op=1,
                 gaps_ns=[40], awaits=(2, 3, 1), end_min_ns=30, end_max_ns=33),
    BusyNotice(host="a-h1", busy_ns=12),
    ArrivalNotice(host="a-h1", t_idle_ns=10, end_min_ns=30, end_max_ns=33),
    ArrivalNotice(host="a-h1", t_idle_ns=10, end_min_ns=30),
    OutputNotice(host="a-h2", awaits=(2, 3, 1), end_min_ns=40),
]


@pytest.mark.parametrize("notice", NOTICES, ids=lambda n: n.kind)
def test_every_notice_kind_round_trips_as_its_type(notice):
    wire = json.loads(encode_notice(notice, seq=7))
    assert wire["kind"] == notice.kind and wire["seq"] == 7 and list(wire)[0] == "kind"
    assert None not in wire.values() and wire.get("pending", True) is True   # unset: left out
    back = parse_notice(wire)
    assert type(back) is type(notice) and back == notice


def test_the_kinds_are_one_definition_and_an_unknown_one_is_refused_in_one_line():
    assert set(PARSERS) == {n.kind for n in NOTICES} == {"bubble", "busy", "arrival", "output"}
    with pytest.raises(ValueError) as err:
        parse_notice({"kind": "idle\nagain", "host": "a-h1", "busy_ns": 1})
    assert str(err.value) == ("unknown notice kind 'idle\\nagain': one of bubble, busy, arrival, "
                              "output")
    with pytest.raises(KeyError):                           # no kind: not guessed from keys
        parse_notice({"host": "a-h1", "busy_ns": 1})
    with pytest.raises(TypeError, match="kind must be a string"):
        parse_notice({"kind": ["busy"], "host": "a-h1", "busy_ns": 1})


def spec(extras=()) -> WorkerSpec:
    return WorkerSpec(run_id="r", name="s0r0@a-h1", stage=0, replica=0, host="a-h1",
                      ip="10.1.0.1", dc="a", listen_port=None, prev=None,
                      next=Peer(name="s1r0@b-h1", host="b-h1", ip="10.2.0.1", port=29501,
                                dc="b", pad_bytes=1000),
                      dp_master_ip="10.1.0.1", dp_master_port=29502, config={}, scale=100.0,
                      spans_path="s.jsonl", loss_path="l.jsonl", extras=tuple(extras))


def test_extras_round_trip_through_the_spec_file(tmp_path):
    gates = GateExtras(next=Gate(ip="10.1.0.254", port=29400, link=LinkDir("a", "b"),
                                 pipeline=0))
    share = GpuShareExtras(lock_path="/run/gpu/a-h1.lock",
                           notify=NoticeAddress(ip="10.1.0.101", port=28200, allreduce=True),
                           inbound_next=Inbound(rate_mbit=50.0, bytes=1000, hold_ms=46.5,
                                                same_dc=False))
    path = tmp_path / "spec.json"
    spec([gates, share]).write(path)
    doc = json.loads(path.read_text())
    assert [e["kind"] for e in doc["extras"]] == ["gate", "gpu_share"]
    assert doc["extras"][0]["next"]["link"] == "a->b"        # the string only in the file
    back = WorkerSpec.load(path)
    assert back == spec([gates, share])
    assert back.extra(GateExtras) == gates and back.extra(GateExtras).next.link == LinkDir("a", "b")
    assert back.extra(GpuShareExtras).inbound_next.hold_ms == 46.5
    plain = tmp_path / "plain.json"
    spec().write(plain)
    assert WorkerSpec.load(plain).extra(GateExtras) is None   # that feature is off
    with pytest.raises(ValueError, match="unknown worker extras kind 'slots'"):
        extras_from_dict({"kind": "slots"})
    with pytest.raises(ValueError, match="kind twice"):
        spec([share, share])
    with pytest.raises(ValueError, match="gate link"):
        Gate(ip="10.1.0.254", port=1, link="a->b", pipeline=0)   # a LinkDir, not its string


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []


class FakeHandle(FeatureHandle):
    """Records its calls; its results are what the real handle of that name gives after an
    early stop (cross-traffic's flows and the faults' events; temporal and BubbleTea none)."""

    def __init__(self, name: str, rec: Recorder, fail_stop: bool = False) -> None:
        self.name, self.rec, self.fail_stop = name, rec, fail_stop
        self.clocked = name in ("cross", "faults")
        rec.events.append(f"start {name}")

    def begin(self) -> None:
        self.rec.events.append(f"begin {self.name}")

    def stop(self) -> None:
        self.rec.events.append(f"stop {self.name}")
        if self.fail_stop:
            raise TestbedError(f"{self.name} would not stop")

    def blame(self) -> str | None:
        return "stopped after the scenario's fault faults[0]" if self.name == "faults" else None

    def results(self, *, partial: bool, spans=()) -> MetricsBlock | None:
        self.rec.events.append(f"results {self.name}")
        if self.name == "cross":
            return MetricsBlock(key="cross_traffic", value=[{"label": "x", "cut_short": True}])
        if self.name == "faults":
            return MetricsBlock(key="faults", value={"events": [], "sample_s": 0.05,
                                                     "wire_mbit": {"a->b": [[0.0, 1.0]]}})
        return None


def fake_plans(rec: Recorder, names=None, fail_stop: str | None = None):
    """(Feature, plan) pairs as testbed.features.registry.plan_all gives them, in its order."""
    names = [f.name for f in FEATURES] if names is None else names
    return [(Feature(name=n, plan=lambda job: None,
                     start=lambda plan, ctx, n=n: FakeHandle(n, rec, fail_stop == n)), object())
            for n in names]


def test_features_stop_in_todays_order_each_once_even_when_one_fails():
    assert [f.name for f in FEATURES] == ["temporal", "bubbletea", "cross", "faults"]
    assert STOP_ORDER == ("cross", "faults", "temporal", "bubbletea")
    rec = Recorder()
    running = Running()

    class Ctx:
        clock = Clock()

    running.start(fake_plans(rec, fail_stop="faults"), Ctx())
    assert rec.events == ["start temporal", "start bubbletea", "start cross", "start faults",
                          "begin temporal", "begin bubbletea", "begin cross", "begin faults"]
    assert Ctx.clock.started
    rec.events.clear()
    with pytest.raises(TestbedError, match="faults would not stop"):
        running.stop()
    assert rec.events == ["stop cross", "stop faults", "stop temporal", "stop bubbletea"]
    running.stop()                            # idempotent: nothing is stopped twice
    assert rec.events == ["stop cross", "stop faults", "stop temporal", "stop bubbletea"]
    assert running.blame("x died") == "stopped after the scenario's fault faults[0]: x died"
    assert 0 <= running.clock_reading() < 5


def test_the_run_clock_is_configured_time():
    clock = Clock(TimeScale(10.0))
    clock.start()
    assert clock.now_s() == pytest.approx(clock.elapsed() / 10, abs=1e-3)
    assert clock.at_wall(clock.wall0 + 5.0) == pytest.approx(0.5)


# ---- run_system's one partial-results path, with a fake network ------------------------------

def small_scenario(tmp_path: Path):
    from testbed.spec.scenario import parse_scenario
    return parse_scenario({
        "name": "tiny", "scale": 100,
        "dcs": [{"name": "ea", "hosts": 1}, {"name": "we", "hosts": 1}],
        "wan": [{"between": ["ea", "we"], "delay_ms": 5, "rate_mbit": 100}],
        "faults": [{"kind": "delay", "link": ["ea", "we"], "at_s": 1, "delay_ms": 20}],
        "cross_traffic": [{"from": "ea", "to": "we", "kind": "udp", "rate_mbit": 5,
                           "start_s": 0, "stop_s": 3}],
        "training": {"model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16,
                               "vocab_size": 64},
                     "stages": 2, "replicas": 1, "micro_batches": 2, "iterations": 4}})


class FakeNetwork:
    """Network's part run_system uses, recording when it is built and taken down."""

    def __init__(self, rec: Recorder, scenario, sys_dir, backend=None, run_id=""):
        from testbed.plans.topo import make_plan
        self.rec = rec
        self.plan = make_plan(scenario.emulated())
        self.realtime, self.backend = False, "delayline"
        self.congestion_control, self.timings_s = {}, {}

    def __enter__(self):
        self.rec.events.append("network up")
        return self

    def __exit__(self, *exc):
        self.rec.events.append("network down")

    def wan_stats(self):
        return {}

    def check(self):
        pass

    def diagnose(self, exc):
        return exc


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """run_system on a fake network whose training fails mid-run: (the recorder, the call)."""
    from testbed.run import launch as launch_mod
    from testbed.run import systemrun

    rec = Recorder()
    monkeypatch.setattr(systemrun, "Network", lambda *a, **k: FakeNetwork(rec, *a, **k))
    monkeypatch.setattr(systemrun.report, "announce", lambda *a, **k: {})

    def failing_launch(cfg, hosts, run_dir, spawner, setup, extras, **kw):
        rec.events.append("launch")
        assert [h.name for h in extras] == ["temporal", "bubbletea", "cross", "faults"]
        assert setup.time_scale == TimeScale(1.0) and setup.connections[LinkDir("ea", "we")] == 1
        raise TestbedError("trainer.worker in we-h1 exited with -9")

    monkeypatch.setattr(launch_mod, "launch", failing_launch)

    def call(**plans):
        from testbed.spec.systems import get_system
        monkeypatch.setattr(systemrun, "plan_all", lambda job: fake_plans(rec, **plans))
        sc = small_scenario(tmp_path)
        from testbed.spec.training import TrainConfig
        return systemrun.run_system(sc, TrainConfig.from_dict(sc.training), get_system("baseline"),
                                    tmp_path / "run", backend=None, progress=lambda line: None)

    return rec, call, tmp_path / "run" / "baseline"


def test_a_failed_run_stops_every_feature_then_writes_each_partial_block(fake_run):
    from testbed.run.systemrun import RunIncomplete
    rec, call, sys_dir = fake_run
    with pytest.raises(RunIncomplete) as err:
        call()
    assert rec.events == [
        "network up", "start temporal", "start bubbletea", "start cross", "start faults",
        "begin temporal", "begin bubbletea", "begin cross", "begin faults", "launch",
        "stop cross", "stop faults", "stop temporal", "stop bubbletea", "network down",
        "results temporal", "results bubbletea", "results cross", "results faults"]
    doc = json.loads((sys_dir / "metrics.json").read_text())
    assert doc == err.value.partial
    assert list(doc) == ["system", "complete", "error", "iterations_done", "iterations_planned",
                         "loss", "cross_traffic", "faults", "stopped_s"]
    assert doc["complete"] is False and doc["iterations_done"] == 0
    assert doc["error"] == ("stopped after the scenario's fault faults[0]: "
                            "trainer.worker in we-h1 exited with -9")
    assert doc["cross_traffic"] == [{"label": "x", "cut_short": True}]
    assert Path(doc["faults"]["plot_png"]).stat().st_size > 1000
    assert 0 <= doc["stopped_s"] < 5        # on the run's clock, seen at the launch's failure


def test_without_a_clocked_feature_no_stop_time_and_a_failing_stop_still_ends_in_partial(
        fake_run):
    from testbed.run.systemrun import RunIncomplete
    rec, call, sys_dir = fake_run
    with pytest.raises(RunIncomplete, match="^temporal would not stop$"):
        call(names=["temporal", "bubbletea"], fail_stop="temporal")
    assert rec.events[-5:] == ["stop temporal", "stop bubbletea", "network down",
                               "results temporal", "results bubbletea"]
    doc = json.loads((sys_dir / "metrics.json").read_text())
    assert doc["stopped_s"] is None and "faults" not in doc and "cross_traffic" not in doc


def test_every_feature_plans_purely_in_order_and_shows_its_plan(tmp_path):
    """plan_all: each feature's plan where the system and the scenario switch it on, in the
    registry's order, as JSON; none where they do not."""
    from dataclasses import replace

    from testbed.features.base import SystemJob
    from testbed.features.registry import plan_all
    from testbed.plans.placement import place_for_system
    from testbed.spec.scenario import parse_scenario
    from testbed.spec.systems import get_system
    from testbed.spec.training import TrainConfig
    sc = small_scenario(tmp_path)
    doc = dict(sc.raw, dcs=[{"name": "ea", "hosts": 1, "decode_hosts": 1},
                            {"name": "we", "hosts": 1, "decode_hosts": 1}],
               bubbletea={"load": {"poisson_per_s": 60, "lengths": "conv", "window_s": 60},
                          "model": {"n_layer": 1, "n_embd": 32, "n_head": 2,
                                    "vocab_size": 64, "context": 48}})
    sc = parse_scenario(doc)
    cfg = TrainConfig.from_dict(sc.training)

    def plans(name: str, scenario=sc):
        system = get_system(name)
        placement = place_for_system(scenario, cfg, system)
        job = SystemJob(scenario=scenario, cfg=replace(cfg, placement=placement.hosts,
                                                       placement_dcs=None),
                        placement=placement, system=system)
        return [(f.name, p) for f, p in plan_all(job)]

    every = plans("atlas+bubbletea")
    assert [n for n, _ in every] == ["temporal", "bubbletea", "cross", "faults"]
    shown = {n: json.loads(json.dumps(p.to_dict())) for n, p in every}
    assert shown["temporal"]["sharing"] == "temporal"
    assert shown["bubbletea"]["arrival_bound"] == "off: delay faults"
    assert shown["cross"]["flows"] == ["cross_traffic[0] (ea->we udp 5 Mbit/s, 0-3 s)"]
    assert shown["faults"]["sample_links"] == [["ea", "we"]]
    assert [n for n, _ in plans("baseline")] == ["cross", "faults"]
    bare = parse_scenario({k: v for k, v in doc.items() if k not in ("faults", "cross_traffic")})
    assert plans("baseline", bare) == []
