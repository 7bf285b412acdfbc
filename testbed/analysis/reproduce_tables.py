"""The tables of `reproduce` (testbed.analysis.reproduce): one record per run and system, written
as Markdown (rounded, for reading: "-2.3%", "-" where there is no figure) and as CSV (the raw
numbers, for computing: each header names its unit, an empty cell where there is no figure).

One job: tabulate. Shares (bubble, GPU utilization) are percent in Markdown, as everywhere a
person reads them (run lines, predict, whatif, figures), and fractions in the CSV. Units in the CSV headers: `_s` seconds, `_ms` milliseconds, `_per_s` per
second, `_frac` a fraction (0.021 is 2.1%), `_x` a ratio; `deadline_misses` is a count. All
times are real time (metrics.json's).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any, Callable, Sequence


@dataclass(frozen=True, slots=True)
class Column:
    md: str                     # the Markdown header
    csv: str                    # the CSV header, with its unit
    fmt: str | None = None      # the Markdown format of a number (None: str)


TRAINING = (Column("results", "results"), Column("point", "point"), Column("system", "system"),
            Column("iteration s", "iteration_s", ".3f"),
            Column("spread s", "iteration_stdev_s", ".3f"), Column("n", "repeats"),
            Column("model s", "model_iteration_s", ".3f"),
            Column("model/measured - 1", "model_error_frac", "+.1%"),
            Column("speedup", "speedup_vs_baseline_x", ".2f"),
            Column("bubble", "bubble_frac", ".1%"),
            Column("model bubble", "model_bubble_frac", ".1%"),
            Column("GPU util", "gpu_utilization_frac", ".1%"))
TRAINING_CSV_ONLY = (Column("", "status"),)     # "complete" or "stopped after i of n iterations"

BUBBLETEA = (Column("results", "results"), Column("point", "point"), Column("system", "system"),
             Column("GPU util without", "gpu_utilization_without_frac", ".1%"),
             Column("GPU util with", "gpu_utilization_with_frac", ".1%"),
             Column("model util", "model_gpu_utilization_frac", ".1%"),
             Column("bubble without", "bubble_without_frac", ".1%"),
             Column("bubble with", "bubble_with_frac", ".1%"),
             Column("slowdown", "training_slowdown_frac", "+.1%"),
             Column("requests/s", "requests_per_s", ".1f"),
             Column("TTFT p50 ms", "ttft_p50_ms", ".0f"),
             Column("TTFT p99 ms", "ttft_p99_ms", ".0f"),
             Column("deadline misses", "deadline_misses"))


def _point(run: Any) -> str | None:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in run.values.items()) or None


def training_records(runs: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        systems = run.metrics["systems"]
        base = systems.get("baseline", {}).get("iteration_time_s")   # None if it stopped
        for name, m in systems.items():
            rec = {"results": run.name, "point": _point(run), "system": name}
            if not m.get("complete", True):     # stopped early (a fault, Ctrl-C): no figures
                rec["status"] = (f"stopped after {m.get('iterations_done', 0)} of "
                                 f"{m.get('iterations_planned', '?')} iterations")
                out.append(rec)
                continue
            pred = (m.get("model") or {}).get("predicted") or {}
            err = (m.get("model") or {}).get("error") or {}
            rep = m.get("repeats") or {}
            rec.update(iteration_s=m["iteration_time_s"],
                       iteration_stdev_s=(rep.get("iteration_time_s") or {}).get("stdev"),
                       repeats=rep.get("n", 1),
                       model_iteration_s=pred.get("iteration_time_s"),
                       model_error_frac=err.get("iteration_time_rel"),
                       speedup_vs_baseline_x=base / m["iteration_time_s"] if base else None,
                       bubble_frac=m["bubble_fraction"],
                       model_bubble_frac=pred.get("bubble_fraction"),
                       gpu_utilization_frac=m["gpu_utilization"], status="complete")
            out.append(rec)
    return out


def bubbletea_records(runs: Sequence[Any]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        for name, m in run.metrics["systems"].items():
            bt = m.get("bubbletea")
            if bt is None or not m.get("complete", True):
                continue
            pf = bt["prefill"]
            model = ((m.get("model") or {}).get("bubbletea") or {}).get("predicted") or {}
            without = bt.get("gpu_utilization_without")
            out.append({"results": run.name, "point": _point(run), "system": name,
                        "gpu_utilization_without_frac": without,
                        "gpu_utilization_with_frac": bt["gpu_utilization"],
                        "model_gpu_utilization_frac": model.get("gpu_utilization"),
                        "bubble_without_frac": None if without is None else 1 - without,
                        "bubble_with_frac": 1 - bt["gpu_utilization"],
                        "training_slowdown_frac": bt.get("training_slowdown"),
                        "requests_per_s": pf["requests_per_s"],
                        "ttft_p50_ms": pf["ttft_ms"]["p50"], "ttft_p99_ms": pf["ttft_ms"]["p99"],
                        "deadline_misses": pf["deadline_misses"]})
    return out


def _md_cell(col: Column, rec: dict[str, Any]) -> str:
    v = rec.get(col.csv)
    if v is None:
        return "-"
    return format(v, col.fmt) if col.fmt else str(v)


def _md_row(columns: Sequence[Column], rec: dict[str, Any]) -> list[str]:
    if rec.get("status", "complete") != "complete":    # the reason in place of the figures
        return [_md_cell(c, rec) for c in columns[:3]] + [rec["status"]] + ["-"] * (len(columns) - 4)
    return [_md_cell(c, rec) for c in columns]


def markdown(columns: Sequence[Column], records: Sequence[dict[str, Any]]) -> str:
    out = ["| " + " | ".join(c.md for c in columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_md_row(columns, r)) + " |" for r in records]
    return "\n".join(out) + "\n"


def csv_text(columns: Sequence[Column], records: Sequence[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c.csv for c in columns])
    writer.writerows([["" if r.get(c.csv) is None else r[c.csv] for c in columns]
                      for r in records])
    return buf.getvalue()


TABLES: tuple[tuple[str, tuple[Column, ...], tuple[Column, ...],
                    Callable[[Sequence[Any]], list[dict[str, Any]]]], ...] = (
    ("training", TRAINING, TRAINING_CSV_ONLY, training_records),
    ("bubbletea", BUBBLETEA, (), bubbletea_records))
