"""Measure this repo's GPT block on a GPU and write a compute profile (same shape as the shipped
data/gpu-profiles/h200-transformer.json), for `compute: profile` runs.

One job: timing. For each (width, seq, micro_batch) it times one `testbed.host.gpt.Block` (pre-norm,
causal SDPA, 4x GELU MLP, no bias) forward, and forward+backward, as the median of `reps` runs
after warm-ups (CUDA events on a GPU, perf_counter on CPU); backward = (fwd+bwd) - fwd.
`activation_bytes` = micro_batch x seq x width x element size: what one micro-batch sends to the
next stage. Weights are random (timing does not depend on them). Needs only torch and this repo.

    python -m trainer.measure_profile OUT.json               # on a CUDA GPU, bf16, < 2 minutes
    python -m trainer.measure_profile OUT.json --cpu-smoke   # tiny grid on CPU (tests)
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from typing import Callable

import torch

from testbed.host.gpt import Block, GPTConfig

GPU_GRID = {"widths": [128, 256, 512], "seqs": [256, 1024, 2048], "micro_batches": [1, 2, 4]}
SMOKE_GRID = {"widths": [32, 64], "seqs": [16], "micro_batches": [1, 2]}


def timed_ms(fn: Callable[[], object], reps: int, warmup: int, device: str) -> float:
    """Median milliseconds of fn() over reps runs after warmup runs."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if device == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def heads_for(width: int) -> int:
    return max(1, width // 64)   # head size 64, as GPT-2


def measure_block(width: int, seq: int, micro_batch: int, device: str, dtype: torch.dtype,
                  reps: int, warmup: int) -> dict:
    cfg = GPTConfig(n_layer=1, n_head=heads_for(width), n_embd=width, block_size=seq)
    with torch.device(device):
        block = Block(cfg).to(dtype)
    x = torch.randn(micro_batch, seq, width, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    fwd = timed_ms(lambda: block(x), reps, warmup, device)
    fwd_bwd = timed_ms(lambda: block(x).backward(grad), reps, warmup, device)
    return {"width": width, "heads": cfg.n_head, "seq": seq, "micro_batch": micro_batch,
            "forward_ms": round(fwd, 4), "backward_ms": round(max(0.0, fwd_bwd - fwd), 4),
            "activation_bytes": micro_batch * seq * width * x.element_size(),
            "params": sum(p.numel() for p in block.parameters())}


def measure(grid: dict, device: str, dtype: torch.dtype, reps: int, warmup: int) -> dict:
    torch.manual_seed(0)
    blocks = []
    t0 = time.time()
    for width in grid["widths"]:
        for seq in grid["seqs"]:
            for mb in grid["micro_batches"]:
                blocks.append(measure_block(width, seq, mb, device, dtype, reps, warmup))
                print(json.dumps(blocks[-1]), flush=True)
    return {
        "what": "testbed.host.gpt.Block (pre-norm GPT block: causal SDPA, 4x GELU MLP, no bias) "
                "forward/backward per block, measured by trainer/measure_profile.py",
        "device": torch.cuda.get_device_name(0) if device == "cuda"
        else (platform.processor() or platform.machine() or "cpu"),
        "dtype": str(dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "timing": f"median of {reps} runs after {warmup} warm-ups; "
                  + ("CUDA events" if device == "cuda" else "perf_counter on CPU"),
        "measured_on": time.strftime("%Y-%m-%d"),
        "measure_s": round(time.time() - t0, 1),
        "blocks": blocks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="measure a GPT-block compute profile")
    parser.add_argument("out", help="output JSON path")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="tiny grid on CPU in float32 (seconds; for tests)")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                        help="default: bfloat16 on a GPU, float32 on CPU")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        device, grid, reps, warmup = "cpu", SMOKE_GRID, args.reps or 3, 1
        torch.set_num_threads(1)
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA GPU here; use --cpu-smoke for a CPU check")
        device, grid, reps, warmup = "cuda", GPU_GRID, args.reps or 10, 3
    dtype = getattr(torch, args.dtype) if args.dtype else (
        torch.bfloat16 if device == "cuda" else torch.float32)
    result = measure(grid, device, dtype, reps, warmup)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {len(result['blocks'])} blocks to {args.out} in {result['measure_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
