"""`run SCENARIO` for a scenario with a `sweep:` section (testbed.spec.sweep): every point trained in
its own results folder, an index of them, progress, and `--resume`.

    <out>/<name>-sweep-<UTC time>-<commit>/
        index.json        the sweep, and per point: its values, status (pending | running | done |
                          failed | interrupted), its run folder (relative), iteration time per
                          system, the error of a failed one
        scenario.yaml     the scenario as given, sweep included
        points/<label>.yaml   each point's whole scenario (what its run loaded)
        runs/<scenario>-<UTC time>-<commit>/   each point's run folder (testbed.run.jobs.run_job)

One job: the loop over points. A failed point is recorded and the next one runs (the exit code
says some failed); Ctrl-C marks the running point interrupted, keeps every finished one and
exits 130; `--resume DIR` runs only the points not done, after checking that DIR is a sweep of
the same scenario and flags. The index is rewritten (atomically) after every point, by one run
at a time: the folder is locked (.lock) while a run works on it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from testbed.emulation import interrupts
from testbed.spec.errors import ScenarioError, TestbedError
from testbed.run.progress import Progress
from testbed.emulation.results import new_run_dir, write_json, write_text
from testbed.features.checks import check_points
from testbed.spec.sweep import Point, expand
from testbed.spec.yamlfile import dump_yaml

INDEX_SCHEMA = 1
LOCK_NAME = ".lock"


def read_doc(scenario_path: str) -> dict[str, Any]:
    """The scenario file's document, after the same checks `load_scenario` makes."""
    from testbed.spec.scenario import load_scenario
    return dict(load_scenario(scenario_path).raw)


def sweep_key(doc: dict[str, Any], systems: list[str] | None, iterations: int | None,
              cluster=None, repeat: int = 1) -> str:
    """What a --resume must match: the sweep, its options, and the cluster's servers (if any)."""
    what: dict[str, Any] = {"doc": doc, "systems": systems, "iterations": iterations}
    if repeat != 1:   # (absent at 1: sweeps made before --repeat resume as they were)
        what["repeat"] = repeat
    if cluster is not None:
        what["servers"] = [f"{s.name}={s.destination}" for s in cluster.servers]
    text = json.dumps(what, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sweep_job(scenario_path: str, *, out_dir: Path, backend: str | None = None,
              systems: list[str] | None = None, iterations: int | None = None,
              resume: Path | None = None, quiet: bool = False,
              timeout_s: float | None = None, cluster=None, repeat: int = 1) -> Path:
    """Every point of the sweep not done yet, one run each (testbed.run.jobs.run_job), then its
    tables. cluster: a testbed.spec.cluster.Cluster every point's DCs are spread over (each point
    placed and checked on its own; a point the cluster cannot hold fails alone)."""
    from testbed.run.jobs import run_job
    doc = read_doc(scenario_path)
    points = expand(doc)
    checked = check_points(points, systems=systems, iterations=iterations)
    key = sweep_key(doc, systems, iterations, cluster, repeat)
    if resume is not None:
        sweep_dir = Path(resume)
        _read_index(sweep_dir, key, len(points))     # a sweep folder at all, before locking
    else:
        sweep_dir = new_run_dir(out_dir, f"{doc['name']}-sweep")
    lock = _lock(sweep_dir)
    try:   # held until the sweep's tables are written: a waiting --resume starts after
        _sweep(doc, points, checked, key, sweep_dir, resume is not None, run_job,
               backend=backend, systems=systems, iterations=iterations, quiet=quiet,
               timeout_s=timeout_s, cluster=cluster, repeat=repeat)
    finally:
        os.close(lock)
    return sweep_dir / "index.json"


def _sweep(doc: dict[str, Any], points: list[Point], checked: list, key: str, sweep_dir: Path,
           resumed: bool, run_job, *, backend: str | None, systems: list[str] | None,
           iterations: int | None, quiet: bool, timeout_s: float | None,
           cluster=None, repeat: int = 1) -> None:
    """The sweep's points not done yet, then its tables (the caller holds the folder's lock)."""
    if resumed:
        index = _read_index(sweep_dir, key, len(points))   # as the last holder left it
    else:
        write_text(sweep_dir / "scenario.yaml", dump_yaml(doc))
        index = {"schema_version": INDEX_SCHEMA, "scenario": doc["name"], "key": key,
                 "sweep": doc["sweep"], "systems": systems, "iterations": iterations,
                 "cluster": None if cluster is None else str(cluster.path),
                 "points": [{"index": p.index, "label": p.label, "values": p.values,
                             "status": "pending"} for p in points]}
    todo = [p for p in points if not _done(sweep_dir, index["points"][p.index])]
    progress = Progress(sum(len(sy) * cfg.iterations * repeat
                            for p, (cfg, sy) in zip(points, checked) if p in todo), quiet=quiet)
    progress.say(f"sweep of {doc['name']}: {len(points)} points, {len(points) - len(todo)} "
                 f"done before, in {sweep_dir}")
    write_json(sweep_dir / "index.json", index)
    try:
        for p in todo:
            _run_point(p, sweep_dir, index, progress, run_job, backend=backend,
                       systems=systems, iterations=iterations, n=len(points),
                       timeout_s=timeout_s, cluster=cluster, repeat=repeat)
    finally:
        progress.close()
    for line in summary(index):
        progress.say(line)
    if any(e["status"] == "done" for e in index["points"]):
        from testbed.analysis.reproduce import reproduce
        reproduce([str(sweep_dir)], sweep_dir, timelines=False)   # the sweep's tables, figures
    failed = [e for e in index["points"] if e["status"] != "done"]
    if failed:
        raise TestbedError(f"{len(failed)} of {len(points)} sweep points failed "
                           f"({', '.join(e['label'] for e in failed)}): see "
                           f"{sweep_dir / 'index.json'}")


def _run_point(p: Point, sweep_dir: Path, index: dict, progress: Progress, run_job, *,
               backend: str | None, systems: list[str] | None, iterations: int | None,
               n: int, timeout_s: float | None = None, cluster=None, repeat: int = 1) -> None:
    entry = index["points"][p.index]
    interrupts.check()
    (sweep_dir / "points").mkdir(exist_ok=True)
    path = write_text(sweep_dir / "points" / f"{p.label}.yaml",
                      dump_yaml(p.doc))
    entry.update(status="running", error=None)
    write_json(sweep_dir / "index.json", index)
    progress.where(f"point {p.index + 1}/{n} {p.label}")
    try:
        metrics_path = run_job(str(path), out_dir=sweep_dir / "runs", backend=backend,
                               systems=systems, iterations=iterations, progress=progress,
                               timeout_s=timeout_s, cluster=cluster, repeat=repeat)
    except KeyboardInterrupt:
        entry["status"] = "interrupted"
        write_json(sweep_dir / "index.json", index)
        raise
    except Exception as exc:  # noqa: BLE001 - recorded; the next point runs
        entry.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:500])
    else:
        doc = json.loads(metrics_path.read_text())
        entry.update(status="done", run_dir=str(metrics_path.parent.relative_to(sweep_dir)),
                     iteration_time_s={k: m["iteration_time_s"]
                                       for k, m in doc["systems"].items()})
    write_json(sweep_dir / "index.json", index)
    progress.say(f"point {p.index + 1}/{n} {p.label}: {entry['status']}"
                 + (f" ({entry['error']})" if entry["status"] == "failed" else ""))


