"""BubbleTea in the model: a run's prefill requests admitted into the simulated bubbles by the
controller's own rule. Pure: no kernel, no root, no torch.

One job: from testbed.rules.pipeline's simulated ops of a `+bubbletea` system, play the prefill side as
a run does, and read its figures with testbed.rules.bubbletea_figures.bubbletea_metrics (the code a run's
figures come from). Each part is the run's own code or rule:
- bubbles: at the end of each compute op a worker announces the gap before its next op as
  testbed.rules.bubbles.BubblePredictor predicts it (the minimum of its last iterations' gaps; none
  while it has too little history, none under MIN_NOTICE_MS, none for the gap that holds the
  all-reduce unless fill_allreduce: BubblePredictor.announced_ns, as the workers announce).
  Admission fits prefills before that predicted end; nothing new starts once the next op wants
  the GPU (its "busy" notice), and a prefill still running then makes that op wait for the GPU
  (a GPU_WAIT span, as the worker's lock records it);
- the load: testbed.features.bubbletea.run.make_requests (the same requests, split over the DCs the same
  way), each DC's replay starting at its first bubble notice (prefill/controller.py);
- admission: testbed.rules.admission.choose at every pick (the host's chunked request first, then a
  whole request, then a first chunk); expiry at the TTFT deadline (Admission.expire);
- a prefill holds the GPU for exactly its profile time (profile mode: what the server holds);
- controller latency, measured on this emulation (medians over docs/bubbletea/runs' records of
  the x5-x80 sweep, in real time): DISPATCH_MS from a bubble's start to its first prefill
  (notice, pick, message), BETWEEN_MS between two prefills of one bubble (pipelined dispatch).
  A host whose bubble nothing fits picks again at the next arrival.
- training's slowdown (`training_slowdown`): the simulator (testbed.rules.pipeline) runs the
  training again with each op that waited for the GPU that much later (op_extra_ms), and the
  slowdown is its mean iteration wall over BubbleTea's window against the run without prefill
  (testbed.run.jobs' definition). The model's gaps repeat exactly from iteration 1, so its learned
  predictions are never too long and no prefill overruns: it predicts no slowdown where the
  emulation's gaps do not vary. `training_slowdown_h200` adds what a real H200 adds and the
  emulation (whose ops are sleeps of profile time) does not: a training op that takes the GPU
  right after a prefill runs AFTER_PREFILL_MS longer (docs/bubbletea/gpu-h200: training's own
  compute grew 0.9-4.6 ms per iteration with prefills in its 2-3 filled bubbles, no overlap);
- KV transfers (testbed.rules.kvcache): every request's KV message, the emulation's byte count, to
  its DC's decode servers in the controller's round robin, over the prefill host's link and the
  decode host's link at the DC's rate, fair-shared, one connection per (prefill host, decode
  server) in order; `kv_transfer_ms` as a run measures it, and the links' busy shares (`kv`).
  Nothing of it crosses the WAN. It does not delay training's messages in the model (they share
  the prefill host's link only while a KV message is on it; the `kv` block says how often).
Not modelled: the prefill side's own CPU, the server's cutting of a late chunk, the decode
servers' compute, the emulation's varying gaps (its overruns come from them).
Folded replicas (testbed.predict.predict, above its FOLD_ABOVE_REPLICAS): one simulated GPU stands for
its alike ones and gets their share of the load, a fraction `share` = simulated / real GPUs
(thin_load: a Poisson load at share x its rate; a replayed trace keeps every request whose
running share crosses a whole number, so its bursts keep their timing). Its figures count as many
times as the GPUs it stands for, and rates and counts are divided by `share` (unthin). Pooling
across the GPUs a simulated one stands for is lost: each sees only its share of the queue.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

from testbed.rules.admission import Admission, Pending, choose, chunk_hold_ns, make_pending
from testbed.rules.bubbletea_figures import bubbletea_metrics, measured_window
from testbed.rules.kvcache import WIRE_PER_PAYLOAD, KvSend, kv_message_bytes, kv_transfers
from testbed.rules.prefill_profile import PrefillProfile
from testbed.rules.bubbles import BubblePredictor
from testbed.rules.spans import COMPUTE_SPANS
from testbed.spec.timescale import TimeScale

if TYPE_CHECKING:
    from testbed.spec.bubbletea import BubbleTeaConfig

DISPATCH_MS = 0.5     # a bubble's start to its first prefill's start (measured median 0.4-0.6)
BETWEEN_MS = 0.35     # one prefill's end to the next one's start in a bubble (0.29-0.40)
NS_PER_MS = 1_000_000
# A training op that takes the GPU right after a prefill, on an H200 (docs/bubbletea/gpu-h200,
# bench/bench_gpu_bubbletea.py; F 10 ms, B 22 ms ops): training's compute grew 3.04 / 4.59 /
# 0.92 / 1.44 ms per iteration in the 512 / 256 / 256 (guard 4 ms) / 128-token runs, whose
# prefills went into 2 / 3 / 2 / 3 of the stage's three bubbles: 1.52 / 1.53 / 0.46 / 0.48 ms
# per op after a prefill (more where the guard left less time between the two). Their mean:
AFTER_PREFILL_MS = 1.0


@dataclass(slots=True)
class _Bubble:
    host: str
    dc: str
    t_idle_ns: int
    end_ns: int                  # the announced (predicted) end: admission fits before it
    op_ns: int                   # the next op wants the GPU: nothing new starts from then
    reason: str = "no_request"
    used: bool = False


def announced_bubbles(spans: Sequence[dict], rows: Sequence[Sequence[str]], dp: bool,
                      fill_allreduce: bool) -> dict[str, list[tuple[int, int, int]]]:
    """Per host: (t_idle_ns, announced end ns, the next op's start ns) of every bubble its
    worker announces (module docstring)."""
    by_host: dict[str, list[dict]] = {}
    for s in spans:
        if s["name"] in COMPUTE_SPANS:
            by_host.setdefault(s["host"], []).append(s)
    out: dict[str, list[tuple[int, int]]] = {}
    for host, ops in by_host.items():
        ops.sort(key=lambda o: o["t_start_ns"])
        row = list(rows[ops[0]["stage"]])
        k_of = {a: k for k, a in enumerate(row)}
        pred = BubblePredictor(row)
        got = out.setdefault(host, [])
        for prev, op in zip(ops, ops[1:]):
            k = len(row) if op["name"] == "OPT" else k_of[f"{op['name']}{op['microbatch']}"]
            gap = op["t_start_ns"] - prev["t_end_ns"]
            guess = pred.announced_ns(k, dp=dp, fill_allreduce=fill_allreduce)
            if guess is not None:
                got.append((prev["t_end_ns"], prev["t_end_ns"] + guess, op["t_start_ns"]))
            pred.observe(op["iteration"], k, gap)
    return out


def fill(bubbles: dict[str, list[tuple[int, ...]]], host_dc: dict[str, str],
         per_dc: dict[str, list[dict]], cfg: "BubbleTeaConfig", profile: PrefillProfile,
         end_ns: int) -> list[dict]:
    """Play every DC's controller over the announced bubbles ((t_idle, end) or (t_idle, end,
    next op's start) each) until end_ns; its records (PREFILL, REQUEST, BUBBLE as
    docs/bubbletea/design.md names them)."""
    records: list[dict] = []
    heap: list[tuple[int, int, str, Any]] = []
    seq = 0

    def push(t: int, kind: str, data: Any) -> None:
        nonlocal seq
        heapq.heappush(heap, (t, seq, kind, data))
        seq += 1

    for host, bs in bubbles.items():
        for a, b, *op in bs:
            push(a, "open", _Bubble(host, host_dc[host], a, b, op[0] if op else b))
    t0: dict[str, int] = {}          # each DC's replay starts with its first notice
    for host, bs in bubbles.items():
        if bs:
            dc = host_dc[host]
            t0[dc] = min(t0.get(dc, bs[0][0]), bs[0][0])
    queues = {dc: Admission() for dc in per_dc}
    arrivals: dict[str, list[Pending]] = {}
    for dc, reqs in per_dc.items():
        if dc not in t0:
            continue
        arrivals[dc] = [make_pending(id=q["id"], seq=i, t_arrival_ns=t0[dc] + round(
            q["arrival_s"] * 1e9), target_tokens=q["target_tokens"],
            output_tokens=q["output_tokens"], deadline_ms=cfg.ttft_deadline_ms,
            predict_ms=profile.prefill_ms, guard_ms=cfg.guard_for_ms, time_scale=TimeScale(),
            truncated_from=q.get("truncated_from")) for i, q in enumerate(reqs)]
    nxt = {dc: 0 for dc in arrivals}
    partial: dict[str, Pending | None] = {h: None for h in bubbles}
    chunking = cfg.chunked_prefill

    def chunk_ns(done: int, end: int) -> tuple[int, int]:
        return chunk_hold_ns(profile, cfg, done, end, time_scale=TimeScale())

    def request(r: Pending, outcome: str, **extra: Any) -> None:
        records.append({"name": "REQUEST", "id": r.id, "t_arrival_ns": r.t_arrival_ns,
                        "deadline_ns": r.deadline_ns, "target_tokens": r.target_tokens,
                        "outcome": outcome, **extra})

    def arrive(dc: str, now: int) -> None:
        got = arrivals[dc]
        while nxt[dc] < len(got) and got[nxt[dc]].t_arrival_ns <= now:
            queues[dc].arrive(got[nxt[dc]])
            nxt[dc] += 1
        for r in queues[dc].expire(now):
            request(r, "expired")

    def close(b: _Bubble) -> None:
        records.append({"name": "BUBBLE", "host": b.host, "t_idle_ns": b.t_idle_ns,
                        "end": "used" if b.reason == "fit" else b.reason})

    while heap:
        now, _, kind, b = heapq.heappop(heap)
        if now >= end_ns or b.dc not in arrivals:
            continue
        if kind == "open":
            push(now + round(DISPATCH_MS * NS_PER_MS), "pick", b)
            continue
        if now >= min(b.end_ns, b.op_ns):
            close(b)
            continue
        arrive(b.dc, now)
        c = choose(queues[b.dc], partial[b.host], now, b.end_ns, chunk_ns,
                   profile.min_chunk_tokens, chunking)
        b.reason = c.reason
        r = c.request
        if r is None:
            got = arrivals[b.dc]
            later = got[nxt[b.dc]].t_arrival_ns if nxt[b.dc] < len(got) else None
            if later is not None and later + DISPATCH_MS * NS_PER_MS < min(b.end_ns, b.op_ns):
                push(later + round(DISPATCH_MS * NS_PER_MS), "pick", b)
            else:
                close(b)
            continue
        hold = r.predicted_ns if c.chunk is None else chunk_ns(*c.chunk)[0]
        start, end = now, now + hold
        start_tok, end_tok = c.chunk if c.chunk is not None else (0, r.target_tokens)
        final = end_tok == r.target_tokens
        records.append({"name": "PREFILL", "id": r.id, "host": b.host, "dc": b.dc,
                        "t_start_ns": start,
                        "t_end_ns": end, "target_tokens": r.target_tokens,
                        "chunk_start": start_tok, "chunk_end": end_tok, "final": final})
        if c.chunk is not None:
            if c.first_chunk:
                partial[b.host] = r
                r.t_first_start_ns = start
            r.chunks += 1
            r.done_tokens = end_tok
        if final:
            partial[b.host] = None
            request(r, "served" if end <= r.deadline_ns else "late",
                    t_prefill_start_ns=r.t_first_start_ns or start, t_first_token_ns=end,
                    host=b.host, chunks=r.chunks)
        push(end + round(BETWEEN_MS * NS_PER_MS), "pick", b)
    for dc, q in queues.items():
        for r in q.drain():
            request(r, "unserved")
    for r in partial.values():
        if r is not None:
            request(r, "unserved")
    return records


@dataclass(frozen=True, kw_only=True, slots=True)
class KvLinks:
    """Where a run's KV messages go: each DC's decode hosts and host-link rate (Mbit/s, None:
    unshaped), and the scenario's scale (it divides the padded bytes)."""
    decode: dict[str, list[str]]
    rate_mbit: dict[str, float | None]
    scale: float


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingCost:
    """What the prefills cost training ops, per (host, iteration, action "F0" | "B3" | "OPT"):
    ms waited for the GPU behind a prefill that overran, and the ops that took the GPU right
    after a prefill."""
    waits_ms: dict[tuple[str, int, str], float]
    after_prefill: frozenset[tuple[str, int, str]]


