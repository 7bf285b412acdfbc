"""A rate as a person reads it: the real one, and the emulated one beside it where they differ.

One job: format. A scenario's rates are the real link's divided by `scale` (docs/network.md);
every command prints the real rate first and, when scale is not 1, the emulated one beside it,
so one link reads the same in show, plan and whatif.
"""

from __future__ import annotations


def mbit_text(mbit: float) -> str:
    """100 Mbit/s, 10 Gbit/s."""
    if mbit >= 1000:
        return f"{mbit / 1000:g} Gbit/s"
    return f"{mbit:g} Mbit/s"


def real_rate_text(emulated_mbit: float, scale: float) -> str:
    """The real rate, with the emulated one beside it when scale is not 1."""
    real = mbit_text(round(emulated_mbit * scale, 6))
    return real if scale == 1 else f"{real} ({mbit_text(emulated_mbit)} emulated)"
