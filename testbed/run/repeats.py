"""A system run N times (`run --repeat N`, each on a fresh network) as one metrics block.

One job: combine. The block is the first repeat's, with its headline figures (HEADLINE) the
mean over the repeats, and `repeats` beside them: n, each repeat's folder, and per headline
figure its values, mean, sample standard deviation, min and max. The model's comparison is
made again against the means (the prediction is one and the same). Every other field (per
stage, per link, the timeline) is the first repeat's, and says so (`repeats.others_from`).
"""

from __future__ import annotations

import statistics
from typing import Any

HEADLINE = ("iteration_time_s", "tokens_per_s", "bubble_fraction", "gpu_utilization",
            "pipeline_bubble_fraction")


def spread(values: list[float]) -> dict[str, Any]:
    return {"values": values, "mean": statistics.fmean(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values)}


def combine(blocks: list[dict[str, Any]], folders: list[str]) -> dict[str, Any]:
    """One system's block from its repeats' (module docstring); blocks all complete."""
    out = dict(blocks[0])
    stats = {key: spread([b[key] for b in blocks]) for key in HEADLINE if key in blocks[0]}
    for key, s in stats.items():
        out[key] = s["mean"]
    out["repeats"] = {"n": len(blocks), "folders": folders, "others_from": folders[0], **stats}
    model = blocks[0].get("model")
    if model:
        out["model"] = _against_means(model, out)
    return out


def _against_means(model: dict[str, Any], block: dict[str, Any]) -> dict[str, Any]:
    pred = model["predicted"]
    measured = dict(model["measured"], iteration_time_s=block["iteration_time_s"],
                    bubble_fraction=block["bubble_fraction"],
                    gpu_utilization=block["gpu_utilization"])
    error = dict(model["error"],
                 iteration_time_rel=pred["iteration_time_s"] / block["iteration_time_s"] - 1.0,
                 bubble_fraction_abs=pred["bubble_fraction"] - block["bubble_fraction"],
                 gpu_utilization_abs=pred["gpu_utilization"] - block["gpu_utilization"])
    targets = model["targets"]
    return dict(model, measured=measured, error=error, within_target=(
        abs(error["iteration_time_rel"]) <= targets["iteration_time_rel"]
        and abs(error["bubble_fraction_abs"]) <= targets["bubble_fraction_abs"]))
