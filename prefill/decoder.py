"""The inference model of BubbleTea: a small decoder-only GPT that really prefills and decodes.

One job: compute a prompt's KV cache and first token (what a prefill server does inside a
training bubble), continue greedy decoding from that cache (what a decode server does), and give
the plain cache-free reference both must agree with. It is *not* the training model
(testbed/host/gpt.py): its own config, its own weights, drawn from `seed`, so every process that
builds it from the same `InferenceConfig` holds the same weights and a KV cache made in one
process can be continued in another. Serving, framing and timing live in prefill/server.py,
prefill/decode_server.py and prefill/wire.py.

Bottom-up: LayerNorm, CausalSelfAttention (with a KV cache), MLP, Block, InferenceConfig,
InferenceGPT, then the three functions. Shapes: one sequence at a time (batch 1); the KV cache
is one float32 tensor [n_layer, 2 (K, V), n_head, T, head_dim].

Context rule (the same in all three functions): positions 0..context-1 exist, so a prompt has
at most `context` tokens, and generation stops once the sequence fills the context: at most
context - len(prompt) + 1 tokens come out (the last one is never fed back).

No torch.set_num_threads here: the caller decides (the servers run with OMP_NUM_THREADS=1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from testbed.host import gpt as train_model
from testbed.host.gpt import MLP, LayerNorm


class CausalSelfAttention(train_model.CausalSelfAttention):
    """The training model's attention (same weights layout), run with a KV cache."""

    def forward(self, x: torch.Tensor, past: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C), past (2, B, nh, P, hs) or None -> (y (B, T, C), kv (2, B, nh, P+T, hs))."""
        B, T, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)             # (B, nh, P+T, hs)
            v = torch.cat([past[1], v], dim=2)
        P = k.size(2) - T                                  # positions already cached
        if P == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif T == 1:                                       # one new token sees everything
            y = F.scaled_dot_product_attention(q, k, v)
        else:                                              # query i sits at position P + i
            mask = torch.ones(T, P + T, dtype=torch.bool, device=x.device).tril(diagonal=P)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # re-assemble heads
        return self.c_proj(y), torch.stack([k, v])


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: InferenceConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, past: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        a, kv = self.attn(self.ln_1(x), past)
        x = x + a
        return x + self.mlp(self.ln_2(x)), kv


@dataclass(frozen=True, kw_only=True, slots=True)
class InferenceConfig:
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    vocab_size: int = 256
    context: int = 256       # longest sequence: positions embedded, prompt + fed-back tokens
    seed: int = 0            # the weights; same seed, same weights in every process

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"model.{f.name}: {value!r} is not an integer")
            minimum = 0 if f.name == "seed" else 2 if f.name == "vocab_size" else 1
            if value < minimum:
                raise ValueError(f"model.{f.name}: {value} is below {minimum}")
        if self.n_embd % self.n_head:
            raise ValueError(f"model.n_embd: {self.n_embd} is not divisible by n_head "
                             f"{self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def kv_shape(self, tokens: int) -> list[int]:
        """Shape of the KV cache of `tokens` positions."""
        return [self.n_layer, 2, self.n_head, tokens, self.head_dim]

    def kv_bytes(self, tokens: int) -> int:
        return math.prod(self.kv_shape(tokens)) * 4   # float32

    @classmethod
    def from_dict(cls, d: Any) -> InferenceConfig:
        """From a plain dict (spec files); missing keys take the defaults, unknown keys and bad
        values raise ValueError naming the field."""
        if not isinstance(d, dict):
            raise ValueError(f"model: expected a mapping, got {type(d).__name__}")
        known = [f.name for f in fields(cls)]
        for key in d:
            if key not in known:
                raise ValueError(f"model.{key}: unknown key (use one of: {', '.join(known)})")
        return cls(**d)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class InferenceGPT(nn.Module):
    """Token + position embedding, n_layer blocks, final norm, LM head (untied)."""

    def __init__(self, config: InferenceConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.context, config.n_embd)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, past_kv: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """idx (1, T) new token ids, past_kv [n_layer, 2, nh, P, hs] or None ->
        (logits (1, T, vocab) of the new positions, kv [n_layer, 2, nh, P+T, hs])."""
        T = idx.size(1)
        P = 0 if past_kv is None else past_kv.size(3)
        if P + T > self.config.context:
            raise ValueError(f"sequence of {P + T} tokens is beyond the context "
                             f"{self.config.context}")
        pos = torch.arange(P, P + T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)                  # (1, T, C)
        kvs = []
        for i, block in enumerate(self.h):
            past = None if past_kv is None else past_kv[i].unsqueeze(1)  # (2, 1, nh, P, hs)
            x, kv = block(x, past)
            kvs.append(kv.squeeze(1))                      # (2, nh, P+T, hs)
        logits = self.lm_head(self.ln_f(x))               # (1, T, vocab)
        return logits, torch.stack(kvs)


def build_model(cfg: InferenceConfig) -> InferenceGPT:
    """The model with weights drawn from cfg.seed (GPT-2 init), in eval mode. Deterministic:
    the caller's RNG state is neither used nor changed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = InferenceGPT(cfg)
        for name, p in model.named_parameters():
            if name.endswith("c_proj.weight"):   # scaled residual projections (GPT-2)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))
            elif p.dim() == 2:                   # embeddings and the other linears
                nn.init.normal_(p, mean=0.0, std=0.02)
    return model.eval()


