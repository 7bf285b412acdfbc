"""Compute profiles: read a profile file and find the row a scenario names.

One job: profile lookup (testbed.rules.costs turns the row into per-stage hold times and pads). A profile (data/gpu-profiles/*.json, see PROVENANCE.md there) lists
`blocks` rows {width, heads, seq, micro_batch, forward_ms, backward_ms, activation_bytes}. A stage
that owns L blocks of the target model costs L x one block forward/backward; what it sends per
micro-batch is one block's activation_bytes (the hidden state, same size in both directions).

No torch here; the worker only sees the numbers this module computes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Protocol

from testbed.spec.errors import ScenarioError, shown
from testbed.spec.inputfile import read_text
from testbed.spec.paths import GPU_PROFILES

MAX_PROFILE_BYTES = 1 << 20      # the shipped profiles are about 11 KB


class BlockChoice(Protocol):
    """Which row of a profile file (testbed.spec.training.ProfileConfig is one)."""

    file: str
    width: int
    seq: int
    micro_batch: int



def profile_path(name: str) -> Path:
    """A bare name (no '/') is a file in data/gpu-profiles/; anything else is a path."""
    return GPU_PROFILES / name if "/" not in name else Path(name)


@lru_cache(maxsize=8)
def load_profile(name: str, field: str = "training.profile.file") -> dict:
    """A profile's JSON document: a regular .json file under GPU_PROFILES of at most
    MAX_PROFILE_BYTES holding a JSON object, else ScenarioError(field)."""
    fix = f"name a .json file in {GPU_PROFILES} (copy a measured profile there)"
    if not name.endswith(".json"):
        raise ScenarioError(field, f"{shown(name)} is not a .json file", fix)
    path = profile_path(name)
    if not path.resolve().is_relative_to(GPU_PROFILES):   # links resolved: none leads out
        raise ScenarioError(field, f"{shown(name)} is not a file in {GPU_PROFILES}", fix)
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


def find_block(cfg: BlockChoice, prefix: str = "training.profile") -> dict:
    """The profile row for (width, seq, micro_batch), or ScenarioError naming what exists."""
    profile = load_profile(cfg.file, f"{prefix}.file")
    blocks = profile.get("blocks")
    if not isinstance(blocks, list) or not all(
            isinstance(b, dict) and {"width", "seq", "micro_batch"} <= b.keys() for b in blocks):
        raise ScenarioError(f"{prefix}.file", f"{shown(cfg.file)} has no list of blocks",
                            "give a profile written by trainer/measure_profile.py")
    for key, value in (("width", cfg.width), ("seq", cfg.seq), ("micro_batch", cfg.micro_batch)):
        have = sorted({b[key] for b in blocks})
        if value not in have:
            raise ScenarioError(f"{prefix}.{key}", f"no block with {key} {value} in {cfg.file}",
                                f"use one of: {', '.join(map(str, have))}")
        blocks = [b for b in blocks if b[key] == value]
    return blocks[0]
