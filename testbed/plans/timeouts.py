"""How long a system's training may run before it is stopped, and how long a peer or a gloo
collective may be waited for: from the model's predicted iteration time where there is one.
Pure.

One job: the two numbers and where they came from.
- run: RUN_MARGIN x iterations x the predicted iteration time + STARTUP_S (processes start, torch
  imports, connections, the warm-up iteration's slow start), at least MIN_RUN_S; in measured
  mode (nothing predicted) DEFAULT_RUN_S. `run --timeout-s S` overrides it.
- peer (connection set-up and gloo's collective timeout): COLLECTIVE_MARGIN x one predicted
  iteration (a collective waits for the slowest replica's whole row), at least MIN_PEER_S;
  DEFAULT_PEER_S in measured mode; never above the run's.
Both are real time; the caller stretches them (testbed.spec.timescale: TimeScale.emulated_span).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from testbed.spec.training import TrainConfig

RUN_MARGIN = 3.0
STARTUP_S = 120.0
MIN_RUN_S = 180.0
DEFAULT_RUN_S = 600.0
COLLECTIVE_MARGIN = 3.0
MIN_PEER_S = 60.0
DEFAULT_PEER_S = 60.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeouts:
    run_s: float
    peer_s: float
    source: str                         # "model" | "flag" | "default (measured mode)"
    predicted_iteration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def timeouts_for(cfg: "TrainConfig", predicted_iteration_s: float | None,
                 flag_s: float | None = None) -> Timeouts:
    """The limits for cfg's training (module docstring); predicted_iteration_s: the model's
    iteration time for the run (None in measured mode)."""
    if predicted_iteration_s is None:
        run_s, peer_s, source = DEFAULT_RUN_S, DEFAULT_PEER_S, "default (measured mode)"
    else:
        run_s = max(MIN_RUN_S, RUN_MARGIN * cfg.iterations * predicted_iteration_s + STARTUP_S)
        peer_s = max(MIN_PEER_S, COLLECTIVE_MARGIN * predicted_iteration_s)
        source = "model"
    if flag_s is not None:
        run_s, source = flag_s, "flag"
    return Timeouts(run_s=run_s, peer_s=min(peer_s, run_s), source=source,
                    predicted_iteration_s=predicted_iteration_s)
