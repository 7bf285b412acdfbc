#!/usr/bin/env python3
"""Regenerate the committed reference runs (results/reference/) and the tables made from them.

    sudo .venv/bin/python scripts/make_reference.py [--keep-full DIR] [--repeat N] [--add FILE ...]

Runs the shipped emulated scenarios with training (two_dc, atlas_bubbletea, atlas_paper,
paper_testbed) and the shipped sweeps (sweep_delay, sweep_bubbletea_rate, sweep_paper_testbed)
with -q into a scratch folder (`--add FILE ...`: only those, kept beside the others), then copies
into results/reference/ what `reproduce` reads: metrics.json, scenario.resolved.yaml, env.json,
a sweep's index.json and points, and per system metrics.json, trainer_spans.jsonl and
prefill_records.jsonl (their timelines). Logs, captures, per-worker files and traces stay out
(size). Then runs `reproduce` on them into results/reference/tables/ and pastes the tables into
docs/experiments.md. About 26 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ["topologies/two_dc.yaml", "topologies/atlas_bubbletea.yaml",
             "topologies/sweep_delay.yaml", "topologies/atlas_paper.yaml",
             "topologies/sweep_bubbletea_rate.yaml", "topologies/paper_testbed.yaml",
             "topologies/sweep_paper_testbed.yaml"]
KEEP_TOP = ("metrics.json", "scenario.resolved.yaml", "env.json", "index.json", "scenario.yaml")
KEEP_SYSTEM = ("metrics.json", "trainer_spans.jsonl", "prefill_records.jsonl")
OUT = REPO / "results" / "reference"


def reference_runs() -> list[str]:
    """The committed runs, in the order the tables list them (by folder name)."""
    return [str(p.relative_to(REPO)) for p in sorted(OUT.iterdir())
            if p.is_dir() and p.name != "tables"]


def copy_run(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for name in KEEP_TOP:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    for sub in sorted(p for p in src.iterdir() if p.is_dir()):
        if sub.name == "runs":
            for run in sorted(p for p in sub.iterdir() if p.is_dir()):
                copy_run(run, dst / "runs" / run.name)
        elif sub.name == "points":
            shutil.copytree(sub, dst / "points")
        elif (sub / "metrics.json").is_file():
            (dst / sub.name).mkdir()
            for name in KEEP_SYSTEM:
                if (sub / name).is_file():
                    shutil.copy2(sub / name, dst / sub.name / name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep-full", default=None, help="run into this folder and keep it")
    ap.add_argument("--add", nargs="+", metavar="SCENARIO", default=None,
                    help="run only these scenario files and put them in place of the committed "
                    "runs of the same scenarios (the others stay)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="each system N times on a fresh network (run --repeat): the tables "
                    "give the mean, its spread and n")
    args = ap.parse_args()
    scratch = Path(args.keep_full or tempfile.mkdtemp(prefix="reference-"))
    made = []
    for scenario in args.add or SCENARIOS:
        before = set(scratch.glob("*")) if scratch.exists() else set()
        subprocess.run([sys.executable, "run_testbed.py", "run", scenario, "--out", str(scratch),
                        "-q", "--repeat", str(args.repeat)], cwd=REPO, check=True)
        made += sorted(set(scratch.glob("*")) - before)
    if OUT.exists() and not args.add:
        shutil.rmtree(OUT)
    for run in made:   # an added scenario's new run takes the place of its committed ones
        name = run.name.rsplit("-", 2)[0]
        for old in OUT.glob(f"{name}-*"):
            if old.is_dir() and old.name.rsplit("-", 2)[0] == name:
                shutil.rmtree(old)
    for run in made:
        copy_run(run, OUT / run.name)
    subprocess.run([sys.executable, "run_testbed.py", "reproduce", *reference_runs(),
                    "--out", str(OUT / "tables")], cwd=REPO, check=True)
    paste_into_docs()
    if args.keep_full is None:
        shutil.rmtree(scratch)
    return 0


def paste_into_docs() -> None:
    """Replace docs/experiments.md's <!-- reproduce: NAME --> blocks with
    results/reference/tables/NAME (tests/test_reference.py checks that they agree)."""
    readme = REPO / "docs" / "experiments.md"
    text = readme.read_text()
    for name in ("training.md", "bubbletea.md"):
        start = f"<!-- reproduce: {name} -->\n"
        i = text.index(start) + len(start)
        j = text.index("<!-- /reproduce -->", i)
        text = text[:i] + (OUT / "tables" / name).read_text() + text[j:]
    readme.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
