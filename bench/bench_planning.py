"""How long the planning commands take on large generated scenarios (issue 23, section 5), against
their targets: `show`, `plan` and `predict` on 50 DCs under 2 s, `validate` on 200 DCs under 5 s.
No root. Each command is run as a user runs it (`python run_testbed.py CMD FILE`), with a
timeout; it prints one row per command and size, and exits 0 (a benchmark: figures, not asserts).

    .venv/bin/python bench/bench_planning.py [--timeout-s 300]
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
TARGETS_S = {("validate", 200): 5.0, ("show", 50): 2.0, ("plan", 50): 2.0, ("predict", 50): 2.0}


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


def timed(cmd: str, path: Path, timeout_s: float) -> tuple[float, str]:
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "run_testbed.py", cmd, str(path)], cwd=REPO,
                           capture_output=True, text=True, timeout=timeout_s)
        status = "ok" if p.returncode == 0 else f"exit {p.returncode}: {p.stderr.strip()[-80:]}"
    except subprocess.TimeoutExpired:
        status = f"killed at {timeout_s:g} s"
    return time.monotonic() - t0, status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args()
    print("| command | DCs | seconds | target s | status |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for (cmd, n), target in TARGETS_S.items():
            path = Path(tmp) / f"ring{n}.yaml"
            path.write_text(yaml.safe_dump(scenario(n)))
            took, status = timed(cmd, path, args.timeout_s)
            mark = "" if took <= target and status == "ok" else " (miss)"
            print(f"| {cmd} | {n} | {took:.2f}{mark} | {target:g} | {status} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