def _action(span: dict) -> str:
    return "OPT" if span["name"] == "OPT" else f"{span['name']}{span['microbatch']}"


def training_cost(spans: Sequence[dict], records: Sequence[dict]) -> tuple[TrainingCost,
                                                                          list[dict]]:
    """(the prefills' cost to training, GPU_WAIT spans as the workers record them): each
    prefill's next training op on its GPU waits for it if it is still running then."""
    ops: dict[str, list[dict]] = {}
    for sp in spans:
        if sp["name"] in COMPUTE_SPANS:
            ops.setdefault(sp["host"], []).append(sp)
    starts = {}
    for host, got in ops.items():
        got.sort(key=lambda o: o["t_start_ns"])
        starts[host] = [o["t_start_ns"] for o in got]
    waits: dict[tuple[str, int, str], float] = {}
    after: set[tuple[str, int, str]] = set()
    wait_spans: dict[tuple[str, int, str], dict] = {}
    for r in records:
        if r["name"] != "PREFILL" or r["host"] not in ops:
            continue
        i = bisect.bisect_left(starts[r["host"]], r["t_start_ns"])
        if i == len(starts[r["host"]]):
            continue
        op = ops[r["host"]][i]
        key = (r["host"], op["iteration"], _action(op))
        after.add(key)
        late = r["t_end_ns"] - op["t_start_ns"]
        if late > 0 and late / NS_PER_MS > waits.get(key, 0.0):
            waits[key] = late / NS_PER_MS
            wait_spans[key] = {"name": "GPU_WAIT", "host": r["host"], "stage": op["stage"],
                               "replica": op["replica"], "iteration": op["iteration"],
                               "op": _action(op), "t_start_ns": op["t_start_ns"],
                               "t_end_ns": r["t_end_ns"]}
    return (TrainingCost(waits_ms=waits, after_prefill=frozenset(after)),
            list(wait_spans.values()))


