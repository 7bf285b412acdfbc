"""The `training:` section of a scenario, as frozen dataclasses checked at the edge.

One job: turn a plain dict (from YAML) into a `TrainConfig`, or raise `ScenarioError` naming the
field, the problem and the fix. Unknown keys are rejected. Nothing here imports torch, starts a
process or reads the network; profile files are read only to check that the chosen target model
is in them (`testbed/spec/profiles.py` does the reading). Host placement against a real topology is
checked by `validate_against_hosts`, which the launcher calls with the hosts it was given.

    training:
      model: {n_layer: 4, n_embd: 64, n_head: 4, seq_len: 32, vocab_size: 256}
      stages: 2            # P pipeline stages
      replicas: 2          # D data-parallel replicas per stage
      micro_batches: 4     # M per replica per iteration
      micro_batch_size: 2  # sequences per micro-batch
      schedule: 1f1b       # gpipe | 1f1b
      iterations: 10
      lr: 0.003
      optimizer: adamw     # adamw | sgd
      seed: 0
      compute: profile     # measured | profile
      profile: {file: h200-transformer.json, width: 4096, seq: 2048, micro_batch: 1, n_layer: 32}
      tp: 1                # tensor parallelism of profile compute: GPUs per stage replica
      placement: [[dc0h1, dc0h2], [dc1h1, dc1h2]]   # optional: hosts[stage][replica]
      # or placement: [east, west]: one DC per stage (all its replicas there; testbed.plans.placement
      # checks the names and host counts against the scenario)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Sequence

from testbed.spec.errors import ScenarioError, shown, unknown_field
from testbed.spec.names import SCHEDULES
from testbed.spec.profiles import find_block

COMPUTE_MODES = ("measured", "profile")
OPTIMIZERS = ("adamw", "sgd")
# Upper bounds of every count: generous (the paper-scale scenarios of topologies/paper use 500
# replicas, 200 layers, 40 micro-batches), but finite, so that a planner or the model sized from
# them allocates a bounded amount.
MAX_COUNT = {"stages": 1024, "replicas": 100_000, "micro_batches": 4096, "micro_batch_size": 4096,
             "iterations": 100_000, "n_layer": 10_000, "n_embd": 1 << 16, "n_head": 1024,
             "seq_len": 1 << 20, "vocab_size": 1 << 20, "width": 1 << 20, "seq": 1 << 20,
             "micro_batch": 4096, "tp": 64}
MAX_SEED = 2**63 - 1
MAX_LR = 10.0


# ---------------------------------------------------------------------------------------------
# small checkers: each raises ScenarioError("<prefix>.<key>", ...)

def _check_keys(d: Any, prefix: str, known: Sequence[str], required: Sequence[str]) -> dict:
    if not isinstance(d, dict):
        raise ScenarioError(prefix, f"expected a mapping, got {type(d).__name__}",
                            f"write {prefix} as key: value pairs")
    for key in d:
        if key not in known:
            raise unknown_field(prefix, key, known, "unknown key")
    for key in required:
        if key not in d:
            raise ScenarioError(f"{prefix}.{key}", "missing", f"set {prefix}.{key}")
    return d


def _pos_int(d: dict, key: str, prefix: str, default: int | None = None, minimum: int = 1) -> int:
    value = d.get(key, default)
    maximum = MAX_COUNT[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{prefix}.{key}", f"{shown(value)} is not an integer",
                            f"set an integer from {minimum} to {maximum}")
    if value < minimum:
        raise ScenarioError(f"{prefix}.{key}", f"{shown(value)} is below {minimum}",
                            f"set an integer from {minimum} to {maximum}")
    if value > maximum:
        raise ScenarioError(f"{prefix}.{key}", f"{shown(value)} is above {maximum}",
                            f"set an integer from {minimum} to {maximum}")
    return value


def _choice(d: dict, key: str, prefix: str, choices: Sequence[str], default: str | None) -> str:
    value = d.get(key, default)
    if value not in choices:
        raise ScenarioError(f"{prefix}.{key}", f"unknown value {shown(value)}",
                            f"use one of: {', '.join(choices)}")
    return value


def _pos_float(d: dict, key: str, prefix: str, default: float) -> float:
    value = d.get(key, default)
    if isinstance(value, str):   # PyYAML (YAML 1.1) reads 3e-3 without a dot as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_LR:
        raise ScenarioError(f"{prefix}.{key}", f"{shown(value)} is not a positive number",
                            f"set a number > 0 and at most {MAX_LR:g}")
    return float(value)


# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """The small GPT that really trains (see testbed/host/gpt.py GPTConfig)."""

    n_layer: int
    n_embd: int
    n_head: int
    seq_len: int        # tokens per sequence (the model's block size)
    vocab_size: int

    @classmethod
    def from_dict(cls, d: Any, prefix: str) -> ModelConfig:
        names = [f.name for f in fields(cls)]
        _check_keys(d, prefix, names, names)
        vals = {k: _pos_int(d, k, prefix) for k in names}
        if vals["n_embd"] % vals["n_head"]:
            raise ScenarioError(f"{prefix}.n_embd",
                                f"{vals['n_embd']} is not divisible by n_head {vals['n_head']}",
                                "pick n_embd a multiple of n_head")
        if vals["vocab_size"] < 2:
            raise ScenarioError(f"{prefix}.vocab_size", f"{vals['vocab_size']} is below 2",
                                "set vocab_size >= 2")
        return cls(**vals)



@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileConfig:
    """The target model and GPU whose compute times `compute: profile` imitates.

    `file` names a profile under data/gpu-profiles/ (or is a path). One row of its `blocks` is
    chosen by (width, seq, micro_batch); a stage owning L of the target's n_layer blocks holds
    each forward/backward for L x the block's time and pads each activation it sends to the
    block's activation_bytes (divided by the run's scale)."""

    file: str
    width: int
    seq: int
    micro_batch: int
    n_layer: int        # layers of the *target* model, split over the stages like the real one

    @classmethod
    def from_dict(cls, d: Any, prefix: str, stages: int) -> ProfileConfig:
        names = [f.name for f in fields(cls)]
        _check_keys(d, prefix, names, names)
        if not isinstance(d["file"], str) or not d["file"]:
            raise ScenarioError(f"{prefix}.file", f"{shown(d['file'])} is not a file name",
                                "name a profile in data/gpu-profiles/, e.g. h200-transformer.json")
        cfg = cls(file=d["file"], width=_pos_int(d, "width", prefix),
                  seq=_pos_int(d, "seq", prefix), micro_batch=_pos_int(d, "micro_batch", prefix),
                  n_layer=_pos_int(d, "n_layer", prefix))
        if cfg.n_layer < stages:
            raise ScenarioError(f"{prefix}.n_layer",
                                f"{stages} stages but the target model has {cfg.n_layer} layers",
                                "set profile.n_layer >= stages")
        find_block(cfg, prefix)   # raises ScenarioError for a missing row or file
        return cfg


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Pipeline (P stages) x data parallel (D replicas) training of a small GPT."""

    model: ModelConfig
    stages: int                      # P
    replicas: int = 1                # D
    micro_batches: int               # M per replica per iteration
    micro_batch_size: int = 1        # sequences per micro-batch
    schedule: str = "1f1b"
    iterations: int = 10
    lr: float = 3e-3
    optimizer: str = "adamw"
    seed: int = 0
    compute: str = "measured"
    profile: ProfileConfig | None = None
    tp: int = 1                      # tensor parallelism: one host stands for tp GPUs
    placement: tuple[tuple[str, ...], ...] | None = None   # hosts[stage][replica]
    placement_dcs: tuple[str, ...] | None = None   # DC per stage (the `placement: [dc, ...]` form)

    @property
    def n_workers(self) -> int:
        return self.stages * self.replicas

    @property
    def tokens_per_iteration(self) -> int:
        return self.replicas * self.micro_batches * self.micro_batch_size * self.model.seq_len

    @classmethod
    def from_dict(cls, d: Any, field_prefix: str = "training") -> TrainConfig:
        p = field_prefix
        names = [f.name for f in fields(cls) if f.name != "placement_dcs"]  # YAML: placement
        _check_keys(d, p, names, ["model", "stages", "micro_batches"])
        model = ModelConfig.from_dict(d["model"], f"{p}.model")
        stages = _pos_int(d, "stages", p)
        if stages > model.n_layer:
            raise ScenarioError(f"{p}.stages",
                                f"{stages} stages but the model has {model.n_layer} layers",
                                "set stages <= n_layer")
        replicas = _pos_int(d, "replicas", p, 1)
        compute = _choice(d, "compute", p, COMPUTE_MODES, "measured")
        profile = None
        if compute == "profile":
            if d.get("profile") is None:
                raise ScenarioError(f"{p}.profile", "missing (compute is 'profile')",
                                    "add profile: {file, width, seq, micro_batch, n_layer}")
            profile = ProfileConfig.from_dict(d["profile"], f"{p}.profile", stages)
        elif d.get("profile") is not None:
            raise ScenarioError(f"{p}.profile", "given but compute is 'measured'",
                                "set compute: profile or drop profile")
        tp = _pos_int(d, "tp", p, 1)
        if tp > 1 and profile is None:
            raise ScenarioError(f"{p}.tp", f"{tp} but compute is 'measured' (the small GPT "
                                "trains on one host's CPU or GPU)",
                                "set compute: profile, or drop tp")
        if profile is not None and (profile.width // 128) % tp:
            raise ScenarioError(f"{p}.tp", f"{tp} does not divide the {profile.width // 128} "
                                f"attention heads of width {profile.width} (128 per head)",
                                "pick tp dividing the heads: 1, 2, 4 or 8")
        seed = d.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise ScenarioError(f"{p}.seed", f"{shown(seed)} is not an integer from 0 to "
                                f"{MAX_SEED}", "set seed: 0")
        placement, placement_dcs = _placement(d.get("placement"), f"{p}.placement", stages,
                                              replicas)
        return cls(model=model, stages=stages, replicas=replicas,
                   micro_batches=_pos_int(d, "micro_batches", p),
                   micro_batch_size=_pos_int(d, "micro_batch_size", p, 1),
                   schedule=_choice(d, "schedule", p, SCHEDULES, "1f1b"),
                   iterations=_pos_int(d, "iterations", p, 10),
                   lr=_pos_float(d, "lr", p, 3e-3),
                   optimizer=_choice(d, "optimizer", p, OPTIMIZERS, "adamw"),
                   seed=seed, compute=compute, profile=profile, tp=tp,
                   placement=placement, placement_dcs=placement_dcs)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["placement_dcs"]    # both forms travel as `placement`, as in the scenario
        if self.placement is not None:
            out["placement"] = [list(row) for row in self.placement]
        elif self.placement_dcs is not None:
            out["placement"] = list(self.placement_dcs)
        if self.profile is None:
            del out["profile"]
        return out


def _placement(value: Any, prefix: str, stages: int, replicas: int
               ) -> tuple[tuple[tuple[str, ...], ...] | None, tuple[str, ...] | None]:
    """(hosts[stage][replica], None) for a list of lists of host names; (None, dc per stage)
    for a list of DC names; (None, None) when absent."""
    if value is None:
        return None, None
    fix = (f"give a list of {stages} DC names (one per stage) or of {stages} lists of "
           f"{replicas} host names (hosts[stage][replica])")
    if not isinstance(value, (list, tuple)) or len(value) != stages:
        raise ScenarioError(prefix, f"expected {stages} rows (one per stage)", fix)
    if all(isinstance(x, str) for x in value):
        for s, dc in enumerate(value):
            if not dc:
                raise ScenarioError(f"{prefix}[{s}]", "empty DC name", fix)
        return None, tuple(value)
    rows = []
    seen: set[str] = set()
    for s, row in enumerate(value):
        if not isinstance(row, (list, tuple)) or len(row) != replicas:
            raise ScenarioError(f"{prefix}[{s}]", f"expected {replicas} host names", fix)
        for r, host in enumerate(row):
            if not isinstance(host, str) or not host:
                raise ScenarioError(f"{prefix}[{s}][{r}]", f"{shown(host)} is not a host name", fix)
            if host in seen:
                raise ScenarioError(f"{prefix}[{s}][{r}]", f"host {shown(host)} is used twice",
                                    "place one worker per host (one host = one GPU)")
            seen.add(host)
        rows.append(tuple(row))
    return tuple(rows), None


def validate_against_hosts(cfg: TrainConfig, n_hosts: int, host_names: Sequence[str] = (),
                           field_prefix: str = "training") -> None:
    """Raise ScenarioError when the P x D workers do not fit the topology's hosts. When
    host_names is given, an explicit placement must name only those hosts."""
    if cfg.n_workers > n_hosts:
        raise ScenarioError(f"{field_prefix}.stages",
                            f"{cfg.stages} stages x {cfg.replicas} replicas = {cfg.n_workers} "
                            f"workers but the topology has {n_hosts} hosts",
                            "lower stages or replicas, or add hosts (one worker per host)")
    if cfg.placement is not None and host_names:
        known = set(host_names)
        for s, row in enumerate(cfg.placement):
            for r, host in enumerate(row):
                if host not in known:
                    raise ScenarioError(f"{field_prefix}.placement[{s}][{r}]",
                                        f"host {shown(host)} is not in the topology",
                                        f"use one of: {', '.join(host_names)}")
