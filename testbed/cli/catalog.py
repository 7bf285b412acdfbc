"""The shipped scenarios: `run_testbed.py list` (one line each) and a scenario by its name.
Pure: no root.

One job: find the scenario files under topologies/. list_text loads each (a broken one is listed
with its error, not fatal) and says what it is: name, path, DCs and hosts, emulated or for the
model only, its systems and its `description`. resolve turns what a user typed into a file, as
`mn --topo` takes a name: a path that exists, else a path under this checkout (so
`topologies/two_dc.yaml` works from any folder), else a shipped scenario's name (`two_dc`).
"""

from __future__ import annotations

from pathlib import Path

from testbed.spec.errors import ScenarioError
from testbed.spec.scenario import load_scenario
from testbed.spec.paths import TOPOLOGIES



def scenario_files(root: Path = TOPOLOGIES) -> list[Path]:
    return sorted(root.rglob("*.yaml"))


def resolve(arg: str, root: Path = TOPOLOGIES) -> str:
    """The scenario file arg names (module docstring); arg itself if it names none (the loader
    then says so)."""
    if Path(arg).exists():
        return arg
    in_checkout = root.parent / arg
    if not Path(arg).is_absolute() and in_checkout.is_file():
        return str(in_checkout)
    name = arg.removesuffix(".yaml")
    if name and "/" not in name:
        found = [p for p in scenario_files(root) if p.stem == name]
        if len(found) == 1:
            return str(found[0])
    return arg


def scenario_names(root: Path = TOPOLOGIES) -> list[str]:
    return [p.stem for p in scenario_files(root)]


def list_text(root: Path = TOPOLOGIES) -> str:
    rows = []
    for path in scenario_files(root):
        rel = path.relative_to(root.parent) if root.parent in path.parents else path
        try:
            sc = load_scenario(path)
        except ScenarioError as exc:
            rows.append((str(rel), "-", "-", "-", f"invalid: {exc}"))
            continue
        kind = "model only" if sc.predict_only else (
            "network + training" if sc.training is not None else "network only")
        hosts = sum(dc.hosts for dc in sc.dcs)
        systems = ", ".join(sc.systems) if sc.training is not None else "-"
        rows.append((str(rel), f"{len(sc.dcs)} DCs, {hosts:,} hosts", kind, systems,
                     sc.description or "(no description)"))
    if not rows:
        return f"no scenarios under {root}"
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[4]}"
                     + (f"\n{'':<{widths[0]}}  systems: {r[3]}" if r[3] != "-" else "")
                     for r in rows)