def kv_sends(records: Sequence[dict], cfg: "BubbleTeaConfig", profile: PrefillProfile,
             kv: KvLinks) -> list[dict]:
    """KV_SEND records (prefill/kv.py's, timed by testbed.rules.kvcache) of every
    request whose last prefill ended: its decode server is the controller's round robin over the
    DC's decode servers, one per dispatched message (a chunk's too)."""
    turn: Counter[str] = Counter()
    sends: list[tuple[dict, KvSend]] = []
    for r in sorted((r for r in records if r["name"] == "PREFILL"),
                    key=lambda r: r["t_start_ns"]):
        hosts = kv.decode[r["dc"]]
        dst = hosts[turn[r["dc"]] % len(hosts)]
        turn[r["dc"]] += 1
        if r["final"]:
            sends.append((r, KvSend(t_ready_ns=r["t_end_ns"], src=r["host"], dst=dst,
                                    bytes=kv_message_bytes(profile, cfg.model,
                                                           r["target_tokens"], cfg.kv_fraction,
                                                           kv.scale))))
    rate = {h: kv.rate_mbit[dc] for dc, hs in kv.decode.items() for h in hs}
    rate.update({r["host"]: kv.rate_mbit[r["dc"]] for r, _ in sends})
    kv_transfers([k for _, k in sends], rate)
    return [{"name": "KV_SEND", "id": r["id"], "host": k.src, "decode_host": k.dst,
             "t_enqueue_ns": k.t_ready_ns, "t_start_ns": k.t_start_ns, "t_end_ns": k.t_end_ns,
             "bytes": k.bytes, "error": None} for r, k in sends]


