"""The jobs run_testbed.py runs: each loads a scenario, makes a run folder, builds the network,
does its work, tears down (always), and returns the run folder.

One job per function; the work itself lives in testbed.calibrate and trainer/.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from testbed.calibrate import Settings, calibrate, table
from testbed.network import Network, check_environment
from testbed.results import new_run_dir, provenance, write_json, write_text
from testbed.scenario import Scenario, load_scenario


def _prepare(scenario_path: str, out_dir: Path) -> tuple[Scenario, Path]:
    scenario = load_scenario(scenario_path)
    check_environment()
    run_dir = new_run_dir(out_dir, scenario.name)
    write_text(run_dir / "scenario.resolved.yaml", yaml.safe_dump(scenario.raw, sort_keys=False))
    write_json(run_dir / "env.json", provenance())
    return scenario, run_dir


def calibrate_job(scenario_path: str, *, out_dir: Path, backend: str | None = None,
                  seconds: float = 4.0, streams: int = 4) -> Path:
    scenario, run_dir = _prepare(scenario_path, out_dir)
    with Network(scenario, run_dir, backend=backend) as net:
        print(f"network up in {net.timings_s['up']:.2f} s (backend {net.backend}, "
              f"{len(scenario.host_names())} hosts, {len(scenario.wan)} WAN links)", flush=True)
        doc = calibrate(net, Settings(seconds=seconds, streams=streams),
                        progress=lambda line: print(line, flush=True))
    doc["timings_s"] = {k: round(v, 3) for k, v in net.timings_s.items()}
    write_json(run_dir / "calibration.json", doc)
    print(table(doc))
    return run_dir / "calibration.json"
