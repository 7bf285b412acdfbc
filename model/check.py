"""The model beside a run: predicted next to measured, with the errors, for one system.

One job: compare. `compare(prediction, metrics)` takes model.predict's figures and a system's
metrics block (real time) and returns {"predicted", "measured", "error", "within_target"};
`summary_line` says it in one line for the run's summary. Targets (issue: every shipped
scenario and system): iteration time within 10 %, bubble fraction within 0.05 absolute.
"""

from __future__ import annotations

from typing import Any

from model.predict import Prediction

ITERATION_REL_TARGET = 0.10
BUBBLE_ABS_TARGET = 0.05


def compare(pred: Prediction, metrics: dict[str, Any]) -> dict[str, Any]:
    measured = {"iteration_time_s": metrics["iteration_time_s"],
                "bubble_fraction": metrics["bubble_fraction"],
                "gpu_utilization": metrics["gpu_utilization"],
                "pipeline_bubble_fraction": metrics["pipeline_bubble_fraction"],
                "per_stage_bubble": [st["bubble_fraction"] for st in metrics["stages"]],
                "wan_utilization": {k: v["utilization"]
                                    for k, v in metrics.get("wan_links", {}).items()
                                    if "utilization" in v},
                "allreduce_ms": [a["measured_ms"] for a in metrics.get("allreduce", [])]}
    predicted = pred.to_dict()
    it_err = pred.iteration_time_s / measured["iteration_time_s"] - 1.0
    error = {"iteration_time_rel": it_err,
             "bubble_fraction_abs": pred.bubble_fraction - measured["bubble_fraction"],
             "gpu_utilization_abs": pred.gpu_utilization - measured["gpu_utilization"],
             "wan_utilization_abs": {k: pred.wan_utilization.get(k, 0.0) - v
                                     for k, v in measured["wan_utilization"].items()}}
    return {"predicted": predicted, "measured": measured, "error": error,
            "targets": {"iteration_time_rel": ITERATION_REL_TARGET,
                        "bubble_fraction_abs": BUBBLE_ABS_TARGET},
            "within_target": abs(it_err) <= ITERATION_REL_TARGET
            and abs(error["bubble_fraction_abs"]) <= BUBBLE_ABS_TARGET}


def summary_line(check: dict[str, Any]) -> str:
    p, m, e = check["predicted"], check["measured"], check["error"]
    flag = "" if check["within_target"] else " (outside the targets: 10% / 0.05)"
    return (f"model: iteration {p['iteration_time_s']:.3f} s predicted vs "
            f"{m['iteration_time_s']:.3f} s measured ({e['iteration_time_rel']:+.1%}), bubble "
            f"{p['bubble_fraction']:.3f} vs {m['bubble_fraction']:.3f} "
            f"({e['bubble_fraction_abs']:+.3f}), GPU utilization {p['gpu_utilization']:.3f} vs "
            f"{m['gpu_utilization']:.3f}{flag}")
