#!/usr/bin/env python3
"""BubbleTea on a real GPU: prefill in the bubbles of one training stage, under the GPU lock.

Two processes share one device, as on a BubbleTea training host:

- A, the training stage: one 1F1B pipeline stage (testbed/rules/schedule.py's row for stage s of P
  stages, M micro-batches, then OPT), really computed: forward and backward of N GPT blocks
  (testbed/host/gpt.py's Block) of width W, sequence S, micro-batch B (bf16 on CUDA, float32 on
  CPU), AdamW step. Between ops it sleeps the pipeline bubbles: the gaps that testbed/rules/schedule.py's
  simulator predicts for that stage from A's own measured F, B and OPT times (x --gap-scale), so
  the idle pattern is the one the stage would have in the pipeline. Before each op it takes the
  host's GpuLock (testbed/host/gpulock.py, blocking), runs the op, synchronizes, releases, and records
  the op's span and lock wait. With notices on, after each op followed by a gap of >= 1 ms it
  sends B (multiprocessing queue) the bubble: {end of the op, predicted start of the next op}.
- B, the prefill server: prefill/decoder.py's InferenceGPT sized like the H200 profile's
  prefill stack (32 blocks of width 4096, 32 heads, vocab 32000, about 8B parameters; built on
  the device in bf16, random weights: timing does not depend on them), prefilling one prompt of
  --prompt-tokens tokens (KV cache of all layers and the greedy first token). A warm-up
  calibration gives its median prefill time. For each bubble notice it admits prefills one after
  another while now + median + --guard-ms <= the bubble's predicted end; each one try-acquires
  the GpuLock (never waits for training), runs, synchronizes, releases.

Three phases in one run (both processes built once; B idle in phase 1):
  1. train_alone  A's loop, B does nothing: the baseline iteration time.
  2. bubbletea    A sends notices, B prefills in the bubbles under the lock.
  3. naive        B prefills back to back without the lock (and without notices): the driver
                  time-slices the GPU, as in ../shared/data/gpu-profiles/h200-colocation.json.

Per phase (over the iterations after --warmup-iterations): iteration time (mean, median) and
slowdown against phase 1; the stage's compute time per iteration and its slowdown (the time-sliced
ops of phase 3 run ~2x longer); lock waits; span-based GPU utilization = busy time / wall, where
busy is the union of A's op spans and B's prefill spans (`util_span`; `util_span_sum` adds them
without merging, > util_span only where they overlap); sampled utilization from NVML (libnvidia-ml
through ctypes, else torch.cuda.utilization(); none on CPU); prefill count, rate, tokens/s,
overruns of the predicted bubble end; and `overlaps`: prefills whose span intersects a training op
(0 under the lock). A span is measured on the host around op + synchronize, so it includes launch
overhead and slightly overstates GPU busy time. The gaps are fixed sleeps, so `slowdown` counts
them as fixed: in a real pipeline a slower stage also stretches the others' bubbles, which the
stage's `compute_slowdown` shows better (phase 3).

    python bench/bench_gpu_bubbletea.py [--out results/bubbletea_gpu.json] [--prompt-tokens 512]
        [--iterations 50] [--stage 1] [--smoke] [--device auto|cuda|cpu]

Default sizes take about a minute on an H200 (well under 4 minutes); --smoke (tiny sizes, CPU
threads 1 per process) takes about 10 s on a CPU. Needs only torch (no pynvml, no network).
Writes the JSON to --out and prints a table.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from prefill.decoder import InferenceConfig, InferenceGPT  # noqa: E402
from testbed.emulation.results import write_json  # noqa: E402
from testbed.host.gpulock import GpuLock  # noqa: E402
from testbed.host.gpt import Block, GPTConfig  # noqa: E402
from testbed.rules.pipeline import compute_only as simulate  # noqa: E402
from testbed.rules.schedule import one_f_one_b_table  # noqa: E402

PHASES = ("train_alone", "bubbletea", "naive")
MIN_NOTICE_MS = 1.0   # docs/bubbletea/design.md: a notice only for a gap of >= 1 ms

FULL = dict(train_blocks=4, width=4096, heads=None, seq=2048, micro_batch=2,
            prefill_blocks=32, prefill_width=4096, prefill_heads=None, vocab=32000,
            prompt_tokens=512, stages=3, micro_batches=4, stage=1, gap_scale=1.0, guard_ms=2.0,
            iterations=50, warmup_iterations=3, calib_prefills=30, threads=0)
SMOKE = dict(train_blocks=2, width=128, heads=None, seq=128, micro_batch=2,
             prefill_blocks=2, prefill_width=128, prefill_heads=None, vocab=256,
             prompt_tokens=64, stages=3, micro_batches=4, stage=1, gap_scale=3.0, guard_ms=1.0,
             iterations=12, warmup_iterations=2, calib_prefills=15, threads=1)


def default_heads(width: int) -> int:
    return width // 128 if width >= 128 else max(1, width // 16)


# ---------------------------------------------------------------------------------------------
# both processes

def setup_torch(cfg: dict) -> tuple[torch.device, torch.dtype]:
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    if cfg["device"] == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0), torch.bfloat16
    return torch.device("cpu"), torch.float32


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def build(dev: torch.device, dtype: torch.dtype, make: Any) -> nn.Module:
    """make() constructed straight on the device in dtype (no float32 copy of 8B parameters)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            return make()
    finally:
        torch.set_default_dtype(old)


