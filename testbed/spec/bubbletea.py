"""The scenario's `bubbletea:` section -> a validated, frozen BubbleTeaConfig. Pure.

One job: turn the section into settings or raise ScenarioError naming the field and the fix.
Used by every system whose name ends in "+bubbletea" (testbed.plans.systems); testbed.features.bubbletea.run runs it.

    bubbletea:
      load: {trace: code, rate_multiplier: 20, start_s: 0, window_s: 600}
      # or:  {poisson_per_s: 40, lengths: conv, seed: 0}
      context_rule: truncate     # a prompt + output beyond the target's 8192 tokens: truncate | refuse
      ttft_deadline_ms: 2000     # time to first token a request must meet (counted when missed)
      guard_ms: 2                # admit a prefill only if prediction + guard fits in the bubble,
      guard_pct: 5               # guard = guard_ms + guard_pct % of the prediction
      kv_fraction: 0.25          # KV heads / attention heads of the target (GQA); 1 = full MHA
      decode_tokens_max: 8       # profile mode: tokens each decode server generates per request
      fill_allreduce: false      # also fill the gap that holds the gradient all-reduce
      extend_bubbles: false      # a bubble that outlasts its prediction: expect the next longer
                                 # gap seen before that op (false: close it; true overran: x40,
                                 # 40 of 47 training waits were prefills put into extensions)
      chunked_prefill: true      # profile mode: a rest no whole request fits may take a chunk of
                                 # one (testbed/rules/prefill_profile.py's chunk cost; docs/bubbletea/design.md)
      pipeline: true             # send the next request behind the running one (no controller
                                 # round trip between two prefills of a bubble)
      arrival_bound: true        # a bubble waiting for a message lasts at least until its last
                                 # byte can be in: while it has not begun, now + its wire time at
                                 # the lowest rate on its way (+ the hold of the op making it, if
                                 # that is in this DC and has not begun); once it has, first
                                 # byte + that (off by itself under WAN jitter or delay/rate faults)
      arrival_margin_ms: 8       # taken off that bound, in this machine's wall-clock ms (not
                                 # dilated: what it covers is the emulation's own latency, the
                                 # notices' and the reader thread's wait for the GIL; seen up to
                                 # 6.5 ms here), and bytes the HTB bucket lets through together
      model: {n_layer: 2, n_embd: 64, n_head: 4, vocab_size: 256, context: 256}
      profile: h200-transformer.json

Profile mode (the training section's compute): a prefill holds its host's GPU for the H200
prefill_stack's time of `target_tokens` (the trace's prompt length, fitted to 8192), the real
inference model runs on the prompt's last `model.context` tokens, and the KV message carries
kv_cache_bytes(target_tokens) x kv_fraction / scale bytes. Decode tokens are real greedy tokens,
capped at decode_tokens_max (decode time is not what this testbed measures). Measured mode: the
prompt is real and whole (at most model.context tokens), nothing is held or padded.

The gap before the optimizer step holds the gradient all-reduce (D > 1). It is not filled by
default: on a GPU, NCCL's reduction kernels run on the SMs and its traffic on the NIC, and no
profile says what a prefill beside them costs; here, prefills in that gap (their KV traffic on
the same host links) made the all-reduce 20-50 % slower (atlas_bubbletea: 29 -> 37 ms).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.spec.errors import ScenarioError, shown, unknown_field

TRACES = ("code", "conv")
CONTEXT_RULES = ("truncate", "refuse")
# The most requests a Poisson load may draw (each is kept in memory): over six times the most
# a paper-scale scenario draws (156,250, gpt70b_3dc's share for the hosts the model simulates).
MAX_POISSON_REQUESTS = 1_000_000
MODEL_FIELDS = {"n_layer": (1, 8), "n_embd": (8, 512), "n_head": (1, 16),
                "vocab_size": (2, 65536), "context": (8, 4096)}
DEFAULT_MODEL = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "context": 256}


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadConfig:
    trace: str = "conv"                  # replay: which Azure trace; poisson: lengths from it
    rate_multiplier: float = 1.0         # replay only
    start_s: float = 0.0                 # replay only: where in the trace the window starts
    window_s: float = 600.0              # replay: trace seconds taken; poisson: duration
    poisson_per_s: float | None = None   # set: Poisson arrivals at this rate instead of replay
    seed: int = 0

    @property
    def kind(self) -> str:
        return "replay" if self.poisson_per_s is None else "poisson"


@dataclass(frozen=True, kw_only=True, slots=True)
class BubbleTeaConfig:
    load: LoadConfig = field(default_factory=LoadConfig)
    context_rule: str = "truncate"
    ttft_deadline_ms: float = 2000.0
    guard_ms: float = 2.0
    guard_pct: float = 5.0
    kv_fraction: float = 1.0
    decode_tokens_max: int = 8
    fill_allreduce: bool = False
    extend_bubbles: bool = False
    chunked_prefill: bool = True
    pipeline: bool = True
    arrival_bound: bool = True
    arrival_margin_ms: float = 8.0
    model: dict = field(default_factory=lambda: dict(DEFAULT_MODEL))
    profile: str = "h200-transformer.json"

    def guard_for_ms(self, predicted_ms: float) -> float:
        """The margin a prefill predicted at predicted_ms must leave before its bubble ends."""
        return self.guard_ms + self.guard_pct / 100.0 * predicted_ms

    def to_dict(self) -> dict[str, Any]:
        """All settings (for specs and results; read back with from_settings)."""
        return asdict(self)

    @classmethod
    def from_settings(cls, d: dict[str, Any]) -> "BubbleTeaConfig":
        """The inverse of to_dict (already validated: no checks)."""
        return cls(**dict(d, load=LoadConfig(**d["load"])))

    @classmethod
    def from_dict(cls, data: Any, where: str = "bubbletea") -> "BubbleTeaConfig":
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ScenarioError(where, "must be a mapping", "see topologies/atlas_bubbletea.yaml")
        _no_unknown(data, where, {"load", "context_rule", "ttft_deadline_ms", "guard_ms",
                                  "guard_pct", "kv_fraction", "decode_tokens_max", "model",
                                  "profile", "fill_allreduce", "extend_bubbles",
                                  "chunked_prefill", "pipeline", "arrival_bound",
                                  "arrival_margin_ms"})
        load = _load(data.get("load", {}), f"{where}.load")
        rule = data.get("context_rule", "truncate")
        if rule not in CONTEXT_RULES:
            raise ScenarioError(f"{where}.context_rule", f"{shown(rule)} is not a rule",
                                f"use one of {', '.join(CONTEXT_RULES)}")
        model = dict(DEFAULT_MODEL)
        m = data.get("model", {})
        if not isinstance(m, dict):
            raise ScenarioError(f"{where}.model", "must be a mapping", "e.g. {n_layer: 2}")
        _no_unknown(m, f"{where}.model", set(MODEL_FIELDS))
        for key, (low, high) in MODEL_FIELDS.items():
            if key in m:
                model[key] = _int(m[key], f"{where}.model.{key}", low, high)
        if model["n_embd"] % model["n_head"]:
            raise ScenarioError(f"{where}.model.n_head", f"{model['n_head']} does not divide "
                                f"n_embd {model['n_embd']}", "pick n_head dividing n_embd")
        profile = data.get("profile", "h200-transformer.json")
        if not isinstance(profile, str) or "/" in profile or not profile.endswith(".json"):
            raise ScenarioError(f"{where}.profile", f"{shown(profile)} is not a profile file name",
                                "name a file in data/gpu-profiles, e.g. h200-transformer.json")
        return cls(load=load, context_rule=rule,
                   ttft_deadline_ms=_num(data.get("ttft_deadline_ms", 2000.0),
                                         f"{where}.ttft_deadline_ms", 1.0, 3.6e6),
                   guard_ms=_num(data.get("guard_ms", 2.0), f"{where}.guard_ms", 0.0, 1e4),
                   guard_pct=_num(data.get("guard_pct", 5.0), f"{where}.guard_pct", 0.0, 100.0),
                   kv_fraction=_num(data.get("kv_fraction", 1.0), f"{where}.kv_fraction",
                                    1e-3, 1.0),
                   decode_tokens_max=_int(data.get("decode_tokens_max", 8),
                                          f"{where}.decode_tokens_max", 1, 4096),
                   model=model, profile=profile,
                   fill_allreduce=_bool(data.get("fill_allreduce", False),
                                        f"{where}.fill_allreduce"),
                   extend_bubbles=_bool(data.get("extend_bubbles", False),
                                        f"{where}.extend_bubbles"),
                   chunked_prefill=_bool(data.get("chunked_prefill", True),
                                         f"{where}.chunked_prefill"),
                   pipeline=_bool(data.get("pipeline", True), f"{where}.pipeline"),
                   arrival_bound=_bool(data.get("arrival_bound", True),
                                       f"{where}.arrival_bound"),
                   arrival_margin_ms=_num(data.get("arrival_margin_ms", 8.0),
                                          f"{where}.arrival_margin_ms", 0.0, 1e4))


def _load(data: Any, where: str) -> LoadConfig:
    if not isinstance(data, dict):
        raise ScenarioError(where, "must be a mapping", "e.g. {trace: conv, rate_multiplier: 20}")
    _no_unknown(data, where, {"trace", "rate_multiplier", "start_s", "window_s",
                              "poisson_per_s", "lengths", "seed"})
    poisson = data.get("poisson_per_s")
    if poisson is not None:
        poisson = _num(poisson, f"{where}.poisson_per_s", 1e-3, 1e7)
        for key in ("rate_multiplier", "start_s"):
            if key in data:
                raise ScenarioError(f"{where}.{key}", "applies to trace replay only",
                                    "drop it, or drop poisson_per_s to replay the trace")
        trace = data.get("lengths", "conv")
        trace_field = f"{where}.lengths"
    else:
        if "lengths" in data:
            raise ScenarioError(f"{where}.lengths", "applies to poisson_per_s only",
                                "use trace: to pick the trace that is replayed")
        trace = data.get("trace", "conv")
        trace_field = f"{where}.trace"
    if trace not in TRACES:
        raise ScenarioError(trace_field, f"{shown(trace)} is not a trace", f"use one of {', '.join(TRACES)}")
    return LoadConfig(trace=trace,
                      rate_multiplier=_num(data.get("rate_multiplier", 1.0),
                                           f"{where}.rate_multiplier", 1e-3, 1e5),
                      start_s=_num(data.get("start_s", 0.0), f"{where}.start_s", 0.0, 1e6),
                      window_s=_num(data.get("window_s", 600.0), f"{where}.window_s", 1e-3, 1e6),
                      poisson_per_s=poisson,
                      seed=_int(data.get("seed", 0), f"{where}.seed", 0, 2**31 - 1))


def _no_unknown(d: dict, where: str, allowed: set[str]) -> None:
    for key in d:
        if key not in allowed:
            raise unknown_field(where, key, allowed)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(where, f"{shown(value)} is not true or false", "use true or false")
    return value


def _num(value: Any, where: str, low: float, high: float) -> float:
    from testbed.spec.fields import checked_number
    return checked_number(value, where, low=low, high=high)


def _int(value: Any, where: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(where, f"{shown(value)} is not an integer", f"use an integer from {low} to {high}")
    if not low <= value <= high:
        raise ScenarioError(where, f"{shown(value)} is out of range", f"use an integer from {low} to {high}")
    return value


def check_poisson_size(rate_per_s: float, duration_s: float) -> None:
    """ScenarioError when a Poisson load would draw over MAX_POISSON_REQUESTS requests."""
    if rate_per_s * duration_s > MAX_POISSON_REQUESTS:
        raise ScenarioError("bubbletea.load", f"poisson_per_s {rate_per_s:g} for window_s "
                            f"{duration_s:g} draws about {rate_per_s * duration_s:.3g} requests",
                            f"keep poisson_per_s x window_s (the simulated hosts' share of it, "
                            f"in a predict_only scenario) at most {MAX_POISSON_REQUESTS}")
