"""A small GPT decoder (nanoGPT-style) that really trains; readable in one sitting.

Bottom-up: LayerNorm, CausalSelfAttention, MLP, Block, GPTConfig, GPT. The model knows nothing
about pipelines, processes or the network: trainer/stage.py cuts it into stages, and
trainer/worker.py runs them. No dropout, so a pipelined run and a single process compute the same
numbers. Input embedding and LM head are *not* tied (unlike nanoGPT): in a pipeline they live on
the first and last stage, and tying them would need an extra gradient exchange.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from testbed.spec.training import ModelConfig


class LayerNorm(nn.Module):
    """LayerNorm without bias (torch's has no bias=False switch on older versions)."""

    def __init__(self, ndim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)  # q, k, v at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.n_head = config.n_head
        self.n_embd = config.n_embd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()  # batch, sequence length, n_embd
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)    # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)                  # re-assemble heads
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    block_size: int = 32      # longest sequence (positions embedded)
    vocab_size: int = 256

    @classmethod
    def of(cls, model: "ModelConfig") -> GPTConfig:
        """The GPT a scenario's `training.model` section describes."""
        return cls(n_layer=model.n_layer, n_embd=model.n_embd, n_head=model.n_head,
                   block_size=model.seq_len, vocab_size=model.vocab_size)


class GPT(nn.Module):
    """Token + position embedding, n_layer blocks, final norm, LM head.

    The parts are separate attributes (wte, wpe, h, ln_f, lm_head) so a pipeline stage can keep
    only its own and drop the rest (trainer/stage.py)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        # Scaled init of the residual projections (GPT-2): keeps the residual stream's variance
        # from growing with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, n_embd) hidden state."""
        T = idx.size(1)
        assert T <= self.config.block_size, f"sequence of {T} > block_size"
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        return self.wte(idx) + self.wpe(pos)

    def head_loss(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(B, T, n_embd) hidden state, (B, T) targets -> mean cross-entropy (scalar)."""
        logits = self.lm_head(self.ln_f(x))  # (B, T, vocab)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.h:
            x = block(x)
        return self.head_loss(x, targets)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
