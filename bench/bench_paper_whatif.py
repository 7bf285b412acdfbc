#!/usr/bin/env python3
"""Which settings give the paper's headline results, by the model: Atlas's speedup over the
baseline (the paper: up to 17x) and GPU utilization with BubbleTea (up to 94 %), at paper scale.

    .venv/bin/python bench/bench_paper_whatif.py [--quick] [SCENARIO ...]

For each shipped paper-scale scenario (topologies/paper/, predict_only; default the three that
the others are variants of) the `whatif` command's table (testbed.predict.whatif): as given, then
one setting changed at a time (WAN rate and delay, fewer pipelines, DC sizes that are not whole
stages, slow start after idle, BubbleTea's request rate to saturation), as Markdown (the docs'
tables), each with how long the model took. No root, no network: the model only (about a
minute; --quick: gpt7b_2dc only, a few seconds).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from testbed.cli.whatif import header, markdown  # noqa: E402
from testbed.predict.whatif import whatif  # noqa: E402
from testbed.spec.scenario import load_scenario  # noqa: E402

PAPER = REPO / "topologies" / "paper"
SCENARIOS = ("gpt7b_2dc", "gpt70b_3dc", "gpt160b_5dc")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="gpt7b_2dc only")
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                    help=f"names under topologies/paper/ (default: {', '.join(SCENARIOS)})")
    args = ap.parse_args(argv)
    names = args.scenarios or (SCENARIOS[:1] if args.quick else SCENARIOS)
    t0 = time.perf_counter()
    for name in names:
        result = whatif(load_scenario(PAPER / f"{name}.yaml"))
        print(f"{header(result)}\n\n{markdown(result)}\n", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
