"""What one GPU of each pipeline stage holds at its peak, against the GPU's memory: the check
that a scenario's stages fit on the hardware its compute profile was measured on. Pure.

One job: per-stage memory of `compute: profile` training, and the error when a stage does not
fit. Per GPU of a stage's tensor-parallel group of t (testbed.rules.costs):
- model state: the stage's parameters over t, 16 bytes each: bf16 weight and gradient (2 + 2)
  and Adam's fp32 master weight and two moments (4 + 4 + 4), as mixed-precision training keeps
  them (no ZeRO sharding across the data-parallel replicas);
- activations: per block and micro-batch, s b h (10 + 24 / t) bytes (Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", the tensor-parallel formula
  without sequence parallelism; the attention scores' 5 a s^2 b / t term is left out, since the
  profiled block runs fused scaled-dot-product attention, which does not store them), for as
  many micro-batches as the stage's schedule row holds at once (forwards run and not yet
  backward: M under GPipe, min(P - s, M) under 1F1B), nothing recomputed.
Not counted: the embedding and LM head (not in the profile either), the CUDA context, the
allocator's fragmentation, communication buffers: the margin left is the room for them.
The capacity is the device's published memory (testbed.rules.devices).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.rules.costs import stage_costs
from testbed.rules.devices import device_of
from testbed.rules.schedule import parse_action, schedule_table
from testbed.spec.errors import ScenarioError
from testbed.spec.profiles import load_profile

if TYPE_CHECKING:
    from testbed.spec.training import TrainConfig

STATE_BYTES_PER_PARAM = 16
GB = 1e9


@dataclass(frozen=True, kw_only=True, slots=True)
class StageMemory:
    stage: int
    layers: int
    in_flight: int              # micro-batches whose activations the stage holds at its peak
    state_bytes: float          # per GPU: weights, gradients, optimizer state
    activation_bytes: float     # per GPU, at the peak
    capacity_bytes: float
    device: str

    @property
    def total_bytes(self) -> float:
        return self.state_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def figures(self) -> str:
        return (f"{self.total_bytes / GB:.1f} GB of {self.capacity_bytes / GB:.0f} GB "
                f"(weights, gradients and Adam {self.state_bytes / GB:.1f}, activations of "
                f"{self.in_flight} micro-batch{'es' if self.in_flight != 1 else ''} "
                f"{self.activation_bytes / GB:.1f})")

    def line(self) -> str:
        return f"stage {self.stage}: {self.figures()}"

    def to_dict(self) -> dict:
        return {"stage": self.stage, "layers": self.layers, "in_flight": self.in_flight,
                "state_gb": self.state_bytes / GB, "activation_gb": self.activation_bytes / GB,
                "total_gb": self.total_bytes / GB, "capacity_gb": self.capacity_bytes / GB,
                "fits": self.fits}


def in_flight(row: list[str]) -> int:
    """The most micro-batches a schedule row has run forward and not yet backward."""
    held = most = 0
    for action in row:
        kind, _ = parse_action(action)
        held += 1 if kind == "F" else -1 if kind == "B" else 0
        most = max(most, held)
    return most


def activation_bytes_per_block(seq: int, micro_batch: int, width: int, tp: int) -> float:
    """One block's stored activations for one micro-batch, per GPU (module docstring)."""
    return seq * micro_batch * width * (10 + 24 / tp)


def stage_memory(cfg: "TrainConfig") -> list[StageMemory]:
    """Per-stage memory of one GPU (module docstring); [] where compute is not a profile."""
    prof = cfg.profile
    if cfg.compute != "profile" or prof is None:
        return []
    device = device_of(load_profile(prof.file))
    per_block = activation_bytes_per_block(prof.seq, prof.micro_batch, prof.width, cfg.tp)
    table = schedule_table(cfg.schedule, cfg.stages, cfg.micro_batches)
    out = []
    for s, cost in enumerate(stage_costs(prof, cfg.stages, cfg.tp)):
        held = in_flight(table[s])
        out.append(StageMemory(stage=s, layers=cost.layers, in_flight=held,
                               state_bytes=cost.params / cfg.tp * STATE_BYTES_PER_PARAM,
                               activation_bytes=cost.layers * held * per_block,
                               capacity_bytes=device.memory_bytes, device=device.name))
    return out


def check_memory(cfg: "TrainConfig", field: str = "training") -> list[StageMemory]:
    """stage_memory, or ScenarioError naming the first stage that does not fit and the fixes."""
    if cfg.compute == "profile" and cfg.profile is not None and cfg.tp > 1:
        device = device_of(load_profile(cfg.profile.file))
        if cfg.tp > device.gpus_per_node:
            raise ScenarioError(f"{field}.tp", f"{cfg.tp} GPUs, past the {device.gpus_per_node} "
                                f"an {device.name} node's NVLink joins",
                                f"set tp to at most {device.gpus_per_node}; add stages instead")
    stages = stage_memory(cfg)
    for m in stages:
        if not m.fits:
            raise ScenarioError(
                f"{field}.stages", f"stage {m.stage} does not fit on one {m.device}: "
                f"{m.figures()}",
                "more stages (fewer blocks each), training.tp (tensor parallelism inside a "
                "node), or fewer micro-batches in flight (schedule: 1f1b)")
    return stages


def summary(stages: list[StageMemory]) -> str:
    """One line: the per-GPU memory range over the stages and the fullest stage."""
    if not stages:
        return ""
    top = max(stages, key=lambda m: m.total_bytes)
    low = min(m.total_bytes for m in stages) / GB
    return (f"memory per GPU ({top.device}, {top.capacity_bytes / GB:.0f} GB): "
            f"{low:.1f}-{top.total_bytes / GB:.1f} GB over {len(stages)} stages; fullest "
            + top.line())