def _check_prompt(model: InferenceGPT, prompt: list[int]) -> None:
    cfg = model.config
    if not prompt:
        raise ValueError("prompt: empty")
    if len(prompt) > cfg.context:
        raise ValueError(f"prompt: {len(prompt)} tokens, the context is {cfg.context}")
    for i, tok in enumerate(prompt):
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < cfg.vocab_size:
            raise ValueError(f"prompt[{i}]: {tok!r} is not a token id in [0, {cfg.vocab_size})")


def _max_out(cfg: InferenceConfig, prompt_len: int, max_new_tokens: int) -> int:
    """Tokens that come out: at most max_new_tokens, and the context rule's limit."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: {max_new_tokens} is below 1")
    return min(max_new_tokens, cfg.context - prompt_len + 1)


@torch.no_grad()
def prefill(model: InferenceGPT, prompt: list[int]) -> tuple[torch.Tensor, int]:
    """The prompt's KV cache (float32 [n_layer, 2, n_head, len(prompt), head_dim]) and the
    greedy first token."""
    return prefill_chunk(model, prompt, None)


@torch.no_grad()
def prefill_chunk(model: InferenceGPT, tokens: list[int], past: torch.Tensor | None
                  ) -> tuple[torch.Tensor, int]:
    """Chunked prefill: the KV cache of the prefix (past, as prefill returns it, or None) and
    tokens, and the greedy token after them. Prefilling a prompt in chunks, each continuing
    the last one's cache, gives the same cache and first token as one prefill (a test): every
    chunk's queries attend to the cached prefix and causally to themselves."""
    _check_prompt(model, tokens)
    if past is not None and past.size(3) + len(tokens) > model.config.context:
        raise ValueError(f"prompt: {past.size(3) + len(tokens)} tokens, the context is "
                         f"{model.config.context}")
    logits, kv = model(torch.tensor([tokens], dtype=torch.long), past)
    return kv.contiguous(), int(logits[0, -1].argmax())


@torch.no_grad()
def generate_from_cache(model: InferenceGPT, kv: torch.Tensor, first_token: int,
                        max_new_tokens: int) -> list[int]:
    """Greedy decoding from a prompt's KV cache: max_new_tokens tokens starting with
    first_token (fewer if the context fills: module docstring)."""
    cfg = model.config
    want = cfg.kv_shape(kv.size(3)) if kv.dim() == 5 else None
    if want is None or list(kv.shape) != want or kv.dtype != torch.float32:
        raise ValueError(f"kv: shape {list(kv.shape)} {kv.dtype}, expected "
                         f"[{cfg.n_layer}, 2, {cfg.n_head}, T, {cfg.head_dim}] float32")
    n = _max_out(cfg, kv.size(3), max_new_tokens)
    out = [first_token]
    while len(out) < n:
        logits, kv = model(torch.tensor([[out[-1]]], dtype=torch.long), kv)
        out.append(int(logits[0, -1].argmax()))
    return out


@torch.no_grad()
def greedy_generate(model: InferenceGPT, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The reference: greedy decoding that recomputes the whole sequence every step, no cache."""
    _check_prompt(model, prompt)
    n = _max_out(model.config, len(prompt), max_new_tokens)
    seq = list(prompt)
    out: list[int] = []
    while len(out) < n:
        logits, _ = model(torch.tensor([seq], dtype=torch.long))
        out.append(int(logits[0, -1].argmax()))
        seq.append(out[-1])
    return out
