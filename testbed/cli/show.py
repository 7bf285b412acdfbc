"""`run_testbed.py show SCENARIO`: a scenario with every setting resolved, as text or JSON.
Pure: no root, no network, no Mininet, no torch.

One job: say what `run` would build and train, before it does: the settings with their defaults
filled in and what they derive (per-host TCP buffers and the window they give, K per WAN path),
the DCs with their hosts, subnets and host links, the WAN links with their queues, the routes,
the training and, per system, where each stage's replicas run (testbed.plans.placement).
"""

from __future__ import annotations

import json
from typing import Any

from testbed.spec.errors import ScenarioError
from testbed.spec.rates import real_rate_text
from testbed.plans.placement import place_for_system
from testbed.plans.routing import dc_paths
from testbed.spec.scenario import Scenario, load_scenario, scaled_tcp_rmem_max_bytes
from testbed.plans.systems import scenario_connections, window_bytes
from testbed.spec.systems import get_system
from testbed.plans.topo import make_plan


def describe(scenario: Scenario) -> dict[str, Any]:
    """The resolved scenario as one JSON-able document (module docstring)."""
    topo = make_plan(scenario.emulated()) if not scenario.predict_only else None
    doc: dict[str, Any] = {
        "name": scenario.name, "path": scenario.path, "description": scenario.description,
        "kind": "model only" if scenario.predict_only else (
            "network + training" if scenario.training is not None else "network only"),
        "settings": {"scale": scenario.scale, "time_scale": scenario.time_scale,
                     "backend": scenario.backend, "routing": scenario.routing,
                     "congestion_control": scenario.congestion_control,
                     "connections": scenario.connections,
                     "tcp_slow_start_after_idle": scenario.tcp_slow_start_after_idle,
                     "tcp_rmem_max_bytes": scaled_tcp_rmem_max_bytes(scenario.scale),
                     "window_bytes_per_connection": round(window_bytes(scenario.scale))},
        "dcs": [{"name": dc.name, "hosts": dc.hosts, "host_link_mbit": dc.rate_mbit,
                 "decode_hosts": dc.decode_hosts,
                 "subnet": topo.subnets[dc.name] if topo else None,
                 "first_host": f"{dc.name}-h1", "last_host": f"{dc.name}-h{dc.hosts}"}
                for dc in scenario.dcs],
        "wan": [{"between": list(w.between), "delay_ms": w.delay_ms, "rate_mbit": w.rate_mbit,
                 "jitter_ms": w.jitter_ms, "loss_pct": w.loss_pct, "queue_bytes": w.queue_bytes,
                 "bdp_bytes": w.bdp_bytes} for w in scenario.wan],
        "routes": [{"src": p.src, "dst": p.dst, "path": list(p.dcs), "delay_ms": p.delay_ms,
                    "connections": scenario_connections(scenario, p.src, p.dst)}
                   for p in dc_paths(scenario)],
    }
    if scenario.training is not None:
        from testbed.cli.planview import load_training
        cfg = load_training(scenario)
        doc["training"] = {"stages": cfg.stages, "replicas": cfg.replicas,
                           "micro_batches": cfg.micro_batches, "schedule": cfg.schedule,
                           "iterations": cfg.iterations, "compute": cfg.compute,
                           "profile": None if cfg.profile is None else {
                               "file": cfg.profile.file, "width": cfg.profile.width,
                               "seq": cfg.profile.seq, "micro_batch": cfg.profile.micro_batch,
                               "n_layer": cfg.profile.n_layer}}
        doc["systems"] = {}
        for i, name in enumerate(scenario.systems):
            system = get_system(name, f"systems[{i}]")
            try:
                placement = place_for_system(scenario, cfg, system)
            except ScenarioError as exc:
                doc["systems"][name] = {"error": str(exc)}
                continue
            doc["systems"][name] = {
                "placement": placement.policy, "connections": system.connections,
                "wan_sharing": system.wan_sharing, "bubbletea": system.fill_bubbles,
                "stage_dcs": [_runs(row) for row in placement.stage_dcs]}
    if scenario.bubbletea is not None:
        doc["bubbletea"] = scenario.bubbletea.to_dict()
    if scenario.faults:
        from testbed.spec.faults import events_of
        doc["faults"] = [e.describe() for e in events_of(scenario.faults)]
    if scenario.cross_traffic:
        doc["cross_traffic"] = [f.describe() for f in scenario.cross_traffic]
        from testbed.spec.cross import tenant_host
        doc["tenant_hosts"] = [tenant_host(dc) for dc in scenario.tenant_dcs()]
    if scenario.time_scale_auto:
        doc["time_scale_auto"] = auto_record(scenario)
    return doc


def auto_record(scenario: Scenario) -> dict[str, Any]:
    """What `time_scale: auto` would pick here now (measured: testbed.run.autoscale)."""
    from testbed.cli.planview import load_training
    from testbed.run.autoscale import resolve
    _, record = resolve(scenario, load_training(scenario), say=lambda line: None)
    return record or {}


