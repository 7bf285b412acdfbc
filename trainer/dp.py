"""Data parallelism inside one stage: a gloo process group over the stage's D replicas.

One job: average gradients across replicas, as one ring over them all or hierarchically where
the spec says so (groups of ranks per DC; testbed.plans.allreduce has the plan): each DC's ranks
all-reduce in their own group, the DCs' leaders (each group's first rank) all-reduce across in
K groups of their own, one part of the buffer each, all at once (so each hop between DCs has K
connections), and each leader broadcasts the sum to its group. Each worker belongs to exactly one such group (its
stage's), so the stage group is the process's default group: master = the stage's replica 0 IP
and port. Gloo picks its own interface from the hostname unless told, which inside a Mininet
host can resolve to an address that namespace does not have; so we name the interface that
carries this worker's IP (GLOO_SOCKET_IFNAME), found with SIOCGIFADDR. The rendezvous store
(a TCPStore on replica 0) listens on the master's address alone, not on every interface as
torch's own would: replica 0 binds the socket and hands it to the store.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from testbed.host.realtime import process_threads, set_fifo

_SIOCGIFADDR = 0x8915


def interface_for_ip(ip: str) -> str:
    """Name of the local interface holding IPv4 address ip (e.g. 'lo', 'dc0h1-eth0')."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                res = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:        # interface without an IPv4 address
                continue
            if socket.inet_ntoa(res[20:24]) == ip:
                return name
    raise RuntimeError(f"no local interface has address {ip}; is the worker in the right host?")


def open_store(my_ip: str, master_ip: str, master_port: int, rank: int, world_size: int,
                timeout_s: float) -> dist.TCPStore:
    """The stage group's rendezvous store: rank 0 serves it on (master_ip, master_port) only
    (its own address), the others connect to it."""
    timeout = timedelta(seconds=timeout_s)
    if rank != 0:
        return dist.TCPStore(master_ip, master_port, world_size, False, timeout)
    if master_ip != my_ip:
        raise ValueError(f"rank 0 serves the store on its own address {my_ip}, not {master_ip}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((master_ip, master_port))
        sock.listen()
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind the store's {master_ip}:{master_port}: {exc}") from exc
    # the store owns the descriptor from here (it closes it when it ends)
    return dist.TCPStore(master_ip, master_port, world_size, True, timeout,
                         master_listen_fd=sock.detach())


@dataclass(frozen=True)
class Hierarchical:
    """This rank's process groups of a hierarchical all-reduce (module docstring)."""

    local: object | None            # its DC's group; None where it is alone in its DC
    leader: int                     # its DC's leader (a rank of the stage group)
    across: tuple = ()              # the leaders' K groups; () unless it is a leader of 2+ DCs


def init_stage_group(my_ip: str, master_ip: str, master_port: int, rank: int, world_size: int,
                     timeout_s: float, io_priority: int | None = None,
                     groups: Sequence[Sequence[int]] = (), connections: int = 1
                     ) -> tuple[str, Hierarchical | None]:
    """Join the stage's gloo group. io_priority: gloo's threads (its workers, which run the
    all-reduce and sum the buffer, and its transport's I/O loop) run at SCHED_FIFO io_priority,
    like the stage-to-stage channels' I/O threads (trainer.transport): a GPU all-reduce runs on
    the GPU and the NIC and does not wait for CPU-bound neighbours; on 2 cores a normal-priority
    one did. gloo makes its threads in init_process_group; they are set after it, by thread id
    (testbed.host.realtime: a thread an RT thread starts does not inherit RT). The store is made before
    it, so on rank 0 the store's server thread, which reads whatever a peer sends, stays at
    normal priority. groups (the replica ranks of each DC) and connections (K across): a
    hierarchical all-reduce's subgroups, made here by every rank in one order as torch
    requires, their threads set like the rest. Returns what was set: "off", "fifo:N" or
    "refused:ERRNO" (tests/test_dp.py checks gloo's threads), and this rank's Hierarchical
    (None: one ring)."""
    os.environ["GLOO_SOCKET_IFNAME"] = interface_for_ip(my_ip)
    store = open_store(my_ip, master_ip, master_port, rank, world_size, timeout_s)
    before = set(process_threads())
    dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    hier = _subgroups(rank, groups, connections, timedelta(seconds=timeout_s)) if groups else None
    if io_priority is None:
        return "off", hier
    return set_fifo(io_priority, [t for t in process_threads() if t not in before]), hier


def _subgroups(rank: int, groups: Sequence[Sequence[int]], connections: int,
               timeout: timedelta) -> Hierarchical:
    """Every DC's group, then the leaders' `connections` groups (all ranks make all of them)."""
    local = None
    for g in groups:
        made = dist.new_group(list(g), timeout=timeout, backend="gloo")
        if rank in g and len(g) > 1:
            local = made
    leaders = [g[0] for g in groups]
    across = tuple(dist.new_group(leaders, timeout=timeout, backend="gloo")
                   for _ in range(max(1, connections)))
    mine = next(g for g in groups if rank in g)
    return Hierarchical(local=local, leader=mine[0],
                        across=across if rank == mine[0] and len(groups) > 1 else ())


def _all_reduce(flat: torch.Tensor, hier: Hierarchical | None) -> None:
    """Sum flat over the stage group: one ring, or hierarchically (module docstring)."""
    if hier is None:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return
    if hier.local is not None:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=hier.local)
    if hier.across:
        parts = flat.tensor_split(len(hier.across))
        works = [dist.all_reduce(part, op=dist.ReduceOp.SUM, group=g, async_op=True)
                 for part, g in zip(parts, hier.across) if part.numel() > 0]
        for work in works:
            work.wait()
    if hier.local is not None:
        dist.broadcast(flat, src=hier.leader, group=hier.local)


_BUFFERS: dict[tuple[int, torch.dtype], torch.Tensor] = {}   # (elements, dtype) -> buffer


def average_gradients(params: list[torch.nn.Parameter], world_size: int,
                      pad_bytes: int = 0, hier: Hierarchical | None = None) -> int:
    """All-reduce the gradients as one flat float buffer and divide by world_size; returns the
    bytes all-reduced. pad_bytes (profile mode) grows the buffer with zeros to the size of the
    target model's stage gradients, so the network carries the right volume. hier: this rank's
    groups of a hierarchical all-reduce (init_stage_group), None for one ring.

    The buffer is kept from call to call: only the real gradients are copied into its head,
    and its zero padding stays zero (a sum of zeros). Allocating, zeroing and concatenating
    the padding afresh each time cost the emulation time a GPU all-reduce would not spend:
    a 64 MiB all-reduce between two hosts at 1000 Mbit/s took 631-661 ms that way and 566-579
    ms with the kept buffer, against 537 ms of wire time (561 ms at TCP's 95.6% of the rate)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    n_real = sum(g.numel() for g in grads)
    dtype = grads[0].dtype
    size = max(n_real, pad_bytes // grads[0].element_size())
    flat = _BUFFERS.get((size, dtype))
    if flat is None:
        flat = _BUFFERS[(size, dtype)] = torch.zeros(size, dtype=dtype)
    offset = 0
    for g in grads:
        n = g.numel()
        flat[offset:offset + n].copy_(g.reshape(-1))
        offset += n
    _all_reduce(flat, hier)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = (flat[offset:offset + n] / world_size).view_as(p)
        offset += n
    return flat.element_size() * size
