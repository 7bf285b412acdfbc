"""What in a scenario the model does not model, one line each, so that `predict` and `whatif`
never drop a setting without a word. Pure.

One job: name the settings the model leaves out or simplifies. Everything not named here is in
the model (testbed.predict.predict's docstring lists its inputs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from testbed.spec.scenario import Scenario


def unmodelled(scenario: "Scenario") -> list[str]:
    """One line per setting of `scenario` the model leaves out or simplifies: what of it is
    not in the model."""
    out = []
    jitter = [f"{w.a}<->{w.b} {w.jitter_ms:g} ms" for w in scenario.wan if w.jitter_ms > 0]
    if jitter:
        out.append("jitter_ms (" + ", ".join(jitter) + "): the configured one-way delay is "
                   "used")
    queued = [f"{w.a}<->{w.b}" for w in scenario.wan if w.queue_given]
    if queued:
        out.append("queue (" + ", ".join(queued) + "): drops of messages that take several "
                   "round trips (fair-shared), timeouts, and window reduction inside a temporal "
                   "slot (a burst's drop, its resend and the senders' window cut are modelled)")
    if scenario.congestion_control == "bbr" and any(w.loss_pct > 0 for w in scenario.wan):
        out.append("congestion_control bbr with loss_pct: a loss response (BBR's rate is "
                   "taken as insensitive to random loss; only the resends cost time); not "
                   "checked against the emulation")
    if scenario.faults:
        out.append(f"faults ({len(scenario.faults)}): the prediction is the run without "
                   "them")
    if scenario.cross_traffic:
        out.append(f"cross_traffic ({len(scenario.cross_traffic)} flow"
                   + ("s" if len(scenario.cross_traffic) > 1 else "")
                   + "): other tenants' traffic on the WAN links")
    if scenario.bubbletea is not None:
        out.append("bubbletea: the emulation's iteration-to-iteration gap variation (its "
                   "learned bubble predictions that outlast the gap make the next op wait for "
                   "the GPU; the model's gaps repeat, so it predicts such waits only where its "
                   "gaps change), KV messages slowing training's messages on the same host "
                   "links, the decode servers' compute and the prefill side's CPU; modelled: "
                   "prefill in the bubbles, training's slowdown from those waits (and, as "
                   "training_slowdown_h200, an H200's slower op after a prefill), the KV "
                   "transfers to each DC's decode servers over its host links (no WAN)")
    return out
