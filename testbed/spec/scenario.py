"""Scenario files (topologies/*.yaml) -> frozen, validated dataclasses.

One job: turn YAML into a `Scenario` or raise `ScenarioError` naming the field, the bad value and
the fix. Nothing here touches the kernel; `testbed.plans.topo` plans addresses from a Scenario and
`testbed.emulation.network` builds it. The `training` section is validated by `testbed.spec.training.TrainConfig`.

Form (every WAN link: one-way delay per direction, rate per direction):

    name: three_dc
    scale: 100                 # optional: emulated WAN is this many times slower than the real one
    time_scale: 1              # optional: time dilation (delays x T, rates / T, bytes kept)
                               # or auto: the smallest T this machine keeps on time
    backend: auto              # optional: auto | netem | delayline
    routing: direct            # optional: direct | shortest-delay (see testbed.plans.routing)
    congestion_control: cubic  # optional: cubic | reno | bbr, every TCP socket the testbed opens
    connections: auto          # optional: K TCP connections per cross-DC transfer, 1..16 or auto
                               # (systems that use K: testbed.plans.systems.connections_for)
    dcs:
      - {name: east, hosts: 2, rate_mbit: 1000,     # rate_mbit: optional intra-DC host link rate
         decode_hosts: 1}      # optional: BubbleTea decode servers <dc>-d1.. (never train)
    wan:
      - {between: [east, west], delay_ms: 20, rate_mbit: 100, jitter_ms: 0, loss_pct: 0,
         queue: 2000}          # queue: packets (int) or bytes ("4MB"); default >= BDP
    systems: [baseline]        # optional: see SYSTEMS (testbed.spec.systems describes each);
                               # "<system>+bubbletea" adds prefill in the bubbles
    bubbletea: {...}           # optional: prefill load and admission (testbed.spec.bubbletea)
    faults: [...]              # optional: link down, delay/rate/loss changes, crashes at given
                               # times (testbed.spec.faults; applied by testbed.features.faults.run)
    cross_traffic: [...]       # optional: other tenants' iperf3 TCP/UDP on WAN links
                               # (testbed.features.cross.run; tenant hosts <dc>-x1)
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.spec.errors import ScenarioError, shown, unknown_field
from testbed.spec.dcs import DataCenter, WanLink
from testbed.spec.fields import checked_number
from testbed.spec.timescale import MAX_TIME_SCALE, TimeScale
from testbed.spec.names import ROUTING_POLICIES
from testbed.spec.systems import BUBBLETEA_SUFFIX, SYSTEMS
from testbed.spec.yamlfile import load_yaml

if TYPE_CHECKING:
    from testbed.spec.bubbletea import BubbleTeaConfig
    from testbed.spec.faults import Fault
    from testbed.spec.cross import CrossFlow

BACKENDS = ("auto", "netem", "delayline")
CONGESTION_CONTROLS = ("cubic", "reno", "bbr")
MTU_BYTES = 1500
# A full-size TCP segment at that MTU: 20 bytes of IP and 32 of TCP (with the timestamps option)
# leave this much payload, in an Ethernet frame 14 bytes longer than the MTU. HTB counts frames.
TCP_MSS_BYTES = MTU_BYTES - 20 - 32     # 1448
ETH_FRAME_BYTES = MTU_BYTES + 14        # 1514
MIN_QUEUE_PACKETS = 100
# A WAN queue is a bfifo whose limit is a u32 of bytes; 1 GiB (715,827 full-size packets) is far
# above the bandwidth-delay product of any link this machine emulates and bounds what one queue
# may pin in kernel memory. A default queue (2 x BDP) is cut to it too.
MAX_QUEUE_BYTES = 1 << 30
DC_NAME_RE = re.compile(r"[a-z][a-z0-9]{0,5}")  # <dc>-h99-eth0 must fit IFNAMSIZ (15 chars)
MAX_WAN_LINKS_PER_DC = 99  # <dc>-gw-eth99 is the longest gateway interface name that fits
MAX_HOSTS_PER_DC = 99
MAX_HOSTS_PER_DC_PREDICT_ONLY = 100_000   # `predict_only: true`: the model's, never emulated
MAX_DECODE_HOSTS_PER_DC = 99   # <dc>-d99-eth0 fits IFNAMSIZ; addresses 10.<d>.0.101-199
MAX_DCS = 200
MAX_RATE_MBIT = 100_000        # a link's rate_mbit (host link or WAN), scaled
MAX_HOSTS_PREDICT_ONLY = 100_000   # all DCs together: the model's plans list every host
MAX_SYSTEMS = 2 * len(SYSTEMS)    # each with and without BUBBLETEA_SUFFIX
# TCP buffer limits of a real server, scaled down by `scale` in each host. The receive limit is
# Linux's default tcp_rmem max; the send limit is twice it, so that (as on a WAN-tuned host) the
# window the receiver advertises is what limits one flow: goodput = window / RTT.
REAL_TCP_RMEM_MAX_BYTES = 6291456
REAL_TCP_WMEM_MAX_BYTES = 2 * REAL_TCP_RMEM_MAX_BYTES
# Linux advertises as window only the payload share of the receive buffer (its scaling_ratio,
# skb length / truesize, for full-size segments); measured 0.73-0.755 on this kernel over veth.
RCV_WINDOW_FRACTION = 0.73
MIN_TCP_BUFFER_BYTES = 4096
# K TCP connections per cross-DC transfer: "auto" (testbed.plans.systems.auto_connections) or 1..16:
# the emulator's limit (each connection is a sender thread on this 2-core machine). A
# `predict_only` scenario may use as many as a real stack opens between two GPUs: NCCL's socket
# transport caps NCCL_NSOCKS_PERTHREAD x NCCL_SOCKET_NTHREADS at 64 sockets per peer (its
# documented limit; gloo opens one per pair), so 64 per GPU of a host's tensor-parallel group
# (each GPU sends its share over its own NIC), though a 100 Gbit/s, 80 ms path needs about 230
# windows of Linux's default buffer to fill.
MAX_CONNECTIONS = 16
NCCL_SOCKETS_PER_PEER = 64


def max_connections(predict_only: bool, tp: int = 1) -> int:
    """The most connections one transfer may use: the emulator's limit, or, predicted only, 64
    (NCCL's socket transport) per GPU of a tensor-parallel host."""
    return NCCL_SOCKETS_PER_PEER * max(1, tp) if predict_only else MAX_CONNECTIONS


def training_tp(raw_training: Any) -> int:
    """training.tp as written, where it is a positive integer (else 1: the training section's
    own check reports it)."""
    tp = raw_training.get("tp", 1) if isinstance(raw_training, dict) else 1
    return tp if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1 else 1


def scaled_tcp_rmem_max_bytes(scale: float) -> int:
    """The receive buffer limit a host gets with `scale` (scale 1: the real server's)."""
    return max(MIN_TCP_BUFFER_BYTES, int(REAL_TCP_RMEM_MAX_BYTES / scale))


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario:
    name: str
    dcs: tuple[DataCenter, ...]
    wan: tuple[WanLink, ...]
    scale: float = 1.0
    time_scale: float = 1.0
    # `time_scale: auto`: the run layer picks T before training (testbed.predict.autoscale);
    # until then time_scale is 1.
    time_scale_auto: bool = False
    backend: str = "auto"
    routing: str = "direct"
    congestion_control: str = "cubic"
    connections: int | str = "auto"   # K per cross-DC transfer, or "auto"
    systems: tuple[str, ...] = ("baseline",)
    training: dict[str, Any] | None = None
    bubbletea: "BubbleTeaConfig | None" = None
    path: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False)
    predict_only: bool = False        # for the model (`predict`) only: too big to emulate
    # Linux's net.ipv4.tcp_slow_start_after_idle in every host (default on, as Linux): a
    # connection idle longer than its RTO restarts from the initial window. WAN-tuned hosts
    # turn it off; the model follows the same setting.
    tcp_slow_start_after_idle: bool = True
    description: str = ""             # one line for `list` and `show`
    sweep: dict[str, Any] | None = None   # testbed.spec.sweep: one run per point (raw holds it)
    faults: "tuple[Fault, ...]" = ()      # testbed.spec.faults, in time order
    cross_traffic: "tuple[CrossFlow, ...]" = ()   # testbed.features.cross.run

    def check_emulable(self) -> None:
        """ScenarioError unless this scenario may be built (run, calibrate)."""
        if self.predict_only:
            raise ScenarioError("predict_only", f"{self.name} is for the model only "
                                f"({sum(dc.hosts for dc in self.dcs)} hosts)",
                                f"use: python run_testbed.py predict {self.path or self.name}")

    def dc(self, name: str) -> DataCenter:
        for dc in self.dcs:
            if dc.name == name:
                return dc
        raise KeyError(name)

    def host_names(self) -> list[str]:
        """The training hosts (one GPU each), in scenario order."""
        return [f"{dc.name}-h{i}" for dc in self.dcs for i in range(1, dc.hosts + 1)]

    def tenant_dcs(self) -> list[str]:
        """DCs that send or receive cross-traffic: each gets a tenant host <dc>-x1."""
        used = {x for f in self.cross_traffic for x in (f.src, f.dst)}
        return [dc.name for dc in self.dcs if dc.name in used]

    def decode_host_names(self, dc: str | None = None) -> list[str]:
        """BubbleTea's decode hosts (of one DC, or all)."""
        return [f"{d.name}-d{i}" for d in self.dcs if dc in (None, d.name)
                for i in range(1, d.decode_hosts + 1)]

    @property
    def dilation(self) -> TimeScale:
        """time_scale as the object that converts between configured, emulated and real."""
        return TimeScale(self.time_scale)

    def emulated(self) -> EmulatedScenario:
        """What the network is built from: with time_scale T every delay and jitter is T times
        longer and every rate T times lower; bytes (queues, buffers, messages) stay. Round trips
        and packet counts are then those of the configured link, in T times the time. A type of
        its own, so a plan of the network (testbed.plans.topo.make_plan) is never made from the
        configured values by mistake."""
        ts = self.dilation
        wan = tuple(replace(w, delay_ms=ts.emulated_span(w.delay_ms),
                            jitter_ms=ts.emulated_span(w.jitter_ms),
                            rate_mbit=ts.emulated_rate(w.rate_mbit)) for w in self.wan)
        dcs = tuple(replace(dc, rate_mbit=None if dc.rate_mbit is None
                            else ts.emulated_rate(dc.rate_mbit)) for dc in self.dcs)
        fields_ = {f.name: getattr(self, f.name) for f in fields(Scenario)}
        return EmulatedScenario(**dict(fields_, wan=wan, dcs=dcs))


