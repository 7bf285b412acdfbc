"""What `reproduce`'s line figures draw, as plain data: each run's points, grouped so that a line
never joins two scenarios. Pure (no matplotlib); testbed.analysis.reproduce_plots draws it.

One job: group. A figure is one scenario (the `name` of the runs' scenario.resolved.yaml, or
metrics.json's `scenario`); inside it, a panel is one setting of the fields that differ among
that scenario's runs other than the x axis's own (and those that change only with it), so a
sweep of delay x replicas draws a panel per replica count (where several fields split the runs
alike, dcs.N.hosts and training.replicas, one of them names the panel); a line is one system in
one panel.

- delay_points: x the first WAN link's one-way delay (ms), y the speedup over baseline in the
  same run (runs without a finished baseline give none);
- rate_points: x the offered prefill requests/s (real time) of a +bubbletea system, y its GPU
  utilization, training slowdown and TTFT p50/p99; the same system without BubbleTea in the same
  run gives a point of its own (its GPU utilization over the same iterations).
A figure is drawn only where its scenario's runs differ in x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from testbed.spec.systems import BUBBLETEA_SUFFIX

IGNORED_FIELDS = ("name", "description")


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    scenario: str
    panel: tuple[tuple[str, Any], ...]    # (field path, value) that set this run apart
    system: str
    x: float
    y: dict[str, float | None]
    run: str                              # the results folder it came from


def scenario_of(run: Any) -> str:
    return run.scenario.get("name") or run.metrics.get("scenario") or run.name


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """A scenario document as {dotted path: leaf value} (list elements by index)."""
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = ((str(i), v) for i, v in enumerate(doc))
    else:
        return {prefix: doc}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def differing(runs: Sequence[Any]) -> list[str]:
    """The scenario fields (dotted paths) whose values are not the same in all these runs."""
    flat = [flatten(r.scenario) for r in runs]
    keys = sorted({k for f in flat for k in f if k not in IGNORED_FIELDS})
    return [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]


def panels(runs: Sequence[Any], is_x_field: Callable[[str], bool]) -> dict[str, tuple]:
    """Per run name, its panel: the fields that differ among these runs (one scenario's),
    leaving out the x axis's own fields (is_x_field) and those that change only with them."""
    flat = {r.name: flatten(r.scenario) for r in runs}
    differ = differing(runs)
    x_keys = [k for k in differ if is_x_field(k)]
    by_x: dict[str, dict[str, set[str]]] = {}
    for f in flat.values():
        at = repr([f.get(k) for k in x_keys])
        for k in differ:
            by_x.setdefault(k, {}).setdefault(at, set()).add(repr(f.get(k)))
    split = [k for k in differ if k not in x_keys
             and any(len(v) > 1 for v in by_x[k].values())]
    # of fields that split the runs alike (dcs.0.hosts and training.replicas both D), one
    # names the panel: the one with fewest list indices, then the shortest
    split.sort(key=lambda k: (sum(p.isdigit() for p in k.split(".")), len(k), k))
    seen: set[str] = set()
    named = []
    for k in split:
        parts = {}
        for name, f in flat.items():
            parts.setdefault(repr(f.get(k)), set()).add(name)
        partition = repr(sorted(sorted(v) for v in parts.values()))
        if partition not in seen:
            seen.add(partition)
            named.append(k)
    named.sort()
    return {name: tuple((k, f.get(k)) for k in named) for name, f in flat.items()}


def _by_scenario(runs: Sequence[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in runs:
        out.setdefault(scenario_of(r), []).append(r)
    return out


def _is_delay_field(key: str) -> bool:
    parts = key.split(".")
    return parts[0] == "wan" and parts[-1] == "delay_ms"


def _is_load_field(key: str) -> bool:
    return key.startswith("bubbletea.load.")


def delay_points(runs: Sequence[Any]) -> list[Point]:
    """Speedup over baseline against the first WAN link's delay, per scenario (module doc)."""
    out = []
    for scenario, group in _by_scenario(runs).items():
        group = [r for r in group if r.first_delay_ms is not None
                 and (r.metrics["systems"].get("baseline") or {}).get("iteration_time_s")]
        if len({r.first_delay_ms for r in group}) < 2:
            continue
        panel = panels(group, _is_delay_field)
        for r in group:
            systems = r.metrics["systems"]
            base = systems["baseline"]
            for name, m in systems.items():
                if m.get("iteration_time_s"):
                    out.append(Point(scenario=scenario, panel=panel[r.name], system=name,
                                     x=r.first_delay_ms, run=r.name, y=_speedup(base, m)))
    return out


def _speedup(base: dict, m: dict) -> dict[str, float]:
    """The measured speedup; with repeats its range (the slowest baseline over the fastest
    system's, and the other way round); the model's, where both have one."""
    y = {"speedup": base["iteration_time_s"] / m["iteration_time_s"]}
    rb, rm = (base.get("repeats") or {}).get("iteration_time_s"), (
        m.get("repeats") or {}).get("iteration_time_s")
    if rb and rm:
        y.update(speedup_lo=rb["min"] / rm["max"], speedup_hi=rb["max"] / rm["min"])
    pb = ((base.get("model") or {}).get("predicted") or {}).get("iteration_time_s")
    pm = ((m.get("model") or {}).get("predicted") or {}).get("iteration_time_s")
    if pb and pm:
        y["model_speedup"] = pb / pm
    return y


def rate_points(runs: Sequence[Any]) -> list[Point]:
    """BubbleTea's figures against the offered request rate, per scenario (module doc)."""
    found = []
    for r in runs:
        for name, m in r.metrics["systems"].items():
            bt = m.get("bubbletea")
            offered = ((bt or {}).get("load") or {}).get("offered_per_s")
            if offered is not None:
                found.append((r, name, bt, offered))
    out = []
    for scenario in _by_scenario([r for r, *_ in found]):
        mine = [f for f in found if scenario_of(f[0]) == scenario]
        group = list({r.name: r for r, *_ in mine}.values())
        if len({offered for *_, offered in mine}) < 2 \
                or not any(_is_load_field(k) for k in differing(group)):
            continue          # the rate is the same, or differs through no load setting
        panel = panels(group, _is_load_field)
        for r, name, bt, offered in mine:
            ttft = bt["prefill"]["ttft_ms"]
            out.append(Point(scenario=scenario, panel=panel[r.name], system=name, x=offered,
                             run=r.name, y={"gpu_utilization": bt["gpu_utilization"],
                                            "training_slowdown": bt.get("training_slowdown"),
                                            "ttft_p50_ms": ttft.get("p50"),
                                            "ttft_p99_ms": ttft.get("p99")}))
            without = bt.get("gpu_utilization_without")
            if without is not None:
                out.append(Point(scenario=scenario, panel=panel[r.name], x=offered, run=r.name,
                                 system=name.removesuffix(BUBBLETEA_SUFFIX),
                                 y={"gpu_utilization": without}))
    return out


def lines(points: Sequence[Point]) -> dict[str, dict[tuple, dict[str, list[Point]]]]:
    """scenario -> panel -> system -> its points by x: a line's points share all three."""
    out: dict[str, dict[tuple, dict[str, list[Point]]]] = {}
    for p in points:
        out.setdefault(p.scenario, {}).setdefault(p.panel, {}).setdefault(p.system, []).append(p)
    for by_panel in out.values():
        for by_system in by_panel.values():
            for pts in by_system.values():
                pts.sort(key=lambda p: (p.x, p.run))
    return out
