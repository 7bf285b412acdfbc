"""The figures of `reproduce` (geodc.analysis.reproduce): matplotlib (Agg), PNG bytes that depend only
on the results read.

One job: draw. speedup_vs_delay.png when the runs differ in their first WAN link's delay (a line
per system: speedup over baseline in the same run), bubbletea_vs_rate.png when +bubbletea runs
differ in request rate (GPU utilization with and without BubbleTea, and the training slowdown),
and one timeline per run and system (geodc.analysis.timeline_plot, from the run's spans and prefill
records).
"""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path
from typing import Callable, Sequence

from geodc.host.spans import read_jsonl

PNG_META = {"Software": None}   # no version string: same bytes across matplotlib builds


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata=PNG_META)
    return buf.getvalue()


def figures(runs: Sequence, out_dir: Path, write: Callable[[Path, bytes], Path], *,
            timelines: bool = True) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[Path] = []
    by_delay = [r for r in runs if r.first_delay_ms is not None
                and "baseline" in r.metrics["systems"]]
    if len({r.first_delay_ms for r in by_delay}) > 1:
        fig, ax = plt.subplots(figsize=(7, 4))
        systems = sorted({s for r in by_delay for s in r.metrics["systems"]})
        for name in systems:
            pts = sorted((r.first_delay_ms, r.metrics["systems"]["baseline"]["iteration_time_s"]
                          / r.metrics["systems"][name]["iteration_time_s"])
                         for r in by_delay if name in r.metrics["systems"])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xlabel("WAN one-way delay, first link (ms)")
        ax.set_ylabel("speedup over baseline")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        out.append(write(out_dir / "speedup_vs_delay.png", _png(fig)))
        plt.close(fig)
    bt = [(r, name, m) for r in runs for name, m in r.metrics["systems"].items()
          if m.get("bubbletea") is not None and r.request_rate is not None]
    if len({r.request_rate for r, _, _ in bt}) > 1:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for name in sorted({n for _, n, _ in bt}):
            pts = sorted((r.request_rate, m["bubbletea"]["gpu_utilization"],
                          m["bubbletea"].get("gpu_utilization_without"),
                          m["bubbletea"].get("training_slowdown")) for r, n, m in bt if n == name)
            xs = [p[0] for p in pts]
            ax1.plot(xs, [p[1] for p in pts], marker="o", label=f"{name}")
            if all(p[2] is not None for p in pts):
                ax1.plot(xs, [p[2] for p in pts], marker="x", ls="--", label=f"{name}, training alone")
            if all(p[3] is not None for p in pts):
                ax2.plot(xs, [100 * p[3] for p in pts], marker="o", label=name)
        ax1.set_xlabel("request rate (trace multiplier or requests/s)")
        ax1.set_ylabel("GPU utilization")
        ax1.grid(alpha=0.3)
        ax1.legend(fontsize=8)
        ax2.set_xlabel("request rate (trace multiplier or requests/s)")
        ax2.set_ylabel("training slowdown (%)")
        ax2.grid(alpha=0.3)
        fig.tight_layout()
        out.append(write(out_dir / "bubbletea_vs_rate.png", _png(fig)))
        plt.close(fig)
    if timelines:
        out += draw_timelines(runs, out_dir, write)
    return out


def draw_timelines(runs: Sequence, out_dir: Path, write: Callable[[Path, bytes], Path]) -> list[Path]:
    from geodc.analysis.timeline_plot import plot_timeline, timeline_extras
    out = []
    for r in runs:
        for name in r.metrics["systems"]:
            spans_path = r.path / name / "trainer_spans.jsonl"
            if not spans_path.is_file():
                continue
            prefill_path = r.path / name / "prefill_records.jsonl"
            extra = (timeline_extras(list(read_jsonl(prefill_path)))
                     if prefill_path.is_file() else None)
            bt = r.metrics["systems"][name].get("bubbletea")
            iteration = bt["iterations"][len(bt["iterations"]) // 2] if bt else None
            slug = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{r.name}-{name}")
            with tempfile.TemporaryDirectory(prefix="timeline-") as scratch:   # ours alone (0700)
                png = plot_timeline(spans_path, Path(scratch) / "timeline.png",
                                    iteration=iteration, extra_spans=extra,
                                    title=f"{r.scenario.get('name', r.name)} {name}")
                data = png.read_bytes()
            out.append(write(out_dir / f"timeline-{slug}.png", data))
    return out