def sleep_until(t_ns: int) -> None:
    d = (t_ns - time.time_ns()) / 1e9
    if d > 0:
        time.sleep(d)


def guarded(who: str, res_q: Any, fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except BaseException:
        res_q.put((who, "error", traceback.format_exc()))
        raise


# ---------------------------------------------------------------------------------------------
# process A: one training stage

def training_proc(cfg: dict, cmd_q: Any, res_q: Any, bq: Any) -> None:
    guarded("A", res_q, _training, cfg, cmd_q, res_q, bq)


def _training(cfg: dict, cmd_q: Any, res_q: Any, bq: Any) -> None:
    dev, dtype = setup_torch(cfg)
    d, heads, seq, mbs = cfg["width"], cfg["heads"], cfg["seq"], cfg["micro_batch"]
    gcfg = GPTConfig(n_layer=cfg["train_blocks"], n_head=heads, n_embd=d, block_size=seq,
                     vocab_size=2)
    stage = build(dev, dtype, lambda: nn.Sequential(*[Block(gcfg)
                                                      for _ in range(cfg["train_blocks"])]))
    opt = torch.optim.AdamW(stage.parameters(), lr=1e-6)
    M = cfg["micro_batches"]
    # a middle stage: inputs are activations that need their gradient (sent upstream)
    xs = [torch.randn(mbs, seq, d, device=dev, dtype=dtype, requires_grad=True)
          for _ in range(M)]
    gs = [torch.randn(mbs, seq, d, device=dev, dtype=dtype) for _ in range(M)]
    outs: dict[int, torch.Tensor] = {}
    row = one_f_one_b_table(cfg["stages"], M)[cfg["stage"]] + ["OPT"]
    lock = GpuLock(cfg["lock_path"])

    def run_op(name: str) -> None:
        if name == "OPT":
            opt.step()
            opt.zero_grad(set_to_none=True)
            for x in xs:
                x.grad = None
        elif name[0] == "F":
            outs[int(name[1:])] = stage(xs[int(name[1:])])
        else:
            outs.pop(int(name[1:])).backward(gs[int(name[1:])])

    def timed_row() -> dict[str, float]:
        ms = {}
        for name in row:
            t0 = time.perf_counter()
            run_op(name)
            sync(dev)
            ms[name] = (time.perf_counter() - t0) * 1e3
        return ms

    n_params = sum(p.numel() for p in stage.parameters())
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    res_q.put(("A", "ready", {"row": row, "params": n_params, "device": name}))
    while True:
        cmd = cmd_q.get()
        if cmd[0] == "exit":
            break
        if cmd[0] == "calibrate":
            with lock:
                for _ in range(3):
                    timed_row()
                rows = [timed_row() for _ in range(cfg["calib_rounds"])]
            f = [r[n] for r in rows for n in row if n[0] == "F"]
            b = [r[n] for r in rows for n in row if n[0] == "B"]
            o = [r["OPT"] for r in rows]
            res_q.put(("A", "calib", {"f_ms": statistics.median(f),
                                      "b_ms": statistics.median(b),
                                      "opt_ms": statistics.median(o)}))
        elif cmd[0] == "phase":
            _, pattern, iterations, notify = cmd
            iter_start, ops = [], []
            for it in range(iterations):
                iter_start.append(time.time_ns())
                for k, (name, gap_ms) in enumerate(pattern):
                    t_req = time.time_ns()
                    wait_ns = lock.acquire()
                    t0 = time.time_ns()
                    run_op(name)
                    sync(dev)
                    t1 = time.time_ns()
                    lock.release()
                    ops.append((it, k, name, t_req, t0, t1, wait_ns))
                    if gap_ms > 0:
                        t_pred_end = t1 + int(gap_ms * 1e6)
                        if notify and gap_ms >= MIN_NOTICE_MS:
                            bq.put(("notice", t1, t_pred_end, it, k))
                        sleep_until(t_pred_end)
            iter_start.append(time.time_ns())
            res_q.put(("A", "phase_done", {"iter_start": iter_start, "ops": ops}))
    lock.close()


# ---------------------------------------------------------------------------------------------
# process B: the prefill server

def prefill_proc(cfg: dict, bq: Any, res_q: Any) -> None:
    guarded("B", res_q, _prefill, cfg, bq, res_q)


def _prefill(cfg: dict, bq: Any, res_q: Any) -> None:
    dev, dtype = setup_torch(cfg)
    T = cfg["prompt_tokens"]
    icfg = InferenceConfig(n_layer=cfg["prefill_blocks"], n_embd=cfg["prefill_width"],
                           n_head=cfg["prefill_heads"], vocab_size=cfg["vocab"], context=T)
    model = build(dev, dtype, lambda: InferenceGPT(icfg)).eval()
    prompt = torch.randint(cfg["vocab"], (1, T), device=dev)
    lock = GpuLock(cfg["lock_path"])

    def do_prefill() -> int:
        with torch.inference_mode():
            logits, kv = model(prompt)          # KV cache of every layer + logits
            token = int(logits[0, -1].argmax())  # the first token (a device sync)
        sync(dev)
        return token

    pred_ms = math.inf
    guard_ns = int(cfg["guard_ms"] * 1e6)
    n_params = sum(p.numel() for p in model.parameters())
    res_q.put(("B", "ready", {"params": n_params}))
    while True:
        cmd = bq.get()
        if cmd[0] == "exit":
            break
        if cmd[0] == "calibrate":
            for _ in range(3):
                do_prefill()
            ms = []
            for _ in range(cfg["calib_prefills"]):
                t0 = time.perf_counter()
                do_prefill()
                ms.append((time.perf_counter() - t0) * 1e3)
            pred_ms = statistics.median(ms)
            ms.sort()
            res_q.put(("B", "calib", {
                "median_ms": pred_ms, "p90_ms": ms[int(0.9 * (len(ms) - 1))],
                "cv": statistics.pstdev(ms) / statistics.mean(ms), "n": len(ms)}))
        elif cmd[0] == "serve":
            need_ns = int(pred_ms * 1e6) + guard_ns
            spans, stats = [], {"notices": 0, "none_fitted": 0, "busy": 0}
            res_q.put(("B", "serving", None))
            stop = False
            while not stop:
                msg = bq.get()
                if msg[0] == "stop_phase":
                    break
                if msg[0] != "notice":
                    continue
                while True:                     # only the newest bubble matters
                    try:
                        nxt = bq.get_nowait()
                    except queue.Empty:
                        break
                    if nxt[0] == "notice":
                        stats["notices"] += 1
                        msg = nxt
                    elif nxt[0] == "stop_phase":
                        stop = True
                        break
                stats["notices"] += 1
                _, t_idle, t_end, it, k = msg
                done = 0
                while time.time_ns() + need_ns <= t_end:
                    if not lock.try_acquire():   # training holds the GPU: never wait for it
                        stats["busy"] += 1
                        break
                    t0 = time.time_ns()
                    do_prefill()
                    t1 = time.time_ns()
                    lock.release()
                    spans.append((t0, t1, t_end, it, k))
                    done += 1
                if not done:
                    stats["none_fitted"] += 1
            res_q.put(("B", "phase_done", {"spans": spans, **stats}))
        elif cmd[0] == "naive":
            spans, started = [], False
            while True:
                try:
                    msg = bq.get_nowait()
                except queue.Empty:
                    msg = None
                if msg is not None and msg[0] == "stop_phase":
                    break
                t0 = time.time_ns()
                do_prefill()                     # no lock: the driver time-slices the GPU
                t1 = time.time_ns()
                spans.append((t0, t1, None, None, None))
                if not started:
                    res_q.put(("B", "naive_started", None))
                    started = True
            res_q.put(("B", "phase_done", {"spans": spans}))
    lock.close()


# ---------------------------------------------------------------------------------------------
# main: orchestration, utilization sampling, analysis

class Inbox:
    """Messages from both processes; wait() for one kind, keeping the others."""

    def __init__(self, q: Any, procs: list, deadline: float) -> None:
        self.q, self.procs, self.deadline, self.kept = q, procs, deadline, []

    def wait(self, who: str, kind: str) -> Any:
        while True:
            for i, (w, k, payload) in enumerate(self.kept):
                if w == who and k == kind:
                    del self.kept[i]
                    return payload
            if time.monotonic() > self.deadline:
                raise TimeoutError(f"no {kind!r} from {who} before the timeout")
            try:
                w, k, payload = self.q.get(timeout=0.5)
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"process(es) {dead} ended while waiting for {kind!r}")
                continue
            if k == "error":
                raise RuntimeError(f"process {w} failed:\n{payload}")
            self.kept.append((w, k, payload))


