"""Training metrics from a finished run's files: bubbles, GPU utilization, throughput, loss.

One job: numbers from records. Reads only trainer_spans.jsonl, trainer_loss.jsonl and
trainer_plan.json (written by testbed/run/launch.py); no torch, no network, no processes, so tables
rebuild anywhere.

Per iteration i: start_i = earliest compute start (F, B, OPT) over all workers; wall_i =
start_{i+1} - start_i (so the gap between iterations counts), and for the last iteration its own
span, start_i to its latest compute end. Per worker: compute_i = sum of its F + B + OPT durations;
gpu_utilization_i = compute_i / wall_i (the paper's metric: compute over wall per host);
bubble_i = 1 - that, so idle includes waiting for activations, gradients, the all-reduce and
whatever runs between iterations. `iteration_time_s` is the mean wall, and `tokens_per_s` the
tokens of one iteration over it. Averages skip iteration 0 (warm-up) when there are >= 3
iterations. The run's figures are means over workers.

Tokens: in profile mode the run stands for the target model, so `tokens_per_s` counts the
target's tokens (D * M * profile.micro_batch * profile.seq per iteration) and
`model_tokens_per_s` the small model's own (D * M * micro_batch_size * seq_len); in measured mode
both are the small model's.

`compute_overruns`: in profile mode every F, B and OPT is held to its profile time; an op whose
real CPU time (its span's compute_ns: the small model's work, before the hold) exceeds that hold
lasted longer than the profile says. They are counted over the measured iterations (count, of how
many ops, total and largest excess) and the run's summary warns: the emulation added that time.
Beside them, `start_latency_total_ms` / `start_latency_max_ms`: the late_ns of those ops (the
worker got to an op that long after it was ready: trainer.worker), time a GPU would not lose.

`pipeline_bubble_fraction` is the same over F and B only (window from the first forward to the
last backward of the iteration, excluding the all-reduce, the optimizer step and the gap to the
next iteration): the quantity the textbook formula (P-1)/(M+P-1) and testbed/rules/schedule.py's
simulator predict.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Sequence

from testbed.rules.spans import COMPUTE_SPANS
from testbed.rules.schedule import bubble_fraction as formula_bubble
from testbed.spec.timescale import TimeScale


def _cv(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


def iterations_used(n_iterations: int) -> list[int]:
    return list(range(1, n_iterations)) if n_iterations >= 3 else list(range(n_iterations))


def iteration_windows(spans: Sequence[dict],
                      names: Sequence[str] = COMPUTE_SPANS) -> dict[int, tuple[int, int]]:
    """iteration -> (first start ns, last end ns) of the named spans (default: compute) over
    all workers."""
    win: dict[int, tuple[int, int]] = {}
    for r in spans:
        if r["name"] in names and r.get("iteration") is not None:
            lo, hi = win.get(r["iteration"], (r["t_start_ns"], r["t_end_ns"]))
            win[r["iteration"]] = (min(lo, r["t_start_ns"]), max(hi, r["t_end_ns"]))
    return win


def iteration_walls(windows: dict[int, tuple[int, int]]) -> dict[int, int]:
    """iteration -> wall ns: from its start to the next iteration's start; the last iteration
    (no next start) to its own end."""
    its = sorted(windows)
    walls = {a: windows[b][0] - windows[a][0] for a, b in zip(its, its[1:])}
    if its:
        walls[its[-1]] = windows[its[-1]][1] - windows[its[-1]][0]
    return walls


def _count_overrun(over: dict, span: dict, holds: dict[str, float]) -> None:
    """Add span to the compute overruns (module docstring) if it has a hold and outlasted it."""
    hold_ms = holds.get(span["name"], 0.0)
    if hold_ms <= 0 or "compute_ns" not in span:
        return
    over["ops"] += 1
    late_ms = span.get("late_ns", 0) / 1e6
    over["start_latency_total_ms"] += late_ms
    over["start_latency_max_ms"] = max(over["start_latency_max_ms"], late_ms)
    excess_ms = span["compute_ns"] / 1e6 - hold_ms
    if excess_ms > 0:
        over["count"] += 1
        over["by_op"][span["name"]] += 1
        over["total_ms"] += excess_ms
        over["max_ms"] = max(over["max_ms"], excess_ms)


def metrics_from_records(spans: Sequence[dict], losses: Sequence[dict], plan: dict,
                         weights: dict[int, float] | None = None) -> dict:
    """The run's figures (module docstring). weights: how many iterations each averaged one
    stands for (default one each); the model gives a steady iteration the weight of the
    iterations it was not simulated for (testbed.predict.steady)."""
    cfg = plan["config"]
    P, D, M = cfg["stages"], cfg["replicas"], cfg["micro_batches"]
    windows = iteration_windows(spans)
    pp_windows = iteration_windows(spans, ("F", "B"))
    n_it = len(windows)
    if n_it == 0:
        raise ValueError("no compute spans in the run's records")
    if sorted(windows) != list(range(n_it)):
        raise ValueError(f"iterations {sorted(windows)} in the records are not 0..{n_it - 1}")
    walls = iteration_walls(windows)
    used = iterations_used(n_it)

    def mean(by_it) -> float:
        """The mean over the averaged iterations of by_it(it), weighted by `weights`."""
        if weights is None:
            return statistics.fmean(by_it(it) for it in used)
        return (sum(weights.get(it, 1.0) * by_it(it) for it in used)
                / sum(weights.get(it, 1.0) for it in used))
    compute = defaultdict(float)                      # (stage, replica, it) -> ns
    compute_pp = defaultdict(float)                   # same, F and B only
    op_ms = defaultdict(list)                          # (stage, replica, name) -> [ms]
    comm = defaultdict(lambda: {"count": 0, "bytes": 0, "total_s": 0.0})
    holds = {(w["stage"], w["replica"]): {"F": w.get("hold_forward_ms", 0.0),
                                         "B": w.get("hold_backward_ms", 0.0),
                                         "OPT": w.get("hold_opt_ms", 0.0)}
             for w in plan["workers"]}
    over = {"count": 0, "ops": 0, "total_ms": 0.0, "max_ms": 0.0,
            "by_op": {"F": 0, "B": 0, "OPT": 0},
            "start_latency_total_ms": 0.0, "start_latency_max_ms": 0.0}
    for r in spans:
        it, dur = r.get("iteration"), r["t_end_ns"] - r["t_start_ns"]
        if r["name"] in COMPUTE_SPANS and it is not None:
            compute[(r["stage"], r["replica"], it)] += dur
            if r["name"] != "OPT":
                compute_pp[(r["stage"], r["replica"], it)] += dur
            if it in used:
                op_ms[(r["stage"], r["replica"], r["name"])].append(dur / 1e6)
                _count_overrun(over, r, holds.get((r["stage"], r["replica"]), {}))
        elif r["name"] not in ("SETUP", "GPU_WAIT", "IDLE") and it in used:
            c = comm[r["name"]]
            c["count"] += 1
            c["bytes"] += r.get("bytes") or 0
            c["total_s"] += dur / 1e9
    workers = {(w["stage"], w["replica"]): w for w in plan["workers"]}
    stages_out = []
    for (s, rep), w in sorted(workers.items()):
        util = mean(lambda it: compute[(s, rep, it)] / walls[it])
        pp_util = mean(lambda it: compute_pp[(s, rep, it)] / (pp_windows[it][1]
                                                               - pp_windows[it][0]))
        stages_out.append({
            "stage": s, "replica": rep, "dc": w["dc"], "host": w["host"],
            "bubble_fraction": 1.0 - util, "gpu_utilization": util,
            "pipeline_bubble_fraction": 1.0 - pp_util,
            "compute_s": mean(lambda it: compute[(s, rep, it)]) / 1e9,
            "forward_ms": _mean(op_ms[(s, rep, "F")]), "backward_ms": _mean(op_ms[(s, rep, "B")]),
            "forward_cv": _cv(op_ms[(s, rep, "F")]), "backward_cv": _cv(op_ms[(s, rep, "B")]),
        })
    iteration_time_s = mean(lambda it: walls[it]) / 1e9
    util = statistics.fmean(x["gpu_utilization"] for x in stages_out)
    model_tokens = D * M * cfg["micro_batch_size"] * cfg["model"]["seq_len"]
    # In profile mode the run stands for the target model: its tokens per iteration too.
    if cfg["compute"] == "profile":
        tokens = D * M * cfg["profile"]["micro_batch"] * cfg["profile"]["seq"]
    else:
        tokens = model_tokens
    return {
        "iteration_time_s": iteration_time_s,
        "tokens_per_s": tokens / iteration_time_s,
        "model_tokens_per_s": model_tokens / iteration_time_s,
        "bubble_fraction": 1.0 - util,
        "gpu_utilization": util,
        "pipeline_bubble_fraction": statistics.fmean(x["pipeline_bubble_fraction"]
                                                     for x in stages_out),
        "bubble_fraction_formula": formula_bubble(P, M),
        "loss": loss_per_iteration(losses),
        "stages": stages_out,
        "compute": cfg["compute"],
        "schedule": cfg["schedule"],
        "n_stages": P, "replicas": D, "micro_batches": M,
        "iterations": n_it, "iterations_averaged": used,
        "iteration_walls_s": [walls[i] / 1e9 for i in range(n_it)],
        "op_duration_cv_max": max((max(x["forward_cv"], x["backward_cv"]) for x in stages_out),
                                  default=0.0),
        "communication": {k: dict(v) for k, v in sorted(comm.items())},
        "compute_only": plan.get("compute_only", {}),
        "compute_overruns": over,
        "scale": plan.get("scale"),
    }


def in_real_time(metrics: dict[str, Any], time_scale: TimeScale | float) -> dict[str, Any]:
    """Metrics of a run on a network and GPUs dilated by time_scale (testbed.spec.scenario's
    `time_scale`: every delay and profile hold T times longer, rates T times lower), as real-time
    figures: times divided by T, throughputs multiplied; fractions stay. In place; returns it.
    The small model's real CPU time (the optimizer step, the parts outside the profile holds) is
    not dilated, so it shrinks by T here: with T > 1 it is under-counted."""
    ts = TimeScale.of(time_scale)
    metrics["time_scale"] = ts.factor
    if not ts.dilated:
        return metrics
    metrics["iteration_time_s"] = ts.real_span(metrics["iteration_time_s"])
    metrics["iteration_walls_s"] = [ts.real_span(w) for w in metrics.get("iteration_walls_s", [])]
    metrics["tokens_per_s"] = ts.real_rate(metrics["tokens_per_s"])
    metrics["model_tokens_per_s"] = ts.real_rate(metrics["model_tokens_per_s"])
    for st in metrics["stages"]:
        for key in ("compute_s", "forward_ms", "backward_ms"):
            st[key] = ts.real_span(st[key])
    for c in metrics["communication"].values():
        c["total_s"] = ts.real_span(c["total_s"])
    if "compute_overruns" in metrics:
        over = metrics["compute_overruns"]
        for key in ("total_ms", "max_ms", "start_latency_total_ms", "start_latency_max_ms"):
            over[key] = ts.real_span(over[key])
    if metrics.get("compute_only", {}).get("iteration_time_s") is not None:
        metrics["compute_only"] = dict(
            metrics["compute_only"],
            iteration_time_s=ts.real_span(metrics["compute_only"]["iteration_time_s"]))
    metrics["figures"] = (f"real time: measured {ts}x slower (time_scale), divided back; the "
                          "timeline and the delay lines' counters stay in emulated time")
    return metrics


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def loss_per_iteration(losses: Sequence[dict]) -> list[float]:
    """Mean over the last stage's replicas of each replica's mean micro-batch loss."""
    by_it: dict[int, list[float]] = defaultdict(list)
    for r in losses:
        by_it[r["iteration"]].append(r["loss"])
    return [statistics.fmean(by_it[it]) for it in sorted(by_it)]
