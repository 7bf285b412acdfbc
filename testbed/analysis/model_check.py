"""The model beside a run: predicted next to measured, with the errors, for one system.

One job: compare. `compare(prediction, metrics)` takes testbed.predict.predict's figures and a system's
metrics block (real time) and returns {"predicted", "measured", "error", "within_target"};
`summary_line` says it in one line for the run's summary. Targets (issue: every shipped
scenario and system): iteration time within 10 %, bubble fraction within 5 points (0.05). A
+bubbletea system adds `bubbletea`: GPU utilization with prefill, requests/s, TTFT, misses and
the unused bubble's causes, predicted (testbed.predict.bubbletea) next to measured, without a target.
`emulation` says what the emulation itself added (emulation_overheads), beside the errors.
"""

from __future__ import annotations

from typing import Any

from testbed.predict.predict import Prediction
from testbed.spec.timescale import TimeScale

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
    out = {"predicted": predicted, "measured": measured, "error": error,
           "targets": {"iteration_time_rel": ITERATION_REL_TARGET,
                       "bubble_fraction_abs": BUBBLE_ABS_TARGET},
           "within_target": abs(it_err) <= ITERATION_REL_TARGET
           and abs(error["bubble_fraction_abs"]) <= BUBBLE_ABS_TARGET}
    out["emulation"] = emulation_overheads(metrics, predicted["allreduce_ms"])
    if pred.bubbletea is not None and metrics.get("bubbletea"):
        out["bubbletea"] = compare_bubbletea(pred.bubbletea, metrics["bubbletea"])
    return out


def emulation_overheads(metrics: dict[str, Any], predicted_allreduce_ms: list[float]
                        ) -> dict[str, Any]:
    """What this machine's emulation added that the model (and the real system) would not, in
    real ms: compute ops past their profile holds (testbed.rules.figures' compute_overruns, per
    averaged iteration; beside them the workers' start latency, summed over workers: only the
    part on the critical path slows the iteration), each stage's all-reduce past the model's,
    and per temporal WAN slot the arbiter's turn-taking (testbed.features.temporal.run.slot_overheads_ms).
    Where a run misses the model, these say how much of the miss is the emulation's."""
    over = metrics.get("compute_overruns") or {}
    n = len(metrics.get("iterations_averaged") or []) or 1
    ts = TimeScale(metrics.get("time_scale") or 1.0)   # the run's, a number in metrics.json
    iterations = metrics.get("iterations") or 1
    slots = {}
    for link, v in (metrics.get("wan_links") or {}).items():
        if v.get("slot_over_wire_ms_median") is None:
            continue
        slots[link] = {"over_wire_ms": ts.real_span(v["slot_over_wire_ms_median"]),
                       "handover_ms": ts.real_span(v.get("handover_ms_median") or 0.0),
                       "per_iteration": (v.get("slots") or 0) / iterations}
    measured_ar = [a["measured_ms"] for a in metrics.get("allreduce", [])]
    return {"compute_overrun_ms_per_iteration": over.get("total_ms", 0.0) / n,
            "compute_overruns": over.get("count", 0),
            "start_latency_ms_per_iteration": over.get("start_latency_total_ms", 0.0) / n,
            "allreduce_over_model_ms": [m - p for m, p in zip(measured_ar,
                                                              predicted_allreduce_ms)],
            "wan_slots": slots}


def _emulation_clause(e: dict[str, Any] | None) -> str:
    if not e:
        return ""
    parts = []
    if e["compute_overruns"]:
        parts.append(f"{e['compute_overrun_ms_per_iteration']:.1f} ms per iteration of compute "
                     f"past its holds ({e['compute_overruns']} ops)")
    if e.get("start_latency_ms_per_iteration", 0.0) >= 0.05:
        parts.append(f"{e['start_latency_ms_per_iteration']:.1f} ms per iteration of the "
                     "workers' start latency (all workers)")
    extra = [x for x in e["allreduce_over_model_ms"] if x > 0.5]
    if extra:
        parts.append(f"all-reduce +{min(extra):.1f}..{max(extra):.1f} ms")
    for link, v in sorted(e["wan_slots"].items()):
        parts.append(f"{link} slots +{v['over_wire_ms']:.1f} ms held and {v['handover_ms']:.1f} "
                     f"ms hand-over each ({v['per_iteration']:.0f} per iteration)")
    return "; the emulation added " + ", ".join(parts) if parts else ""


def compare_bubbletea(pred: dict[str, Any], meas: dict[str, Any]) -> dict[str, Any]:
    """BubbleTea's figures, predicted (testbed.predict.bubbletea) next to measured (testbed.rules.bubbletea_figures);
    no target: reported."""
    def figures(b: dict[str, Any]) -> dict[str, Any]:
        pf = b["prefill"]
        return {"gpu_utilization": b["gpu_utilization"], "training_only": b["training_only"],
                "prefill_share": b["prefill_share"], "requests_per_s": pf["requests_per_s"],
                "prompt_tokens_per_s": pf["prompt_tokens_per_s"],
                "ttft_p50_ms": pf["ttft_ms"]["p50"], "ttft_p99_ms": pf["ttft_ms"]["p99"],
                "deadline_misses": pf["deadline_misses"],
                "unused_by_cause": b["unused_bubble"]["share_by_cause"]}
    p, m = figures(pred), figures(meas)
    return {"predicted": p, "measured": m,
            "error": {"gpu_utilization_abs": p["gpu_utilization"] - m["gpu_utilization"],
                      "requests_per_s_rel": (p["requests_per_s"] / m["requests_per_s"] - 1.0
                                             if m["requests_per_s"] else None)}}


def summary_line(check: dict[str, Any]) -> str:
    p, m, e = check["predicted"], check["measured"], check["error"]
    flag = "" if check["within_target"] else " (outside the targets: 10% / 5 points)"
    return (f"model: iteration {p['iteration_time_s']:.3f} s predicted vs "
            f"{m['iteration_time_s']:.3f} s measured ({e['iteration_time_rel']:+.1%}), bubble "
            f"{p['bubble_fraction']:.1%} vs {m['bubble_fraction']:.1%} "
            f"({100 * e['bubble_fraction_abs']:+.1f} points), GPU utilization "
            f"{p['gpu_utilization']:.1%} vs {m['gpu_utilization']:.1%}{flag}"
            + _emulation_clause(check.get("emulation"))
            + _bubbletea_line(check.get("bubbletea"))
            + (f"; the model leaves out {check['left_out']}" if check.get("left_out") else ""))


def _bubbletea_line(bt: dict[str, Any] | None) -> str:
    if bt is None:
        return ""
    p, m = bt["predicted"], bt["measured"]
    return (f"; with BubbleTea {p['gpu_utilization']:.1%} vs {m['gpu_utilization']:.1%}, "
            f"{p['requests_per_s']:.1f} vs {m['requests_per_s']:.1f} requests/s")