class UtilSampler:
    """GPU utilization (% of time a kernel ran, NVML) every `period` s, in a thread."""

    def __init__(self, enabled: bool, period: float = 0.05) -> None:
        self.period, self.samples, self.source = period, [], None
        self._stop = threading.Event()
        self._read = self._open() if enabled else None
        self._thread: threading.Thread | None = None

    def _open(self) -> Any:
        idx = 0
        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if vis.isdigit():
            idx = int(vis)
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")

            class Util(ctypes.Structure):
                _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]
            if lib.nvmlInit_v2() != 0:
                raise OSError("nvmlInit failed")
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(idx), ctypes.byref(handle)) != 0:
                raise OSError("no NVML handle")
            util = Util()

            def read() -> float | None:
                if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) != 0:
                    return None
                return float(util.gpu)
            if read() is None:
                raise OSError("no utilization")
            self.source = "nvml (libnvidia-ml via ctypes)"
            return read
        except (OSError, AttributeError):
            pass
        try:
            torch.cuda.utilization(0)
            self.source = "torch.cuda.utilization"
            return lambda: float(torch.cuda.utilization(0))
        except Exception:
            return None

    def start(self) -> None:
        if self._read is None:
            return

        def loop() -> None:
            while not self._stop.is_set():
                v = self._read()
                if v is not None:
                    self.samples.append((time.time_ns(), v))
                self._stop.wait(self.period)
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self, t0: int, t1: int) -> tuple[float | None, int]:
        vals = [v for t, v in self.samples if t0 <= t <= t1]
        return (statistics.mean(vals) / 100 if vals else None), len(vals)


