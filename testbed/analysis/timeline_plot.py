"""Per-stage timeline of one training iteration as a PNG: the picture that shows the bubbles.

One job: draw spans, in real time: a run's records are emulated time (time_scale T times
longer), drawn divided by T as metrics.json and trace.json report them. Reads a run's trainer_spans.jsonl (or records), draws one row per worker
(stage, replica): forward (light) and backward (dark) compute labelled with the micro-batch,
optimizer step, waits for activations/gradients and the all-reduce (communication), and idle
(the row's background). A thin strip under each row shows when the sender thread was writing.
matplotlib is imported inside the function (Agg backend), so importing this module is cheap.

Shared GPU (BubbleTea): a worker's GPU_WAIT spans (it waited for the host's GPU lock: a prefill
overran the bubble) are drawn in red on its row, its IDLE spans (announced bubbles, from the
notice to the predicted end) as a thin strip above the row, and `extra_spans` records named
PREFILL ({"host", "t_start_ns", "t_end_ns"}, the prefill servers' records) on the row(s) of their
host, so the prefills appear inside the bubbles, and records named BUBBLE with a t_bound_end_ns
(the controller's: the arrival bound kept the bubble open past its announced end, prefill/
controller.py) as a strip of another colour from the announced end to that bound, beside the
announced one; a prefill that overlaps a training op of its
host (which the GPU lock forbids) is outlined and hatched in black. These are drawn wherever
they overlap the iteration's window (clipped to it), whatever their iteration field says.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from testbed.host.spans import read_jsonl
from testbed.rules.figures import iteration_windows
from testbed.spec.timescale import TimeScale

COLOURS = {"F": "#8ecae6", "B": "#1d4e89", "OPT": "#6c757d", "RECV_F": "#f4a261",
           "RECV_B": "#e76f51", "ALLREDUCE": "#e9c46a", "SEND_F": "#2a9d8f", "SEND_B": "#2a9d8f",
           "idle": "#f1f1f1", "GPU_WAIT": "#d62828", "PREFILL": "#9d4edd", "IDLE": "#adb5bd",
           "BOUND": "#00b4d8", "OVERLAP": "#000000"}
LABELS = {"F": "forward", "B": "backward", "OPT": "optimizer", "RECV_F": "wait activation",
          "RECV_B": "wait gradient", "ALLREDUCE": "all-reduce", "SEND_F": "sending",
          "idle": "idle (bubble)", "GPU_WAIT": "training waits for GPU",
          "PREFILL": "prefill", "IDLE": "announced bubble",
          "BOUND": "bubble kept open by the arrival bound",
          "OVERLAP": "prefill overlapping training (defect)"}


def timeline_extras(prefill_records: Sequence[dict]) -> list[dict]:
    """What plot_timeline draws from a +bubbletea system's prefill records: the prefills, and
    the bubbles the arrival bound held open past their announced end."""
    return [r for r in prefill_records if r["name"] == "PREFILL"
            or (r["name"] == "BUBBLE" and r.get("t_bound_end_ns"))]


def pick_iteration(spans: Sequence[dict]) -> int:
    """The second iteration when there is one (the first includes warm-up)."""
    its = sorted(iteration_windows(spans))
    return its[1] if len(its) > 1 else its[0]


def plot_timeline(spans: Path | Sequence[dict], out_png: Path, iteration: int | None = None,
                  title: str = "", extra_spans: Sequence[dict] | None = None,
                  time_scale: TimeScale = TimeScale()) -> Path:
    """Draw one iteration (default: pick_iteration) of the run's spans to out_png.
    extra_spans: other processes' records to draw on their host's row (PREFILL, BUBBLE).
    time_scale: the run's dilation; the records are emulated time, drawn in real time."""
    fig = timeline_figure(spans, iteration, title, extra_spans, time_scale)   # (Agg)
    import matplotlib.pyplot as plt
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120, metadata={"Software": None})   # same bytes across versions
    plt.close(fig)
    return out_png


