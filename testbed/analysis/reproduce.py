"""`run_testbed.py reproduce RESULTS... [--out DIR]`: the paper-style tables and figures, rebuilt
from saved results alone (no root, no network, no torch; matplotlib for the figures).

One job: read results folders and write what a paper shows, the same bytes every time.
RESULTS are run folders (metrics.json) or sweep folders (index.json: each of its done points).
Written to DIR (default `reproduced/`), each file replaced whole:
- training.md / training.csv: per run and system, iteration time, speedup over baseline, bubble
  fraction and GPU utilization, each beside the model's prediction and its error;
- bubbletea.md / bubbletea.csv: per +bubbletea system, GPU utilization and bubble fraction
  without and with BubbleTea, training slowdown, requests/s, TTFT p50/p99, deadline misses
  (testbed.analysis.reproduce_tables: the Markdown rounded, the CSV raw with units in its header);
- speedup_vs_delay-<scenario>.png, bubbletea_vs_rate-<scenario>.png: per scenario whose runs
  differ in WAN delay (or offered request rate), a line per system (testbed.analysis.series,
  testbed.analysis.reproduce_plots), and timeline-<run>-<system>.png (one iteration of every
  system's timeline, in real time).
Each row names the results folder it came from (relative to the common parent of RESULTS). The
Markdown tables are printed too. Schema 1 folders (a system's compute-only schedule under
`predicted`, now `compute_only`) are read as schema 2; another schema version gets one line.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from testbed.analysis.reproduce_tables import TABLES, csv_text, markdown
from testbed.spec.errors import ScenarioError
from testbed.emulation.results import write_bytes
from testbed.spec.yamlfile import load_yaml

SCHEMA_VERSION = 2          # metrics.json's `schema_version` that this code writes
READS = (1, 2)              # and those it reads (as_current_schema)


@dataclass(frozen=True, kw_only=True, slots=True)
class Run:
    name: str                    # the folder, relative to the results' common parent
    path: Path
    metrics: dict[str, Any]
    scenario: dict[str, Any]     # scenario.resolved.yaml
    values: dict[str, Any]       # the sweep point's values ({} for a plain run)

    @property
    def first_delay_ms(self) -> float | None:
        wan = self.scenario.get("wan") or []
        return wan[0].get("delay_ms") if wan else None


def load_runs(paths: Sequence[str]) -> list[Run]:
    """Every run under the RESULTS arguments, in the order given (a sweep's in point order)."""
    found: list[tuple[Path, dict]] = []
    for arg in paths:
        p = Path(arg)
        if (p / "index.json").is_file():
            index = _json(p / "index.json")
            for e in index.get("points", []):
                if e.get("status") == "done":
                    found.append((p / e["run_dir"], e.get("values", {})))
        elif (p / "metrics.json").is_file():
            found.append((p, {}))
        else:
            raise ScenarioError("RESULTS", f"{p} holds neither metrics.json nor index.json",
                                "name run folders (results/<scenario>-<time>-<commit>) or sweep "
                                "folders")
    if not found:
        raise ScenarioError("RESULTS", "no finished run in them", "name finished runs")
    base = Path(os.path.commonpath([str(f.resolve()) for f, _ in found]))
    if len(found) == 1:
        base = base.parent
    runs = []
    for folder, values in found:
        metrics = _json(folder / "metrics.json")
        version = metrics.get("schema_version")
        if version not in READS:
            raise ScenarioError("RESULTS", f"{folder / 'metrics.json'} has schema version "
                                f"{version} (this testbed reads {', '.join(map(str, READS))})",
                                "re-run it with this testbed, or reproduce it with the commit "
                                "that wrote it (env.json names it)")
        metrics = as_current_schema(metrics)
        scenario_path = folder / "scenario.resolved.yaml"
        scenario = load_yaml(scenario_path, "give a results folder this testbed wrote") \
            if scenario_path.is_file() else {}         # read as strictly as a scenario file
        runs.append(Run(name=str(folder.resolve().relative_to(base)), path=folder,
                        metrics=metrics, scenario=scenario or {}, values=values))
    return runs


def as_current_schema(metrics: dict[str, Any]) -> dict[str, Any]:
    """A metrics.json document of a schema in READS, as SCHEMA_VERSION (a new dict). Schema 1
    named each system's compute-only schedule `predicted`, which read as the model's prediction
    (that is `model.predicted`); schema 2 names it `compute_only`."""
    if metrics.get("schema_version") == 1:
        systems = {name: {("compute_only" if k == "predicted" else k): v for k, v in m.items()}
                   for name, m in metrics.get("systems", {}).items()}
        metrics = dict(metrics, schema_version=2, systems=systems)
    return metrics


def finished_only(runs: Sequence[Run]) -> list[Run]:
    """The runs with only the systems that finished (a run stopped by a fault or Ctrl-C has a
    partial block, `complete: false`, that no figure can use)."""
    return [replace(r, metrics=dict(r.metrics, systems={
        n: m for n, m in r.metrics["systems"].items() if m.get("complete", True)})) for r in runs]


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ScenarioError("RESULTS", f"{path} cannot be read ({exc.__class__.__name__})",
                            "it is incomplete: re-run it") from None


def reproduce(paths: Sequence[str], out_dir: Path, *, figures: bool = True,
              timelines: bool = True) -> tuple[str, list[Path]]:
    """Write the tables and figures (module docstring); return the Markdown and the files.
    A run and a sweep write their own tables (and a sweep its figures, without timelines: each
    run has its own) into their folders this way."""
    runs = load_runs(paths)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    text = ""
    for stem, columns, csv_only, records_of in TABLES:
        records = records_of(runs)
        if not records:
            continue
        md = markdown(columns, records)
        text += f"{stem}:\n\n{md}\n"
        written.append(write_bytes(out_dir / f"{stem}.md", md.encode()))
        written.append(write_bytes(out_dir / f"{stem}.csv",
                                   csv_text(columns + csv_only, records).encode()))
    if figures:
        from testbed.analysis.reproduce_plots import figures as draw
        written += draw(finished_only(runs), out_dir, write_bytes, timelines=timelines)
    return text, written
