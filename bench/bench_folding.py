#!/usr/bin/env python3
"""The model's folding of alike replicas against simulating every replica, over generated
scenarios (tests.scenarios.generated_scenario, as tests/test_folding.py): per system and setting of slow start after idle,
the worst and median error of the folded iteration time, and the time each took.

    .venv/bin/python bench/bench_folding.py [--n 25] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import testbed.predict.predict as mp  # noqa: E402
from testbed.cli.planview import load_training  # noqa: E402
from testbed.spec.errors import ScenarioError  # noqa: E402
from testbed.spec.scenario import parse_scenario  # noqa: E402
from testbed.spec.systems import get_system  # noqa: E402
from tests.scenarios import generated_scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=25, help="scenarios per setting (default 25)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import random
    print("| slow start after idle | system | scenarios | median error | worst error | "
          "worst case | folded s | unfolded s |\n|---|---|---|---|---|---|---|---|")
    for slow in (False, True):
        rng = random.Random(args.seed)
        errs: dict[str, list] = {}
        for _ in range(args.n):
            doc = generated_scenario(rng, slow)
            sc = parse_scenario(doc, "generated.yaml")
            cfg = load_training(sc)
            for system in doc["systems"]:
                mp.FOLD_ABOVE_REPLICAS = 8
                t0 = time.perf_counter()
                try:
                    a = mp.predict(sc, cfg, get_system(system)).iteration_time_s
                except ScenarioError:
                    continue
                ta = time.perf_counter() - t0
                mp.FOLD_ABOVE_REPLICAS = 10**9
                t0 = time.perf_counter()
                u = mp.predict(sc, cfg, get_system(system)).iteration_time_s
                tu = time.perf_counter() - t0
                t = doc["training"]
                where = (f"P={t['stages']} D={t['replicas']} {t['schedule']} "
                         f"K={doc['connections']} DCs={[d['hosts'] - 2 for d in doc['dcs']]}")
                errs.setdefault(system, []).append((a / u - 1, where, ta, tu))
        for system, rows in errs.items():
            worst = max(rows, key=lambda r: abs(r[0]))
            print(f"| {'on' if slow else 'off'} | {system} | {len(rows)} | "
                  f"{statistics.median(abs(r[0]) for r in rows):.2%} | {worst[0]:+.2%} | "
                  f"{worst[1]} | {sum(r[2] for r in rows):.1f} | {sum(r[3] for r in rows):.1f} |")
        mp.FOLD_ABOVE_REPLICAS = 8


if __name__ == "__main__":
    main()
