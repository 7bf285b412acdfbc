"""The per-worker spec file: everything one stage replica needs, written by the launcher.

One job: the launcher/worker contract, as a dataclass that round-trips through JSON. A worker
finds its peers only here: `next` is the listener of stage s+1 replica d (ip, port) it connects
to; `listen_port` is where it accepts stage s-1 replica d (bound to its own `ip`); `dp_master_*`
is the TCPStore of its stage's data-parallel group (the stage's replica 0). `allreduce_groups` and
`allreduce_connections` say how that group's all-reduce runs (testbed.plans.allreduce).
`connections_next` and `connections_prev` are the K (TCP connections each message is striped over) of those two
channels; both ends of a channel get the same K. `prev.pad_bytes` / `next.pad_bytes` are what
those neighbours pad their messages to: with the model config they give the one shape and size a
channel accepts (trainer/worker.py). `extras` are what the run's features add, one
typed object per feature (testbed/host/extras.py: temporal sharing's gates, BubbleTea's GPU
share); the worker asks `spec.extra(GateExtras)`, None when that feature is off.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from testbed.host.extras import WorkerExtras, extras_from_dict

E = TypeVar("E", bound=WorkerExtras)


class SpecFile:
    """JSON round trip of a spec dataclass: the file a launcher writes and its process reads
    (this worker spec, and the BubbleTea servers' and controller's). `from_dict` rebuilds
    nested dataclasses where a spec has them."""

    __slots__ = ()

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())

    @classmethod
    def from_dict(cls, d: dict):
        return cls(**d)

    @classmethod
    def load(cls, path: Path):
        return cls.from_dict(json.loads(Path(path).read_text()))


@dataclass(frozen=True, kw_only=True, slots=True)
class Peer:
    name: str            # worker name, e.g. "s1r0@dc1h1" (the hello that is checked)
    host: str
    ip: str
    port: int
    dc: str | None = None
    pad_bytes: int = 0   # what the peer pads its messages to (its spec's pad_bytes)


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSpec(SpecFile):
    run_id: str
    name: str
    stage: int
    replica: int
    host: str
    ip: str
    dc: str
    listen_port: int | None          # stage > 0: accept stage s-1 here
    prev: Peer | None                # who connects to us (stage > 0)
    next: Peer | None                # whom we connect to (stage < P-1)
    dp_master_ip: str
    dp_master_port: int
    config: dict                     # TrainConfig.to_dict()
    scale: float
    hold_forward_ms: float = 0.0     # profile mode: hold each F/B to this long (0 = measured)
    hold_backward_ms: float = 0.0
    hold_opt_ms: float = 0.0         # profile mode: hold the optimizer step to this long
    pad_bytes: int = 0               # pad each activation/gradient message to this many bytes
    allreduce_pad_bytes: int = 0     # pad the gradient all-reduce buffer to this many bytes
    spans_path: str
    loss_path: str
    connect_timeout_s: float = 60.0
    recv_timeout_s: float = 120.0
    congestion_control: str | None = None   # TCP_CONGESTION of the stage-to-stage sockets
    connections_next: int = 1        # K: TCP connections of the channel to `next`
    connections_prev: int = 1        # K: TCP connections of the channel from `prev`
    io_priority: int | None = None   # SCHED_FIFO of the channels' I/O threads (None: normal)
    # the stage's all-reduce (testbed.plans.allreduce): () a ring over every replica; else the
    # replica ranks of each DC (hierarchical), the leaders' ring over allreduce_connections
    allreduce_groups: tuple[tuple[int, ...], ...] = ()
    allreduce_connections: int = 1
    extras: tuple[WorkerExtras, ...] = ()   # the features' (testbed/host/extras.py), one per kind

    def __post_init__(self) -> None:
        kinds = [e.KIND for e in self.extras]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"worker {self.name}: extras {kinds} name a kind twice")

    def extra(self, kind: type[E]) -> E | None:
        """This worker's extras of that type (a feature's part), or None: that feature is off."""
        return next((e for e in self.extras if type(e) is kind), None)

    def to_dict(self) -> dict:
        return dict(asdict(self), extras=[e.to_dict() for e in self.extras])

    @classmethod
    def from_dict(cls, d: dict) -> WorkerSpec:
        d = dict(d)
        for key in ("prev", "next"):
            if d.get(key) is not None:
                d[key] = Peer(**d[key])
        d["extras"] = tuple(extras_from_dict(e) for e in d.get("extras", ()))
        d["allreduce_groups"] = tuple(tuple(g) for g in d.get("allreduce_groups", ()))
        return cls(**d)
