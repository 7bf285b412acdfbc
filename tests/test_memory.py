"""Tensor parallelism and the per-GPU memory check (testbed.rules.memory, testbed.rules.costs):
the figures by hand from the profile's block, the errors a stage that does not fit gets, and
what validate, predict and run say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.rules.costs import stage_costs, tp_allreduce_ms
from testbed.rules.memory import STATE_BYTES_PER_PARAM, check_memory, in_flight, stage_memory
from testbed.rules.schedule import schedule_table
from testbed.spec.errors import ScenarioError
from testbed.spec.profiles import find_block
from testbed.spec.scenario import load_scenario
from testbed.spec.training import ProfileConfig, TrainConfig

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parent.parent
SMALL = {"n_layer": 4, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": 256}


def training(**kw) -> dict:
    base = {"model": SMALL, "stages": 4, "replicas": 2, "micro_batches": 16,
            "schedule": "1f1b", "compute": "profile",
            "profile": {"file": "h200-transformer.json", "width": 4096, "seq": 2048,
                        "micro_batch": 1, "n_layer": 32}}
    return {**base, **kw}


def with_profile(**kw) -> dict:
    d = training()
    d["profile"] = {**d["profile"], **kw}
    return d


def test_micro_batches_in_flight_follow_the_schedule_rows():
    for P, M in ((4, 16), (4, 2), (8, 8)):
        one_f = schedule_table("1f1b", P, M)
        assert [in_flight(row) for row in one_f] == [min(M, P - s) for s in range(P)]
        assert all(in_flight(row) == M for row in schedule_table("gpipe", P, M))


def test_stage_memory_by_hand():
    """gpt7b-like: 8 blocks of width 4096 a stage; 16 bytes a parameter; 34 s b h bytes of
    activations a block and micro-batch, 4 micro-batches in flight on stage 0 (1F1B, P = 4)."""
    cfg = TrainConfig.from_dict(training())
    block = find_block(cfg.profile)
    m = stage_memory(cfg)
    assert [x.in_flight for x in m] == [4, 3, 2, 1]
    assert m[0].state_bytes == 8 * block["params"] * STATE_BYTES_PER_PARAM
    assert m[0].activation_bytes == 8 * 4 * 2048 * 1 * 4096 * 34
    assert m[0].capacity_bytes == 141e9 and m[0].fits
    assert m[3].activation_bytes == m[0].activation_bytes / 4


def test_tensor_parallelism_splits_state_and_most_activations():
    one = stage_memory(TrainConfig.from_dict(training()))[0]
    eight = stage_memory(TrainConfig.from_dict(training(tp=8)))[0]
    assert eight.state_bytes == pytest.approx(one.state_bytes / 8)
    assert eight.activation_bytes == pytest.approx(one.activation_bytes * (10 + 24 / 8) / 34)


def test_tensor_parallel_compute_is_the_profile_over_tp_plus_nvlink_all_reduces():
    prof = ProfileConfig.from_dict(training()["profile"], "p", 4)
    block = find_block(prof)
    one, eight = stage_costs(prof, 4, 1)[0], stage_costs(prof, 4, 8)[0]
    ring = 2 * 7 / 8 * block["activation_bytes"] / 450e9 * 1e3      # ms, one all-reduce
    assert tp_allreduce_ms(block["activation_bytes"], 8, 450e9) == pytest.approx(ring)
    assert eight.forward_ms == pytest.approx(8 * (block["forward_ms"] / 8 + 2 * ring))
    assert eight.backward_ms == pytest.approx(8 * (block["backward_ms"] / 8 + 2 * ring))
    assert one.forward_ms == pytest.approx(8 * block["forward_ms"])
    assert eight.gradient_bytes == one.gradient_bytes
    assert eight.rail_gradient_bytes == pytest.approx(one.gradient_bytes / 8, abs=1)
    assert eight.optimizer_ms == pytest.approx(one.optimizer_ms / 8)


def test_a_stage_that_does_not_fit_is_an_error_naming_the_fixes():
    big = with_profile(width=8192, n_layer=200)
    big.update(stages=20, micro_batches=40, model={**SMALL, "n_layer": 20})
    with pytest.raises(ScenarioError) as e:
        check_memory(TrainConfig.from_dict(big))
    text = str(e.value)
    assert "training.stages" in text and "stage 0 does not fit" in text and "242.9 GB" in text
    assert "training.tp" in text and "more stages" in text and "1f1b" in text
    fits = check_memory(TrainConfig.from_dict({**big, "tp": 8}))
    assert all(m.fits for m in fits) and max(m.total_bytes for m in fits) < 0.5 * 141e9


@pytest.mark.parametrize("change, field", [
    ({"tp": 3}, "training.tp"),                         # 32 heads at width 4096
    ({"tp": 2, "compute": "measured", "profile": None}, "training.tp"),
    ({"tp": 65}, "training.tp"),
])
def test_bad_tp_is_a_one_line_error(change, field):
    d = {k: v for k, v in {**training(), **change}.items() if v is not None}
    with pytest.raises(ScenarioError) as e:
        TrainConfig.from_dict(d)
    assert str(e.value).startswith(field)


def test_tp_past_a_node_is_refused():
    with pytest.raises(ScenarioError, match=r"training.tp.*past the 8"):
        check_memory(TrainConfig.from_dict(with_profile(width=8192) | {"tp": 16}))


def test_every_shipped_scenario_fits_and_predict_and_validate_say_so():
    for path in sorted((REPO / "topologies").rglob("*.yaml")):
        sc = load_scenario(path)
        if sc.training is None or sc.training.get("compute") != "profile":
            continue
        assert all(m.fits for m in check_memory(TrainConfig.from_dict(sc.training))), path
    from testbed.cli.main import _validate
    from testbed.cli.predict import predict_command
    text = _validate(str(REPO / "topologies" / "paper" / "gpt160b_5dc.yaml"), routes=False)
    assert "TP=8" in text and "memory per GPU (NVIDIA H200, 141 GB)" in text
    doc = json.loads(predict_command(str(REPO / "topologies" / "paper" / "gpt7b_2dc.yaml"),
                                     systems=["atlas"], as_json=True))
    assert doc["tp"] == 1 and len(doc["memory_per_gpu"]) == 4
    assert doc["memory_per_gpu"][0]["total_gb"] == pytest.approx(34.9, abs=0.1)


def test_run_refuses_what_the_emulation_cannot_carry_with_tp():
    """A run with tp > 1: the compute hold is the group's (testbed.plans.workers uses the same
    stage costs), but BubbleTea's prefill servers hold one GPU's time and the emulated host has
    one rail, so those two are refused with the way out; the model predicts both."""
    from testbed.features.checks import check_run
    from testbed.spec.scenario import parse_scenario
    raw = dict(load_scenario(REPO / "topologies" / "atlas_bubbletea.yaml").raw)
    raw["training"] = dict(raw["training"], tp=2)
    sc = parse_scenario(raw, "tp.yaml")
    bt = [s for s in sc.systems if "bubbletea" in s]
    with pytest.raises(ScenarioError, match=r"training.tp: 2 with .*bubbletea"):
        check_run(sc, systems=bt)
    _, cfg, _ = check_run(sc, systems=["atlas"])
    assert cfg.tp == 2
    raw = dict(load_scenario(REPO / "topologies" / "two_dc.yaml").raw)
    raw["training"] = dict(raw["training"], tp=2)
    with pytest.raises(ScenarioError, match=r"training.tp: 2 with dp-across-dcs"):
        check_run(parse_scenario(raw, "tp.yaml"), systems=["dp-across-dcs"])


def test_the_workers_hold_the_tp_groups_time_and_all_reduce_one_rail(tmp_path):
    """What the emulation's workers are told with tp 2: the same per-GPU compute as the model
    (testbed.rules.costs, TP all-reduces in it) and one rail's gradients to all-reduce."""
    from testbed.plans.workers import HostInfo, WorkerSetup, plan_workers
    raw = dict(load_scenario(REPO / "topologies" / "two_dc.yaml").raw)
    hosts = [HostInfo(name=n, ip=f"10.0.0.{i}", dc=n.split("-")[0])
             for i, n in enumerate(load_scenario(REPO / "topologies" / "two_dc.yaml")
                                   .host_names(), 1)]
    one = TrainConfig.from_dict(raw["training"])
    two = TrainConfig.from_dict(dict(raw["training"], tp=2))
    a = plan_workers(one, hosts, tmp_path, WorkerSetup(scale=100))
    b = plan_workers(two, hosts, tmp_path, WorkerSetup(scale=100))
    costs = stage_costs(two.profile, two.stages, 2)
    for x, y in zip(a, b):
        assert y.hold_forward_ms == pytest.approx(costs[0].forward_ms)
        assert y.hold_forward_ms < 0.6 * x.hold_forward_ms
        assert y.allreduce_pad_bytes == pytest.approx(x.allreduce_pad_bytes / 2, abs=1)
        assert y.pad_bytes == x.pad_bytes                  # the whole activation still goes