def make_pattern(cfg: dict, cal: dict) -> tuple[list[tuple[str, float]], dict]:
    """The stage's row with the idle gap after each op (ms): the simulated 1F1B timeline of all
    stages with the measured F, B, OPT times; the last gap wraps to the next iteration's first op
    (period = the iteration window)."""
    P, M, s = cfg["stages"], cfg["micro_batches"], cfg["stage"]
    sim = simulate(one_f_one_b_table(P, M), cal["f_ms"], cal["b_ms"], opt_ms=cal["opt_ms"])
    ops = [o for o in sim.ops if o.stage == s]
    gaps = [ops[i + 1].start_ms - ops[i].end_ms for i in range(len(ops) - 1)]
    gaps.append(sim.window_ms + ops[0].start_ms - ops[-1].end_ms)
    pattern = [(o.action, round(max(0.0, g) * cfg["gap_scale"], 3)) for o, g in zip(ops, gaps)]
    info = {"schedule": "1f1b", "stages": P, "micro_batches": M, "stage": s,
            "row": [o.action for o in ops], "f_ms": cal["f_ms"], "b_ms": cal["b_ms"],
            "opt_ms": cal["opt_ms"], "gap_scale": cfg["gap_scale"],
            "pattern": [{"op": n, "gap_after_ms": g} for n, g in pattern],
            "bubble_ms_per_iteration": round(sum(g for _, g in pattern), 3),
            "simulated_iteration_ms": sim.window_ms, "simulated_bubble_fraction": sim.bubble[s]}
    return pattern, info


