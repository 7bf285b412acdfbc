"""How the model's run time grows with the size of what it predicts: micro-batches x stages x
replicas, on atlas_paper's DCs and links with the Atlas system.

    .venv/bin/python bench/bench_model.py [--max-gpus N]

Prints per size: P, D, M, GPUs (P x D), ops represented (P x D x M x 2 per iteration, 3
iterations), seconds, and microseconds per op. Above testbed.predict.predict.FOLD_ABOVE_REPLICAS replicas,
alike replicas are folded (Atlas keeps a stage's replicas in one DC: one class), so the time
stops growing with D. The scenario's hosts are raised to fit, past what the emulation could
build (the model does not care). No root, no network.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.predict.predict import predict  # noqa: E402
from testbed.cli.planview import load_training  # noqa: E402
from testbed.spec.scenario import load_scenario  # noqa: E402
from testbed.spec.systems import get_system

ITERATIONS = 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-gpus", type=int, default=10_000)
    args = parser.parse_args(argv)
    base = load_scenario(Path(__file__).resolve().parent.parent / "topologies" /
                         "atlas_paper.yaml")
    cfg0 = load_training(base)
    print("| P | D | M | GPUs | ops | seconds | us per op |")
    print("|---|---|---|---|---|---|---|")
    for P, D, M in [(3, 2, 4), (3, 2, 16), (3, 8, 16), (6, 8, 16), (6, 16, 32), (12, 16, 32),
                    (12, 21, 64), (16, 128, 64), (16, 625, 64)]:
        if P * D > args.max_gpus:
            break
        # hosts enough for any placement: every DC gets P x D
        sc = dataclasses.replace(base, dcs=tuple(dataclasses.replace(dc, hosts=P * D)
                                                 for dc in base.dcs))
        cfg = dataclasses.replace(cfg0, stages=P, replicas=D, micro_batches=M,
                                  iterations=ITERATIONS,
                                  profile=dataclasses.replace(cfg0.profile, n_layer=4 * P),
                                  model=dataclasses.replace(cfg0.model, n_layer=max(
                                      cfg0.model.n_layer, P)))
        t0 = time.perf_counter()
        predict(sc, cfg, get_system("atlas"), ITERATIONS)
        took = time.perf_counter() - t0
        ops = P * D * M * 2 * ITERATIONS
        print(f"| {P} | {D} | {M} | {P * D} | {ops} | {took:.2f} | {took / ops * 1e6:.0f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
