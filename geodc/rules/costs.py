"""What one micro-batch costs on each pipeline stage of the target model, from its profile row.

A stage that owns L blocks of the target model costs L x one block forward/backward; what it
sends per micro-batch is one block's activation_bytes (the hidden state, same size in both
directions). The optimizer step is not in the profiles; it is estimated (optimizer_ms):
mixed-precision Adam is memory-bound, and per parameter it reads bf16 weight and gradient and
fp32 master weight and two moments (16 bytes) and writes all but the gradient (14 bytes), 30
bytes at the H200's 4.8 TB/s HBM bandwidth (a stated estimate, not a measurement: 403M
parameters, 2.5 ms). Pure: the worker, the slot planner and the predictor use the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from geodc.rules.stages import split_layers
from geodc.spec.profiles import find_block

if TYPE_CHECKING:
    from geodc.spec.training import ProfileConfig


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


def stage_costs(cfg: ProfileConfig, n_stages: int) -> list[StageCost]:
    """Per-stage forward/backward ms and activation bytes, splitting the target's n_layer blocks
    over n_stages the same way the real model is split."""
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
