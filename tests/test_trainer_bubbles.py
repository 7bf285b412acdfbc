"""BubbleTea's training side: the bubble predictor, the GPU lock around F/B/OPT, bubble notices.

- BubblePredictor: min of the last 3 iterations' gaps per op index, OPT after the row, wrap to
  op 0 of the next iteration, no prediction without history;
- a loopback profile-mode run (P=2, GPipe) whose hosts share their GPU: each worker announces
  its bubbles by UDP to a socket of this test and logs them as IDLE spans; a "hog" that takes
  one host's GPU lock at each of its notices and keeps it 30 ms past the predicted end (a prefill
  that overruns) makes that worker wait (GPU_WAIT), and never computes at the same time as it;
- the arrival bounds (trainer/worker.py): each notice names the message its op awaits, with
  its wire time while it has not begun (then one arrival notice at its first byte) or first byte
  + wire time once it has, and between hosts of one DC the maker's output notices at the start
  of the op making each message; all checked against the run's spans;
- every compute span's late_ns (the worker's start latency) is how long after the op was ready
  (its input's last byte in, the previous op or all-reduce over) the worker got to it;
- every datagram parses as the notice kind it says (testbed/host/notices.py: the one definition
  the worker sends and the controller reads);
- without the GpuShareExtras the run has no lock, no notices, no new spans.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from testbed.emulation.procs import LocalSpawner
from testbed.rules.bubbles import MIN_NOTICE_MS, BubblePredictor
from testbed.spec.training import TrainConfig
from testbed.host.spans import read_jsonl
from testbed.rules.spans import COMPUTE_SPANS
from testbed.host.gpulock import GpuLock
from testbed.host.extras import GpuShareExtras, Inbound, NoticeAddress
from testbed.host.notices import (ArrivalNotice, BubbleNotice, BusyNotice, OutputNotice,
                                parse_notice)
from testbed.plans.workers import WorkerSlot
from testbed.plans.workers import HostInfo, WorkerSetup, plan_workers
from testbed.run.launch import TrainRun, launch
from testbed.emulation.procs import free_base_port
from testbed.rules.schedule import schedule_table
from trainer.worker import wire_ns

MODEL = {"n_layer": 2, "n_embd": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64}
HOSTS = [HostInfo(name="dc0h0", ip="127.0.0.1", dc="dc0"),
         HostInfo(name="dc1h1", ip="127.0.0.1", dc="dc1")]
HOG_HOST = "dc0h0"          # stage 0: its bubble before B0 is ~F + B of stage 1 (~68 ms)
HOG_OVERRUN_MS = 30.0


# -- predictor ------------------------------------------------------------------------------
def check_start_latency(spans: list[dict], exact: bool) -> int:
    """Every op of iterations >= 1 was ready at max(the previous compute op's or all-reduce's
    end on its host, its input's last byte); the worker got to it late_ns later: exactly at its
    span's start without a GPU lock (exact), at or before it with one (taking the lock takes a
    moment, a prefill may hold it). Returns how many ops were late by > 0.1 ms."""
    recv = {(r["host"], r["name"][-1], r["iteration"], r["microbatch"]): r["t_arrived_ns"]
            for r in spans if r["name"] in ("RECV_F", "RECV_B")}
    late = 0
    for host in sorted({r["host"] for r in spans}):
        ops = sorted((r for r in spans if r["host"] == host
                      and r["name"] in (*COMPUTE_SPANS, "ALLREDUCE")),
                     key=lambda r: r["t_start_ns"])
        for prev, r in zip(ops, ops[1:]):
            if r["name"] == "ALLREDUCE" or r["iteration"] == 0:
                continue
            arrived = recv.get((host, r["name"], r["iteration"], r["microbatch"]))
            ready = max(prev["t_end_ns"], arrived or 0)
            assert r["late_ns"] >= 0, r
            if exact:
                assert r["t_start_ns"] - r["late_ns"] == ready, (r, prev, arrived)
            else:
                assert ready <= r["t_start_ns"] - r["late_ns"] <= r["t_start_ns"], (r, prev)
            late += r["late_ns"] > 100_000
    return late



@pytest.mark.unit
def test_predictor_is_min_of_last_three_iterations():
    p = BubblePredictor(["F0", "F1", "B0", "B1"], history=3)
    assert p.ops == ["F0", "F1", "B0", "B1", "OPT"] and p.n_ops == 5
    for it, gap in enumerate([5_000_000, 9_000_000, 7_000_000, 8_000_000]):
        p.observe(it, 2, gap)
    assert p.predict_ns(2) == 7_000_000            # iterations 1..3: 9, 7, 8 ms (0 is warm-up)
    p.observe(4, 2, 1_000_000)
    assert p.predict_ns(2) == 1_000_000
    p.observe(4, 2, 3_000_000)                     # same iteration again: replaces
    assert p.predict_ns(2) == 3_000_000
    assert BubblePredictor(["F0"], history=1).history == 1
    with pytest.raises(ValueError):
        BubblePredictor(["F0"], history=0)


@pytest.mark.unit
def test_predictor_none_without_history():
    p = BubblePredictor(["F0", "B0"])
    assert all(p.predict_ns(k) is None for k in range(3))
    p.observe(0, 1, 40_000_000)                    # warm-up iteration: not learned from
    assert p.predict_ns(1) is None
    p.observe(1, 1, 2_000_000)
    assert p.predict_ns(1) is None                 # one iteration is not enough (MIN_HISTORY)
    p.observe(2, 1, 3_000_000)
    assert p.predict_ns(1) == 2_000_000 and p.predict_ns(0) is None and p.predict_ns(2) is None
    p.observe(1, 0, -5)                            # clock noise: never a negative gap
    p.observe(2, 0, 1_000_000)
    assert p.predict_ns(0) == 0
    with pytest.raises(IndexError):
        p.predict_ns(3)
    with pytest.raises(IndexError):
        p.observe(0, -1, 1)


@pytest.mark.unit
def test_predictor_next_op_reaches_opt_then_wraps():
    p = BubblePredictor(["F0", "F1", "B0", "B1"])
    assert p.next_op(3, 0) == (3, 1)
    assert p.next_op(3, 3) == (3, 4) and p.ops[4] == "OPT"
    assert p.next_op(3, 4) == (4, 0)
    p.observe(2, 4, 4_000_000)                     # the gap before OPT (e.g. the all-reduce)
    p.observe(3, 4, 5_000_000)
    assert p.predict_ns(4) == 4_000_000
    with pytest.raises(IndexError):
        p.next_op(3, 5)
    assert MIN_NOTICE_MS == 1.0


# -- runs ------------------------------------------------------------------------------------

def profile_cfg(iterations: int = 6) -> TrainConfig:
    # as test_profile_gpipe_bubble_matches_formula: per stage F 21.6 ms, B 46.0 ms
    return TrainConfig.from_dict({
        "model": MODEL, "stages": 2, "replicas": 1, "micro_batches": 4, "micro_batch_size": 2,
        "schedule": "gpipe", "iterations": iterations, "compute": "profile",
        "profile": {"file": "h200-transformer.json", "width": 4096, "seq": 2048,
                    "micro_batch": 1, "n_layer": 32}})


class Controller:
    """A UDP socket standing in for the DC controller: records every notice; at each notice from
    HOG_HOST (when `hog` is set) it takes that host's GPU lock if free, like a prefill server, and
    holds it until HOG_OVERRUN_MS past the predicted end of the bubble."""

    def __init__(self, hog: GpuLock | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.hog = hog
        self.notices: list[dict] = []
        self.parsed: list = []
        self.busy: list[dict] = []
        self.bounds: list[dict] = []
        self.hogged: list[tuple[int, int]] = []      # (acquired ns, released ns)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                if self._stop.is_set():     # stopped, and every datagram sent is read
                    return
                continue
            notice = json.loads(data)
            typed = parse_notice(notice)     # as the controller reads it: the kind it says
            assert type(typed) is KINDS[notice["kind"]], notice
            self.parsed.append(typed)
            if isinstance(typed, BusyNotice):    # training took the GPU again
                self.busy.append(notice)
                continue
            if not isinstance(typed, BubbleNotice):   # an arrival or output notice (bounds)
                self.bounds.append(notice)
                continue
            self.notices.append(notice)
            if self.hog is not None and notice["host"] == HOG_HOST and self.hog.try_acquire():
                t_acq = time.time_ns()
                until_ns = notice["t_pred_end_ns"] + int(HOG_OVERRUN_MS * 1e6)
                time.sleep(max(0.0, (until_ns - time.time_ns()) / 1e9))
                t_rel = time.time_ns()
                self.hog.release()
                self.hogged.append((t_acq, t_rel))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


KINDS = {"bubble": BubbleNotice, "busy": BusyNotice, "arrival": ArrivalNotice,
         "output": OutputNotice}


class Share:
    """BubbleTea's part of each worker's spec, as testbed.features.bubbletea.run's handle gives
    it: the host's lock, the controller's address and, with rate_mbit, the arrival bound's
    Inbound of each neighbour (the lowest rate on the way: here one for every pair)."""

    def __init__(self, lock_path: dict[str, Path], port: int, rate_mbit: float | None) -> None:
        self.lock_path, self.port, self.rate_mbit = lock_path, port, rate_mbit

    def worker_extras(self, slot: WorkerSlot) -> GpuShareExtras:
        inbound = {key: Inbound(rate_mbit=self.rate_mbit, bytes=nb.message_bytes,
                                hold_ms=nb.make_hold_ms, same_dc=nb.dc == slot.dc)
                   for key, nb in (("prev", slot.prev), ("next", slot.next))
                   if nb is not None and self.rate_mbit is not None}
        return GpuShareExtras(lock_path=str(self.lock_path[slot.host]),
                              notify=NoticeAddress(ip="127.0.0.1", port=self.port),
                              inbound_prev=inbound.get("prev"), inbound_next=inbound.get("next"))


def run(tmp_path: Path, share: bool, hog: bool = False, hosts: list[HostInfo] = HOSTS,
        rate_mbit: float | None = None) -> tuple[TrainRun, Controller]:
    lock_path = {h.name: tmp_path / "gpu" / f"{h.name}.lock" for h in hosts}
    controller = Controller(GpuLock(lock_path[HOG_HOST]) if hog else None)
    spawner = LocalSpawner()
    try:
        result = launch(profile_cfg(), hosts, tmp_path / "run", spawner,
                        WorkerSetup(scale=100, base_port=free_base_port(4)),
                        [Share(lock_path, controller.port, rate_mbit)] if share else [],
                        timeout_s=60)
    finally:
        spawner.stop_all()
        controller.close()
        if controller.hog is not None:
            controller.hog.close()
    return result, controller


def op_label(r: dict) -> str:
    return "OPT" if r["name"] == "OPT" else f"{r['name']}{r['microbatch']}"


def last_spreads(recv: dict, r: dict, t_ns: int) -> set[int | None]:
    """The longest first-to-last-byte time of the last 8 messages of r's kind its host took
    before t_ns (iteration 0 left out), or None: both readings of "took" (its RECV span ended,
    or its last byte was in), as the worker counts a message in between the two."""
    out: set[int | None] = set()
    for key in ("t_end_ns", "t_arrived_ns"):
        before = sorted((x for x in recv.values() if x["host"] == r["host"]
                         and x["name"] == r["name"] and x["iteration"] > 0
                         and x[key] < t_ns), key=lambda x: x["t_end_ns"])
        spreads = [x["t_arrived_ns"] - x["t_first_ns"] for x in before][-8:]
        out.add(max(spreads) if spreads else None)
    return out


def check_bounds(result: TrainRun, controller: Controller, rate_mbit: float,
                 same_dc: bool) -> None:
    """The arrival-bound fields of every notice (trainer/worker.py) against the run's spans."""
    cfg = profile_cfg()
    spans = read_jsonl(result.spans_path)
    rows = schedule_table(cfg.schedule, cfg.stages, cfg.micro_batches)
    recv = {(r["host"], r["name"][-1], r["iteration"], r["microbatch"]): r for r in spans
            if r["name"] in ("RECV_F", "RECV_B")}
    starts = {(r["host"], r["name"], r["iteration"], r["microbatch"]): r["t_start_ns"]
              for r in spans if r["name"] in ("F", "B")}
    specs = {s.host: s for s in result.specs}
    pending = {}
    for n in controller.notices:
        op = [*rows[specs[n["host"]].stage], "OPT"][n["op"]]
        waits = op != "OPT" and ((op[0] == "F" and specs[n["host"]].stage == 1)
                                 or (op[0] == "B" and specs[n["host"]].stage == 0))
        assert ("awaits" in n) == waits, n
        if not waits:
            continue
        code = 1 if op[0] == "F" else 2
        assert n["awaits"] == [code, n["iteration"], int(op[1:])], n
        extras = specs[n["host"]].extra(GpuShareExtras)
        inbound = extras.inbound_prev if code == 1 else extras.inbound_next
        assert inbound.rate_mbit == rate_mbit and inbound.same_dc == same_dc
        r = recv[(n["host"], op[0], n["iteration"], int(op[1:]))]
        # a message already in when the op before ended: that op starts at once, no notice
        assert r["t_arrived_ns"] >= n["t_idle_ns"], (n, r)
        wire = wire_ns(r["bytes"], rate_mbit)
        if n.get("pending"):          # not begun when the notice went: its first byte after
            assert n["wire_ns"] == wire, (n, r)
            assert ("made_ns" in n) == ("maker" in n) == same_dc
            if same_dc:
                assert n["made_ns"] == int(inbound.hold_ms * 1e6) > 0
                maker = [s for s in result.specs if s.host != n["host"]][0]
                assert n["maker"] == [maker.host, n["iteration"],
                                      rows[maker.stage].index(op)], n
                assert n.get("spread_ns") in last_spreads(recv, r, n["t_idle_ns"]), n
            pending[(n["host"], n["t_idle_ns"])] = r
        elif "end_min_ns" in n:       # begun: first byte + wire time
            assert n["end_min_ns"] == r["t_first_ns"] + wire, (n, r)
    arrivals = [b for b in controller.bounds if b["kind"] == "arrival"]
    outputs = [b for b in controller.bounds if b["kind"] == "output"]
    assert len(arrivals) + len(outputs) == len(controller.bounds)
    # one arrival notice per pending bubble, at its message's first byte
    assert sorted((b["host"], b["t_idle_ns"]) for b in arrivals) == sorted(pending), arrivals
    for b in arrivals:
        r = pending[(b["host"], b["t_idle_ns"])]
        assert b["end_min_ns"] == r["t_first_ns"] + wire_ns(r["bytes"], rate_mbit)
        # its expected end: first byte + the longest first-to-last-byte time of the host's
        # last 8 messages of that kind taken before it (iteration 0 left out)
        assert b.get("end_max_ns") in {None if x is None else r["t_first_ns"] + x
                                       for x in last_spreads(recv, r, r["t_first_ns"])}, b
    if not same_dc:
        assert outputs == []          # another DC's controller would hear it a WAN delay late
        return
    # one output notice per message sent, at the start of the op making it + that op's hold
    sent = [r for r in spans if r["name"] in ("SEND_F", "SEND_B")]
    assert len(outputs) == len(sent) > 0
    for b in outputs:
        code, it, mb = b["awaits"]
        maker = [s for s in result.specs if s.host != b["host"]][0]
        name = "F" if code == 1 else "B"
        hold = maker.hold_forward_ms if code == 1 else maker.hold_backward_ms
        assert b["end_min_ns"] == starts[(maker.host, name, it, mb)] + int(hold * 1e6), b
        assert b["end_min_ns"] <= recv[(b["host"], name, it, mb)]["t_arrived_ns"]


