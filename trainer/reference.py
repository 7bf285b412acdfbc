"""Single-process reference: the same model, seed, data and global batch, no pipeline.

One job: the numbers a pipelined run must reproduce. Per iteration the global batch is the
D x M micro-batches (in global index order, trainer/data.py); the loss is their mean, the
gradient is accumulated micro-batch by micro-batch, then one optimizer step. Returns the loss per
iteration (mean over micro-batches), as the pipeline's last stage reports it.
"""

from __future__ import annotations

import torch

from testbed.spec.training import TrainConfig
from trainer.data import MarkovTokens
from testbed.host.gpt import GPTConfig
from trainer.stage import build_full_model
from trainer.worker import make_optimizer


def reference_losses(cfg: TrainConfig, iterations: int | None = None) -> list[float]:
    torch.set_num_threads(1)
    model = build_full_model(GPTConfig.of(cfg.model), cfg.seed)
    opt = make_optimizer(cfg, list(model.parameters()))
    data = MarkovTokens(cfg.model.vocab_size, cfg.seed)
    n_global = cfg.replicas * cfg.micro_batches
    out = []
    for it in range(cfg.iterations if iterations is None else iterations):
        total = 0.0
        for index in range(n_global):
            x, y = data.micro_batch(it, index, cfg.micro_batch_size, cfg.model.seq_len)
            loss = model(x, y)
            (loss / n_global).backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(total / n_global)
    return out
