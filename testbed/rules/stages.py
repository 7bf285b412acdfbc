"""Which layers each pipeline stage owns: a pure plan, no torch, no processes.

Blocks are split into contiguous runs as evenly as possible, earlier stages taking the extra
block when n_layer does not divide (torchtitan's `_generate_llm_fqn_per_model_part` does the
same with module names). Stage 0 also owns the embeddings; the last stage owns the final norm,
the LM head and the loss. trainer/stage.py builds the torch module for one plan.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    stage: int
    n_stages: int
    layers: tuple[int, ...]     # block indices into GPT.h

    @property
    def first(self) -> bool:     # owns wte/wpe, takes token ids
        return self.stage == 0

    @property
    def last(self) -> bool:      # owns ln_f/lm_head, computes the loss
        return self.stage == self.n_stages - 1

    def module_names(self) -> list[str]:
        names = ["wte", "wpe"] if self.first else []
        names += [f"h.{i}" for i in self.layers]
        return names + (["ln_f", "lm_head"] if self.last else [])


def split_layers(n_layer: int, n_stages: int) -> list[tuple[int, ...]]:
    """Contiguous block indices per stage; every stage gets at least one block."""
    if not 1 <= n_stages <= n_layer:
        raise ValueError(f"cannot split {n_layer} layers over {n_stages} stages "
                         f"(need 1 <= stages <= n_layer)")
    base, extra = divmod(n_layer, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        n = base + (1 if s < extra else 0)
        out.append(tuple(range(start, start + n)))
        start += n
    return out


def plan_stages(n_layer: int, n_stages: int) -> list[StagePlan]:
    return [StagePlan(stage=s, n_stages=n_stages, layers=layers)
            for s, layers in enumerate(split_layers(n_layer, n_stages))]
