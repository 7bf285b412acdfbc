"""Compute profiles: read a profile file and turn it into per-stage hold times and pad sizes.

One job: profile lookup. A profile (data/gpu-profiles/*.json, see PROVENANCE.md there) lists
`blocks` rows {width, heads, seq, micro_batch, forward_ms, backward_ms, activation_bytes}. A stage
that owns L blocks of the target model costs L x one block forward/backward; what it sends per
micro-batch is one block's activation_bytes (the hidden state, same size in both directions).

The optimizer step is not in the profiles; it is estimated (optimizer_ms): mixed-precision
Adam is memory-bound, and per parameter it reads bf16 weight and gradient and fp32 master weight
and two moments (16 bytes) and writes all but the gradient (14 bytes), 30 bytes at the H200's
4.8 TB/s HBM bandwidth (a stated estimate, not a measurement: 403M parameters, 2.5 ms).
No torch here; the worker only sees the numbers this module computes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from geodc.spec.errors import ScenarioError, shown
from geodc.spec.inputfile import read_text
from geodc.spec.paths import GPU_PROFILES

if TYPE_CHECKING:
    from geodc.spec.training import ProfileConfig

PROFILE_DIR = GPU_PROFILES


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCost:
    """What one micro-batch costs on one stage of the target model."""

    layers: int
    forward_ms: float
    backward_ms: float
    activation_bytes: int    # per micro-batch, before dividing by the run's scale
    params: int = 0          # the stage's blocks' parameters
    optimizer_ms: float = 0.0   # the estimated optimizer step (module docstring)

    @property
    def gradient_bytes(self) -> int:
        """The stage's gradients in bf16, what its data-parallel all-reduce carries (before
        dividing by the run's scale)."""
        return self.params * 2


ADAM_BYTES_PER_PARAM = 30         # HBM bytes moved per parameter by a mixed-precision Adam step
H200_HBM_BYTES_PER_S = 4.8e12


def optimizer_ms(params: int) -> float:
    """Estimated optimizer step of `params` parameters on an H200 (module docstring)."""
    return params * ADAM_BYTES_PER_PARAM / H200_HBM_BYTES_PER_S * 1e3


MAX_PROFILE_BYTES = 1 << 20      # the shipped profiles are about 11 KB


def profile_path(name: str) -> Path:
    """A bare name (no '/') is a file in data/gpu-profiles/; anything else is a path."""
    return PROFILE_DIR / name if "/" not in name else Path(name)


@lru_cache(maxsize=8)
def load_profile(name: str, field: str = "training.profile.file") -> dict:
    """A profile's JSON document: a regular .json file under PROFILE_DIR of at most
    MAX_PROFILE_BYTES holding a JSON object, else ScenarioError(field)."""
    fix = f"name a .json file in {PROFILE_DIR} (copy a measured profile there)"
    if not name.endswith(".json"):
        raise ScenarioError(field, f"{shown(name)} is not a .json file", fix)
    path = profile_path(name)
    if not path.resolve().is_relative_to(PROFILE_DIR):   # links resolved: none leads out
        raise ScenarioError(field, f"{shown(name)} is not a file in {PROFILE_DIR}", fix)
    if not path.exists():
        raise ScenarioError(field, f"profile {shown(name)} not found (looked for {path})", fix)
    text = read_text(path, field, MAX_PROFILE_BYTES, fix)
    try:
        doc = json.loads(text)
    except (RecursionError, ValueError) as exc:   # JSONDecodeError, or an integer too long
        raise ScenarioError(field, f"{shown(name)} is not JSON ({str(exc)[:60]})", fix) from None
    if not isinstance(doc, dict):
        raise ScenarioError(field, f"{shown(name)} holds no JSON object", fix)
    return doc


def find_block(cfg: ProfileConfig, prefix: str = "training.profile") -> dict:
    """The profile row for (width, seq, micro_batch), or ScenarioError naming what exists."""
    profile = load_profile(cfg.file, f"{prefix}.file")
    blocks = profile.get("blocks")
    if not isinstance(blocks, list) or not all(
            isinstance(b, dict) and {"width", "seq", "micro_batch"} <= b.keys() for b in blocks):
        raise ScenarioError(f"{prefix}.file", f"{shown(cfg.file)} has no list of blocks",
                            "give a profile written by geodc/hostproc/trainer/measure_profile.py")
    for key, value in (("width", cfg.width), ("seq", cfg.seq), ("micro_batch", cfg.micro_batch)):
        have = sorted({b[key] for b in blocks})
        if value not in have:
            raise ScenarioError(f"{prefix}.{key}", f"no block with {key} {value} in {cfg.file}",
                                f"use one of: {', '.join(map(str, have))}")
        blocks = [b for b in blocks if b[key] == value]
    return blocks[0]


def stage_costs(cfg: ProfileConfig, n_stages: int) -> list[StageCost]:
    """Per-stage forward/backward ms and activation bytes, splitting the target's n_layer blocks
    over n_stages the same way the real model is split."""
    from geodc.rules.stages import split_layers  # pure, no torch at import time
    block = find_block(cfg)
    costs = []
    for layers in split_layers(cfg.n_layer, n_stages):
        n = len(layers)
        params = n * int(block.get("params", 0))
        costs.append(StageCost(layers=n, forward_ms=n * float(block["forward_ms"]),
                               backward_ms=n * float(block["backward_ms"]),
                               activation_bytes=int(block["activation_bytes"]), params=params,
                               optimizer_ms=optimizer_ms(params)))
    return costs
