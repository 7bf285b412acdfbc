"""Deterministic synthetic token data with structure a small GPT can learn. No downloads.

One job: give any worker the exact micro-batch a single process would see. Tokens follow a fixed
random Markov chain (seeded): each token has `branching` likely successors, so the best possible
loss is about ln(branching) nats while an untrained model starts near ln(vocab_size). A
micro-batch is identified by (iteration, global index) with global index = replica * M + mb, and
is generated from its own seeded stream, so it does not matter which process asks or in what
order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class MarkovTokens:
    vocab_size: int
    seed: int
    branching: int = 4
    _succ: np.ndarray = field(init=False, repr=False)   # (V, k) successor token ids
    _cdf: np.ndarray = field(init=False, repr=False)    # (V, k) cumulative probabilities

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, 0xDA7A])
        k = min(self.branching, self.vocab_size)
        self._succ = np.stack([rng.choice(self.vocab_size, size=k, replace=False)
                               for _ in range(self.vocab_size)])
        probs = rng.dirichlet(np.ones(k), size=self.vocab_size)
        self._cdf = np.cumsum(probs, axis=1)
        self._cdf[:, -1] = 1.0

    def sequences(self, iteration: int, index: int, batch: int, length: int) -> np.ndarray:
        """(batch, length) int64 tokens for micro-batch `index` of `iteration`."""
        rng = np.random.default_rng([self.seed, iteration, index])
        out = np.empty((batch, length), dtype=np.int64)
        out[:, 0] = rng.integers(0, self.vocab_size, size=batch)
        u = rng.random((batch, length))
        for t in range(1, length):
            prev = out[:, t - 1]
            choice = (u[:, t, None] > self._cdf[prev]).sum(axis=1)   # (batch,) in [0, k)
            out[:, t] = self._succ[prev, np.minimum(choice, self._succ.shape[1] - 1)]
        return out

    def micro_batch(self, iteration: int, index: int, batch: int,
                    seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y): (batch, seq_len) inputs and next-token targets."""
        seq = torch.from_numpy(self.sequences(iteration, index, batch, seq_len + 1))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def global_index(replica: int, micro_batches: int, mb: int) -> int:
    """Position of (replica, mb) in the global batch of one iteration."""
    return replica * micro_batches + mb
