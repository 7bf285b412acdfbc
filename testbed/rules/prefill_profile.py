"""How long a prefill of N prompt tokens takes on the target GPU, and how many KV-cache bytes it
makes: from the H200 profile's `prefill_stack` (data/gpu-profiles/h200-transformer.json, 32 blocks
of width 4096, about an 8B model, batch 1, prompts of 128-8192 tokens). Pure, no torch.

Model of the measured points (stated, so a prediction can be checked against them):
- time: piecewise-linear interpolation between the measured (tokens, ms) points, which are close
  to linear from 512 tokens on (about 25 us per token; slightly superlinear: 8192 tokens take
  2.15x the time of 4096, attention's quadratic share); below the first point, the first point's time (launch-bound: 128 tokens take
  5.5 ms, 256 take 6.9 ms); above the last point, not modelled (ValueError: a prompt beyond the
  profiled context must be truncated or refused first, testbed/features/bubbletea/load.py's fit_context).
- a chunk (chunked prefill: tokens [done, end) of a prompt whose first `done` tokens are already
  in the GPU's KV cache) costs max(prefill_ms(end) - prefill_ms(done), prefill_ms(end - done)):
  the increment the whole prompt's time grows by (the new tokens, and their attention over the
  cached prefix), but never less than a prompt of the chunk's length alone (a pass reads every
  weight however few its tokens: the launch-bound floor, 5.5 ms at <= 128 tokens). Chunks
  therefore cost at least the whole prefill in total, more the smaller they are; the chunk floor
  is not measured here but stated (a decode-like pass of an 8B model reads its 16 GB of weights,
  about 3.4 ms at an H200's 4.8 TB/s, under the 128-token point's 5.5 ms).
- KV cache: 2 (K and V) x layers x tokens x width x 2 bytes (bf16), which is what the profile
  lists for every point; `kv_cache_bytes` checks the formula against them on load.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from testbed.spec.profiles import load_profile

BF16_BYTES = 2


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefillProfile:
    width: int
    layers: int
    tokens: tuple[int, ...]      # measured prompt lengths, ascending
    ms: tuple[float, ...]        # measured prefill times

    @classmethod
    def load(cls, name: str = "h200-transformer.json", tp: int = 1) -> "PrefillProfile":
        """The profile's prefill stack; with tp > 1 (a host stands for a tensor-parallel group
        of tp GPUs, testbed.rules.costs) a prefill takes 1/tp of the measured time, the same
        perfect scaling the group's training compute is given (a stated simplification)."""
        doc = load_profile(name, "bubbletea.profile")
        stack = doc.get("prefill_stack")
        if not stack or not stack.get("points"):
            raise ValueError(f"profile {name!r} has no prefill_stack")
        points = sorted(stack["points"], key=lambda p: p["prompt_tokens"])
        prof = cls(width=int(stack["width"]), layers=int(stack["layers"]),
                   tokens=tuple(int(p["prompt_tokens"]) for p in points),
                   ms=tuple(float(p["prefill_ms"]) / tp for p in points))
        for p in points:
            if "kv_cache_bytes" in p and p["kv_cache_bytes"] != prof.kv_cache_bytes(
                    p["prompt_tokens"]):
                raise ValueError(f"profile {name!r}: kv_cache_bytes at {p['prompt_tokens']} "
                                 f"tokens is {p['kv_cache_bytes']}, the formula gives "
                                 f"{prof.kv_cache_bytes(p['prompt_tokens'])}")
        return prof

    @property
    def max_tokens(self) -> int:
        return self.tokens[-1]

    def prefill_ms(self, prompt_tokens: int) -> float:
        """Predicted prefill time (module docstring's model)."""
        if prompt_tokens < 1:
            raise ValueError(f"prompt of {prompt_tokens} tokens")
        if prompt_tokens > self.max_tokens:
            raise ValueError(f"prompt of {prompt_tokens} tokens is beyond the profiled "
                             f"{self.max_tokens}: truncate or refuse it first")
        if prompt_tokens <= self.tokens[0]:
            return self.ms[0]
        i = bisect.bisect_left(self.tokens, prompt_tokens)
        if self.tokens[i] == prompt_tokens:
            return self.ms[i]
        t0, t1, m0, m1 = self.tokens[i - 1], self.tokens[i], self.ms[i - 1], self.ms[i]
        return m0 + (m1 - m0) * (prompt_tokens - t0) / (t1 - t0)

    def chunk_ms(self, done_tokens: int, end_tokens: int) -> float:
        """Predicted time of the chunk [done_tokens, end_tokens) (module docstring's model)."""
        if not 0 <= done_tokens < end_tokens:
            raise ValueError(f"chunk [{done_tokens}, {end_tokens}) is empty or negative")
        if done_tokens == 0:
            return self.prefill_ms(end_tokens)
        return max(self.prefill_ms(end_tokens) - self.prefill_ms(done_tokens),
                   self.prefill_ms(end_tokens - done_tokens))

    @property
    def min_chunk_tokens(self) -> int:
        """The shortest chunk worth cutting: the first measured point (below it a pass costs
        the same)."""
        return self.tokens[0]

    def kv_cache_bytes(self, prompt_tokens: int) -> int:
        return 2 * self.layers * prompt_tokens * self.width * BF16_BYTES
