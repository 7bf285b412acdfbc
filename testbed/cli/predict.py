"""`run_testbed.py predict SCENARIO [--systems a,b] [--json]`: the model's figures per system,
without building anything (no root, no network, no torch).

One job: format testbed.predict.predict's predictions for the scenario's systems as a table or one JSON
document; per system the speedup against baseline, or where baseline is not among the systems
against the first one listed (a line says which), and for a +bubbletea system a line of
BubbleTea's predicted figures (testbed.predict.bubbletea), counts with what they are counted of.
With --plan N: the N fastest stage-to-DC assignments instead (testbed.predict.planner). A scenario with a
sweep: every point in turn.
"""

from __future__ import annotations

import json
import time
from typing import Sequence

from testbed.spec.errors import ScenarioError
from testbed.cli.planview import load_training, resolve_systems
from testbed.spec.scenario import load_scenario


def predict_command(path: str, systems: Sequence[str] | None = None,
                    as_json: bool = False, plan_top: int | None = None) -> str:
    scenario = load_scenario(path)
    if not scenario.sweep:
        return _predict_one(scenario, systems, as_json, plan_top)
    from testbed.spec.scenario import parse_scenario
    from testbed.spec.sweep import expand
    out = []
    docs = []
    for point in expand(dict(scenario.raw)):       # a sweep: every point, as `run` would
        one = parse_scenario(point.doc, path=scenario.path)
        text = _predict_one(one, systems, as_json, plan_top)
        if as_json:
            docs.append(dict(json.loads(text), point=point.index, values=point.values))
        else:
            out.append(f"sweep point {point.index} ({json.dumps(point.values)}):\n{text}")
    if as_json:
        return json.dumps({"scenario": scenario.name, "points": docs}, indent=1)
    return "\n\n".join(out)


