"""BubbleTea's figures from a finished run's records. Pure: no torch, no network.

One job: numbers from trainer_spans.jsonl (training: F, B, OPT, GPU_WAIT, IDLE) and
prefill_records.jsonl (PREFILL, KV_SEND, DECODE, REQUEST, BUBBLE, SUMMARY; docs/bubbletea/
design.md), over a measured window like testbed.rules.figures' but from the first iteration that gets
bubble notices (iteration 3: 0 is warm-up, 1 and 2 are learned from) to the end, for the sum of their
walls; `iteration_time_s` is their mean wall (the training slowdown compares it with the same
iterations of the system without BubbleTea).

- GPU utilization per training host = (training compute + prefill compute) / window; per stage
  the mean over its replicas; overall the mean over hosts. `training_only` is the same without
  prefill (what the system without BubbleTea would count).
- overlap: training compute and prefill intervals that intersect on one host (must be 0: the GPU
  lock makes them take turns). gpu_wait: training ops that waited for a prefill to finish (an
  overrun of its bubble); their total is training time lost to BubbleTea on that host.
- prefill throughput over the window (requests/s, target prompt tokens/s), TTFT (arrival to the
  prefill's end, where the first token exists) p50/p99 (a chunked request counts once, when its
  last chunk ends, its tokens per chunk; `chunks` says how many chunks and requests), KV
  transfer (send start to the decode server's ack) p50/p99, deadline misses (late + expired), every request's outcome.
- unused bubble time: every idle gap between training ops inside the window, minus the prefill
  time in it; the rest, by cause: dispatch (before and between prefills: notice and controller
  latency), and after the last prefill (or the whole gap) the bubble's end reason from the
  controller: no_request, none_fitted, guard, rejected, host_down, filled (ran to the predicted
  end), allreduce (the gap before the optimizer step, not announced unless fill_allreduce), or
  not_predicted (no notice: a gap under 1 ms, no history yet, the awaited message already in
  when the op before ended, or a lost datagram).
- notices_lost: worker datagrams the controllers never got (their numbers are missing); the
  arrival bound holds only if none that would lower it is lost. notices_refused: datagrams the
  controllers ignored (malformed, out of range, not from a training host); hosts_down: hosts
  whose controller agent died (their bubbles went unfilled from then on).
Times are emulated; figures are in real time (divided by time_scale).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Sequence

from testbed.rules.bubbles import MIN_HISTORY, WARMUP_ITERATIONS
from testbed.rules.spans import COMPUTE_SPANS
from testbed.rules.figures import iteration_walls, iteration_windows, iterations_used
from testbed.spec.timescale import TimeScale

REASONS = ("dispatch", "no_request", "none_fitted", "guard", "rejected", "host_down", "filled",
           "allreduce", "not_predicted")
NOTICE_MATCH_NS = 2_000_000     # a notice belongs to the gap that starts within 2 ms of it


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def _clip(a: int, b: int, lo: int, hi: int) -> int:
    return max(0, min(b, hi) - max(a, lo))


def filled_iterations(n_iterations: int) -> list[int]:
    """The iterations BubbleTea's figures average: from the first that gets bubble notices
    (testbed.rules.bubbles: warm-up, then one iteration to learn from), else testbed.rules.figures'."""
    first = WARMUP_ITERATIONS + MIN_HISTORY
    return list(range(first, n_iterations)) if n_iterations >= first + 2 else \
        iterations_used(n_iterations)


def measured_window(spans: Sequence[dict]) -> tuple[int, int, list[int], list[int]]:
    """(start ns, end ns, the iterations, their walls in ns) of BubbleTea's window."""
    windows = iteration_windows(spans)
    walls = iteration_walls(windows)
    used = filled_iterations(len(windows))
    start = windows[used[0]][0]
    return start, start + sum(walls[i] for i in used), used, [walls[i] for i in used]


