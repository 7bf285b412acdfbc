"""The data-parallel all-reduce: the padded ring reduces the real gradients exactly as gloo's
all_reduce does, over real gloo process groups on loopback (3 processes)."""

from __future__ import annotations

import socket

import pytest
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


def test_allreduce_report_against_the_ideal_ring() -> None:
    """The report takes, per iteration, the replica that arrived last (shortest span), and
    compares the median with 2 (D-1) chunks of 1/D at the host link's rate."""
    from testbed.allreduce import allreduce_report, ring_ms
    from testbed.placement import Placement
    from testbed.scenario import parse_scenario
    from testbed.slotplan import WIRE_BYTES_PER_PAYLOAD_BYTE as WF
    sc = parse_scenario({"name": "ar", "dcs": [{"name": "ea", "hosts": 2, "rate_mbit": 1000},
                                               {"name": "we", "hosts": 2, "rate_mbit": 1000}],
                         "wan": [{"between": ["ea", "we"], "delay_ms": 10, "rate_mbit": 100}]})
    n = 1_000_000
    assert ring_ms(n, ["ea", "ea"], sc) == pytest.approx(2 * (n / 2 * WF * 8 / 1e6))
    assert ring_ms(n, ["ea", "we"], sc) == pytest.approx(2 * (n / 2 * WF * 8 / 1e5 + 10))
    pl = Placement(policy="atlas", stage_dcs=(("ea", "ea"),), hosts=(("ea-h1", "ea-h2"),))
    spans = [{"name": "ALLREDUCE", "stage": 0, "replica": rep, "iteration": it, "bytes": n,
              "t_start_ns": 0, "t_end_ns": int(ms * 1e6)}
             for it, (a, b) in enumerate([(30, 10), (50, 12), (20, 14), (90, 99)])
             for rep, ms in enumerate((a, b))]
    out = allreduce_report(spans, pl, sc, [0, 1, 2], time_scale=2.0)
    assert len(out) == 1 and out[0]["measured_ms"] == pytest.approx(12 / 2)
    assert out[0]["wire_ms"] == pytest.approx(ring_ms(n, ["ea", "ea"], sc))
    assert out[0]["ratio"] == pytest.approx(6 / out[0]["wire_ms"])
