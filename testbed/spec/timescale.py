"""Time dilation, one owner for it: a scenario's `time_scale` T as an object that converts.

Three clocks: the *configured* system (the scenario's delays, rates, profile holds, fault and
cross-traffic times: what the real system would see), the *emulated* one (what the network and
the workers run: every span T times longer, every rate T times lower, bytes unchanged, so round
trips and packet counts are the configured ones in T times the time), and *real* figures (what a
run reports: measured emulated spans divided back by T, rates multiplied back). Configured and
real share a time base, so there are two directions, each for spans and for rates:

    TimeScale(T).emulated_span(x)  = x * T     configured -> emulated (s, ms, ns)
    TimeScale(T).emulated_rate(x)  = x / T     configured -> emulated (Mbit/s, bytes/s)
    TimeScale(T).real_span(x)      = x / T     emulated (measured) -> real
    TimeScale(T).real_rate(x)      = x * T     emulated (measured) -> real

Each is one multiplication or division, in that order, so a converted value is bit for bit the
expression it replaces (tests/test_vocabulary.py).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TIME_SCALE = 100.0    # the kernel's dilated minimum RTO (tcp_rto_min_us) allows no more


@dataclass(frozen=True, slots=True)
class TimeScale:
    factor: float = 1.0       # T >= 1: how many times slower the emulated world runs

    def __post_init__(self) -> None:
        if not 1.0 <= self.factor <= MAX_TIME_SCALE:
            raise ValueError(f"time_scale {self.factor!r} is outside 1..{MAX_TIME_SCALE:g}")

    @classmethod
    def of(cls, value: TimeScale | float) -> TimeScale:
        """value as a TimeScale: itself, or a bare factor. For callers that still pass the
        number (testbed.run.systemrun, testbed.run.launch, testbed.features, the prefill controller:
        tests/test_vocabulary.py LEGACY_*); once they pass TimeScale this goes."""
        return value if isinstance(value, TimeScale) else cls(value)

    @property
    def dilated(self) -> bool:
        return self.factor != 1.0

    def emulated_span(self, configured: float) -> float:
        """A configured duration as the emulation runs it (any unit)."""
        return configured * self.factor

    def emulated_rate(self, configured: float) -> float:
        """A configured rate as the emulation runs it (any unit)."""
        return configured / self.factor

    def real_span(self, emulated: float) -> float:
        """A duration measured on the emulation, in the configured system's time."""
        return emulated / self.factor

    def real_rate(self, emulated: float) -> float:
        """A rate measured on the emulation, in the configured system's units."""
        return emulated * self.factor

    def __str__(self) -> str:
        return f"{self.factor:g}"
