"""Cross-traffic's lines in a run's summary, from its results."""

from __future__ import annotations

from typing import Any


def summary_lines(entries: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in entries:
        extra = ((f", {e['retransmits']} retransmits" if e["retransmits"] is not None
                  else ", retransmits unknown (cut short)") if e["kind"] == "tcp"
                 else f", {e['lost_pct']}% lost" if e.get("lost_pct") is not None else "")
        good = "n/a" if e["goodput_mbit"] is None else f"{e['goodput_mbit']:.1f} Mbit/s"
        out.append(f"cross-traffic {e['what']}: goodput {good}{extra}"
                   + (" (cut short: training ended first)" if e["cut_short"] else "")
                   + (f"; {'; '.join(e['errors'])}" if e.get("errors") else ""))
    return out
