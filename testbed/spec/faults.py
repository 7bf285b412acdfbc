"""A scenario's `faults:` section -> validated, time-ordered `Fault`s. Pure: nothing is applied
here (testbed.features.faults.run applies them to a running network).

One job: parse and check. Each fault names a kind, a time and a target:

    faults:
      - {kind: link_down, link: [east, west], at_s: 5, for_s: 2}   # for_s omitted: stays down
      - {kind: delay, link: [east, west], at_s: 3, delay_ms: 40, jitter_ms: 0}
      - {kind: rate, link: [east, west], at_s: 3, rate_mbit: 50}
      - {kind: rate_trace, link: [east, west], at_s: 0,           # (seconds after at_s, rate)
         steps: [[0, 100], [2, 50], [4, 100]]}
      - {kind: loss, link: [east, west], at_s: 4, loss_pct: 5, for_s: 1}   # a loss burst
      - {kind: crash, process: trainer, host: east-h1, at_s: 6}
        # process: trainer | prefill (on a training host) | decode (a decode host) |
        #          delayline (host: a gateway, <dc>-gw)

Times are seconds after the trainers are started, in the configured system's time (with
time_scale T they happen T times later on the wall clock); delay, rate and loss are in the same
units as the `wan` section's, and change both directions of the link. A link change with for_s
is restored to the link's configured figures after for_s; a `rate_trace` is one `rate` fault per
step. A loss fault makes its link's delay lines take packets one segment at a time from the
start (as a link configured with loss does), so a lost packet is one segment, not a GSO burst.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from testbed.spec.errors import ScenarioError, shown, unknown_field
from testbed.spec.fields import checked_number
from testbed.spec.timescale import TimeScale

if TYPE_CHECKING:
    from testbed.spec.dcs import DataCenter, WanLink

KINDS = ("link_down", "delay", "rate", "rate_trace", "loss", "crash")
PROCESSES = ("trainer", "prefill", "decode", "delayline")
MAX_FAULTS = 1000
MAX_AT_S = 1e6
_FIELDS = {
    "link_down": ({"link", "at_s"}, {"for_s"}),
    "delay": ({"link", "at_s", "delay_ms"}, {"jitter_ms", "for_s"}),
    "rate": ({"link", "at_s", "rate_mbit"}, {"for_s"}),
    "rate_trace": ({"link", "at_s", "steps"}, set()),
    "loss": ({"link", "at_s", "loss_pct"}, {"for_s"}),
    "crash": ({"process", "host", "at_s"}, set()),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    label: str                   # where it came from: "faults[2]", "faults[3].steps[1]"
    kind: str                    # link_down | delay | rate | loss | crash (a trace is rates)
    at_s: float
    link: tuple[str, str] | None = None
    for_s: float | None = None   # restored after this long; None: stays
    delay_ms: float | None = None
    jitter_ms: float | None = None
    rate_mbit: float | None = None
    loss_pct: float | None = None
    process: str | None = None
    host: str | None = None

    def describe(self) -> str:
        """One line: what and when, in the scenario's terms."""
        where = f"{self.link[0]}<->{self.link[1]}" if self.link else f"{self.process} on {self.host}"
        if self.kind == "delay":
            what = f"delay {self.delay_ms:g} ms" + (f" +-{self.jitter_ms:g}" if self.jitter_ms else "")
        elif self.kind == "rate":
            what = f"rate {self.rate_mbit:g} Mbit/s"
        elif self.kind == "loss":
            what = f"loss {self.loss_pct:g}%"
        else:
            what = self.kind.replace("_", " ")
        until = f" for {self.for_s:g} s" if self.for_s is not None else ""
        return f"{self.label} ({what} {where} at {self.at_s:g} s{until})"

    def scaled(self, dilation: TimeScale | float) -> "Fault":
        """As the network is built (Scenario.emulated): delays x T, rates / T. Times stay
        configured (the runner multiplies them by T)."""
        ts = TimeScale.of(dilation)
        if not ts.dilated:
            return self
        delay, jitter, rate = self.delay_ms, self.jitter_ms, self.rate_mbit
        return replace(self, delay_ms=None if delay is None else ts.emulated_span(delay),
                       jitter_ms=None if jitter is None else ts.emulated_span(jitter),
                       rate_mbit=None if rate is None else ts.emulated_rate(rate))


@dataclass(frozen=True, kw_only=True, slots=True)
class Event:
    fault: Fault
    restore: bool            # put the link's configured figures back
    at_s: float              # configured time

    def describe(self) -> str:
        return ("restore after " if self.restore else "") + self.fault.describe()


def events_of(faults: tuple[Fault, ...]) -> list[Event]:
    """Every fault, and a restore for each with for_s, in time order; at one time, restores
    first (a link restored and faulted again at once ends up faulted). A restore puts the
    link's configured figures back, even over a later fault of the same kind that overlaps it."""
    out = [Event(fault=f, restore=False, at_s=f.at_s) for f in faults]
    out += [Event(fault=f, restore=True, at_s=round(f.at_s + f.for_s, 9)) for f in faults
            if f.for_s is not None]     # rounded: 0.1 + 0.2 is due with a fault at 0.3
    return sorted(out, key=lambda e: (e.at_s, not e.restore))


