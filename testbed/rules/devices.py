"""Published figures of the GPUs whose compute profiles the scenarios use, by the profile's
`device` field: what the memory check and tensor parallelism need beside the measured block
times. Stated inputs from the vendor's datasheet, not measurements. Pure.

- NVIDIA H200 (SXM, HGX H200 datasheet): 141 GB of HBM3e at 4.8 TB/s; fourth-generation
  NVLink at 900 GB/s per GPU (both directions together, so 450 GB/s each way), 8 GPUs to an
  HGX node, all-to-all through NVSwitch.
"""

from __future__ import annotations

from dataclasses import dataclass

from testbed.spec.errors import ScenarioError, shown


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    name: str
    memory_bytes: float         # HBM capacity
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float   # one direction, per GPU
    gpus_per_node: int          # GPUs a node's NVLink joins (the most a TP group spans)


DEVICES = {
    "NVIDIA H200": Device(name="NVIDIA H200", memory_bytes=141e9, hbm_bytes_per_s=4.8e12,
                          nvlink_bytes_per_s=450e9, gpus_per_node=8),
}


def device_of(profile: dict, field: str = "training.profile.file") -> Device:
    """The published figures of the GPU a profile document says it was measured on."""
    name = profile.get("device")
    if name not in DEVICES:
        raise ScenarioError(field, f"the profile's device {shown(name)} has no published "
                            "figures here (memory, NVLink)",
                            f"use a profile measured on one of: {', '.join(DEVICES)}, or add "
                            "the device to testbed/rules/devices.py")
    return DEVICES[name]