def kv_figures(kv_records: Sequence[dict], kv: KvLinks, host_dc: dict[str, str], lo: int,
               hi: int) -> dict[str, Any]:
    """The KV messages that began in BubbleTea's window [lo, hi) ns: bytes/s, and the busiest
    prefill host's and decode host's link, as a share of its time (wire bytes at its rate)."""
    win = [r for r in kv_records if lo <= r["t_start_ns"] < hi]
    window_s = (hi - lo) / 1e9
    up: Counter[str] = Counter()
    down: Counter[str] = Counter()
    for r in win:
        up[r["host"]] += r["bytes"]
        down[r["decode_host"]] += r["bytes"]
    dc_of = {h: dc for dc, hs in kv.decode.items() for h in hs} | host_dc

    def busy(by_host: Counter[str]) -> float | None:
        shares = [b * WIRE_PER_PAYLOAD * 8 / (kv.rate_mbit[dc_of[h]] * 1e6 * window_s)
                  for h, b in by_host.items() if kv.rate_mbit[dc_of[h]] is not None]
        return max(shares, default=None)

    return {"messages": len(win), "bytes_per_s": sum(up.values()) / window_s,
            "prefill_link_busy_max": busy(up), "decode_link_busy_max": busy(down),
            "decode_hosts": sum(len(hs) for hs in kv.decode.values())}


