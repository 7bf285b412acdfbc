"""TrainConfig validation: every bad field gives a ScenarioError that names it."""

import pytest

from testbed.spec.errors import ScenarioError
from testbed.host.gpt import GPTConfig
from testbed.spec.training import TrainConfig, validate_against_hosts

pytestmark = pytest.mark.unit


def base(**over) -> dict:
    d = {"model": {"n_layer": 4, "n_embd": 64, "n_head": 4, "seq_len": 32, "vocab_size": 256},
         "stages": 2, "replicas": 2, "micro_batches": 4, "micro_batch_size": 2,
         "schedule": "1f1b", "iterations": 5, "seed": 1}
    d.update(over)
    return d


def model(**over) -> dict:
    m = dict(base()["model"])
    m.update(over)
    return m


def test_valid_config_round_trips():
    cfg = TrainConfig.from_dict(base(compute="profile", placement=[["a", "b"], ["c", "d"]],
                                     profile={"file": "h200-transformer.json", "width": 4096,
                                              "seq": 2048, "micro_batch": 1, "n_layer": 32}))
    assert cfg.n_workers == 4 and cfg.tokens_per_iteration == 2 * 4 * 2 * 32
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert GPTConfig.of(cfg.model).block_size == 32


@pytest.mark.parametrize("d, field, words", [
    (base(stages=6), "training.stages", ["6 stages", "4 layers", "stages <= n_layer"]),
    (base(model=model(n_embd=66)), "training.model.n_embd", ["not divisible", "n_head"]),
    (base(schedule="zb"), "training.schedule", ["'zb'", "gpipe", "1f1b"]),
    (base(colour="red"), "training.colour", ["unknown key"]),
    (base(model={**model(), "dropout": 0.1}), "training.model.dropout", ["unknown key"]),
    (base(replicas=0), "training.replicas", ["below 1"]),
    (base(micro_batches="4"), "training.micro_batches", ["not an integer"]),
    (base(compute="fast"), "training.compute", ["'fast'", "measured"]),
    (base(compute="profile"), "training.profile", ["missing"]),
    (base(compute="profile", profile={"file": "h200-transformer.json", "width": 1000, "seq": 2048,
                                      "micro_batch": 1, "n_layer": 32}),
     "training.profile.width", ["no block with width 1000", "4096"]),
    (base(compute="profile", profile={"file": "nope.json", "width": 4096, "seq": 2048,
                                      "micro_batch": 1, "n_layer": 32}),
     "training.profile.file", ["not found"]),
    (base(placement=[["a", "b"]]), "training.placement", ["2 rows"]),
    (base(placement=[["a", "b"], ["c", "a"]]), "training.placement[1][1]", ["used twice"]),
])
def test_bad_fields_name_the_field(d, field, words):
    with pytest.raises(ScenarioError) as err:
        TrainConfig.from_dict(d)
    assert err.value.field == field
    assert str(err.value).startswith(field + ":")
    for w in words:
        assert w in str(err.value)


def test_field_prefix_is_used():
    with pytest.raises(ScenarioError) as err:
        TrainConfig.from_dict(base(stages=9), field_prefix="workloads[0].training")
    assert err.value.field == "workloads[0].training.stages"


def test_more_workers_than_hosts():
    cfg = TrainConfig.from_dict(base())                       # 2 x 2 = 4 workers
    validate_against_hosts(cfg, 4)
    with pytest.raises(ScenarioError) as err:
        validate_against_hosts(cfg, 3)
    assert err.value.field == "training.stages"
    assert "4 workers" in str(err.value) and "3 hosts" in str(err.value)


def test_placement_must_name_topology_hosts():
    cfg = TrainConfig.from_dict(base(placement=[["a", "b"], ["c", "x"]]))
    with pytest.raises(ScenarioError) as err:
        validate_against_hosts(cfg, 4, ["a", "b", "c", "d"])
    assert err.value.field == "training.placement[1][1]" and "'x'" in str(err.value)


def test_yaml_scenario_section_parses():
    import yaml
    text = """
training:
  model: {n_layer: 4, n_embd: 64, n_head: 4, seq_len: 32, vocab_size: 256}
  stages: 2
  replicas: 2
  micro_batches: 4
  lr: 3e-3
  compute: profile
  profile: {file: h200-transformer.json, width: 4096, seq: 2048, micro_batch: 1, n_layer: 32}
"""
    cfg = TrainConfig.from_dict(yaml.safe_load(text)["training"])
    assert cfg.lr == 0.003 and cfg.profile.n_layer == 32
    with pytest.raises(ScenarioError, match="training.lr"):
        TrainConfig.from_dict(base(lr="fast"))
