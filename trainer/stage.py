"""One pipeline stage of the GPT as a torch module, cut from the whole model.

Every worker builds the *whole* model from the run's seed and keeps only its stage's parts, so
all stages start from exactly the weights a single process would have (trainer/reference.py).
The model is tiny, so building it whole costs little. Forward takes token ids (first stage) or a
hidden state (others); the last stage also takes targets and returns the loss.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from testbed.host.gpt import GPT, GPTConfig
from testbed.rules.stages import StagePlan


def build_full_model(config: GPTConfig, seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


class StageModule(nn.Module):
    def __init__(self, model: GPT, plan: StagePlan) -> None:
        super().__init__()
        self.plan = plan
        self.wte = model.wte if plan.first else None
        self.wpe = model.wpe if plan.first else None
        self.h = nn.ModuleList([model.h[i] for i in plan.layers])
        self.ln_f = model.ln_f if plan.last else None
        self.lm_head = model.lm_head if plan.last else None
        self._model = [model]  # a list, so the whole model is not registered as a submodule

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """First stage: x is (B, T) token ids; else (B, T, C) hidden. Returns (B, T, C) hidden,
        or the scalar mean loss on the last stage."""
        model = self._model[0]
        if self.plan.first:
            x = model.embed(x)
        for block in self.h:
            x = block(x)
        if self.plan.last:
            assert targets is not None, "the last stage needs targets"
            return model.head_loss(x, targets)
        return x


def build_stage(config: GPTConfig, plan: StagePlan, seed: int) -> StageModule:
    return StageModule(build_full_model(config, seed), plan)
