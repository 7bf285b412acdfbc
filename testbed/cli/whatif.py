"""`run_testbed.py whatif SCENARIO [--json]`: the scenario as given and changed one setting at a
time, by the model (no root, no network, no torch).

One job: format testbed.predict.whatif's rows as a table (a line per row, its reason on the line
below), one JSON document, or Markdown (`markdown`, for bench/bench_paper_whatif.py and the
docs): per row the iteration time of each system, Atlas's speedup over the baseline beside the
paper's "up to 17x" and over the fastest other system (named), BubbleTea's GPU utilization beside its "up to 94%" where it was predicted.
"""

from __future__ import annotations

import json
import os

from testbed.predict.whatif import (BUBBLETEA, PAPER_GPU_UTILIZATION, PAPER_SPEEDUP, SYSTEMS, Row,
                                  WhatIf, whatif)
from testbed.spec.scenario import load_scenario

SPEEDUP_HEAD = f"paper: up to {PAPER_SPEEDUP:g}x"
UTIL_HEAD = f"paper: up to {PAPER_GPU_UTILIZATION:.0%}"
BEST_HEAD = "Atlas over the best other"


def whatif_command(path: str, as_json: bool = False) -> str:
    from testbed.cli.ticker import Ticker
    from testbed.emulation import interrupts
    from testbed.plans.systems import capped_connections
    from testbed.predict.unmodelled import unmodelled
    scenario = load_scenario(path)
    ticker = Ticker(f"whatif {scenario.name}")
    with interrupts.installed():    # SIGTERM, SIGHUP as Ctrl-C: the row workers end with it
        result = whatif(scenario, progress=ticker, workers=os.cpu_count() or 1)
    ticker.done()
    left_out = unmodelled(scenario)
    capped = capped_connections(scenario)
    if as_json:
        return json.dumps(dict(result.to_dict(), not_modelled=left_out,
                               connections_capped=capped), indent=1)
    return "\n".join([whatif_text(result)] + capped
                     + [f"not in the model: {line}" for line in left_out])


def header(result: WhatIf) -> str:
    return (f"{result.scenario}: what if, one setting changed at a time (the model: "
            f"{result.gpus:,} GPUs, P={result.stages} x D={result.replicas}"
            + (f" x TP={result.tp}" if result.tp > 1 else "") + ", rates real at "
            f"scale {result.scale:g}; {BUBBLETEA} on the rows with a GPU utilization; "
            f"{result.seconds:.1f} s)")


def whatif_text(result: WhatIf) -> str:
    width = max(len("change"), *(len(r.label) for r in result.rows))
    cells = [[r.label, *(_secs(r, n) for n in SYSTEMS), *_claims(r)] for r in result.rows]
    heads = ["change", *(f"{n} s" for n in SYSTEMS), "Atlas speedup", SPEEDUP_HEAD,
             BEST_HEAD, "BubbleTea GPU", UTIL_HEAD]
    widths = [width] + [max(len(h), *(len(c[i]) for c in cells)) for i, h in
                        enumerate(heads[1:], 1)]
    line = "  ".join

    def fmt(row: list[str]) -> str:
        return line([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])])

    out = [header(result), fmt(heads)]
    for r, c in zip(result.rows, cells):
        out += [fmt(c), f"  why: {r.reason}"]
    return "\n".join(out + waterfall_lines(result))


def waterfall_lines(result: WhatIf) -> list[str]:
    """The gain from the baseline to Atlas one mechanism at a time, on the row as given."""
    steps = result.rows[0].waterfall() if result.rows else []
    if not steps:
        return []
    parts = []
    for name, what, x, gain in steps:
        secs = "-" if x is None else f"{x:,.2f} s"
        parts.append(f"{what} ({name}) {secs}" + ("" if gain is None else f", {gain:.2f}x"))
    total = steps[0][2] / steps[-1][2] if None not in (steps[0][2], steps[-1][2]) else None
    best = result.rows[0].best_other()
    return ["waterfall, as given: " + " -> ".join(parts)
            + ("" if total is None else f"; Atlas over the baseline {total:.2f}x")
            + ("" if best is None else f", over the best other system ({best[0]}) "
               f"{best[1]:.2f}x")]


def markdown(result: WhatIf) -> str:
    """The rows as a Markdown table (the docs' what-if tables)."""
    heads = ["change", *(f"{n} s" for n in SYSTEMS), "Atlas speedup", SPEEDUP_HEAD,
             BEST_HEAD, "BubbleTea GPU util", UTIL_HEAD, "why"]
    out = [f"| {' | '.join(heads)} |", "|" + "---|" * len(heads)]
    for r in result.rows:
        cells = [r.label, *(_secs(r, n) for n in SYSTEMS), *_claims(r), r.reason]
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(out + [""] + waterfall_lines(result))


def _secs(row: Row, name: str) -> str:
    f = row.systems.get(name)
    if f is None or f.iteration_s is None:
        return "-"
    x = f.iteration_s
    return f"{x:.3f}" if x < 1 else f"{x:.2f}" if x < 1000 else f"{x:,.0f}"


def _claims(row: Row) -> list[str]:
    """Atlas's speedup over the baseline and where it stands to the paper's, over the fastest
    other system (named), then BubbleTea's GPU utilization and where it stands to the paper's
    ("-" where not predicted)."""
    x = row.speedup
    bt = row.bubbletea
    best = row.best_other()
    return ["-" if x is None else f"{x:.2f}x",
            "-" if x is None else ("reached" if x >= PAPER_SPEEDUP else "below"),
            "-" if best is None else f"{best[1]:.2f}x ({best[0]})",
            "-" if bt is None else f"{bt.gpu_utilization:.1%}",
            "-" if bt is None else ("reached" if bt.gpu_utilization >= PAPER_GPU_UTILIZATION
                                    else "below")]
