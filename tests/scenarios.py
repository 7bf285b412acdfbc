"""Small scenarios the network tests build, and writing them as YAML files.

GEODC_TEST_BACKEND=netem|delayline forces the backend of every scenario the tests write (or
pass through with_test_backend) that names none, so each backend's tests run on either kind
of kernel: the stock-kernel ring (`make test-stock-kernel`) runs them once per backend in a
guest whose kernel has netem. Unset: the scenario's own field (auto). With netem forced on a
kernel without it, tests/conftest.py skips the network tests, saying so.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def two_dc(prefix: str, delay_ms: float = 5, rate_mbit: float = 20) -> dict:
    """DCs '<prefix>a' and '<prefix>b', one host each, one WAN link."""
    a, b = f"{prefix}a", f"{prefix}b"
    return {"name": f"two_{prefix}",
            "dcs": [{"name": a, "hosts": 1}, {"name": b, "hosts": 1}],
            "wan": [{"between": [a, b], "delay_ms": delay_ms, "rate_mbit": rate_mbit}]}


BACKENDS = ("netem", "delayline")
TEST_BACKEND = os.environ.get("GEODC_TEST_BACKEND", "")


def with_test_backend(data: dict) -> dict:
    """data with `backend` set to GEODC_TEST_BACKEND when that is set and data names none."""
    if TEST_BACKEND and "backend" not in data:
        return {**data, "backend": TEST_BACKEND}
    return data


def write_scenario(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = with_test_backend(data)
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def generated_scenario(rng, slow_start: bool = False) -> dict:
    """A predict-only scenario document drawn with rng (random.Random): P stages x D replicas
    (2-4 x 9-64) over a chain of DCs, a whole stage per DC or DC sizes that split stages; 1, 4
    or auto connections; several delays, rates, widths; 1F1B or GPipe."""
    P, D = rng.randint(2, 4), rng.randint(9, 64)
    if rng.random() < 0.5:
        sizes = [D] * P
    else:
        cuts = sorted(rng.sample(range(1, P * D), rng.randint(1, 3)))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, P * D])]
    return {
        "name": "generated", "scale": 100, "predict_only": True,
        "connections": rng.choice([1, 4, "auto"]), "tcp_slow_start_after_idle": slow_start,
        "dcs": [{"name": f"d{i}", "hosts": s + 2, "rate_mbit": 1000} for i, s in enumerate(sizes)],
        "wan": [{"between": [f"d{i}", f"d{i + 1}"], "delay_ms": rng.choice([5, 20, 40, 80]),
                 "rate_mbit": rng.choice([50, 100, 400])} for i in range(len(sizes) - 1)],
        "systems": ["baseline", "multitcp", "atlas"],
        "training": {
            "model": {"n_layer": 4 * P, "n_embd": 64, "n_head": 4, "seq_len": 32,
                      "vocab_size": 256},
            "stages": P, "replicas": D, "micro_batches": rng.choice([4, 8]),
            "micro_batch_size": 1, "schedule": rng.choice(["1f1b", "gpipe"]),
            "iterations": 3, "compute": "profile",
            "profile": {"file": "h200-transformer.json", "width": rng.choice([2048, 4096]),
                        "seq": 2048, "micro_batch": 1, "n_layer": 32}}}
