"""What a feature adds to one training worker's spec: typed extras, one type per feature.

One job: the extras' types and their JSON form. A feature's run handle gives each worker what
it needs (testbed.features.base.FeatureHandle.worker_extras); the launcher puts them in the
worker's spec file (testbed/host/specfiles.py, `WorkerSpec.extras`), and the worker asks for the
one it reads, `spec.extra(GateExtras)`: None when that feature is off. In the file each is an
object with its `kind` (`to_dict` / `extras_from_dict`); a link direction is "a->b" there only.

- GateExtras (temporal WAN sharing): the arbiter a worker asks before each message it sends
  to prev / next (trainer.slotclient), None where that channel stays in its DC.
- GpuShareExtras (BubbleTea): the host's GPU lock the worker holds for every F, B and OPT
  (testbed/host/gpulock.py), the DC controller's address for its notices (testbed/host/notices.py:
  the protocol), and how fast a message from prev / next can come at most (`Inbound`: the
  arrival bound, profile mode).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from testbed.spec.links import LinkDir


def _check(ok: bool, what: str, value: object, need: str) -> None:
    if not ok:
        raise ValueError(f"{what} is {value!r}: need {need}")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True, slots=True)
class Gate:
    """One direction's WAN arbiter (testbed.features.temporal.arbiter): where to ask, for which
    link direction, as which pipeline (the worker's replica)."""

    ip: str
    port: int
    link: LinkDir
    pipeline: int

    def __post_init__(self) -> None:
        _check(isinstance(self.ip, str) and bool(self.ip), "gate ip", self.ip, "an address")
        _check(_int(self.port), "gate port", self.port, "an integer")
        _check(isinstance(self.link, LinkDir), "gate link", self.link, "a LinkDir")
        _check(_int(self.pipeline), "gate pipeline", self.pipeline, "an integer")

    def to_dict(self) -> dict:
        return {"ip": self.ip, "port": self.port, "link": str(self.link),
                "pipeline": self.pipeline}

    @classmethod
    def from_dict(cls, d: dict) -> Gate:
        return cls(ip=d["ip"], port=d["port"], link=LinkDir.parse(d["link"]),
                   pipeline=d["pipeline"])


@dataclass(frozen=True, kw_only=True, slots=True)
class NoticeAddress:
    """The DC controller's UDP address for a worker's notices; allreduce: also announce the gap
    that holds the gradient all-reduce."""

    ip: str
    port: int
    allreduce: bool = False

    def __post_init__(self) -> None:
        _check(isinstance(self.ip, str) and bool(self.ip), "notice address ip", self.ip,
               "an address")
        _check(_int(self.port), "notice address port", self.port, "an integer")
        _check(isinstance(self.allreduce, bool), "notice address allreduce", self.allreduce,
               "true or false")

    def to_dict(self) -> dict:
        return {"ip": self.ip, "port": self.port, "allreduce": self.allreduce}

    @classmethod
    def from_dict(cls, d: dict) -> NoticeAddress:
        return cls(ip=d["ip"], port=d["port"], allreduce=d.get("allreduce", False))


@dataclass(frozen=True, kw_only=True, slots=True)
class Inbound:
    """How a message from one neighbour comes (profile mode): rate_mbit, the lowest rate on its
    way as the network shapes it (None: unshaped); bytes, the neighbour's padded message bytes;
    hold_ms, the hold of the neighbour's op that makes it (F of prev, B of next; emulated ms);
    same_dc, whether the neighbour is in this DC. A message of N bytes takes at least
    N * 8 / rate after its first byte, and comes no sooner than hold_ms after its op starts:
    lower bounds on the bubble that waits for it (trainer/worker.py)."""

    rate_mbit: float | None
    bytes: int
    hold_ms: float
    same_dc: bool

    def __post_init__(self) -> None:
        _check(self.rate_mbit is None or (isinstance(self.rate_mbit, float)
                                          and self.rate_mbit > 0),
               "inbound rate_mbit", self.rate_mbit, "a float > 0 or None")
        _check(_int(self.bytes) and self.bytes >= 0, "inbound bytes", self.bytes,
               "an integer >= 0")
        _check(isinstance(self.hold_ms, (int, float)) and not isinstance(self.hold_ms, bool)
               and self.hold_ms >= 0, "inbound hold_ms", self.hold_ms, "a number >= 0")
        _check(isinstance(self.same_dc, bool), "inbound same_dc", self.same_dc,
               "true or false")

    def to_dict(self) -> dict:
        return {"rate_mbit": self.rate_mbit, "bytes": self.bytes, "hold_ms": self.hold_ms,
                "same_dc": self.same_dc}

    @classmethod
    def from_dict(cls, d: dict) -> Inbound:
        return cls(rate_mbit=d["rate_mbit"], bytes=d["bytes"], hold_ms=d["hold_ms"],
                   same_dc=d["same_dc"])


class WorkerExtras:
    """A feature's part of a worker spec: a frozen dataclass with a KIND, its JSON form
    (to_dict, with "kind") and from_dict. Every kind is in KINDS."""

    __slots__ = ()
    KIND: ClassVar[str]

    def to_dict(self) -> dict:
        out: dict = {"kind": self.KIND}
        for f in fields(self):   # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class GateExtras(WorkerExtras):
    """Temporal WAN sharing: the arbiter to ask before each message to prev / next."""

    KIND: ClassVar[str] = "gate"
    prev: Gate | None = None
    next: Gate | None = None

    def __post_init__(self) -> None:
        for key in ("prev", "next"):
            value = getattr(self, key)
            _check(value is None or isinstance(value, Gate), f"gate {key}", value,
                   "a Gate or None")

    @classmethod
    def from_dict(cls, d: dict) -> GateExtras:
        return cls(**{key: None if d.get(key) is None else Gate.from_dict(d[key])
                      for key in ("prev", "next")})


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuShareExtras(WorkerExtras):
    """BubbleTea: the host's GPU lock file, the controller's notice address (None: no
    notices), and the arrival bound's figures of the messages from prev / next (None: none)."""

    KIND: ClassVar[str] = "gpu_share"
    lock_path: str
    notify: NoticeAddress | None = None
    inbound_prev: Inbound | None = None
    inbound_next: Inbound | None = None

    def __post_init__(self) -> None:
        _check(isinstance(self.lock_path, str) and bool(self.lock_path), "gpu_share lock_path",
               self.lock_path, "a non-empty path")
        _check(self.notify is None or isinstance(self.notify, NoticeAddress), "gpu_share notify",
               self.notify, "a NoticeAddress or None")
        for key in ("inbound_prev", "inbound_next"):
            value = getattr(self, key)
            _check(value is None or isinstance(value, Inbound), f"gpu_share {key}", value,
                   "an Inbound or None")

    @classmethod
    def from_dict(cls, d: dict) -> GpuShareExtras:
        return cls(lock_path=d["lock_path"],
                   notify=None if d.get("notify") is None else NoticeAddress.from_dict(d["notify"]),
                   **{key: None if d.get(key) is None else Inbound.from_dict(d[key])
                      for key in ("inbound_prev", "inbound_next")})


KINDS: dict[str, type] = {c.KIND: c for c in (GateExtras, GpuShareExtras)}


def extras_from_dict(d: dict) -> WorkerExtras:
    """One extras object from its JSON form; ValueError naming an unknown kind."""
    kind = d.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown worker extras kind {kind!r}: one of {', '.join(KINDS)}")
    return KINDS[kind].from_dict({k: v for k, v in d.items() if k != "kind"})
