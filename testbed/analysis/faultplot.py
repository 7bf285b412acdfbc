"""wire.png: what the wire carried on each link with faults or cross-traffic, faults marked.

One job: draw testbed.features.faults.run's results (matplotlib, Agg): one line per link direction (Mbit/s
in configured units, sampled every faultrun.SAMPLE_S), a dashed line where each fault was
applied, a dotted one where it took effect on the wire, and the cross-traffic's goodput when
the results have it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testbed.emulation.results import write_bytes


def plot_faults(faults: dict[str, Any], path: Path, title: str,
                cross: list[dict[str, Any]] = ()) -> Path:
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for key, series in sorted(faults.get("wire_mbit", {}).items()):
        if series:
            ax.plot([t for t, _ in series], [v for _, v in series], lw=1, label=f"wire {key}")
    for entry in cross:
        pts = entry.get("intervals_mbit") or []
        if pts:
            ax.step([t for t, _ in pts], [v for _, v in pts], where="post", lw=1.5, ls="-.",
                    label=f"cross {entry['label']} goodput")
    for i, ev in enumerate(faults.get("events", [])):
        color = f"C{(i + 3) % 10}"
        if ev.get("applied_s") is not None:
            ax.axvline(ev["applied_s"], color=color, ls="--", lw=1,
                       label=("restore " if ev["restore"] else "") + ev["fault"])
        if ev.get("took_effect_s") is not None and ev["took_effect_s"] != ev.get("applied_s"):
            ax.axvline(ev["took_effect_s"], color=color, ls=":", lw=1)
    ax.set_xlabel("seconds after the trainers started (configured time)")
    ax.set_ylabel("Mbit/s")
    ax.set_title(f"{title}: the wire" + (" and cross-traffic" if cross else "")
                 + (" (faults dashed: applied, dotted: took effect)"
                    if faults.get("events") else ""), fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return write_bytes(path, buf.getvalue())