def timeline_figure(spans: Path | Sequence[dict], iteration: int | None = None,
                    title: str = "", extra_spans: Sequence[dict] | None = None,
                    time_scale: TimeScale = TimeScale()):
    """plot_timeline's figure (matplotlib), not saved: the caller closes it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    records = read_jsonl(Path(spans)) if isinstance(spans, (str, Path)) else list(spans)
    it = pick_iteration(records) if iteration is None else iteration
    lo, hi = iteration_windows(records)[it]
    rows = sorted({(r["stage"], r["replica"]) for r in records}, reverse=True)
    row_y = {key: i for i, key in enumerate(rows)}
    hosts = {(r["stage"], r["replica"]): r.get("host", "") for r in records}
    fig_h_in = 0.55 * len(rows) + 1.8
    fig, ax = plt.subplots(figsize=(12, fig_h_in))
    def ms(ns: float) -> float:
        """An emulated span in ns as real ms."""
        return time_scale.real_span(ns / 1e6)

    span_ms = ms(hi - lo)
    for key, y in row_y.items():
        ax.barh(y, span_ms, left=0, height=0.7, color=COLOURS["idle"], edgecolor="none")
    rows_of_host: dict[str, list[float]] = {}
    for key, y in row_y.items():
        rows_of_host.setdefault(hosts[key], []).append(y)
    shown: set[str] = set()

    def clipped(r: dict) -> tuple[float, float] | None:
        """(x0 ms, width ms) of r inside the window, None if it does not overlap it."""
        t0, t1 = max(r["t_start_ns"], lo), min(r["t_end_ns"], hi)
        return None if t1 <= t0 else (ms(t0 - lo), ms(t1 - t0))

    for r in records:
        if r["name"] in ("GPU_WAIT", "IDLE"):
            continue                  # drawn on top, below
        if r.get("iteration") != it or r["name"] not in COLOURS:
            continue
        y = row_y[(r["stage"], r["replica"])]
        x0, w = ms(r["t_start_ns"] - lo), ms(r["t_end_ns"] - r["t_start_ns"])
        if r["name"].startswith("SEND"):
            ax.barh(y - 0.42, w, left=x0, height=0.12, color=COLOURS[r["name"]],
                    edgecolor="none")
            continue
        ax.barh(y, w, left=x0, height=0.7, color=COLOURS[r["name"]], edgecolor="white",
                linewidth=0.5)
        if r["name"] in ("F", "B") and r.get("microbatch") is not None and w > span_ms / 80:
            ax.text(x0 + w / 2, y, f"{r['name']}{r['microbatch']}", ha="center", va="center",
                    fontsize=7, color="black" if r["name"] == "F" else "white")
    # A prefill holds the host's GPU lock, so it never overlaps the row's F/B/OPT: drawn over
    # the waits it fills (a little narrower, so what the worker was waiting for still shows).
    compute = [r for r in records if r["name"] in ("F", "B", "OPT")]
    for r in extra_spans or ():
        if r.get("name") == "BUBBLE":
            if r.get("t_bound_end_ns") and r["t_bound_end_ns"] > r["t_pred_end_ns"]:
                xw = clipped({"t_start_ns": r["t_pred_end_ns"], "t_end_ns": r["t_bound_end_ns"]})
                for y in rows_of_host.get(r.get("host", ""), []) if xw is not None else []:
                    ax.barh(y + 0.42, xw[1], left=xw[0], height=0.1, color=COLOURS["BOUND"],
                            edgecolor="none")
                    shown.add("BOUND")
            continue
        xw = clipped(r) if r.get("name") == "PREFILL" else None
        for y in rows_of_host.get(r.get("host", ""), []) if xw is not None else []:
            ax.barh(y, xw[1], left=xw[0], height=0.56, color=COLOURS["PREFILL"],
                    edgecolor="none")
            shown.add("PREFILL")
        # an overlap with training compute on the host (a defect: the lock should forbid it)
        for c in compute if xw is not None else []:
            if c.get("host") == r.get("host") and c["t_start_ns"] < r["t_end_ns"] \
                    and r["t_start_ns"] < c["t_end_ns"]:
                both = clipped({"t_start_ns": max(c["t_start_ns"], r["t_start_ns"]),
                                "t_end_ns": min(c["t_end_ns"], r["t_end_ns"])})
                if both is not None:
                    ax.barh(row_y[(c["stage"], c["replica"])], both[1], left=both[0],
                            height=0.8, fill=False, hatch="xxx", edgecolor="black")
                    shown.add("OVERLAP")
    for r in records:
        xw = clipped(r) if r["name"] in ("GPU_WAIT", "IDLE") else None
        if xw is None:
            continue
        y = row_y[(r["stage"], r["replica"])]
        if r["name"] == "IDLE":
            ax.barh(y + 0.42, xw[1], left=xw[0], height=0.1, color=COLOURS["IDLE"],
                    edgecolor="none")
        else:
            ax.barh(y, xw[1], left=xw[0], height=0.4, color=COLOURS["GPU_WAIT"],
                    edgecolor="none")
        shown.add(r["name"])
    ax.set_yticks(list(row_y.values()))
    ax.set_yticklabels([f"stage {s} rep {d}\n{hosts[(s, d)]}" for s, d in row_y], fontsize=8)
    ax.set_xlim(0, span_ms)
    if time_scale.dilated:
        ax.set_xlabel(f"real time since iteration {it} start (ms)")
        ax.set_title(f"{title or f'iteration {it}'} (time_scale {time_scale}: emulated "
                     f"spans drawn / {time_scale}, in real time)")
    else:
        ax.set_xlabel(f"time since iteration {it} start (ms)")
        ax.set_title(title or f"iteration {it}")
    keys = ["F", "B", "OPT", "RECV_F", "RECV_B", "ALLREDUCE", "SEND_F", "idle"]
    keys += [k for k in ("PREFILL", "GPU_WAIT", "IDLE", "BOUND", "OVERLAP") if k in shown]
    legend_rows = -(-len(keys) // 8)
    fig.set_figheight(fig_h_in + 0.2 * (legend_rows - 1))
    fig.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in keys],
               loc="lower center", ncol=min(len(keys), 8), fontsize=7, frameon=False)
    # leave the legend's rows free under the axes and their x label
    fig.tight_layout(rect=(0, (0.2 * legend_rows + 0.05) / fig.get_figheight(), 1, 1))
    return fig
