"""The figures of `reproduce` (testbed.analysis.reproduce): matplotlib (Agg), PNG bytes that depend only
on the results read.

One job: draw. Per scenario whose runs differ in the first WAN link's delay,
speedup_vs_delay-<scenario>.png (speedup over baseline, log scale, a line per system, a panel per
setting of the other fields that differ); per scenario whose +bubbletea runs differ in offered
request rate, bubbletea_vs_rate-<scenario>.png (GPU utilization with and without BubbleTea,
training slowdown, TTFT p50/p99, against offered requests/s in real time); testbed.analysis.series
groups the points, so no line joins two scenarios. A system has one colour in every figure
(SYSTEM_COLOURS). And one timeline per run and system (testbed.analysis.timeline_plot, from the
run's spans and prefill records, in real time). The benchmarks bench/bench_atlas_sweep.py and
bench/bench_bubbletea_sweep.py draw the docs' figures with speedup_figure and bubbletea_figure.
"""

from __future__ import annotations

import io
import re
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Callable, Sequence

from testbed.analysis.series import Point, delay_points, lines, rate_points
from testbed.host.spans import read_jsonl
from testbed.spec.timescale import TimeScale

PNG_META = {"Software": None}   # no version string: same bytes across matplotlib builds

# One colour per system in every figure (matplotlib's tab10, and two of tab20's light ones,
# in testbed.spec.systems' order).
SYSTEM_COLOURS = {
    "baseline": "#1f77b4", "multitcp": "#ff7f0e", "temporal": "#2ca02c", "atlas": "#d62728",
    "atlas-concurrent": "#ff9896", "dp-across-dcs": "#9467bd", "baseline+bubbletea": "#8c564b",
    "multitcp+bubbletea": "#e377c2", "temporal+bubbletea": "#bcbd22",
    "atlas+bubbletea": "#17becf", "atlas-concurrent+bubbletea": "#9edae5",
    "dp-across-dcs+bubbletea": "#7f7f7f", "hierarchical": "#2f4b7c",
    "hierarchical+bubbletea": "#a05195"}
OTHER_COLOUR = "#000000"        # a system this table does not know


def colour_of(system: str) -> str:
    return SYSTEM_COLOURS.get(system, OTHER_COLOUR)


def _system_order(names: Sequence[str]) -> list[str]:
    known = list(SYSTEM_COLOURS)
    return sorted(set(names), key=lambda n: (known.index(n) if n in known else len(known), n))


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata=PNG_META)
    return buf.getvalue()


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def panel_title(panel: tuple) -> str:
    return textwrap.fill(", ".join(f"{k}={v:g}" if isinstance(v, (int, float))
                                   and not isinstance(v, bool) else f"{k}={v}"
                                   for k, v in panel), 60)


def panel_order(panel: tuple) -> tuple:
    """Panels in the order of their values, numbers as numbers."""
    return tuple((k, (0, v, "") if isinstance(v, (int, float)) else (1, 0, repr(v)))
                 for k, v in panel)


def _legends(axes: Sequence, systems: Sequence[set[str]]) -> None:
    """One legend when every panel draws the same systems, else one per panel."""
    for ax in axes[:1] if all(s == systems[0] for s in systems) else axes:
        ax.legend(fontsize=7)


def speedup_figure(scenario: str, by_panel: dict[tuple, dict[str, list[Point]]]):
    """One scenario's speedup over baseline against the delay: a panel per other setting."""
    import matplotlib.ticker as ticker
    plt = _pyplot()

    keys = sorted(by_panel, key=panel_order)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys), 3.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for name in _system_order(by_panel[key]):
            pts = by_panel[key][name]
            ys = [p.y["speedup"] for p in pts]
            if all("speedup_lo" in p.y for p in pts):   # repeats: the range as error bars
                err = [[y - p.y["speedup_lo"] for y, p in zip(ys, pts)],
                       [p.y["speedup_hi"] - y for y, p in zip(ys, pts)]]
                ax.errorbar([p.x for p in pts], ys, yerr=err, marker="o", capsize=3,
                            color=colour_of(name), label=name)
            else:
                ax.plot([p.x for p in pts], ys, marker="o", color=colour_of(name), label=name)
            if all("model_speedup" in p.y for p in pts) and name != "baseline":
                ax.plot([p.x for p in pts], [p.y["model_speedup"] for p in pts], ls="--",
                        lw=1, color=colour_of(name), alpha=0.7)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        if key:
            ax.set_title(panel_title(key), fontsize=8)
        ax.set_xlabel("one-way WAN delay, first link (ms)")
        ax.set_ylabel("speedup over baseline (x)")
        ax.set_yscale("log")
        ys = [p.y["speedup"] for pts in by_panel[key].values() for p in pts] + [1.0]
        wide = max(ys) / min(ys) >= 10          # a decade or more: fewer ticks per decade
        subs = (1.0, 2.0, 5.0) if wide else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0)
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.grid(alpha=0.3)
    _legends(list(axes[0]), [set(by_panel[k]) for k in keys])
    fig.suptitle(f"{scenario}: speedup over baseline (same run)\nvs WAN delay "
                 f"(dashed: the model; bars: range over repeats)", fontsize=9)
    fig.tight_layout()
    return fig


