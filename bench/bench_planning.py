"""How long the planning commands take at every size (issue 23, section 5), against their targets:
`show`, `plan` and `predict` on a generated ring of 50 DCs under 2 s, `validate` (and `validate
-q`, without the route lines) on 200 DCs under 5 s, `plan` on each paper-scale scenario
(topologies/paper/, up to 10,000 GPUs) under 5 s. No root. Each command is run as a user runs it
(`python run_testbed.py CMD FILE`), with a timeout; one row per command and scenario with its
seconds and the size of what it printed, and exit 0 (a benchmark: figures, not asserts).

Before/after: `--repo DIR` runs another checkout's run_testbed.py on the same scenario files
(e.g. `git worktree add /tmp/before <commit>`), so two runs give two comparable tables.

    .venv/bin/python bench/bench_planning.py [--timeout-s 300] [--only plan,validate] [--repo DIR]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
PAPER = sorted((REPO / "topologies" / "paper").glob("*.yaml"))
# (command and flags, scenario: a ring's DC count or a paper file's stem) -> target seconds
TARGETS_S: dict[tuple[str, int | str], float] = {
    ("validate", 200): 5.0, ("validate -q", 200): 5.0,
    ("show", 50): 2.0, ("plan", 50): 2.0, ("predict", 50): 2.0,
    **{("plan", p.stem): 5.0 for p in PAPER}}


def scenario(n_dcs: int) -> dict:
    """A ring of n DCs with a chord every 5, 4 hosts each, P=8 x D=n/2 training (predict only)."""
    rnd = random.Random(0)
    wan = [{"between": [f"d{i}", f"d{(i + 1) % n_dcs}"], "delay_ms": rnd.choice([5, 10, 20, 40]),
            "rate_mbit": 100} for i in range(n_dcs)]
    wan += [{"between": [f"d{i}", f"d{(i + 7) % n_dcs}"], "delay_ms": 30, "rate_mbit": 100}
            for i in range(0, n_dcs, 5)]
    return {"name": f"ring{n_dcs}", "scale": 100, "predict_only": True,
            "routing": "shortest-delay", "systems": ["baseline", "multitcp"],
            "dcs": [{"name": f"d{i}", "hosts": 4} for i in range(n_dcs)], "wan": wan,
            "training": {"model": {"n_layer": 8, "n_embd": 32, "n_head": 2, "seq_len": 16,
                                   "vocab_size": 64},
                         "stages": 8, "replicas": n_dcs // 2, "micro_batches": 8,
                         "micro_batch_size": 1, "schedule": "1f1b", "iterations": 2,
                         "compute": "profile",
                         "profile": {"file": "h200-transformer.json", "width": 2048,
                                     "seq": 2048, "micro_batch": 1, "n_layer": 64}}}


def timed(repo: Path, cmd: str, path: Path, timeout_s: float) -> tuple[float, int, str]:
    """(seconds, bytes printed, status) of `python run_testbed.py CMD PATH` run in repo."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "run_testbed.py", *cmd.split(), str(path)], cwd=repo,
                           capture_output=True, text=True, timeout=timeout_s)
        status = "ok" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-80:]}"
        size = len(p.stdout.encode())
    except subprocess.TimeoutExpired:
        status, size = f"killed at {timeout_s:g} s", 0
    return time.monotonic() - t0, size, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--only", default=None, metavar="CMDS",
                    help="comma-separated commands to time (e.g. plan,validate; default all)")
    ap.add_argument("--repo", type=Path, default=REPO,
                    help="the checkout whose run_testbed.py runs (default this one)")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    print(f"checkout {args.repo}\n")
    print("| command | scenario | seconds | target s | printed | status |\n"
          "|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for (cmd, which), target in TARGETS_S.items():
            if only is not None and cmd.split()[0] not in only:
                continue
            if isinstance(which, int):
                path, name = Path(tmp) / f"ring{which}.yaml", f"ring of {which} DCs"
                path.write_text(yaml.safe_dump(scenario(which)))
            else:
                path = REPO / "topologies" / "paper" / f"{which}.yaml"
                name = which
            took, size, status = timed(args.repo, cmd, path, args.timeout_s)
            mark = "" if took <= target and status == "ok" else " (miss)"
            print(f"| {cmd} | {name} | {took:.2f}{mark} | {target:g} | {size / 1e3:.1f} kB | "
                  f"{status} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