def auto_line(record: dict[str, Any]) -> str:
    return (f"time_scale auto: T={record['time_scale']:g} on this machine; training takes about "
            f"{record['wall_clock_s']:,.0f} s of wall clock (the model's "
            f"{record['model_iteration_s']:.3f} s per iteration x T x iterations x systems); "
            + "; ".join(record["reasons"]))


def _runs(row: tuple[str, ...]) -> str:
    """('us', 'us', 'eu') -> 'us x2, eu x1' (replicas in order)."""
    out: list[list] = []
    for dc in row:
        if out and out[-1][0] == dc:
            out[-1][1] += 1
        else:
            out.append([dc, 1])
    return ", ".join(f"{dc} x{n}" for dc, n in out)


def show_text(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [f"{doc['name']} ({doc['path']}): {doc['description'] or '(no description)'}",
             f"kind: {doc['kind']}",
             f"settings: scale {s['scale']:g}, time_scale "
             f"{'auto' if 'time_scale_auto' in doc else format(s['time_scale'], 'g')}, backend "
             f"{s['backend']}, routing {s['routing']}, congestion control "
             f"{s['congestion_control']}, connections {s['connections']}, slow start after "
             f"idle {'on' if s['tcp_slow_start_after_idle'] else 'off'}",
             f"  per host: tcp_rmem max {s['tcp_rmem_max_bytes']:,} B -> a window of "
             f"{s['window_bytes_per_connection']:,} B per connection"]
    if doc.get("time_scale_auto"):
        lines.append(auto_line(doc["time_scale_auto"]))
    lines.append("DCs:")
    for dc in doc["dcs"]:
        link = ("unshaped" if dc["host_link_mbit"] is None else
                real_rate_text(dc["host_link_mbit"], s["scale"]))
        lines.append(f"  {dc['name']}: {dc['hosts']:,} host{'' if dc['hosts'] == 1 else 's'} "
                     f"({dc['first_host']}.."
                     f"{dc['last_host']}), host links {link}, {dc['decode_hosts']} decode hosts"
                     + (f", subnet {dc['subnet']}" if dc["subnet"] else ""))
    lines.append("WAN links (each direction):")
    for w in doc["wan"]:
        a, b = w["between"]
        lines.append(f"  {a} <-> {b}: {w['delay_ms']:g} ms one way, "
                     f"{real_rate_text(w['rate_mbit'], s['scale'])}, "
                     f"jitter {w['jitter_ms']:g} ms, loss {w['loss_pct']:g}%, queue "
                     f"{w['queue_bytes']:,} B (BDP {w['bdp_bytes']:,} B)")
    lines.append(f"routes ({s['routing']}):")
    for r in doc["routes"]:
        lines.append(f"  {r['src']} -> {r['dst']}: {' > '.join(r['path'])}, {r['delay_ms']:g} ms "
                     f"one way, K = {r['connections']} connections for multi-connection systems")
    if "training" in doc:
        t = doc["training"]
        prof = t["profile"]
        lines.append(f"training: P={t['stages']} x D={t['replicas']}, M={t['micro_batches']}, "
                     f"{t['schedule']}, {t['iterations']} iterations, compute {t['compute']}"
                     + (f" (profile {prof['file']}: width {prof['width']}, seq {prof['seq']}, "
                        f"micro-batch {prof['micro_batch']}, {prof['n_layer']} blocks)"
                        if prof else ""))
        for name, sy in doc["systems"].items():
            if "error" in sy:
                lines.append(f"  {name}: cannot be placed: {sy['error']}")
                continue
            lines.append(f"  {name}: placement {sy['placement']}, connections "
                         f"{sy['connections']}, WAN sharing {sy['wan_sharing']}"
                         + (", prefill in the bubbles" if sy["bubbletea"] else ""))
            for st, row in enumerate(sy["stage_dcs"]):
                lines.append(f"    stage {st}: {row}")
    if "bubbletea" in doc:
        bt = doc["bubbletea"]
        load = bt["load"]
        what = (f"Poisson {load['poisson_per_s']:g}/s, {load['trace']} lengths"
                if load["poisson_per_s"] else f"{load['trace']} trace x{load['rate_multiplier']:g}"
                f" from {load['start_s']:g} s")
        lines.append(f"bubbletea: {what}, window {load['window_s']:g} s; guard {bt['guard_ms']:g} "
                     f"ms + {bt['guard_pct']:g}%, TTFT deadline {bt['ttft_deadline_ms']:g} ms, "
                     f"chunked prefill {'on' if bt['chunked_prefill'] else 'off'}")
    if doc.get("faults"):
        lines.append("faults (seconds after the trainers start):")
        lines += [f"  {e}" for e in doc["faults"]]
    if doc.get("cross_traffic"):
        lines.append(f"cross-traffic (tenant hosts {', '.join(doc['tenant_hosts'])}):")
        lines += [f"  {c}" for c in doc["cross_traffic"]]
    return "\n".join(lines)


def show_command(path: str, as_json: bool = False) -> str:
    doc = describe(load_scenario(path))
    return json.dumps(doc, indent=1) if as_json else show_text(doc)
