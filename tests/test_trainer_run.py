"""Whole training runs through the launcher: real worker processes, real TCP on 127.0.0.1.

- a P=2 x D=2 pipeline gives the single-process reference's losses, and the loss falls;
- profile mode on loopback: every op held to the profile, GPipe's order on each stage; as root,
  the timing too: the measured bubble is the textbook (P-1)/(M+P-1), the holds the profile's;
- a worker that cannot start stops the run with an error carrying its log tail.

Wall-clock fidelity asserts (measured against a target) are in root (`network`) tests only, with
tests/tolerance.py; the loopback tests assert counts, order and bounds that load cannot break.
"""

import json

import pytest

from testbed.spec.errors import TestbedError
from testbed.emulation.procs import LocalSpawner
from testbed.spec.training import TrainConfig
from testbed.plans.workers import HostInfo, WorkerSetup, plan_workers
from testbed.run.launch import launch
from testbed.emulation.procs import free_base_port
from testbed.analysis.metrics import compute_metrics
from trainer.reference import reference_losses
from testbed.rules.schedule import schedule_table
from tests.tolerance import assert_within

MODEL = {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64}


def loopback_hosts(n: int, dcs: int = 2) -> list[HostInfo]:
    return [HostInfo(name=f"dc{i * dcs // n}h{i}", ip="127.0.0.1", dc=f"dc{i * dcs // n}")
            for i in range(n)]


@pytest.fixture(scope="module")
def pp_dp_run(tmp_path_factory):
    cfg = TrainConfig.from_dict({"model": MODEL, "stages": 2, "replicas": 2, "micro_batches": 4,
                                 "micro_batch_size": 2, "schedule": "1f1b", "iterations": 6,
                                 # SGD, not Adam: Adam is blind to a wrongly scaled gradient
                                 # (a missing 1/D or 1/M), SGD's step size is not
                                 "optimizer": "sgd", "lr": 1.0, "seed": 3})
    run_dir = tmp_path_factory.mktemp("ppdp")
    spawner = LocalSpawner()
    try:
        run = launch(cfg, loopback_hosts(4), run_dir, spawner,
                     WorkerSetup(base_port=free_base_port(8)), timeout_s=90)
    finally:
        spawner.stop_all()
    return cfg, run


@pytest.mark.loopback
def test_pipeline_matches_single_process(pp_dp_run):
    cfg, run = pp_dp_run
    metrics = compute_metrics(run.run_dir)
    ref = reference_losses(cfg)
    assert len(metrics["loss"]) == cfg.iterations
    assert metrics["loss"] == pytest.approx(ref, rel=1e-4), \
        f"pipeline {metrics['loss']} vs reference {ref}"
    # each last-stage replica reported its own M micro-batch losses
    rows = [json.loads(line) for line in run.loss_path.read_text().splitlines()]
    assert sorted({r["replica"] for r in rows}) == [0, 1]
    assert all(len(r["microbatch_losses"]) == cfg.micro_batches for r in rows)


@pytest.mark.loopback
def test_loss_falls(pp_dp_run):
    cfg, run = pp_dp_run
    loss = compute_metrics(run.run_dir)["loss"]
    assert loss[-1] < loss[0] - 0.3, loss


