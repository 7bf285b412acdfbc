"""Small scenarios the network tests build, and writing them as YAML files."""

from __future__ import annotations

from pathlib import Path

import yaml


def two_dc(prefix: str, delay_ms: float = 5, rate_mbit: float = 20) -> dict:
    """DCs '<prefix>a' and '<prefix>b', one host each, one WAN link."""
    a, b = f"{prefix}a", f"{prefix}b"
    return {"name": f"two_{prefix}",
            "dcs": [{"name": a, "hosts": 1}, {"name": b, "hosts": 1}],
            "wan": [{"between": [a, b], "delay_ms": delay_ms, "rate_mbit": rate_mbit}]}


def write_scenario(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