def bubbletea_metrics(spans: Sequence[dict], records: Sequence[dict], *,
                      time_scale: TimeScale | float = TimeScale(), load: dict | None = None,
                      crashed: Sequence[str] = ()) -> dict[str, Any]:
    ts = TimeScale.of(time_scale)
    lo, hi, used, walls = measured_window(spans)
    win_ns = hi - lo
    train: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    where: dict[str, tuple[int, int]] = {}
    waits = []
    for r in spans:
        if r["name"] in COMPUTE_SPANS:
            train[r["host"]].append((r["t_start_ns"], r["t_end_ns"], r["name"]))
            where[r["host"]] = (r["stage"], r["replica"])
        elif r["name"] == "GPU_WAIT" and lo <= r["t_start_ns"] < hi:
            waits.append(ts.real_span((r["t_end_ns"] - r["t_start_ns"]) / 1e6))
    pre: dict[str, list[tuple[int, int]]] = defaultdict(list)
    prefill_recs = [r for r in records if r["name"] == "PREFILL"]
    for r in prefill_recs:
        pre[r["host"]].append((r["t_start_ns"], r["t_end_ns"]))
    bubbles: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["name"] == "BUBBLE":
            bubbles[r["host"]].append(r)

    hosts = []
    overlaps = 0
    overlap_ns = 0
    unused = defaultdict(float)
    for host in sorted(train, key=lambda h: where[h]):
        t_iv = sorted(train[host])
        p_iv = sorted(pre.get(host, []))
        t_ns = sum(_clip(a, b, lo, hi) for a, b, _ in t_iv)
        p_ns = sum(_clip(a, b, lo, hi) for a, b in p_iv)
        for a, b in p_iv:
            for c, d, _ in t_iv:
                if c < b and a < d:
                    overlaps += 1
                    overlap_ns += min(b, d) - max(a, c)
        stage, replica = where[host]
        hosts.append({"host": host, "stage": stage, "replica": replica,
                      "training": t_ns / win_ns, "prefill": p_ns / win_ns,
                      "gpu_utilization": (t_ns + p_ns) / win_ns})
        for cause, ns in _unused_in_gaps(t_iv, p_iv, bubbles.get(host, []), lo, hi).items():
            unused[cause] += ns
    stages = sorted({h["stage"] for h in hosts})
    per_stage = [{"stage": s, "gpu_utilization": statistics.fmean(
        h["gpu_utilization"] for h in hosts if h["stage"] == s),
        "training_only": statistics.fmean(h["training"] for h in hosts if h["stage"] == s)}
        for s in stages]

    # a request counts when its last chunk (or its whole prefill) ends in the window; prompt
    # tokens count per chunk
    ended = [r for r in prefill_recs if lo <= r["t_end_ns"] < hi]
    in_win = [r for r in ended if r.get("final", True)]
    tokens_in_win = sum(r["chunk_end"] - r["chunk_start"] if "chunk_end" in r
                        else r["target_tokens"] for r in ended)
    chunked = [r for r in prefill_recs
               if r.get("chunk_end", r["target_tokens"]) - r.get("chunk_start", 0)
               < r["target_tokens"]]
    reqs = [r for r in records if r["name"] == "REQUEST"]
    outcomes = defaultdict(int)
    for r in reqs:
        outcomes[r["outcome"]] += 1
    ttft = [ts.real_span((r["t_first_token_ns"] - r["t_arrival_ns"]) / 1e6) for r in reqs
            if "t_first_token_ns" in r]
    queue_ms = [ts.real_span((r["t_prefill_start_ns"] - r["t_arrival_ns"]) / 1e6) for r in reqs
                if "t_prefill_start_ns" in r]
    kv = [ts.real_span((r["t_end_ns"] - r["t_start_ns"]) / 1e6) for r in records
          if r["name"] == "KV_SEND" and not r.get("error")]
    kv_errors = sum(1 for r in records if r["name"] == "KV_SEND" and r.get("error"))
    decoded = [r for r in records if r["name"] == "DECODE"]
    total_unused = sum(unused.values())
    n_hosts = max(1, len(hosts))
    window_s = ts.real_span(win_ns / 1e9)
    return {
        "gpu_utilization": statistics.fmean(h["gpu_utilization"] for h in hosts),
        "training_only": statistics.fmean(h["training"] for h in hosts),
        "prefill_share": statistics.fmean(h["prefill"] for h in hosts),
        "per_stage": per_stage, "per_host": hosts,
        "window_s": window_s,
        "iterations": used,
        "iteration_time_s": ts.real_span(statistics.fmean(walls) / 1e9),
        "overlap": {"count": overlaps, "ms": ts.real_span(overlap_ns / 1e6)},
        "gpu_wait": {"count": len(waits), "total_ms": sum(waits),
                     "max_ms": max(waits, default=0.0),
                     "per_host_ms_per_s": sum(waits) / n_hosts / window_s},
        "prefill": {
            "requests_per_s": len(in_win) / window_s,
            "prompt_tokens_per_s": tokens_in_win / window_s,
            "prefills": len(prefill_recs), "in_window": len(in_win),
            "chunks": {"chunks": len(chunked),
                       "requests": len({r["id"] for r in chunked if r.get("final")})},
            "ttft_ms": {"p50": _pct(ttft, 0.5), "p99": _pct(ttft, 0.99), "n": len(ttft)},
            "queue_ms": {"p50": _pct(queue_ms, 0.5), "p99": _pct(queue_ms, 0.99)},
            "kv_transfer_ms": {"p50": _pct(kv, 0.5), "p99": _pct(kv, 0.99), "n": len(kv),
                               "errors": kv_errors},
            "decoded": len(decoded),
            "outcomes": dict(sorted(outcomes.items())),
            "deadline_misses": outcomes["late"] + outcomes["expired"],
        },
        "unused_bubble": {
            "per_host_ms_per_s": ts.real_span(total_unused / 1e6) / n_hosts / window_s,
            "share_by_cause": {c: (unused[c] / total_unused if total_unused else 0.0)
                               for c in REASONS},
        },
        "notices_lost": sum(r.get("notices_lost", 0) for r in records
                            if r["name"] == "SUMMARY"),
        "notices_refused": sum(r.get("notices_refused", 0) for r in records
                               if r["name"] == "SUMMARY"),
        "hosts_down": sorted({h for r in records if r["name"] == "SUMMARY"
                              for h in r.get("hosts_down", [])}),
        "load": load or {},
        "crashed": list(crashed),
    }


def _unused_in_gaps(t_iv: list[tuple[int, int, str]], p_iv: list[tuple[int, int]],
                    bubbles: list[dict], lo: int, hi: int) -> dict[str, int]:
    """Unused ns of every training gap in [lo, hi), by cause (module docstring)."""
    out: dict[str, int] = defaultdict(int)
    notices = sorted(bubbles, key=lambda b: b["t_idle_ns"])
    for (_, g0, _), (g1, _, after) in zip(t_iv, t_iv[1:]):
        a, b = max(g0, lo), min(g1, hi)
        if b <= a:
            continue
        inside = [(max(x, a), min(y, b)) for x, y in p_iv if x < b and y > a]
        notice = next((n for n in notices if abs(n["t_idle_ns"] - g0) <= NOTICE_MATCH_NS), None)
        if notice is None:
            reason = "allreduce" if after == "OPT" else "not_predicted"
        else:
            reason = notice["end"] if notice["end"] != "used" else "filled"
        if not inside:
            out[reason] += b - a
            continue
        t = a
        for x, y in inside:
            out["dispatch"] += max(0, x - t)
            t = max(t, y)
        out[reason] += max(0, b - t)
    return out
