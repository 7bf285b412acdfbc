"""The what-if's scenarios: from a scenario's document, one derived document per setting, each
changing that one setting and nothing else. Pure: documents in, documents out.

Settings and what each derived document writes (`Variant.fields`, paths into the document):

    rate_down / rate_up     every WAN link's rate_mbit x RATE_DOWN / x RATE_UP (less where
                            that passes MAX_RATE_MBIT)                       wan[].rate_mbit
    delay_up / delay_down   every WAN link's delay_ms x DELAY_UP / x DELAY_DOWN   wan[].delay_ms
    fewer_pipelines         D / FEWER_PIPELINES pipelines, on the GPUs they need: every DC's
                            hosts scaled alike (so each DC holds the stages it held)
                                                             training.replicas, dcs[].hosts
    uneven_dcs              DC sizes that are not whole stages: UNEVEN_CUT x D hosts moved from
                            every DC but the last to the last (total kept), or added to every
                            DC but the last where Atlas's whole stages would no longer fit
                                                                                dcs[].hosts
    slow_start              tcp_slow_start_after_idle turned over           tcp_slow_start_after_idle
    request_rate            BubbleTea's offered request rate set to a target (request_rate_variant:
                            the target comes from a prediction)  bubbletea.load.poisson_per_s or
                                                                   bubbletea.load.rate_multiplier

A setting that cannot change on this scenario (no WAN, one pipeline) gives no variant. Rates are
shown in real units: the document's rate_mbit x its `scale`.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from testbed.spec.scenario import MAX_RATE_MBIT, training_tp

RATE_DOWN, RATE_UP = 0.1, 4.0
DELAY_UP, DELAY_DOWN = 4.0, 0.25
FEWER_PIPELINES = 16
UNEVEN_CUT = 3 / 16


@dataclass(frozen=True, kw_only=True, slots=True)
class Variant:
    key: str                  # "as_given", "rate_down", ... (module docstring)
    label: str                # what changed, with the values before and after
    fields: tuple[str, ...]   # the document paths this setting owns ("wan[].rate_mbit")
    doc: dict[str, Any]       # the derived scenario document


def as_given(doc: dict[str, Any]) -> Variant:
    return Variant(key="as_given", label="as given", fields=(), doc=copy.deepcopy(doc))


def variants(doc: dict[str, Any]) -> list[Variant]:
    """Every one-setting variant of `doc` but request_rate (module docstring), in table order."""
    out = []
    wan = doc.get("wan") or []
    scale = float(doc.get("scale", 1.0))
    if wan:
        rates = [w["rate_mbit"] for w in wan]
        # up: at most to the highest rate a scenario may give (a whole number of times)
        up = max(1.0, min(RATE_UP, math.floor(MAX_RATE_MBIT / max(rates) * 10) / 10))
        for key, factor in (("rate_down", RATE_DOWN), ("rate_up", up)):
            if factor == 1.0:
                continue
            d = copy.deepcopy(doc)
            for w in d["wan"]:
                w["rate_mbit"] = round(w["rate_mbit"] * factor, 6)
            out.append(Variant(key=key, fields=("wan[].rate_mbit",), doc=d, label=(
                f"WAN rate x{factor:g} ({_rates(rates, scale)} -> "
                f"{_rates([w['rate_mbit'] for w in d['wan']], scale)})")))
        delays = [w["delay_ms"] for w in wan]
        for key, factor in (("delay_up", DELAY_UP), ("delay_down", DELAY_DOWN)):
            d = copy.deepcopy(doc)
            for w in d["wan"]:
                w["delay_ms"] = round(w["delay_ms"] * factor, 3)
            out.append(Variant(key=key, fields=("wan[].delay_ms",), doc=d, label=(
                f"WAN delay x{factor:g} ({_span(delays)} -> "
                f"{_span([w['delay_ms'] for w in d['wan']])} ms one way)")))
    training = doc.get("training") or {}
    replicas = int(training.get("replicas", 1))
    fewer = max(1, replicas // FEWER_PIPELINES)
    if fewer < replicas:
        d = copy.deepcopy(doc)
        d["training"]["replicas"] = fewer
        for dc in d["dcs"]:
            whole, rest = divmod(dc["hosts"], replicas)
            dc["hosts"] = whole * fewer + math.ceil(rest * fewer / replicas)
        out.append(Variant(key="fewer_pipelines", fields=("training.replicas", "dcs[].hosts"),
                           doc=d, label=(f"pipelines /{replicas / fewer:g} (D {replicas} -> "
                                         f"{fewer}, DCs {_sizes(d)} {_hosts(doc)})")))
    if replicas >= 2 and len(doc["dcs"]) >= 2:
        d = _uneven(doc, replicas, int(training.get("stages", 1)))
        out.append(Variant(key="uneven_dcs", fields=("dcs[].hosts",), doc=d, label=(
            f"DC sizes not whole stages ({_sizes(doc)} -> {_sizes(d)} {_hosts(doc)})")))
    if wan:
        d = copy.deepcopy(doc)
        on = not doc.get("tcp_slow_start_after_idle", True)
        d["tcp_slow_start_after_idle"] = on
        out.append(Variant(key="slow_start", fields=("tcp_slow_start_after_idle",), doc=d,
                           label="slow start after idle on (Linux's default)" if on
                           else "slow start after idle off (WAN-tuned hosts)"))
    return out


def _uneven(doc: dict[str, Any], replicas: int, stages: int) -> dict[str, Any]:
    """UNEVEN_CUT x D hosts (at least 1) moved from every DC but the last to the last; where
    that leaves too few whole stages for Atlas's placement, added to every DC but the last
    instead (so both placements still fit). One more host at a time until some DC holds a
    part of a stage."""
    def whole(d: dict) -> int:
        return sum(dc["hosts"] // replicas for dc in d["dcs"])

    def parted(d: dict) -> bool:
        return any(dc["hosts"] % replicas for dc in d["dcs"])

    first = max(1, round(replicas * UNEVEN_CUT))
    for cut in range(first, first + replicas):
        moved = copy.deepcopy(doc)
        taken = 0
        for dc in moved["dcs"][:-1]:
            take = min(cut, dc["hosts"] - 1)
            dc["hosts"] -= take
            taken += take
        moved["dcs"][-1]["hosts"] += taken
        if taken and whole(moved) >= stages and parted(moved):
            return moved
    for cut in range(first, first + replicas):
        added = copy.deepcopy(doc)
        for dc in added["dcs"][:-1]:
            dc["hosts"] += cut
        if parted(added):
            return added
    return added


def request_rate_variant(doc: dict[str, Any], offered_per_s: float, target_per_s: float,
                         why: str) -> Variant:
    """`doc` with BubbleTea's load offering target_per_s instead of offered_per_s (a Poisson
    load's rate; a replayed trace's rate_multiplier in proportion)."""
    d = copy.deepcopy(doc)
    load = d["bubbletea"].setdefault("load", {})
    if load.get("poisson_per_s") is not None:
        offered_per_s = load["poisson_per_s"]       # as configured (the draw's rate differs)
        load["poisson_per_s"] = target_per_s
        field = "bubbletea.load.poisson_per_s"
    else:
        load["rate_multiplier"] = round(load.get("rate_multiplier", 1.0) * target_per_s
                                        / offered_per_s, 6)
        field = "bubbletea.load.rate_multiplier"
    return Variant(key="request_rate", fields=(field,), doc=d, label=(
        f"request rate {why} ({offered_per_s:,.0f} -> {target_per_s:,.0f} /s)"))


def changed_fields(base: Any, doc: Any, path: str = "") -> set[str]:
    """The paths at which two documents differ (list items as `[]`, a missing key as a
    difference)."""
    if isinstance(base, dict) and isinstance(doc, dict):
        out: set[str] = set()
        for key in set(base) | set(doc):
            sub = f"{path}.{key}" if path else str(key)
            if key not in base or key not in doc:
                out.add(sub)
            else:
                out |= changed_fields(base[key], doc[key], sub)
        return out
    if isinstance(base, list) and isinstance(doc, list) and len(base) == len(doc):
        out = set()
        for a, b in zip(base, doc):
            out |= changed_fields(a, b, f"{path}[]")
        return out
    return set() if base == doc else {path}


def round_rate(per_s: float) -> float:
    """A request rate to two significant figures (81,234 -> 81,000)."""
    if per_s <= 0:
        return per_s
    digits = 1 - int(math.floor(math.log10(per_s)))
    return float(round(per_s, digits))


def _sizes(doc: dict[str, Any]) -> str:
    return "/".join(str(dc["hosts"]) for dc in doc["dcs"])


def _hosts(doc: dict[str, Any]) -> str:
    """What a DC's hosts are: GPUs, or nodes of a tensor-parallel group's GPUs."""
    tp = training_tp(doc.get("training"))
    return "GPUs" if tp == 1 else f"nodes of {tp} GPUs"


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"


def _rates(mbit: list[float], scale: float) -> str:
    """Rates in real units (x scale), in Gbit/s from 1 Gbit/s up."""
    real = [m * scale for m in mbit]
    if max(real) >= 1000:
        return _span([round(r / 1000, 3) for r in real]) + " Gbit/s"
    return _span([round(r, 3) for r in real]) + " Mbit/s"
