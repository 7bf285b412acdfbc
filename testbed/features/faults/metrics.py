"""The faults' lines in a run's summary, from their results."""

from __future__ import annotations


def summary_lines(faults: dict | None) -> list[str]:
    """One line per fault event: when it was due, applied and seen on the wire."""
    out = []
    for ev in (faults or {}).get("events", []):
        if ev.get("error"):
            out.append(f"fault {ev['what']}: not applied: {ev['error']}")
            continue
        took = ev.get("took_effect_s")
        out.append(f"fault {ev['what']}: applied at {ev['applied_s']:.3f} s, on the wire at "
                   + ("n/a" if took is None else f"{took:.3f} s") +
                   (f" ({ev['note']})" if ev.get("note") else ""))
    return out
