#!/usr/bin/env python3
"""Both backends' calibrations side by side, as the Markdown table in docs/network.md.

    python3 scripts/fidelity_table.py OUT    # OUT/<backend>/<run>/calibration.json

OUT as `calibrate --backend B --out OUT/B` writes it (the stock-kernel guest: docs/network.md).
Per link and quantity: configured, expected (95.6% of the rate for N flows, the window limit
for one) and each backend's measurement; RTTs are the median reply.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

BACKENDS = ("netem", "delayline")
# (label, measured value of a link, expected value from its predicted block)
QUANTITIES = [
    ("idle RTT ms", lambda m: statistics.median(m["samples"]["rtt_ms"]), lambda p: p["rtt_ms"]),
    ("RTT under 90% load ms", lambda m: statistics.median(m["samples"]["rtt_loaded_ms"]),
     lambda p: p["rtt_ms"]),
    ("goodput Mbit/s, 4 flows", lambda m: m["measured"]["goodput_mbit"],
     lambda p: p["goodput_mbit"]),
    ("goodput Mbit/s, 4 flows back", lambda m: m["measured"]["goodput_reverse_mbit"],
     lambda p: p["goodput_reverse_mbit"]),
    ("goodput Mbit/s, 1 flow", lambda m: m["measured"]["goodput_1flow_mbit"],
     lambda p: p["goodput_1flow_mbit"]),
]


def table(out: Path) -> str:
    links: dict[tuple[str, str], dict[str, dict]] = {}
    for path in sorted(out.glob("*/*/calibration.json")):
        doc = json.loads(path.read_text())
        for link in doc["links"]:
            key = (path.parent.name.split("-")[0], "<->".join(link["between"]))
            links.setdefault(key, {})[doc["backend"]] = link
    lines = ["| scenario | link | quantity | configured | expected | netem | delay line |",
             "|---|---|---|---|---|---|---|"]
    for (scenario, name), per in links.items():
        first = next(iter(per.values()))
        c, p = first["configured"], first["predicted"]
        for label, measured, expected in QUANTITIES:
            configured = f"{p['rtt_ms']:g}" if "RTT" in label else f"{c['rate_mbit']:g}"
            got = [f"{measured(per[b]):.1f}" if b in per else "not measured" for b in BACKENDS]
            lines.append(f"| {scenario} | {name} | {label} | {configured} | "
                         f"{expected(p):.1f} | {got[0]} | {got[1]} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        print("error: OUT: give the folder holding <backend>/<run>/calibration.json", file=sys.stderr)
        sys.exit(2)
    print(table(Path(sys.argv[1])))
