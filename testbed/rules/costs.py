"""What one micro-batch costs on each pipeline stage of the target model, from its profile row.

A stage that owns L blocks of the target model costs L x one block forward/backward; what it
sends per micro-batch is one block's activation_bytes (the hidden state, same size in both
directions). The optimizer step is not in the profiles; it is estimated (optimizer_ms):
mixed-precision Adam is memory-bound, and per parameter it reads bf16 weight and gradient and
fp32 master weight and two moments (16 bytes) and writes all but the gradient (14 bytes), 30
bytes at the H200's 4.8 TB/s HBM bandwidth (a stated estimate, not a measurement: 403M
parameters, 2.5 ms). Pure: the worker, the slot planner and the predictor use the same numbers.

Tensor parallelism (`training.tp` = t, Megatron-LM's split of each block over t GPUs of one
node): a GPU computes 1/t of each block (the profile's time over t: perfect scaling, a stated
simplification) and joins two all-reduces of the block's activation per forward and two per
backward (after the attention and the MLP; their input gradients on the way back), each a ring
over the node's NVLink: 2 (t - 1) / t x activation bytes at the device's published per-direction
bandwidth (testbed.rules.devices). One emulated host stands for the TP group: its compute hold is
the group's per-GPU time with those all-reduces in it (they run over NVLink inside the node, not
over any network the testbed emulates). What the group sends to the next stage is the whole
activation; its optimizer step is 1/t of the stage's parameters; its data-parallel all-reduce
is t rings in parallel, each GPU's 1/t of the gradients with its peers over its own NIC (a rail:
HGX nodes give each GPU its NIC), so a host's link carries one rail (`rail_gradient_bytes`):
the emulated host has one interface and the other t - 1 rails are alike. Over the WAN the t
rails share the link: the model counts them all there (testbed.predict.predict); the emulation,
which builds one rail, refuses a TP run whose all-reduce crosses the WAN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.rules.devices import device_of
from testbed.rules.stages import split_layers
from testbed.spec.profiles import find_block, load_profile

if TYPE_CHECKING:
    from testbed.spec.training import ProfileConfig


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCost:
    """What one micro-batch costs on one stage of the target model."""

    layers: int
    forward_ms: float
    backward_ms: float
    activation_bytes: int    # per micro-batch, before dividing by the run's scale
    params: int = 0          # the stage's blocks' parameters
    optimizer_ms: float = 0.0   # the estimated optimizer step (module docstring)
    tp: int = 1              # GPUs of its tensor-parallel group

    @property
    def gradient_bytes(self) -> int:
        """The stage's gradients in bf16, what its data-parallel all-reduce carries (before
        dividing by the run's scale)."""
        return self.params * 2

    @property
    def rail_gradient_bytes(self) -> int:
        """What one GPU of the TP group all-reduces over its own NIC: its 1/tp of the
        gradients (module docstring)."""
        return -(-self.gradient_bytes // self.tp)


ADAM_BYTES_PER_PARAM = 30         # HBM bytes moved per parameter by a mixed-precision Adam step
H200_HBM_BYTES_PER_S = 4.8e12


def optimizer_ms(params: float) -> float:
    """Estimated optimizer step of `params` parameters on an H200 (module docstring)."""
    return params * ADAM_BYTES_PER_PARAM / H200_HBM_BYTES_PER_S * 1e3


def tp_allreduce_ms(activation_bytes: float, tp: int, nvlink_bytes_per_s: float) -> float:
    """One ring all-reduce of a block's activation over tp GPUs of a node (module docstring)."""
    if tp <= 1:
        return 0.0
    return 2 * (tp - 1) / tp * activation_bytes / nvlink_bytes_per_s * 1e3


def stage_costs(cfg: ProfileConfig, n_stages: int, tp: int = 1) -> list[StageCost]:
    """Per-stage forward/backward ms (per GPU of a TP group of tp) and activation bytes,
    splitting the target's n_layer blocks over n_stages the same way the real model is split."""
    block = find_block(cfg)
    act = int(block["activation_bytes"])
    comm = 0.0
    if tp > 1:
        nvlink = device_of(load_profile(cfg.file)).nvlink_bytes_per_s
        comm = 2 * tp_allreduce_ms(act, tp, nvlink)     # two a block, each way
    costs = []
    for layers in split_layers(cfg.n_layer, n_stages):
        n = len(layers)
        params = n * int(block.get("params", 0))
        costs.append(StageCost(layers=n, forward_ms=n * (float(block["forward_ms"]) / tp + comm),
                               backward_ms=n * (float(block["backward_ms"]) / tp + comm),
                               activation_bytes=act, params=params,
                               optimizer_ms=optimizer_ms(params / tp), tp=tp))
    return costs