def _predict_one(scenario, systems: Sequence[str] | None, as_json: bool,
                 plan_top: int | None) -> str:
    from testbed.predict.predict import predict
    cfg = load_training(scenario)
    if cfg.compute != "profile":
        raise ScenarioError("training.compute", "the model needs profile mode (measured op "
                            "times are not known before a run)", "set compute: profile")
    if plan_top is not None:
        from testbed.predict.planner import plan_options, plan_text
        options = plan_options(scenario, cfg)
        if as_json:
            return json.dumps({"scenario": scenario.name, "options": [
                {"stage_dcs": list(o.stage_dcs), **o.prediction.to_dict()}
                for o in options[:plan_top]]}, indent=1)
        return plan_text(scenario, options, plan_top)
    from testbed.cli.ticker import Ticker
    from testbed.predict.unmodelled import unmodelled
    from testbed.plans.systems import capped_connections
    from testbed.rules.memory import stage_memory, summary as memory_summary
    rows = []
    t0 = time.perf_counter()
    chosen = resolve_systems(scenario, systems)
    ticker = Ticker(f"predict {scenario.name}")
    for i, system in enumerate(chosen, 1):
        ticker(f"{system.name} ({i} of {len(chosen)} systems)")
        rows.append(predict(scenario, cfg, system,
                            progress=lambda text: ticker(f"{system.name}: {text}")))
    ticker.done()
    took_s = time.perf_counter() - t0
    left_out = unmodelled(scenario)
    ref = next((p for p in rows if p.system == "baseline"), rows[0])
    base = ref.iteration_time_s
    memory = stage_memory(cfg)
    if as_json:
        return json.dumps({"scenario": scenario.name, "seconds": took_s,
                           "speedup_against": ref.system, "not_modelled": left_out,
                           "tp": cfg.tp, "memory_per_gpu": [m.to_dict() for m in memory],
                           "connections_capped": capped_connections(scenario),
                           "systems": [dict(p.to_dict(), speedup=base / p.iteration_time_s)
                                       for p in rows]}, indent=1)
    out = [f"{scenario.name}: model of P={cfg.stages} D={cfg.replicas} M={cfg.micro_batches} "
           f"{cfg.schedule}" + (f" TP={cfg.tp} (a host is {cfg.tp} GPUs)" if cfg.tp > 1 else "")
           + f", {rows[0].iterations} iterations ({took_s:.2f} s)",
           memory_summary(memory),
           f"speedup: against {ref.system}" + ("" if ref.system == "baseline"
                                                else " (baseline not among the systems)"),
           f"{'system':<24} {'iteration s':>11} {'speedup':>8} {'bubble':>7} {'GPU util':>8}"
           "  WAN utilization"]
    for p in rows:
        wan = ", ".join(f"{k} {v:.0%}" for k, v in p.wan_utilization.items()) or "-"
        out.append(f"{p.system:<24} {p.iteration_time_s:>11.3f} "
                   f"{base / p.iteration_time_s:>7.2f}x {p.bubble_fraction:>7.1%} "
                   f"{p.gpu_utilization:>8.1%}  {wan}")
    for p in rows:
        if p.wan_drop_packets:
            out.append(f"{p.system}: WAN queues drop bursts (packets per iteration, each sent "
                       "again a round trip later): " + ", ".join(
                           f"{k} {v:,.0f}" for k, v in p.wan_drop_packets.items())
                       + (f" (alike replicas folded, {p.simulated_replicas} simulated of "
                          f"{cfg.replicas}: with drops the fold is approximate, within 2% of "
                          "every replica simulated on 257 of 260 generated scenarios, +13.5% "
                          "the worst found)"
                          if p.simulated_replicas < cfg.replicas else ""))
    for p in rows:
        if p.bubbletea is not None:
            out.append(bubbletea_text(p.system, p.bubbletea))
    if rows[0].steady:
        out.append(rows[0].steady)
    out += capped_connections(scenario)
    out += [f"not in the model: {line}" for line in left_out]
    if scenario.time_scale_auto and not scenario.predict_only:
        from testbed.cli.show import auto_line, auto_record
        out.append(auto_line(auto_record(scenario)))
    else:
        wall = scenario.dilation.emulated_span(sum(p.iteration_time_s for p in rows) * cfg.iterations)
        out.append(f"time_scale {scenario.time_scale:g}: training takes about {wall:,.0f} s of "
                   "wall clock (the model's iteration times x T x iterations)")
    return "\n".join(out)


def bubbletea_text(system: str, bt: dict) -> str:
    """One line of testbed.predict.bubbletea's figures."""
    pf, load = bt["prefill"], bt["load"]
    ttft = pf["ttft_ms"]
    causes = sorted(bt["unused_bubble"]["share_by_cause"].items(), key=lambda kv: -kv[1])
    requests = sum(pf["outcomes"].values())
    misses = pf["deadline_misses"]
    return (f"{system}: GPU utilization {bt['gpu_utilization']:.1%} (training "
            f"{bt['training_only']:.1%} + prefill {bt['prefill_share']:.1%}), "
            f"{_rate(pf['requests_per_s'])} requests/s served of "
            f"{_rate(load.get('offered_per_s', 0.0))} offered, TTFT p50/p99 "
            + ("-" if ttft["p50"] is None else f"{ttft['p50']:.0f}/{ttft['p99']:.0f} ms")
            + f", deadline misses {misses:,} of {requests:,} requests"
            + (f" ({misses / requests:.0%})" if requests else "") + ", unused bubble: "
            + ", ".join(f"{c} {v:.0%}" for c, v in causes[:3] if v > 0)
            + (f"; training {bt['training_slowdown']:+.1%} ({bt['training_slowdown_h200']:+.1%} "
               "on an H200)" if "training_slowdown" in bt else "")
            + ("" if not pf["kv_transfer_ms"].get("n") else
               f", KV to decode p50/p99 {pf['kv_transfer_ms']['p50']:.1f}/"
               f"{pf['kv_transfer_ms']['p99']:.1f} ms"))


def _rate(per_s: float) -> str:
    return f"{per_s:,.0f}" if per_s >= 1000 else f"{per_s:.1f}"