@dataclass(frozen=True, kw_only=True, slots=True)
class EmulatedScenario(Scenario):
    """A scenario in the emulation's units (Scenario.emulated): delays and jitters x T, rates / T.
    `time_scale` still says T; `emulated()` of it is itself."""

    def emulated(self) -> EmulatedScenario:
        return self


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises ScenarioError (one line) on any problem."""
    data = load_yaml(path, "give a scenario file's path or a shipped scenario's name, such as "
                     "two_dc (run_testbed.py list shows them)")
    return parse_scenario(data, path=str(Path(path)))


def _time_scale(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 1.0 <= float(value) <= MAX_TIME_SCALE:
        raise ScenarioError("time_scale", f"{shown(value)} is not a valid time_scale",
                            f"use a number 1..{MAX_TIME_SCALE:g} or auto")
    return float(value)


def parse_scenario(data: Any, path: str = "") -> Scenario:
    top = _mapping(data, "scenario")
    _no_unknown(top, "", {"name", "dcs", "wan", "scale", "time_scale", "backend", "routing",
                          "congestion_control", "connections", "systems", "training",
                          "bubbletea", "predict_only", "tcp_slow_start_after_idle",
                          "description", "sweep", "faults", "cross_traffic"})
    name = top.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise ScenarioError("name", f"{shown(name)} is not a valid name",
                            "use 1-64 letters, digits, '_', '-' or '.'")
    predict_only = _flag(top.get("predict_only", False), "predict_only",
                         "use true for a scenario only `predict` reads")
    dcs = _parse_dcs(top.get("dcs"), MAX_HOSTS_PER_DC_PREDICT_ONLY if predict_only
                     else MAX_HOSTS_PER_DC)
    if sum(dc.hosts for dc in dcs) > MAX_HOSTS_PREDICT_ONLY:
        raise ScenarioError("dcs", f"{sum(dc.hosts for dc in dcs)} hosts in all",
                            f"use at most {MAX_HOSTS_PREDICT_ONLY}")
    wan = _parse_wan(top.get("wan", []), dcs)
    _check_connected(dcs, wan)
    links_of = Counter(end for link in wan for end in {link.a, link.b})   # O(links), not DCs x links
    for dc in dcs:
        n = links_of[dc.name]
        if n > MAX_WAN_LINKS_PER_DC:
            raise ScenarioError("wan", f"DC {shown(dc.name)} has {n} WAN links",
                                f"give each DC at most {MAX_WAN_LINKS_PER_DC} (interface names "
                                "are capped at 15 characters)")
    scale = checked_number(top.get("scale", 1.0), "scale", low=1.0, high=1e6)
    # At most 100: the dilated minimum RTO (200 ms x T) must stay under the kernel's 120 s cap.
    time_scale_auto = top.get("time_scale") == "auto"
    time_scale = 1.0 if time_scale_auto else _time_scale(top.get("time_scale", 1.0))
    backend = _choice(top.get("backend", "auto"), "backend", BACKENDS)
    routing = _choice(top.get("routing", "direct"), "routing", ROUTING_POLICIES)
    congestion_control = _choice(top.get("congestion_control", "cubic"), "congestion_control",
                                 CONGESTION_CONTROLS)
    connections = _parse_connections(top.get("connections", "auto"),
                                     max_connections(predict_only,
                                                     training_tp(top.get("training"))))
    systems = top.get("systems", ["baseline"])
    if isinstance(systems, str):
        systems = [systems]
    if not isinstance(systems, list) or not systems:
        raise ScenarioError("systems", f"{shown(systems)} is not a list",
                            f"use a list of {', '.join(SYSTEMS)}")
    if len(systems) > MAX_SYSTEMS:
        raise ScenarioError("systems", f"{len(systems)} entries",
                            f"list each system once (at most {MAX_SYSTEMS})")
    for i, s in enumerate(systems):
        if not is_system_name(s):
            raise ScenarioError(f"systems[{i}]", f"{shown(s)} is not a system",
                                f"use one of {', '.join(SYSTEMS)}, each optionally with "
                                f"{BUBBLETEA_SUFFIX}")
    training = top.get("training")
    if training is not None and not isinstance(training, dict):
        raise ScenarioError("training", "must be a mapping", "see topologies/two_dc.yaml")
    description = top.get("description", "")
    if not isinstance(description, str) or "\n" in description.strip() \
            or len(description) > 300:
        raise ScenarioError("description", "must be one line of at most 300 characters",
                            "shorten it; longer notes go in YAML comments")
    sweep = top.get("sweep")
    if sweep is not None:
        from testbed.spec.sweep import expand
        expand(top)              # its shape and paths (each point is checked when it runs)
    slow_start = _flag(top.get("tcp_slow_start_after_idle", True), "tcp_slow_start_after_idle",
                       "use true (Linux's default) or false (a WAN-tuned host)")
    faults: tuple = ()
    if "faults" in top:
        from testbed.spec.faults import parse_faults
        faults = parse_faults(top["faults"], dcs, wan)
    cross: tuple = ()
    if "cross_traffic" in top:
        from testbed.spec.cross import parse_cross_traffic
        cross = parse_cross_traffic(top["cross_traffic"], dcs, wan, CONGESTION_CONTROLS)
    bubbletea = None
    if "bubbletea" in top:
        from testbed.spec.bubbletea import BubbleTeaConfig
        bubbletea = BubbleTeaConfig.from_dict(top["bubbletea"])
        if bubbletea.load.kind == "poisson" and not predict_only:   # drawn for every host
            from testbed.spec.bubbletea import check_poisson_size
            check_poisson_size(bubbletea.load.poisson_per_s, bubbletea.load.window_s)
    return Scenario(name=name, dcs=dcs, wan=wan, scale=scale, time_scale=time_scale,
                    time_scale_auto=time_scale_auto,
                    backend=backend, routing=routing, congestion_control=congestion_control,
                    connections=connections, systems=tuple(systems), training=training,
                    bubbletea=bubbletea, path=path, raw=top, predict_only=predict_only,
                    tcp_slow_start_after_idle=slow_start, description=description.strip(),
                    sweep=sweep, faults=faults, cross_traffic=cross)


def is_system_name(name: Any) -> bool:
    """A system of SYSTEMS, or one with BUBBLETEA_SUFFIX."""
    if not isinstance(name, str):
        return False
    return name.removesuffix(BUBBLETEA_SUFFIX) in SYSTEMS


def _parse_connections(value: Any, cap: int = MAX_CONNECTIONS) -> int | str:
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= cap:
        raise ScenarioError("connections", f"{shown(value)} is not a connection count",
                            f"use auto or an integer from 1 to {cap}"
                            + (f" (NCCL's socket transport opens at most "
                               f"{NCCL_SOCKETS_PER_PEER} per GPU pair)"
                               if cap > MAX_CONNECTIONS else
                               " (more only in a predict_only scenario)"))
    return value


def _parse_dcs(value: Any, max_hosts: int = MAX_HOSTS_PER_DC) -> tuple[DataCenter, ...]:
    if not isinstance(value, list) or not value:
        raise ScenarioError("dcs", "missing or empty", "list at least one {name: ..., hosts: N}")
    if len(value) > MAX_DCS:
        raise ScenarioError("dcs", f"{len(value)} DCs", f"use at most {MAX_DCS}")
    out: list[DataCenter] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"dcs[{i}]"
        d = _mapping(item, where)
        _no_unknown(d, where, {"name", "hosts", "rate_mbit", "decode_hosts"})
        name = d.get("name")
        if not isinstance(name, str) or not DC_NAME_RE.fullmatch(name):
            raise ScenarioError(f"{where}.name", f"{shown(name)} is not a valid DC name",
                                "use 1-6 lowercase letters/digits starting with a letter "
                                "(it prefixes interface names, which Linux caps at 15 chars)")
        if name in seen:
            raise ScenarioError(f"{where}.name", f"{shown(name)} appears twice", "give each DC its own name")
        hosts = d.get("hosts")
        if not isinstance(hosts, int) or isinstance(hosts, bool) or not 1 <= hosts <= max_hosts:
            raise ScenarioError(f"{where}.hosts", f"{shown(hosts)} is not a host count",
                                f"use an integer from 1 to {max_hosts}"
                                + ("" if max_hosts > MAX_HOSTS_PER_DC else
                                   " (more only in a predict_only scenario)"))
        rate = d.get("rate_mbit")
        if rate is not None:
            rate = checked_number(rate, f"{where}.rate_mbit", low=0.1, high=MAX_RATE_MBIT)
        decode = d.get("decode_hosts", 0)
        if (not isinstance(decode, int) or isinstance(decode, bool)
                or not 0 <= decode <= MAX_DECODE_HOSTS_PER_DC):
            raise ScenarioError(f"{where}.decode_hosts", f"{shown(decode)} is not a host count",
                                f"use an integer from 0 to {MAX_DECODE_HOSTS_PER_DC}")
        out.append(DataCenter(name=name, hosts=hosts, rate_mbit=rate, decode_hosts=decode))
        seen.add(name)
    return tuple(out)


def _parse_wan(value: Any, dcs: tuple[DataCenter, ...]) -> tuple[WanLink, ...]:
    if not isinstance(value, list):
        raise ScenarioError("wan", "must be a list of links", "e.g. - {between: [a, b], delay_ms: 20, rate_mbit: 100}")
    names = [dc.name for dc in dcs]
    known = set(names)
    out: list[WanLink] = []
    seen: set[frozenset[str]] = set()
    for i, item in enumerate(value):
        where = f"wan[{i}]"
        d = _mapping(item, where)
        _no_unknown(d, where, {"between", "delay_ms", "rate_mbit", "jitter_ms", "loss_pct", "queue"})
        between = d.get("between")
        if (not isinstance(between, list) or len(between) != 2
                or not all(isinstance(x, str) for x in between)):
            raise ScenarioError(f"{where}.between", f"{shown(between)} is not a pair of DC names",
                                "use between: [dc1, dc2]")
        for x in between:
            if x not in known:
                raise ScenarioError(f"{where}.between", f"{shown(x)} is not a DC",
                                    f"use one of {', '.join(names)}")
        if between[0] == between[1]:
            raise ScenarioError(f"{where}.between", f"links {shown(between[0])} to itself",
                                "name two different DCs")
        key = frozenset(between)
        if key in seen:
            raise ScenarioError(f"{where}.between", f"{shown(between)} is listed twice", "keep one link per DC pair")
        seen.add(key)
        for req in ("delay_ms", "rate_mbit"):
            if req not in d:
                raise ScenarioError(f"{where}.{req}", "missing", f"set {req} (a number)")
        delay = checked_number(d["delay_ms"], f"{where}.delay_ms", low=0.0, high=10000)
        rate = checked_number(d["rate_mbit"], f"{where}.rate_mbit", low=0.01,
                              high=MAX_RATE_MBIT)
        jitter = checked_number(d.get("jitter_ms", 0), f"{where}.jitter_ms", low=0.0, high=10000)
        if jitter > delay:
            raise ScenarioError(f"{where}.jitter_ms", f"{jitter} is more than delay_ms {delay}",
                                "use jitter_ms <= delay_ms")
        loss = checked_number(d.get("loss_pct", 0), f"{where}.loss_pct", low=0.0, high=100.0)
        link = WanLink(a=between[0], b=between[1], delay_ms=delay, rate_mbit=rate,
                       jitter_ms=jitter, loss_pct=loss)
        queue = _parse_queue(d.get("queue"), f"{where}.queue", link)
        out.append(WanLink(a=link.a, b=link.b, delay_ms=delay, rate_mbit=rate, jitter_ms=jitter,
                           loss_pct=loss, queue_bytes=queue,
                           queue_given=d.get("queue") is not None))
    return tuple(out)


_SIZE_RE = re.compile(r"^\s*([0-9]{1,15}(?:\.[0-9]{1,15})?)\s*(p|pkts|packets|b|kb|mb|kib|mib)\s*$",
                      re.I)
_SIZE_BYTES = {"b": 1, "kb": 1000, "mb": 1000**2, "kib": 1024, "mib": 1024**2}


def _parse_queue(value: Any, where: str, link: WanLink) -> int:
    """Queue size in bytes. Default: 2 x BDP, at least MIN_QUEUE_PACKETS full-size packets."""
    floor = MIN_QUEUE_PACKETS * MTU_BYTES
    if value is None:
        return min(max(2 * link.bdp_bytes, floor), MAX_QUEUE_BYTES)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        size = value * MTU_BYTES
    else:
        m = _SIZE_RE.match(value) if isinstance(value, str) else None
        if not m or float(m.group(1)) <= 0:
            raise ScenarioError(where, f"{shown(value)} is not a queue size",
                                "use packets (e.g. 2000) or bytes with a unit (e.g. '4MB', "
                                "'512KiB')")
        num, unit = float(m.group(1)), m.group(2).lower()
        size = int(num * (MTU_BYTES if unit in ("p", "pkts", "packets") else _SIZE_BYTES[unit]))
    if size > MAX_QUEUE_BYTES:
        raise ScenarioError(where, f"{shown(value)} is over {MAX_QUEUE_BYTES // MTU_BYTES} "
                            "packets (1 GiB)", "give a smaller queue")
    return size


def _check_connected(dcs: tuple[DataCenter, ...], wan: tuple[WanLink, ...]) -> None:
    reached = {dcs[0].name}
    changed = True
    while changed:
        changed = False
        for link in wan:
            if (link.a in reached) != (link.b in reached):
                reached |= {link.a, link.b}
                changed = True
    missing = [dc.name for dc in dcs if dc.name not in reached]
    if missing:
        raise ScenarioError("wan", f"no path from {shown(dcs[0].name)} to {', '.join(map(repr, missing))}",
                            "add WAN links so every DC is reachable")


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ScenarioError(where or "scenario", f"expected a mapping, got {type(value).__name__}",
                            "write key: value pairs")
    return value


def _no_unknown(d: dict[str, Any], where: str, allowed: set[str]) -> None:
    for key in d:
        if key not in allowed:
            raise unknown_field(where, key, allowed)


def _flag(value: Any, where: str, fix: str) -> bool:
    if not isinstance(value, bool):
        raise ScenarioError(where, f"{shown(value)} is not true or false", fix)
    return value


def _choice(value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ScenarioError(where, f"{shown(value)} is not one of {', '.join(allowed)}",
                            f"use one of {', '.join(allowed)}")
    return value


