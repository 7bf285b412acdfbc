"""Per-stage timeline of one training iteration as a PNG: the picture that shows the bubbles.

One job: draw spans. Reads a run's trainer_spans.jsonl (or records), draws one row per worker
(stage, replica): forward (light) and backward (dark) compute labelled with the micro-batch,
optimizer step, waits for activations/gradients and the all-reduce (communication), and idle
(the row's background). A thin strip under each row shows when the sender thread was writing.
matplotlib is imported inside the function (Agg backend), so importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from trainer.events import read_jsonl
from trainer.metrics import iteration_windows

COLOURS = {"F": "#8ecae6", "B": "#1d4e89", "OPT": "#6c757d", "RECV_F": "#f4a261",
           "RECV_B": "#e76f51", "ALLREDUCE": "#e9c46a", "SEND_F": "#2a9d8f", "SEND_B": "#2a9d8f",
           "idle": "#f1f1f1"}
LABELS = {"F": "forward", "B": "backward", "OPT": "optimizer", "RECV_F": "wait activation",
          "RECV_B": "wait gradient", "ALLREDUCE": "all-reduce", "SEND_F": "sending",
          "idle": "idle (bubble)"}


def pick_iteration(spans: Sequence[dict]) -> int:
    """The second iteration when there is one (the first includes warm-up)."""
    its = sorted(iteration_windows(spans))
    return its[1] if len(its) > 1 else its[0]


def plot_timeline(spans: Path | Sequence[dict], out_png: Path, iteration: int | None = None,
                  title: str = "") -> Path:
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
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(rows) + 1.6))
    span_ms = (hi - lo) / 1e6
    for key, y in row_y.items():
        ax.barh(y, span_ms, left=0, height=0.7, color=COLOURS["idle"], edgecolor="none")
    for r in records:
        if r.get("iteration") != it or r["name"] not in COLOURS:
            continue
        y = row_y[(r["stage"], r["replica"])]
        x0, w = (r["t_start_ns"] - lo) / 1e6, (r["t_end_ns"] - r["t_start_ns"]) / 1e6
        if r["name"].startswith("SEND"):
            ax.barh(y - 0.42, w, left=x0, height=0.12, color=COLOURS[r["name"]],
                    edgecolor="none")
            continue
        ax.barh(y, w, left=x0, height=0.7, color=COLOURS[r["name"]], edgecolor="white",
                linewidth=0.5)
        if r["name"] in ("F", "B") and r.get("microbatch") is not None and w > span_ms / 80:
            ax.text(x0 + w / 2, y, f"{r['name']}{r['microbatch']}", ha="center", va="center",
                    fontsize=7, color="black" if r["name"] == "F" else "white")
    ax.set_yticks(list(row_y.values()))
    ax.set_yticklabels([f"stage {s} rep {d}\n{hosts[(s, d)]}" for s, d in row_y], fontsize=8)
    ax.set_xlim(0, span_ms)
    ax.set_xlabel(f"time since iteration {it} start (ms)")
    ax.set_title(title or f"iteration {it}")
    keys = ["F", "B", "OPT", "RECV_F", "RECV_B", "ALLREDUCE", "SEND_F", "idle"]
    ax.legend(handles=[Patch(color=COLOURS[k], label=LABELS[k]) for k in keys],
              loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(keys), fontsize=7,
              frameon=False)
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png