def bubbletea_figure(scenario: str, by_panel: dict[tuple, dict[str, list[Point]]]):
    """One scenario's BubbleTea figures against the offered rate: a row per other setting."""
    plt = _pyplot()

    keys = sorted(by_panel, key=panel_order)
    fig, axes = plt.subplots(len(keys), 3, figsize=(12, 3.6 * len(keys)), squeeze=False)
    for row, key in zip(axes, keys):
        a1, a2, a3 = row
        for name in _system_order(by_panel[key]):
            pts, c = by_panel[key][name], colour_of(name)
            xs = [p.x for p in pts]
            a1.plot(xs, [100 * p.y["gpu_utilization"] for p in pts], marker="o", color=c,
                    label=name if "training_slowdown" in pts[0].y else f"{name} (no prefill)")
            if "training_slowdown" not in pts[0].y:
                continue
            slow = [(p.x, p.y["training_slowdown"]) for p in pts
                    if p.y["training_slowdown"] is not None]
            a2.plot([x for x, _ in slow], [100 * y for _, y in slow], marker="o", color=c,
                    label=name)
            for q, style, marker in (("p50", "-", "o"), ("p99", "--", "^")):
                ttft = [(p.x, p.y[f"ttft_{q}_ms"]) for p in pts if p.y[f"ttft_{q}_ms"]]
                a3.plot([x for x, _ in ttft], [y for _, y in ttft], ls=style, marker=marker,
                        color=c, label=f"{name} {q}")
        a1.set_ylabel("GPU utilization (%)")
        a2.axhline(0, color="black", lw=0.5)
        a2.set_ylabel("training slowdown (%)")
        a3.set_ylabel("TTFT (ms)")
        a3.set_yscale("log")
        for ax in row:
            ax.set_xlabel("offered prefill requests/s (real time)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        if key:
            a2.set_title(panel_title(key), fontsize=8)
    fig.suptitle(f"{scenario}: BubbleTea vs offered request rate (real time)", fontsize=10)
    fig.tight_layout()
    return fig


def line_figure_plan(runs: Sequence) -> list[tuple[str, Callable, str, dict]]:
    """(file name, draw, scenario, its panels' lines) of each line figure, in file order."""
    out = []
    for stem, points, draw in (("speedup_vs_delay", delay_points(runs), speedup_figure),
                               ("bubbletea_vs_rate", rate_points(runs), bubbletea_figure)):
        for scenario, by_panel in sorted(lines(points).items()):
            out.append((f"{stem}-{slug(scenario)}.png", draw, scenario, by_panel))
    return out


def line_figures(runs: Sequence, out_dir: Path,
                 write: Callable[[Path, bytes], Path]) -> list[Path]:
    """speedup_vs_delay-<scenario>.png and bubbletea_vs_rate-<scenario>.png (module doc)."""
    plt = _pyplot()
    out = []
    for name, draw, scenario, by_panel in line_figure_plan(runs):
        fig = draw(scenario, by_panel)
        out.append(write(out_dir / name, png_bytes(fig)))
        plt.close(fig)
    return out


def figures(runs: Sequence, out_dir: Path, write: Callable[[Path, bytes], Path], *,
            timelines: bool = True) -> list[Path]:
    out = line_figures(runs, out_dir, write)
    if timelines:
        out += draw_timelines(runs, out_dir, write)
    return out


def time_scale_of(run: Any) -> TimeScale:
    return TimeScale(float(run.metrics.get("time_scale") or run.scenario.get("time_scale") or 1))


def draw_timelines(runs: Sequence, out_dir: Path, write: Callable[[Path, bytes], Path]) -> list[Path]:
    from testbed.analysis.timeline_plot import plot_timeline, timeline_extras
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
            slug_ = slug(f"{r.name}-{name}")
            with tempfile.TemporaryDirectory(prefix="timeline-") as scratch:   # ours alone (0700)
                png = plot_timeline(spans_path, Path(scratch) / "timeline.png",
                                    iteration=iteration, extra_spans=extra,
                                    title=f"{r.scenario.get('name', r.name)} {name}",
                                    time_scale=time_scale_of(r))
                data = png.read_bytes()
            out.append(write(out_dir / f"timeline-{slug_}.png", data))
    return out
