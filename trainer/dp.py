"""Data parallelism inside one stage: a gloo process group over the stage's D replicas.

One job: average gradients across replicas. Each worker belongs to exactly one such group (its
stage's), so the stage group is the process's default group: master = the stage's replica 0 IP
and port. Gloo picks its own interface from the hostname unless told, which inside a Mininet
host can resolve to an address that namespace does not have; so we name the interface that
carries this worker's IP (GLOO_SOCKET_IFNAME), found with SIOCGIFADDR.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from datetime import timedelta

import torch
import torch.distributed as dist

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


def init_stage_group(my_ip: str, master_ip: str, master_port: int, rank: int, world_size: int,
                     timeout_s: float) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = interface_for_ip(my_ip)
    dist.init_process_group(backend="gloo", init_method=f"tcp://{master_ip}:{master_port}",
                            rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


SEGMENT = 1 << 18          # elements per message (1 MiB of float32)
_buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # numel -> (ring buffer, chunk scratch)


def _ring_buffers(numel: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat buffer and a receive chunk, kept between iterations: the padding is never read,
    so it is allocated once and never zeroed or reduced."""
    if numel not in _buffers:
        _buffers.clear()
        _buffers[numel] = (torch.empty(numel), torch.empty(chunk))
    return _buffers[numel]


def ring_all_reduce(flat: torch.Tensor, n_real: int, world_size: int, rank: int,
                    scratch: torch.Tensor | None = None) -> None:
    """Sum flat[:n_real] over the group in place with the ring pattern (reduce-scatter, then
    all-gather: 2 (D-1) steps, each sending one of D equal chunks to the next rank and receiving
    one from the previous), so every rank puts 2 (D-1)/D x flat's bytes on the wire. Only the
    first n_real elements are added; the rest is padding that is carried and never reduced, so the
    CPU cost is that of the real gradients (a GPU's NCCL ring reduces at memory speed; gloo
    reducing megabytes of padding on this machine's CPU doubled the all-reduce)."""
    D, n = world_size, flat.numel()
    chunk = -(-n // D)
    right, left = (rank + 1) % D, (rank - 1) % D
    if scratch is None:
        scratch = torch.empty(chunk, dtype=flat.dtype)

    def part(i: int) -> tuple[int, int]:
        return min(i * chunk, n), min((i + 1) * chunk, n)

    def exchange(send_i: int, recv_into: torch.Tensor) -> None:
        a, b = part(send_i)
        works = []
        for o in range(0, max(b - a, recv_into.numel()), SEGMENT):
            if a + o < b:
                works.append(dist.isend(flat[a + o:min(b, a + o + SEGMENT)], right))
            if o < recv_into.numel():
                works.append(dist.irecv(recv_into[o:o + SEGMENT], left))
        for w in works:
            w.wait()

    for step in range(D - 1):                      # reduce-scatter
        send_i, recv_i = (rank - step) % D, (rank - step - 1) % D
        a, b = part(recv_i)
        got = scratch[:b - a]
        exchange(send_i, got)
        real_end = min(b, n_real)
        if real_end > a:
            flat[a:real_end] += got[:real_end - a]
    for step in range(D - 1):                      # all-gather
        send_i, recv_i = (rank - step + 1) % D, (rank - step) % D
        a, b = part(recv_i)
        exchange(send_i, flat[a:b])


def average_gradients(params: list[torch.nn.Parameter], world_size: int,
                      pad_bytes: int = 0) -> int:
    """All-reduce the gradients as one flat float buffer and divide by world_size; returns the
    bytes all-reduced. pad_bytes (profile mode) grows the buffer to the size of the target
    model's stage gradients, so the network carries the right volume in the ring's pattern
    (ring_all_reduce); only the real gradients are reduced."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    n_real = sum(g.numel() for g in grads)
    elem = 4
    total = max(n_real, pad_bytes // elem)
    if total > n_real:
        chunk = -(-total // world_size)
        flat, scratch = _ring_buffers(chunk * world_size, chunk)
        torch.cat([g.reshape(-1).float() for g in grads], out=flat[:n_real])
        ring_all_reduce(flat, n_real, world_size, dist.get_rank(), scratch)
        total = flat.numel()
    else:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    real = flat[:n_real] / world_size
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = real[offset:offset + n].view_as(p).to(g.dtype).clone()
        offset += n
    return elem * total