@pytest.mark.loopback
def test_shared_gpu_notices_and_overrunning_prefill(tmp_path):
    cfg = profile_cfg()
    result, controller = run(tmp_path, share=True, hog=True, rate_mbit=50.0)
    spans = read_jsonl(result.spans_path)
    rows = schedule_table(cfg.schedule, cfg.stages, cfg.micro_batches)
    ops = {h.name: [*rows[s], "OPT"] for s, h in enumerate(HOSTS)}
    compute = [r for r in spans if r["name"] in COMPUTE_SPANS]
    ends = {(r["host"], r["t_end_ns"]) for r in compute}
    plan = json.loads(result.plan_path.read_text())
    shares = [next(e for e in w["extras"] if e["kind"] == "gpu_share") for w in plan["workers"]]
    assert [e["lock_path"] for e in shares] == \
        [str(tmp_path / "gpu" / f"{h.name}.lock") for h in HOSTS]
    assert all(e["notify"] == {"ip": "127.0.0.1", "port": controller.port,
                               "allreduce": False} for e in shares)

    # (a) notices: fields, sane values, one IDLE span each, starting where a compute op ended
    notices = controller.notices
    assert notices, "no bubble notices"
    starts = {(r["host"], r["t_start_ns"]) for r in compute}
    for n in controller.busy:                                    # one per compute op, at its start
        assert set(n) == {"kind", "host", "busy_ns", "seq"} and n["kind"] == "busy", n
        assert (n["host"], n["busy_ns"]) in starts, n
    for h in HOSTS:        # every datagram numbered, none lost on loopback (two DCs: each
        # host's datagrams are about itself; an output notice would name its neighbour)
        seqs = sorted(n["seq"] for n in controller.notices + controller.busy + controller.bounds
                      if n["host"] == h.name)
        assert seqs == list(range(len(seqs))), (h.name, seqs[:10])
    assert len(controller.busy) == len(compute)
    for n in notices:
        assert {"kind", "host", "t_idle_ns", "t_pred_end_ns", "iteration", "op", "gaps_ns",
                "seq"} \
            <= set(n) <= {"kind", "host", "t_idle_ns", "t_pred_end_ns", "iteration", "op",
                          "gaps_ns", "seq", "awaits",
                "pending", "wire_ns", "made_ns", "maker", "spread_ns", "end_min_ns",
                "end_max_ns"}, n
        gaps = n["gaps_ns"]                                      # learned gaps, ascending
        assert gaps == sorted(gaps) and n["t_pred_end_ns"] - n["t_idle_ns"] == gaps[0], n
        assert n["host"] in ops and 0 <= n["op"] < len(ops[n["host"]]), n
        assert 3 <= n["iteration"] < cfg.iterations, n           # 0: warm-up, 1-2: learning
        assert n["t_pred_end_ns"] - n["t_idle_ns"] >= MIN_NOTICE_MS * 1e6, n
        assert (n["host"], n["t_idle_ns"]) in ends, n            # the end of the op just done
    idle = [r for r in spans if r["name"] == "IDLE"]
    assert sorted((r["host"], r["t_start_ns"], r["t_end_ns"], r["iteration"], r["op"])
                  for r in idle) == \
        sorted((n["host"], n["t_idle_ns"], n["t_pred_end_ns"], n["iteration"], n["op"])
               for n in notices)
    for r in idle:
        op = ops[r["host"]][r["op"]]
        assert r["microbatch"] == (None if op == "OPT" else int(op[1:])), r
    announced = {(n["host"], ops[n["host"]][n["op"]]) for n in notices}
    # the two big GPipe bubbles: stage 0 before B0, stage 1 before F0 (~F + B of the other)
    assert {("dc0h0", "B0"), ("dc1h1", "F0")} <= announced, announced
    big = [n for n in notices if (n["host"], ops[n["host"]][n["op"]]) == ("dc0h0", "B0")]
    assert all(40 < (n["t_pred_end_ns"] - n["t_idle_ns"]) / 1e6 < 120 for n in big), big

    # (b) the hog overran: the hogged worker waited for the GPU, and never computed under it
    assert len(controller.hogged) >= 2, controller.hogged
    waits = [r for r in spans if r["name"] == "GPU_WAIT"]
    assert waits and {r["host"] for r in waits} == {HOG_HOST}, waits
    starts = {(r["host"], r["t_start_ns"]): r for r in compute}
    for w in waits:
        assert w["t_end_ns"] > w["t_start_ns"] and w["iteration"] >= 3, w
        op = starts[(w["host"], w["t_end_ns"])]                 # the op starts when it got it
        assert op_label(op) == ops[w["host"]][w["op"]] and op["iteration"] == w["iteration"]
        assert op["microbatch"] == w["microbatch"], (w, op)
    assert max(w["t_end_ns"] - w["t_start_ns"] for w in waits) > 0.5 * HOG_OVERRUN_MS * 1e6
    for r in compute:
        if r["host"] == HOG_HOST:
            for t0, t1 in controller.hogged:
                assert r["t_end_ns"] <= t0 or r["t_start_ns"] >= t1, (r, (t0, t1))

    # (c) the arrival bounds: every field as the spans say (hosts in two DCs: no output notice)
    check_bounds(result, controller, 50.0, same_dc=False)
    # (d) the workers' start latency
    assert check_start_latency(spans, exact=False) > 0

    # the timeline draws the waits and, given the hog's intervals as prefills, those too
    from testbed.analysis.timeline_plot import plot_timeline
    prefills = [{"name": "PREFILL", "host": HOG_HOST, "t_start_ns": t0, "t_end_ns": t1}
                for t0, t1 in controller.hogged]
    out = plot_timeline(result.spans_path, tmp_path / "tl.png", iteration=waits[0]["iteration"],
                        extra_spans=prefills)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.loopback