def predict_bubbletea(spans: Sequence[dict], host_dc: dict[str, str],
                      rows: Sequence[Sequence[str]], dp: bool, cfg: "BubbleTeaConfig",
                      load: dict[str, Any], tp: int = 1, kv: KvLinks | None = None
                      ) -> tuple[dict[str, Any], TrainingCost]:
    """(BubbleTea's figures, testbed.rules.bubbletea_figures' block, for the simulated training
    `spans`, one host per GPU (or per tensor-parallel group of tp), under `load`
    (testbed.features.bubbletea.run.make_requests), with the KV transfers where `kv` says; what
    the prefills cost training ops)."""
    profile = PrefillProfile.load(cfg.profile, tp)
    bubbles = announced_bubbles(spans, rows, dp, cfg.fill_allreduce)
    end_ns = max(s["t_end_ns"] for s in spans)
    records = fill(bubbles, host_dc, load["per_dc"], cfg, profile, end_ns)
    cost, waits = training_cost(spans, records)
    kv_records = kv_sends(records, cfg, profile, kv) if kv is not None else []
    m = bubbletea_metrics([*spans, *waits], records + kv_records, time_scale=TimeScale(),
                          load={k: v for k, v in load.items() if k != "per_dc"})
    if kv is not None:
        lo, hi, _, _ = measured_window(spans)
        m["kv"] = kv_figures(kv_records, kv, host_dc, lo, hi)
    return m, cost


def thin_load(cfg: "BubbleTeaConfig", compute: str, host_dc: dict[str, str],
              gpus: dict[str, int]) -> tuple[dict[str, Any], float]:
    """(testbed.features.bubbletea.run.make_requests' load for the simulated hosts, share = simulated /
    real GPUs) (module docstring)."""
    from testbed.features.bubbletea.plan import make_requests
    simulated = Counter(host_dc.values())
    share = sum(simulated.values()) / sum(gpus.values())
    gen = cfg
    if share < 1 and cfg.load.kind == "poisson":
        gen = replace(cfg, load=replace(cfg.load, poisson_per_s=cfg.load.poisson_per_s * share))
    load = make_requests(gen, compute, {dc: simulated[dc] for dc in gpus if simulated[dc]})
    if share < 1:
        if cfg.load.kind == "poisson":
            load["offered_per_s"] /= share
        else:
            for dc, reqs in load["per_dc"].items():
                kept, credit = [], 0.0
                for q in reqs:
                    credit += share
                    if credit >= 1.0:
                        credit -= 1.0
                        kept.append(q)
                load["per_dc"][dc] = kept
    return load, share


def unthin(m: dict[str, Any], weight: dict[str, int], share: float) -> dict[str, Any]:
    """testbed.rules.bubbletea_figures' figures of the simulated hosts as those of every GPU (module
    docstring): means weighted by the GPUs each host stands for, rates and counts / share."""
    hosts = m["per_host"]
    w = [weight[h["host"]] for h in hosts]

    def mean(key: str, stage: int | None = None) -> float:
        pairs = [(x, h[key]) for x, h in zip(w, hosts) if stage is None or h["stage"] == stage]
        return sum(x * v for x, v in pairs) / sum(x for x, _ in pairs)

    out = dict(m, gpu_utilization=mean("gpu_utilization"), training_only=mean("training"),
               prefill_share=mean("prefill"),
               per_stage=[dict(st, gpu_utilization=mean("gpu_utilization", st["stage"]),
                               training_only=mean("training", st["stage"]))
                          for st in m["per_stage"]],
               simulated={"gpus": sum(w), "hosts": len(hosts), "load_share": share})
    if share < 1:
        pf = dict(m["prefill"])
        for key in ("requests_per_s", "prompt_tokens_per_s"):
            pf[key] /= share
        for key in ("prefills", "in_window", "deadline_misses", "decoded"):
            pf[key] = round(pf[key] / share)
        pf["outcomes"] = {k: round(v / share) for k, v in pf["outcomes"].items()}
        out["prefill"] = pf
        if "kv" in m:
            out["kv"] = dict(m["kv"], messages=round(m["kv"]["messages"] / share),
                             bytes_per_s=m["kv"]["bytes_per_s"] / share)
    return out
