"""BubbleTea's lines in a run's summary, from its metrics block."""

from __future__ import annotations

from typing import Any


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f} ms"


def summary_lines(bt: dict[str, Any] | None) -> list[str]:
    if bt is None:
        return []
    pf = bt["prefill"]
    lines = [f"bubbletea: GPU utilization {bt['gpu_utilization']:.1%} (training "
             f"{bt['training_only']:.1%} + prefill {bt['prefill_share']:.1%}), "
             f"{pf['requests_per_s']:.1f} requests/s, "
             f"{pf['prompt_tokens_per_s']:.0f} prompt tokens/s, TTFT p50 "
             f"{_ms(pf['ttft_ms']['p50'])} p99 {_ms(pf['ttft_ms']['p99'])}, KV p50 "
             f"{_ms(pf['kv_transfer_ms']['p50'])}, deadline misses "
             f"{pf['deadline_misses']}, training waited for prefill "
             f"{bt['gpu_wait']['count']}x ({bt['gpu_wait']['total_ms']:.1f} ms), "
             f"overlaps {bt['overlap']['count']}"]
    if bt["crashed"]:
        lines.append("warning: BubbleTea processes died during training (training went "
                     "on): " + "; ".join(bt["crashed"]))
    return lines