def test_output_notices_between_hosts_of_one_dc(tmp_path):
    """Both stages in one DC: the maker of each message tells the controller when the op making
    it started, and the waiting host's notices carry that op's hold (made_ns)."""
    hosts = [HostInfo(name=h.name, ip=h.ip, dc="dc0") for h in HOSTS]
    result, controller = run(tmp_path, share=True, hosts=hosts, rate_mbit=80.0)
    assert controller.notices and [n for n in controller.notices if n.get("pending")]
    check_bounds(result, controller, 80.0, same_dc=True)


@pytest.mark.loopback
def test_without_gpu_share_extras_nothing_changes(tmp_path):
    result, controller = run(tmp_path, share=False)
    spans = read_jsonl(result.spans_path)
    assert not [r for r in spans if r["name"] in ("GPU_WAIT", "IDLE")]
    assert controller.notices == []
    assert not (tmp_path / "gpu").exists()
    assert all(s.extra(GpuShareExtras) is None and s.extras == () for s in result.specs)
    plan = json.loads(result.plan_path.read_text())
    assert all(w["extras"] == [] for w in plan["workers"])
    assert sum(r["name"] == "F" for r in spans) == 6 * 4 * 2
    assert check_start_latency(spans, exact=True) > 0


@pytest.mark.unit
def test_plan_gives_each_worker_its_typed_extras(tmp_path):
    """A feature sees each worker as a WorkerSlot (its neighbours' message bytes and the holds
    of the ops making them, what BubbleTea's Inbound is made of) and gives it typed extras,
    checked where they are made."""
    cfg = profile_cfg()
    slots: list[WorkerSlot] = []

    class OnlyDc1:
        def worker_extras(self, slot: WorkerSlot) -> GpuShareExtras | None:
            slots.append(slot)
            return None if slot.host == "dc0h0" else GpuShareExtras(lock_path="/x/gpu/dc1h1.lock")

    specs = plan_workers(cfg, HOSTS, tmp_path, WorkerSetup(scale=100), [OnlyDc1()])
    assert [s.extra(GpuShareExtras) for s in specs] == \
        [None, GpuShareExtras(lock_path="/x/gpu/dc1h1.lock")]
    s0, s1 = slots
    assert (s0.prev, s0.next.host, s1.prev.host, s1.next) == (None, "dc1h1", "dc0h0", None)
    assert s1.prev.message_bytes == specs[0].pad_bytes > 0     # what stage 0 sends stage 1
    assert s1.prev.make_hold_ms == specs[0].hold_forward_ms > 0
    assert s0.next.make_hold_ms == specs[1].hold_backward_ms > 0
    with pytest.raises(ValueError, match="lock_path"):
        GpuShareExtras(lock_path="")
    with pytest.raises(TypeError):                      # an address needs its port
        NoticeAddress(ip="127.0.0.1")
    with pytest.raises(ValueError, match="notify"):     # a dict is not an address
        GpuShareExtras(lock_path="/x.lock", notify={"ip": "127.0.0.1", "port": 9})
    with pytest.raises(ValueError, match="kind twice"):
        plan_workers(cfg, HOSTS, tmp_path, WorkerSetup(scale=100), [OnlyDc1(), OnlyDc1()])
