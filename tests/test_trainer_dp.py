"""The data-parallel all-reduce: the padded ring reduces the real gradients exactly as gloo's
all_reduce does, over real gloo process groups on loopback (3 processes)."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.dp import average_gradients, ring_all_reduce


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        g = torch.Generator().manual_seed(rank)
        # ring_all_reduce: 10 real of 23 (not a multiple of 3: the last chunk is short)
        flat = torch.randn(23, generator=g)
        ring_all_reduce(flat, 10, world, rank)
        out[f"ring{rank}"] = flat[:10].clone()
        out[f"in{rank}"] = torch.randn(23, generator=torch.Generator().manual_seed(rank))[:10]
        # average_gradients with and without padding give the same gradients
        params = [torch.nn.Parameter(torch.zeros(4, 3)), torch.nn.Parameter(torch.zeros(5))]
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, float(rank + 1)) * (i + 1)
        n_plain = average_gradients(params, world, 0)
        plain = [p.grad.clone() for p in params]
        for i, p in enumerate(params):
            p.grad = torch.full_like(p, float(rank + 1)) * (i + 1)
        n_pad = average_gradients(params, world, 4000)
        out[f"avg{rank}"] = (plain, [p.grad.clone() for p in params], n_plain, n_pad)
    finally:
        dist.destroy_process_group()


def test_ring_all_reduce_and_padded_average_match_plain_all_reduce() -> None:
    world = 3
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_worker, args=(world, _free_port(), out), nprocs=world)
        expect = sum(out[f"in{r}"] for r in range(world))
        for r in range(world):
            assert torch.allclose(out[f"ring{r}"], expect, atol=1e-6)
            plain, padded, n_plain, n_pad = out[f"avg{r}"]
            assert n_plain == 4 * (12 + 5)
            assert n_pad >= 4000 and n_pad % world == 0
            mean = (1 + 2 + 3) / 3
            assert torch.allclose(plain[0], torch.full((4, 3), mean))
            assert torch.allclose(plain[1], torch.full((5,), 2 * mean))
            for a, b in zip(plain, padded):
                assert torch.equal(a, b)
