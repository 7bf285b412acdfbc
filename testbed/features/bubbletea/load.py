"""Prefill request load: arrivals and prompt/output lengths replayed from the real Azure LLM
inference traces (2023), or drawn from a Poisson process. Pure: no torch, no network.

Data: data/azure-llm-inference-2023/AzureLLMInferenceTrace_{code,conv}.csv, unchanged copies of the public
Azure/AzurePublicDataset files (CC-BY 4.0; see data/azure-llm-inference-2023/README-azure-llm-inference-2023.md).
Cite when publishing: Patel et al., "Splitwise: Efficient generative LLM inference using phase
splitting", ISCA 2024.

    trace = load_trace("conv")                       # 19,365 requests, times from the first
    reqs = replay(trace, rate_multiplier=2.0, start_s=60, window_s=30)
    reqs = poisson(rate_per_s=5, duration_s=30, lengths=trace, seed=0)
    kept, refused = fit_context(reqs, max_context_tokens=8192, rule="truncate")

replay: the requests whose arrival falls in [start_s, start_s + window_s) of the trace, times
re-based to 0 and divided by rate_multiplier (2.0 = twice the request rate, same order and
sizes). poisson: exponential gaps at rate_per_s; each request's lengths are drawn (with
replacement, seeded) from a trace, so sizes stay real.

Context rule (a request that does not fit never crashes anything): a request needs
prompt + output tokens <= max_context_tokens. "truncate" keeps the prompt's last
max_context_tokens - output tokens (at least 1; the output is cut to leave one prompt token if it
alone is too long), as a serving stack drops the oldest context; "refuse" leaves it out. Both
return what was changed or refused, so a run can report it.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Iterable, Sequence

from testbed.spec.bubbletea import check_poisson_size
from testbed.spec.paths import AZURE_TRACES

TRACES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}
CONTEXT_RULES = ("truncate", "refuse")


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    index: int            # position in the trace (replay) or in the draw (poisson)
    arrival_s: float      # from the start of the load
    prompt_tokens: int
    output_tokens: int
    truncated_from: int | None = None   # the prompt's length before fit_context cut it


def load_trace(name: str, path: Path | None = None) -> list[Request]:
    """A trace ("code" or "conv", or a CSV with the same columns) as requests, arrival times in
    seconds from its first request. Raises ValueError naming the file and line on bad rows."""
    if path is None:
        if name not in TRACES:
            raise ValueError(f"unknown trace {name!r}: use one of {', '.join(TRACES)}")
        path = AZURE_TRACES / TRACES[name]
    out: list[Request] = []
    t0: datetime | None = None
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        want = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}
        if not want <= set(reader.fieldnames or ()):
            raise ValueError(f"{path}: columns {reader.fieldnames}, expected {sorted(want)}")
        for line, row in enumerate(reader, start=2):
            try:
                # 7 fractional digits: datetime takes 6
                stamp = row["TIMESTAMP"].strip()
                head, _, frac = stamp.partition(".")
                t = datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}" if frac else head)
                prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{line}: {exc}") from None
            if prompt < 1 or output < 0:
                raise ValueError(f"{path}:{line}: prompt {prompt}, output {output} tokens")
            t0 = t if t0 is None else t0
            out.append(Request(index=len(out), arrival_s=(t - t0).total_seconds(),
                               prompt_tokens=prompt, output_tokens=output))
    if not out:
        raise ValueError(f"{path}: no requests")
    return sorted(out, key=lambda r: (r.arrival_s, r.index))


def replay(trace: Sequence[Request], *, rate_multiplier: float = 1.0, start_s: float = 0.0,
           window_s: float | None = None) -> list[Request]:
    """The trace's requests in [start_s, start_s + window_s), re-based and sped up."""
    if rate_multiplier <= 0:
        raise ValueError(f"rate_multiplier {rate_multiplier} must be > 0")
    end = float("inf") if window_s is None else start_s + window_s
    return [replace(r, arrival_s=(r.arrival_s - start_s) / rate_multiplier)
            for r in trace if start_s <= r.arrival_s < end]


def poisson(*, rate_per_s: float, duration_s: float, lengths: Sequence[Request],
            seed: int = 0) -> list[Request]:
    """Poisson arrivals at rate_per_s for duration_s; lengths drawn from `lengths`."""
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError(f"rate_per_s {rate_per_s} and duration_s {duration_s} must be > 0")
    if not lengths:
        raise ValueError("no requests to draw lengths from")
    check_poisson_size(rate_per_s, duration_s)
    rng = random.Random(seed)
    out: list[Request] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        src = lengths[rng.randrange(len(lengths))]
        out.append(Request(index=len(out), arrival_s=t, prompt_tokens=src.prompt_tokens,
                           output_tokens=src.output_tokens))
        t += rng.expovariate(rate_per_s)
    return out


def fit_context(requests: Iterable[Request], *, max_context_tokens: int,
                rule: str = "truncate") -> tuple[list[Request], list[Request]]:
    """(requests that fit, possibly truncated; requests refused) under the module's rule."""
    if rule not in CONTEXT_RULES:
        raise ValueError(f"unknown context rule {rule!r}: use one of {', '.join(CONTEXT_RULES)}")
    if max_context_tokens < 2:
        raise ValueError(f"max_context_tokens {max_context_tokens} must be >= 2")
    kept: list[Request] = []
    refused: list[Request] = []
    for r in requests:
        if r.prompt_tokens + r.output_tokens <= max_context_tokens:
            kept.append(r)
        elif rule == "refuse":
            refused.append(r)
        else:
            output = min(r.output_tokens, max_context_tokens - 1)
            kept.append(replace(r, prompt_tokens=max_context_tokens - output,
                                output_tokens=output, truncated_from=r.prompt_tokens))
    return kept, refused