def union_ns(spans: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def count_overlaps(prefills: list[tuple[int, int]], train: list[tuple[int, int]]) -> int:
    train = sorted(train)
    n = 0
    for p0, p1 in prefills:
        if any(min(p1, t1) - max(p0, t0) > 0 for t0, t1 in train if t0 < p1 and t1 > p0):
            n += 1
    return n


def analyze(a: dict, b: dict | None, cfg: dict, sampler: UtilSampler) -> dict:
    w = cfg["warmup_iterations"]
    starts = a["iter_start"]
    w0, w1 = starts[w], starts[-1]
    wall_ns = w1 - w0
    iters = [(starts[i + 1] - starts[i]) / 1e6 for i in range(w, len(starts) - 1)]
    ops = [o for o in a["ops"] if o[0] >= w]
    n_it = len(iters)
    train = [(o[4], o[5]) for o in ops]
    train_ns = sum(t1 - t0 for t0, t1 in train)
    by_kind: dict[str, list[float]] = {"F": [], "B": [], "OPT": []}
    for o in ops:
        by_kind["OPT" if o[2] == "OPT" else o[2][0]].append((o[5] - o[4]) / 1e6)
    waits = [o[6] for o in ops]
    prefills, overruns = [], 0
    b = b or {}
    for s in b.get("spans", []):
        p0, p1 = max(s[0], w0), min(s[1], w1)
        if p1 > p0:
            prefills.append((p0, p1))
            if s[2] is not None and s[1] > s[2]:
                overruns += 1
    prefill_ns = sum(p1 - p0 for p0, p1 in prefills)
    util_sampled, n_samples = sampler.mean(w0, w1)
    bubble_ms = sum(g for _, g in cfg["_pattern"]) * n_it
    out = {
        "iterations": n_it,
        "iteration_ms_mean": statistics.mean(iters),
        "iteration_ms_median": statistics.median(iters),
        "iteration_ms_max": max(iters),
        "train_compute_ms_per_iteration": train_ns / 1e6 / n_it,
        "op_ms_median": {k: statistics.median(v) for k, v in by_kind.items() if v},
        "lock_wait_ms_per_iteration": sum(waits) / 1e6 / n_it,
        "ops_that_waited": sum(1 for x in waits if x > 100_000),
        "wall_s": wall_ns / 1e9,
        "util_span": union_ns(train + prefills) / wall_ns,
        "util_span_sum": (train_ns + prefill_ns) / wall_ns,
        "train_busy_fraction": train_ns / wall_ns,
        "prefill_busy_fraction": prefill_ns / wall_ns,
        "util_sampled": util_sampled,
        "util_samples": n_samples,
        "prefills": len(prefills),
        "prefills_per_s": len(prefills) / (wall_ns / 1e9),
        "prefill_tokens_per_s": len(prefills) * cfg["prompt_tokens"] / (wall_ns / 1e9),
        "prefill_ms_median": (statistics.median([(p1 - p0) / 1e6 for p0, p1 in prefills])
                              if prefills else None),
        "overlaps": count_overlaps(prefills, train),
    }
    if "notices" in b:
        out.update(bubble_fill=prefill_ns / 1e6 / bubble_ms if bubble_ms else None,
                   overruns=overruns, notices=b["notices"], none_fitted=b["none_fitted"],
                   try_acquire_busy=b["busy"])
    return out


def resolve(args: argparse.Namespace) -> dict:
    base = SMOKE if args.smoke else FULL
    cfg = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in base.items()}
    want = args.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    cfg["device"] = want
    cfg["heads"] = cfg["heads"] or default_heads(cfg["width"])
    cfg["prefill_heads"] = cfg["prefill_heads"] or default_heads(cfg["prefill_width"])
    cfg["calib_rounds"] = 5 if args.smoke else 10
    if not 0 <= cfg["stage"] < cfg["stages"]:
        raise SystemExit(f"--stage {cfg['stage']}: not in [0, {cfg['stages']})")
    if cfg["iterations"] <= cfg["warmup_iterations"]:
        raise SystemExit("--iterations must be above --warmup-iterations")
    return cfg


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(REPO / "results" / "bubbletea_gpu.json"))
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, ~10 s on a CPU")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ints = ("train_blocks", "width", "heads", "seq", "micro_batch", "prefill_blocks",
            "prefill_width", "prefill_heads", "vocab", "prompt_tokens", "stages",
            "micro_batches", "stage", "iterations", "warmup_iterations", "calib_prefills",
            "threads")
    for k in FULL:
        ap.add_argument("--" + k.replace("_", "-"), type=int if k in ints else float,
                        default=None, help=f"default {FULL[k]} ({SMOKE[k]} with --smoke)")
    return ap.parse_args(argv)


def fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v * 100:.1f}%" if pct else f"{v:.1f}"


def print_table(result: dict) -> None:
    ph = result["phases"]
    pipe, cal = result["pipeline"], result["prefill_calibration"]
    print(f"\ndevice {result['device']} ({result['dtype']}), torch {result['torch']}; "
          f"stage {pipe['stage']} of 1F1B P={pipe['stages']} M={pipe['micro_batches']}, "
          f"F {pipe['f_ms']:.2f} ms, B {pipe['b_ms']:.2f} ms, OPT {pipe['opt_ms']:.2f} ms, "
          f"bubble {pipe['bubble_ms_per_iteration']:.1f} ms/iteration; prefill "
          f"{cal['prompt_tokens']} tokens {cal['median_ms']:.2f} ms (median) + guard "
          f"{cal['guard_ms']} ms")
    cols = ("phase", "iter ms", "slowdown", "compute ms", "op slowdn", "wait ms/it",
            "util span", "util nvml", "prefill/s", "tokens/s", "overlaps")
    print("  ".join(f"{c:>11}" for c in cols))
    for name in PHASES:
        p = ph[name]
        row = (name, fmt(p["iteration_ms_mean"]), fmt(p["slowdown"], True),
               fmt(p["train_compute_ms_per_iteration"]), fmt(p["compute_slowdown"], True),
               f"{p['lock_wait_ms_per_iteration']:.2f}", fmt(p["util_span"], True),
               fmt(p["util_sampled"], True), fmt(p["prefills_per_s"]),
               fmt(p["prefill_tokens_per_s"]), str(p["overlaps"]))
        print("  ".join(f"{c:>11}" for c in row))
    bt = ph["bubbletea"]
    print(f"bubbletea: bubble fill {fmt(bt.get('bubble_fill'), True)}, overruns "
          f"{bt.get('overruns')}, notices {bt.get('notices')} (none fitted "
          f"{bt.get('none_fitted')}); sampled utilization: {result['util_source'] or 'none'}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = resolve(args)
    t_begin = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="bubbletea-gpu-")
    cfg["lock_path"] = str(Path(tmp) / "gpu.lock")
    ctx = mp.get_context("spawn")
    cmd_a, bq, res = ctx.Queue(), ctx.Queue(), ctx.Queue()
    pa = ctx.Process(target=training_proc, args=(cfg, cmd_a, res, bq), name="A-training",
                     daemon=True)
    pb = ctx.Process(target=prefill_proc, args=(cfg, bq, res), name="B-prefill", daemon=True)
    sampler = UtilSampler(enabled=cfg["device"] == "cuda")
    procs = [pa, pb]
    try:
        for p in procs:
            p.start()
        inbox = Inbox(res, procs, time.monotonic() + args.timeout_s)
        a_info, b_info = inbox.wait("A", "ready"), inbox.wait("B", "ready")
        print(f"built: stage {a_info['params'] / 1e6:.1f} M params, prefill model "
              f"{b_info['params'] / 1e6:.1f} M params ({time.monotonic() - t_begin:.1f} s)",
              flush=True)
        cmd_a.put(("calibrate",))
        a_cal = inbox.wait("A", "calib")
        bq.put(("calibrate",))
        b_cal = inbox.wait("B", "calib")
        pattern, pipe = make_pattern(cfg, a_cal)
        cfg["_pattern"] = pattern
        print(f"calibrated: F {a_cal['f_ms']:.2f} ms, B {a_cal['b_ms']:.2f} ms, OPT "
              f"{a_cal['opt_ms']:.2f} ms, prefill {b_cal['median_ms']:.2f} ms; gaps "
              f"{[g for _, g in pattern]} ms", flush=True)
        sampler.start()
        runs: dict[str, tuple[dict, dict | None]] = {}
        it = cfg["iterations"]

        cmd_a.put(("phase", pattern, it, False))
        runs["train_alone"] = (inbox.wait("A", "phase_done"), None)
        print("phase 1 (train alone) done", flush=True)

        bq.put(("serve",))
        inbox.wait("B", "serving")
        cmd_a.put(("phase", pattern, it, True))
        a2 = inbox.wait("A", "phase_done")
        bq.put(("stop_phase",))
        runs["bubbletea"] = (a2, inbox.wait("B", "phase_done"))
        print("phase 2 (bubbletea) done", flush=True)

        bq.put(("naive",))
        inbox.wait("B", "naive_started")
        cmd_a.put(("phase", pattern, it, False))
        a3 = inbox.wait("A", "phase_done")
        bq.put(("stop_phase",))
        runs["naive"] = (a3, inbox.wait("B", "phase_done"))
        print("phase 3 (naive colocation) done", flush=True)
        sampler.stop()
        cmd_a.put(("exit",))
        bq.put(("exit",))
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)

    phases = {name: analyze(a, b, cfg, sampler) for name, (a, b) in runs.items()}
    base = phases["train_alone"]
    for p in phases.values():
        p["slowdown"] = p["iteration_ms_mean"] / base["iteration_ms_mean"] - 1
        p["slowdown_median"] = p["iteration_ms_median"] / base["iteration_ms_median"] - 1
        p["compute_slowdown"] = (p["train_compute_ms_per_iteration"]
                                 / base["train_compute_ms_per_iteration"] - 1)
    cuda = cfg["device"] == "cuda"
    sizes = {k: cfg[k] for k in FULL if k not in ("iterations", "warmup_iterations")}
    result = {
        "device": a_info["device"],
        "torch": torch.__version__, "cuda": cuda,
        "dtype": "bfloat16" if cuda else "float32", "smoke": args.smoke,
        "sizes": sizes,
        "iterations": cfg["iterations"], "warmup_iterations": cfg["warmup_iterations"],
        "train_stage_params": a_info["params"], "prefill_model_params": b_info["params"],
        "pipeline": pipe,
        "prefill_calibration": {"prompt_tokens": cfg["prompt_tokens"], **b_cal,
                                "guard_ms": cfg["guard_ms"]},
        "util_source": sampler.source,
        "phases": phases,
        "summary": {
            "bubbletea_slowdown": phases["bubbletea"]["slowdown"],
            "bubbletea_util_span": phases["bubbletea"]["util_span"],
            "bubbletea_util_sampled": phases["bubbletea"]["util_sampled"],
            "train_alone_util_span": base["util_span"],
            "train_alone_util_sampled": base["util_sampled"],
            "bubbletea_overlaps": phases["bubbletea"]["overlaps"],
            "bubbletea_prefills_per_s": phases["bubbletea"]["prefills_per_s"],
            "naive_slowdown": phases["naive"]["slowdown"],
            "naive_compute_slowdown": phases["naive"]["compute_slowdown"],
            "naive_util_span": phases["naive"]["util_span"],
            "naive_prefills_per_s": phases["naive"]["prefills_per_s"],
        },
        "runtime_s": time.monotonic() - t_begin,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(Path(args.out), result)
    print_table(result)
    print(f"runtime {result['runtime_s']:.1f} s; results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