@pytest.mark.loopback
def test_run_records_every_span(pp_dp_run):
    cfg, run = pp_dp_run
    spans = [json.loads(line) for line in run.spans_path.read_text().splitlines()]
    names = {r["name"] for r in spans}
    assert {"F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "ALLREDUCE", "OPT"} <= names
    per = {}
    for r in spans:
        per.setdefault((r["name"], r["stage"], r["replica"]), 0)
        per[(r["name"], r["stage"], r["replica"])] += 1
    n = cfg.iterations * cfg.micro_batches
    for s in range(2):
        for d in range(2):
            assert per[("F", s, d)] == per[("B", s, d)] == n
    assert per[("SEND_F", 0, 0)] == per[("RECV_F", 1, 0)] == n
    assert per[("SEND_B", 1, 1)] == per[("RECV_B", 0, 1)] == n
    assert all(r["t_start_ns"] <= r["t_end_ns"] for r in spans)
    m = compute_metrics(run.run_dir)
    assert [(s["stage"], s["replica"], s["dc"]) for s in m["stages"]] == \
        [(0, 0, "dc0"), (0, 1, "dc0"), (1, 0, "dc1"), (1, 1, "dc1")]
    assert 0.0 < m["gpu_utilization"] < 1.0 and m["tokens_per_s"] > 0


PROFILE_HOLD_MS = {"F": 16 * 1.3511, "B": 16 * 2.8724}   # 16 blocks of the H200 profile


@pytest.fixture(scope="module")
def gpipe_profile_run(tmp_path_factory):
    """P=2, M=4 GPipe in profile mode on loopback (one run for the structural test and the
    root test of its timing)."""
    # target: 32 blocks of width 4096, seq 2048, micro-batch 1 on an H200 -> per stage of 16
    # blocks 21.6 ms forward, 46.0 ms backward; the real model here needs ~1 ms.
    cfg = TrainConfig.from_dict({
        "model": MODEL, "stages": 2, "replicas": 1, "micro_batches": 4, "micro_batch_size": 2,
        "schedule": "gpipe", "iterations": 6, "compute": "profile",
        "profile": {"file": "h200-transformer.json", "width": 4096, "seq": 2048,
                    "micro_batch": 1, "n_layer": 32}})
    spawner = LocalSpawner()
    try:
        run = launch(cfg, loopback_hosts(2), tmp_path_factory.mktemp("gpipe"), spawner,
                     WorkerSetup(scale=100, base_port=free_base_port(4)), timeout_s=60)
    finally:
        spawner.stop_all()
    spans = [json.loads(line) for line in run.spans_path.read_text().splitlines()]
    return cfg, run, spans, compute_metrics(run.run_dir)


def _op_ms(spans: list[dict], name: str) -> list[float]:
    return sorted((r["t_end_ns"] - r["t_start_ns"]) / 1e6 for r in spans if r["name"] == name)


@pytest.mark.loopback
def test_profile_gpipe_runs_the_schedule_with_profile_holds(gpipe_profile_run):
    """Structure, no timing figures (those are the root test's below): every F/B is held to at
    least its profile time (the hold sleeps until then: load only lengthens it), each stage runs
    GPipe's order in every iteration, and messages are padded to the target's bytes / scale."""
    cfg, run, spans, m = gpipe_profile_run
    plan = json.loads((run.run_dir / "trainer_plan.json").read_text())
    for w in plan["workers"]:
        assert w["hold_forward_ms"] == pytest.approx(PROFILE_HOLD_MS["F"], rel=1e-9), w
        assert w["hold_backward_ms"] == pytest.approx(PROFILE_HOLD_MS["B"], rel=1e-9), w
    order = schedule_table("gpipe", 2, 4)
    for stage in range(2):
        for it in range(cfg.iterations):
            ops = sorted((r for r in spans if r["name"] in ("F", "B") and r["stage"] == stage
                          and r["iteration"] == it), key=lambda r: r["t_start_ns"])
            assert [f"{r['name']}{r['microbatch']}" for r in ops] == order[stage], (stage, it)
    for name, hold_ms in PROFILE_HOLD_MS.items():
        ms = _op_ms(spans, name)
        assert len(ms) == 2 * cfg.iterations * cfg.micro_batches, (name, ms)
        assert min(ms) >= hold_ms - 0.01, (name, hold_ms, ms)
    assert m["bubble_fraction_formula"] == pytest.approx((2 - 1) / (4 + 2 - 1))
    assert 0 < m["bubble_fraction"] < 1 and 0 < m["pipeline_bubble_fraction"] < 1, m
    # messages were padded to the target's activation bytes / scale
    assert m["communication"]["SEND_F"]["bytes"] == (cfg.iterations - 1) * 4 * (16777216 // 100)


@pytest.mark.network   # wall-clock fidelity: the root ring's, not loopback's (the module docstring)
def test_profile_gpipe_bubble_and_holds_match_the_profile(gpipe_profile_run):
    """GPipe's measured bubble is the textbook (P-1)/(M+P-1), the iteration the compute-only
    simulation of the profile (the median measured iteration within 10 %), each stage's F/B
    means the profile's; each hold lasts its profile time: the median op within 5 %, and at
    least 3 in 4 ops within 10 % (a stall of a 2-core VM may stretch one op or one iteration:
    CI's busy host once made one of three iterations' mean 15 % long; the spread is
    bench_bubbles' figure)."""
    cfg, run, spans, m = gpipe_profile_run
    formula = (2 - 1) / (4 + 2 - 1)
    assert_within([m["bubble_fraction"]], formula, abs=0.05, what="bubble_fraction")
    assert_within([m["pipeline_bubble_fraction"]], formula, abs=0.05,
                  what="pipeline_bubble_fraction")
    walls = [m["iteration_walls_s"][it] for it in m["iterations_averaged"]]
    assert len(walls) == cfg.iterations - 1, m["iterations_averaged"]
    assert_within(walls, m["compute_only"]["iteration_time_s"], rel=0.1, center="median",
                  what="iteration walls against compute_only, median")
    assert_within([s["forward_ms"] for s in m["stages"]], PROFILE_HOLD_MS["F"], rel=0.1,
                  what="stages' forward_ms")
    assert_within([s["backward_ms"] for s in m["stages"]], PROFILE_HOLD_MS["B"], rel=0.1,
                  what="stages' backward_ms")
    for name, hold_ms in PROFILE_HOLD_MS.items():
        ms = _op_ms(spans, name)
        assert_within(ms, hold_ms, rel=0.05, center="median", what=f"{name} holds, median")
        assert_within(ms, hold_ms, rel=0.1, share=0.75, what=f"{name} holds")


@pytest.mark.loopback
def test_failed_worker_stops_the_run_with_its_log(tmp_path):
    cfg = TrainConfig.from_dict({"model": MODEL, "stages": 2, "micro_batches": 2,
                                 "iterations": 2})
    # 192.0.2.1 (TEST-NET-1) is not on this machine: stage 1 cannot bind its listener
    hosts = [HostInfo(name="a", ip="127.0.0.1", dc="x"), HostInfo(name="b", ip="192.0.2.1",
                                                                  dc="x")]
    spawner = LocalSpawner()
    try:
        with pytest.raises(TestbedError) as err:
            launch(cfg, hosts, tmp_path, spawner,
                   WorkerSetup(base_port=free_base_port(4), connect_timeout_s=30), timeout_s=60)
        # the launcher stopped the healthy worker too (it would wait 30 s to connect)
        assert len(spawner.procs) == 2 and all(p.poll() is not None for p in spawner.procs)
    finally:
        spawner.stop_all()
    assert "cannot bind 192.0.2.1" in str(err.value)
    assert "in b " in str(err.value)            # names the failing host


@pytest.mark.unit
def test_plan_places_stages_dc_by_dc_and_assigns_ports(tmp_path):
    cfg = TrainConfig.from_dict({"model": {**MODEL, "n_layer": 4}, "stages": 2, "replicas": 2,
                                 "micro_batches": 2})
    hosts = [HostInfo(name="e1", ip="10.0.0.1", dc="east"),
             HostInfo(name="w1", ip="10.1.0.1", dc="west"),
             HostInfo(name="e2", ip="10.0.0.2", dc="east"),
             HostInfo(name="w2", ip="10.1.0.2", dc="west")]
    specs = plan_workers(cfg, hosts, tmp_path, WorkerSetup(base_port=5000))
    assert [(s.stage, s.replica, s.host) for s in specs] == \
        [(0, 0, "e1"), (0, 1, "e2"), (1, 0, "w1"), (1, 1, "w2")]
    s0r1, s1r1 = specs[1], specs[3]
    assert s0r1.next.ip == "10.1.0.2" and s0r1.next.port == s1r1.listen_port == 5003
    assert s1r1.prev.name == s0r1.name and s1r1.next is None
    assert s1r1.dp_master_ip == "10.1.0.1" and s1r1.dp_master_port == 5000 + 4 + 1
    explicit = TrainConfig.from_dict({**cfg.to_dict(), "placement": [["w2", "w1"],
                                                                     ["e2", "e1"]]})
    assert [s.host for s in plan_workers(explicit, hosts, tmp_path)] == ["w2", "w1", "e2", "e1"]