def _lock(sweep_dir: Path) -> int:
    """Hold the sweep folder (an flock on its .lock, released when the fd closes, or the
    process dies): two runs of one sweep at once would each rewrite index.json."""
    fd = os.open(sweep_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ScenarioError("--resume", f"{sweep_dir} is being run by another process",
                            "wait until that run ends (or stop it), then resume") from None
    return fd


def _done(sweep_dir: Path, entry: dict) -> bool:
    return (entry.get("status") == "done" and entry.get("run_dir") is not None
            and (sweep_dir / entry["run_dir"] / "metrics.json").is_file())


def _read_index(sweep_dir: Path, key: str, n_points: int) -> dict:
    path = sweep_dir / "index.json"
    try:
        index = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise ScenarioError("--resume", f"{sweep_dir} has no readable index.json",
                            "name the folder a sweep printed as its results") from None
    if index.get("schema_version") != INDEX_SCHEMA:
        raise ScenarioError("--resume", f"{path} has schema version "
                            f"{index.get('schema_version')}, this testbed writes {INDEX_SCHEMA}",
                            "start a new sweep")
    if index.get("key") != key or len(index.get("points", [])) != n_points:
        raise ScenarioError("--resume", f"{sweep_dir} is a sweep of another scenario, sweep or "
                            "flags", "resume with the same scenario file and flags, or start "
                            "a new sweep")
    return index


def summary(index: dict) -> list[str]:
    """A table of the points: values, status, iteration time per system."""
    systems = sorted({s for e in index["points"] for s in e.get("iteration_time_s", {})})
    keys = list(index["sweep"])
    head = ["point", *[k.rsplit(".", 1)[-1] for k in keys], "status",
            *[f"{s} s" for s in systems]]
    rows = [head]
    for e in index["points"]:
        times = e.get("iteration_time_s", {})
        rows.append([str(e["index"]), *[_fmt(e["values"][k]) for k in keys], e["status"],
                     *[f"{times[s]:.3f}" if s in times else "-" for s in systems]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _fmt(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else f"{value}"