def parse_faults(value: Any, dcs: "tuple[DataCenter, ...]",
                 wan: "tuple[WanLink, ...]") -> tuple[Fault, ...]:
    """The `faults` list, each checked against the scenario's DCs, links and hosts, in time
    order (a rate_trace expanded). ScenarioError (one line, naming the field) on a problem."""
    if not isinstance(value, list):
        raise ScenarioError("faults", "must be a list", "e.g. - {kind: link_down, link: [a, b], "
                            "at_s: 5, for_s: 2}")
    if len(value) > MAX_FAULTS:
        raise ScenarioError("faults", f"{len(value)} faults", f"use at most {MAX_FAULTS}")
    out: list[Fault] = []
    for i, item in enumerate(value):
        out += _parse_one(item, f"faults[{i}]", dcs, wan)
        if len(out) > MAX_FAULTS:   # each rate_trace step counts as one
            raise ScenarioError(f"faults[{i}]", f"over {MAX_FAULTS} faults and steps in all",
                                f"use at most {MAX_FAULTS}")
    return tuple(sorted(out, key=lambda f: f.at_s))


def _parse_one(item: Any, where: str, dcs: "tuple[DataCenter, ...]",
               wan: "tuple[WanLink, ...]") -> list[Fault]:
    if not isinstance(item, dict):
        raise ScenarioError(where, f"expected a mapping, got {type(item).__name__}",
                            "write kind: ..., at_s: ... and the fault's fields")
    kind = item.get("kind")
    if kind not in KINDS:
        raise ScenarioError(f"{where}.kind", f"{shown(kind)} is not a fault kind",
                            f"use one of {', '.join(KINDS)}")
    required, optional = _FIELDS[kind]
    for key in item:
        if key != "kind" and key not in required | optional:
            raise unknown_field(where, key, required | optional,
                                f"unknown field for a {kind} fault")
    for key in sorted(required):
        if key not in item:
            raise ScenarioError(f"{where}.{key}", "missing", f"a {kind} fault needs it")
    at_s = checked_number(item["at_s"], f"{where}.at_s", low=0.0, high=MAX_AT_S)
    for_s = None
    if "for_s" in item:
        for_s = checked_number(item["for_s"], f"{where}.for_s", low=0.001, high=MAX_AT_S)
    if kind == "crash":
        process = item["process"]
        if process not in PROCESSES:
            raise ScenarioError(f"{where}.process", f"{shown(process)} is not a process",
                                f"use one of {', '.join(PROCESSES)}")
        host = item["host"]
        hosts = _hosts_for(process, dcs)
        if host not in hosts:
            raise ScenarioError(f"{where}.host", f"{shown(host)} runs no {process}",
                                f"use one of {', '.join(hosts[:8]) or '(none: add decode_hosts)'}"
                                + (", ..." if len(hosts) > 8 else ""))
        return [Fault(label=where, kind=kind, at_s=at_s, process=process, host=host)]
    link = _link(item["link"], f"{where}.link", wan)
    if kind == "rate_trace":
        return _trace(item["steps"], f"{where}.steps", link, at_s)
    fault = Fault(label=where, kind=kind, at_s=at_s, link=link, for_s=for_s)
    if kind == "delay":
        delay = checked_number(item["delay_ms"], f"{where}.delay_ms", low=0.0, high=10000.0)
        jitter = checked_number(item.get("jitter_ms", 0), f"{where}.jitter_ms", low=0.0,
                                high=10000.0)
        if jitter > delay:
            raise ScenarioError(f"{where}.jitter_ms", f"{jitter:g} is more than delay_ms "
                                f"{delay:g}", "use jitter_ms <= delay_ms")
        return [replace(fault, delay_ms=delay, jitter_ms=jitter)]
    if kind == "rate":
        return [replace(fault, rate_mbit=checked_number(item["rate_mbit"], f"{where}.rate_mbit",
                                                        low=0.01, high=100000.0))]
    if kind == "loss":
        return [replace(fault, loss_pct=checked_number(item["loss_pct"], f"{where}.loss_pct",
                                                       low=0.0, high=100.0))]
    return [fault]   # link_down


def _trace(steps: Any, where: str, link: tuple[str, str], at_s: float) -> list[Fault]:
    if not isinstance(steps, list) or not steps:
        raise ScenarioError(where, "must be a non-empty list of [seconds, rate_mbit] pairs",
                            "e.g. steps: [[0, 100], [2, 50], [4, 100]]")
    out: list[Fault] = []
    last = -1.0
    for j, step in enumerate(steps):
        here = f"{where}[{j}]"
        if not isinstance(step, list) or len(step) != 2:
            raise ScenarioError(here, f"{shown(step)} is not a [seconds, rate_mbit] pair",
                                "write each step as [t_s, rate_mbit]")
        t = checked_number(step[0], f"{here}[0]", low=0.0, high=MAX_AT_S)
        if t <= last:
            raise ScenarioError(f"{here}[0]", f"{t:g} s does not come after the step before",
                                "list steps in increasing time")
        last = t
        rate = checked_number(step[1], f"{here}[1]", low=0.01, high=100000.0)
        out.append(Fault(label=here, kind="rate", at_s=at_s + t, link=link, rate_mbit=rate))
    return out


def _link(value: Any, where: str, wan: "tuple[WanLink, ...]") -> tuple[str, str]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(x, str) for x in value)):
        raise ScenarioError(where, f"{shown(value)} is not a pair of DC names", "use link: [dc1, dc2]")
    for w in wan:
        if {w.a, w.b} == set(value):
            return (w.a, w.b)
    raise ScenarioError(where, f"no WAN link between {shown(value[0])} and {shown(value[1])}",
                        "name the two ends of a link in the wan section")


def _hosts_for(process: str, dcs: "tuple[DataCenter, ...]") -> list[str]:
    if process in ("trainer", "prefill"):
        return [f"{dc.name}-h{i}" for dc in dcs for i in range(1, dc.hosts + 1)]
    if process == "decode":
        return [f"{dc.name}-d{i}" for dc in dcs for i in range(1, dc.decode_hosts + 1)]
    return [f"{dc.name}-gw" for dc in dcs]


