"""One pipeline stage replica (one emulated host = one "GPU"): `python -m trainer.worker --spec F`.

One job: execute the schedule table for this stage, iteration after iteration, and record what
happened. The spec file (testbed/host/specfiles.py, written by testbed/run/launch.py) says which stage and
replica this is, where the neighbours listen and where the stage's data-parallel master is.

Per iteration: run this stage's row of the schedule (testbed/rules/schedule.py): F = receive the
activation (or make the tokens), run the stage, send the output; B = receive the gradient (or
start from the loss), backward, send the input's gradient. Then average gradients over the D
replicas (gloo) and step the optimizer. Every step is a span in this worker's JSONL file
(testbed/host/spans.py); the last stage also writes the loss per iteration.

compute=profile: each F/B still runs the real model, then sleeps until the profile's duration for
the target model has passed since it started, and messages are padded to the target's bytes.
Every F, B and OPT span records late_ns, the worker's start latency: how long after the op was
ready (its input's last byte in, the previous op or the all-reduce over) this process got to it
(its thread woke up, took the GIL back from the I/O threads after a send, ...). A GPU fed by a
launch queue loses none of that; testbed.rules.figures sums it beside the compute overruns.

Shared GPU (BubbleTea: the spec's GpuShareExtras, testbed/host/extras.py;
docs/bubbletea/design.md): the worker holds the host's GpuLock (testbed/host/gpulock.py) for each
F, B and OPT: it asks for the lock when the op's inputs are ready (t_want), computes once it has
it (the span starts there), and releases it when the hold ends, before sending the output
(network, not GPU); the all-reduce stays outside the lock. A wait for the lock (a prefill overran
its bubble) is a GPU_WAIT span {op, iteration, microbatch} from t_want to the acquisition. Every
op's idle gap (t_want minus the end of the previous compute op) feeds a BubblePredictor
(testbed/rules/bubbles.py). With the extras' notice address the worker tells the DC's controller
about its bubbles: the notices (bubble, busy, arrival, output), when each is sent and what it
carries are the protocol's, defined once in testbed/host/notices.py and built here as its types;
each announced bubble is also an IDLE span {op} with the next op's iteration and micro-batch
(and the notice's wire_ns, end_min_ns). The arrival bound's figures (how fast a message from a
neighbour can come at most) are the extras' Inbound. Without the extras none of this happens.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import socket
import sys
import threading
import time
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist

from testbed.host.extras import Gate, GateExtras, GpuShareExtras
from testbed.host.notices import (ArrivalNotice, BubbleNotice, BusyNotice, Notice, OutputNotice,
                                encode_notice)
from testbed.host.realtime import demote_on_rttime
from testbed.rules.bubbles import OPT, BubblePredictor
from testbed.spec.training import TrainConfig
from trainer.data import MarkovTokens, global_index
from trainer.dp import average_gradients, init_stage_group
from testbed.host.spans import SpanLog
from testbed.host.gpulock import GpuLock
from testbed.rules.stages import plan_stages
from testbed.rules.schedule import parse_action, schedule_table
from testbed.host.specfiles import Peer, WorkerSpec
from testbed.host.gpt import GPTConfig
from trainer.stage import StageModule, build_stage
from trainer.slotclient import SlotClient
from trainer.transport import (KIND_ACT, KIND_GRAD, Arrival, Channel, Expect, Expected,
                               Listener, SendRecord, connect)
from testbed.host.tcpcc import congestion_control_of


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr)
    # weight_decay=0 and foreach=False: the per-parameter update must not depend on how the
    # parameters are grouped, so a stage and a single process step identically.
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, foreach=False)


SPREAD_HISTORY = 8    # messages whose first-to-last-byte time gives an arrival's expected end


def wire_ns(n_bytes: int, rate_mbit: float) -> int:
    """The least time n_bytes take through a link of rate_mbit (ns)."""
    return int(n_bytes * 8 / (rate_mbit * 1e6) * 1e9)


def _hold(t_start_ns: int, hold_ms: float) -> None:
    """Sleep until hold_ms after t_start_ns (no-op if already past or hold_ms is 0)."""
    if hold_ms > 0:
        left_s = (t_start_ns + int(hold_ms * 1e6) - time.time_ns()) / 1e9
        if left_s > 0:
            time.sleep(left_s)


class StageWorker:
    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.cfg = TrainConfig.from_dict(spec.config)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.plan = plan_stages(self.cfg.model.n_layer, self.cfg.stages)[spec.stage]
        self.module: StageModule = build_stage(GPTConfig.of(self.cfg.model), self.plan,
                                               self.cfg.seed).to(self.device)
        self.params = list(self.module.parameters())
        self.opt = make_optimizer(self.cfg, self.params)
        self.data = MarkovTokens(self.cfg.model.vocab_size, self.cfg.seed)
        self.table_row = schedule_table(self.cfg.schedule, self.cfg.stages,
                                        self.cfg.micro_batches)[spec.stage]
        self.log = SpanLog(Path(spec.spans_path),
                           {"stage": spec.stage, "replica": spec.replica, "host": spec.host,
                            "dc": spec.dc})
        self.prev: Channel | None = None
        self.next: Channel | None = None
        self.dp = self.cfg.replicas > 1
        self.dp_realtime: str | None = None   # what gloo's threads got (init_stage_group)
        self.dp_groups = None                 # a hierarchical all-reduce's groups (dp.py)
        self._slot_clients: list[SlotClient] = []
        self.gates = spec.extra(GateExtras) or GateExtras()   # temporal sharing's
        # Shared GPU (BubbleTea): the host's lock, the bubble predictor, the notice socket.
        self.share = spec.extra(GpuShareExtras)
        self.gpu = GpuLock(self.share.lock_path) if self.share is not None else None
        self.bubbles = BubblePredictor(self.table_row)
        self._op_end_ns: int | None = None     # end of the last compute op (with self.gpu)
        self._free_ns: int | None = None       # end of the last compute op or all-reduce
        self._notify: socket.socket | None = None
        if self.share is not None and self.share.notify is not None:
            self._notify = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._notify.setblocking(False)
        # the message the announced bubble waits for, not yet begun: ((kind, it, mb), t_idle_ns,
        # rate_mbit); the notice and the reader thread's arrival notice take turns under the lock
        self._awaiting: tuple[tuple[int, int, int], int, float | None] | None = None
        self._await_lock = threading.Lock()
        self._seq = itertools.count()   # the notices' numbers (next() is atomic in CPython)
        # per kind: how long the last messages took from first byte to last (ns; iteration 0,
        # warm-up, left out): once a message has begun, its last byte is expected by then
        self._spreads: dict[int, deque[int]] = {KIND_ACT: deque(maxlen=SPREAD_HISTORY),
                                                KIND_GRAD: deque(maxlen=SPREAD_HISTORY)}
        # the schedule rows of the neighbours that make this worker's inputs (their op index
        # names the op making a message, for the notices' "maker")
        table = schedule_table(self.cfg.schedule, self.cfg.stages, self.cfg.micro_batches)
        self._maker_rows = {KIND_ACT: table[spec.stage - 1] if spec.stage > 0 else [],
                            KIND_GRAD: table[spec.stage + 1] if spec.stage + 1 < self.cfg.stages
                            else []}

    # -- lifecycle ------------------------------------------------------------------------
    def run(self) -> None:
        listener = None
        try:
            t0 = time.time_ns()
            if self.spec.stage > 0:
                listener = Listener(self.spec.ip, self.spec.listen_port,
                                    congestion_control=self.spec.congestion_control)
            if self.spec.next is not None:
                nxt = self.spec.next
                self.next = connect(nxt.ip, nxt.port, hello=self.spec.name, peer=nxt.name,
                                    timeout_s=self.spec.connect_timeout_s, bind_ip=self.spec.ip,
                                    on_sent=self._on_sent,
                                    congestion_control=self.spec.congestion_control,
                                    connections=self.spec.connections_next,
                                    gate=self._gate(self.gates.next),
                                    io_priority=self.spec.io_priority,
                                    expect=self._expect(KIND_GRAD, nxt))
            if listener is not None:
                assert self.spec.prev is not None
                self.prev = listener.accept(self.spec.prev.name, self.spec.connect_timeout_s,
                                            on_sent=self._on_sent,
                                            connections=self.spec.connections_prev,
                                            gate=self._gate(self.gates.prev),
                                            io_priority=self.spec.io_priority,
                                            expect=self._expect(KIND_ACT, self.spec.prev))
            if self.dp:
                self.dp_realtime, self.dp_groups = init_stage_group(
                    self.spec.ip, self.spec.dp_master_ip, self.spec.dp_master_port,
                    self.spec.replica, self.cfg.replicas, self.spec.connect_timeout_s,
                    io_priority=self.spec.io_priority, groups=self.spec.allreduce_groups,
                    connections=self.spec.allreduce_connections)
            if self._notify is not None:
                for ch in (self.prev, self.next):
                    if ch is not None:
                        ch.on_arrival = self._on_arrival
            # What the kernel runs on each stage-to-stage connection, read back (TCP_CONGESTION).
            in_use = {peer: congestion_control_of(ch.sock) for peer, ch in
                      (("next", self.next), ("prev", self.prev)) if ch is not None}
            io_rt = sorted({ch.io_realtime for ch in (self.next, self.prev) if ch is not None})
            self.log.span("SETUP", t0, time.time_ns(), None, device=str(self.device),
                          congestion_control=in_use, io_realtime=io_rt,
                          allreduce_realtime=self.dp_realtime)
            Path(self.spec.loss_path).parent.mkdir(parents=True, exist_ok=True)
            with open(self.spec.loss_path, "w") as loss_file:
                for it in range(self.cfg.iterations):
                    losses = self.iteration(it)
                    if self.plan.last:
                        loss_file.write(json.dumps({
                            "iteration": it, "stage": self.spec.stage,
                            "replica": self.spec.replica, "loss": sum(losses) / len(losses),
                            "microbatch_losses": losses, "t_end_ns": time.time_ns()}) + "\n")
                        loss_file.flush()
                    self.log.flush()
            for ch in (self.next, self.prev):
                if ch is not None:
                    ch.close(self.spec.recv_timeout_s)
        finally:
            for ch in (self.next, self.prev):
                if ch is not None:
                    for sock in ch.socks:
                        try:
                            sock.close()
                        except OSError:
                            pass
            if listener is not None:
                listener.close()
            for client in self._slot_clients:
                client.close()
            if dist.is_initialized():
                dist.destroy_process_group()
            if self.gpu is not None:
                self.gpu.close()
            if self._notify is not None:
                self._notify.close()
            self.log.close()

    def _expect(self, kind: int, peer: Peer) -> Expect:
        """What a channel takes from peer: `kind` only (activations from prev, their gradients
        from next), both of the stage boundary's hidden states (micro-batch, sequence, width) in
        float32, padded to the peer's pad_bytes, within this run's iterations and micro-batches."""
        model = self.cfg.model
        shape = (self.cfg.micro_batch_size, model.seq_len, model.n_embd)
        payload = math.prod(shape) * torch.float32.itemsize
        return Expect({kind: Expected(torch.float32, shape, max(payload, peer.pad_bytes))},
                      self.cfg.iterations, self.cfg.micro_batches)

    def _gate(self, where: Gate | None):
        """The WAN arbiter's gate for messages in one direction (temporal sharing), or None."""
        if where is None:
            return None
        client = SlotClient(where.ip, where.port, link=str(where.link),
                            pipeline=where.pipeline, timeout_s=self.spec.recv_timeout_s)
        self._slot_clients.append(client)
        return client.gate

    def _on_sent(self, rec: SendRecord) -> None:  # called from a sender thread
        self.log.span("SEND_F" if rec.kind == KIND_ACT else "SEND_B", rec.t_start_ns,
                      rec.t_end_ns, rec.iteration, rec.microbatch,
                      bytes=rec.payload_bytes + rec.pad_bytes, t_enqueue_ns=rec.t_enqueue_ns)

    def _recv(self, channel, kind: int, it: int, mb: int):
        """Wait for one message from a neighbour, recording the wait as RECV_F / RECV_B."""
        t = time.time_ns()
        got = channel.recv(kind, it, mb, self.spec.recv_timeout_s)
        if it > 0 and self._notify is not None:   # (what the notices need)
            with self._await_lock:
                self._spreads[kind].append(got.t_last_ns - got.t_first_ns)
        self.log.span("RECV_F" if kind == KIND_ACT else "RECV_B", t, time.time_ns(), it, mb,
                      bytes=got.payload_bytes + got.pad_bytes, t_arrived_ns=got.t_last_ns,
                      t_first_ns=got.t_first_ns)
        return got

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # -- the shared GPU (no-ops without the GpuShareExtras) ------------------------------
    def _gpu_acquire(self, it: int, mb: int | None, k: int,
                     t_input_ns: int | None = None) -> tuple[int, int]:
        """Op k wants the GPU now (its input, if any, last came in at t_input_ns): take the
        host's lock (recording the gap before op k and any wait as GPU_WAIT). Returns the compute
        start (time_ns) and the start latency (module docstring: late_ns)."""
        t_want = time.time_ns()
        ready = max((t for t in (self._free_ns, t_input_ns) if t is not None), default=t_want)
        late_ns = max(0, t_want - ready)
        if self.gpu is None:
            return t_want, late_ns
        if self._op_end_ns is not None:
            self.bubbles.observe(it, k, t_want - self._op_end_ns)
        waited_ns = self.gpu.acquire()
        t_got = time.time_ns()
        if self._notify is not None:
            self._send(BusyNotice(host=self.spec.host, busy_ns=t_got))   # the bubble is over
        if waited_ns > 0:
            self.log.span("GPU_WAIT", t_want, t_got, it, mb, op=k)
        return t_got, late_ns

    def _send(self, notice: Notice) -> None:
        """One datagram to the controller, numbered (testbed/host/notices.py)."""
        assert self._notify is not None and self.share is not None and \
            self.share.notify is not None
        try:
            self._notify.sendto(encode_notice(notice, next(self._seq)),
                                (self.share.notify.ip, self.share.notify.port))
        except OSError:
            pass                # a dead or unreachable controller never stops training

    def _compute_done(self, name: str, it: int, mb: int | None, k: int, t_start: int,
                      **extra: object) -> None:
        """Op k's hold is over: give the GPU back, log the op's span, announce the bubble
        before the next op."""
        t_end = time.time_ns()
        if self.gpu is not None:
            self.gpu.release()
        self._free_ns = t_end
        self.log.span(name, t_start, t_end, it, mb, **extra)
        if self.gpu is not None:
            self._op_end_ns = t_end
            self._announce(it, k, t_end)

    def _announce(self, it: int, k: int, t_idle_ns: int) -> None:
        """Tell the DC's controller how long the GPU will be free, if that is >= MIN_NOTICE_MS."""
        if self._notify is None or self.share is None or self.share.notify is None:
            return
        next_it, next_k = self.bubbles.next_op(it, k)
        if next_it >= self.cfg.iterations:
            return
        pred_ns = self.bubbles.announced_ns(next_k, dp=self.dp,
                                            fill_allreduce=self.share.notify.allreduce)
        if pred_ns is None:
            return
        t_pred_end_ns = t_idle_ns + pred_ns
        gaps = self.bubbles.history_ns(next_k)
        with self._await_lock:
            bound = self._arrival_bound(next_it, next_k, t_idle_ns)
            if bound is None:       # its input is already in: the op starts now, no bubble
                return
            notice = BubbleNotice(host=self.spec.host, t_idle_ns=t_idle_ns,
                                  t_pred_end_ns=t_pred_end_ns, iteration=next_it, op=next_k,
                                  gaps_ns=gaps, **bound)
            self._send(notice)
        op = self.bubbles.ops[next_k]
        self.log.span("IDLE", t_idle_ns, t_pred_end_ns, next_it,
                      None if op == OPT else parse_action(op)[1], op=next_k,
                      **{k: getattr(notice, k) for k in ("wire_ns", "end_min_ns")
                         if getattr(notice, k) is not None})

    def _arrival_bound(self, it: int, k: int, t_idle_ns: int) -> dict | None:
        """The bubble notice's arrival-bound fields for op k (testbed/host/notices.py), and what
        the reader thread is to watch for (under self._await_lock); None when the message op k
        awaits is already in (op k starts at once: there is no bubble to announce)."""
        self._awaiting = None
        op = self.bubbles.ops[k]
        if op == OPT:
            return {}
        kind, mb = parse_action(op)
        assert self.share is not None
        if kind == "F" and self.prev is not None:
            channel, code, inbound = self.prev, KIND_ACT, self.share.inbound_prev
        elif kind == "B" and self.next is not None:
            channel, code, inbound = self.next, KIND_GRAD, self.share.inbound_next
        else:
            return {}
        out: dict = {"awaits": (code, it, mb)}
        got = channel.arrival(code, it, mb)
        if got is not None and got.complete:
            return None
        if inbound is None:
            return out
        rate = inbound.rate_mbit
        if got is None:       # not begun: notices follow when it does (and when it is made)
            self._awaiting = ((code, it, mb), t_idle_ns, rate)
            out["pending"] = True
            if rate is not None:
                out["wire_ns"] = wire_ns(int(inbound.bytes), rate)
            if inbound.same_dc and inbound.hold_ms > 0:
                out["made_ns"] = int(inbound.hold_ms * 1e6)
                maker = self.spec.prev if code == KIND_ACT else self.spec.next
                row = self._maker_rows[code]
                out["maker"] = (maker.host, it, row.index(f"{kind}{mb}"))
                if self._spreads[code]:   # made, it is expected in within this
                    out["spread_ns"] = max(self._spreads[code])
        else:
            if rate is not None:
                out["end_min_ns"] = got.t_first_ns + wire_ns(got.total_bytes, rate)
            out.update(self._expected_end(code, got.t_first_ns))
        return out

    def _expected_end(self, code: int, t_first_ns: int) -> dict:
        """{"end_max_ns": first byte + the longest first-to-last-byte time of the last
        messages of this kind} (an estimate, not a bound), or {} without history."""
        spreads = self._spreads[code]
        return {"end_max_ns": t_first_ns + max(spreads)} if spreads else {}

    def _announce_output(self, code: int, it: int, mb: int, t_start_ns: int,
                         hold_ms: float) -> None:
        """This op's output goes to a neighbour whose bubbles the same controller fills: that
        neighbour's op awaiting it cannot start before this op's hold ends. (The controller of
        another DC would hear it one WAN delay late: not sent.)"""
        if self._notify is None or hold_ms <= 0:
            return
        to = self.spec.next if code == KIND_ACT else self.spec.prev
        if to is None or to.dc != self.spec.dc:
            return
        self._send(OutputNotice(host=to.host, awaits=(code, it, mb),
                                end_min_ns=t_start_ns + int(hold_ms * 1e6)))

    def _on_arrival(self, a: Arrival) -> None:   # a channel's reader thread
        with self._await_lock:
            w = self._awaiting
            if w is None or w[0] != (a.kind, a.iteration, a.microbatch):
                return
            self._awaiting = None
            self._send(ArrivalNotice(host=self.spec.host, t_idle_ns=w[1],
                                     end_min_ns=a.t_first_ns + (0 if w[2] is None
                                                                else wire_ns(a.total_bytes, w[2])),
                                     **self._expected_end(a.kind, a.t_first_ns)))

    # -- one iteration --------------------------------------------------------------------
    def iteration(self, it: int) -> list[float]:
        cfg, spec = self.cfg, self.spec
        saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}   # mb -> (input, output)
        losses: list[float] = []
        for k, action in enumerate(self.table_row):
            kind, mb = parse_action(action)
            if kind == "F":
                saved[mb] = self.forward(it, mb, losses, k)
            else:
                self.backward(it, mb, *saved.pop(mb), k)
        if self.dp:
            t = time.time_ns()
            n_bytes = average_gradients(self.params, cfg.replicas, spec.allreduce_pad_bytes,
                                        self.dp_groups)
            self._free_ns = time.time_ns()
            self.log.span("ALLREDUCE", t, self._free_ns, it, bytes=n_bytes)
        k_opt = len(self.table_row)
        t, late_ns = self._gpu_acquire(it, None, k_opt)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self._sync()
        t_compute = time.time_ns()
        _hold(t, spec.hold_opt_ms)     # profile mode: the target's estimated step
        self._compute_done("OPT", it, None, k_opt, t, compute_ns=t_compute - t,
                           late_ns=late_ns)
        return losses

    def forward(self, it: int, mb: int, losses: list[float],
                k: int) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, spec = self.cfg, self.spec
        index = global_index(spec.replica, cfg.micro_batches, mb)
        tokens, targets = self.data.micro_batch(it, index, cfg.micro_batch_size,
                                                cfg.model.seq_len)
        t_input = None
        if self.plan.first:
            inp = tokens.to(self.device)
        else:
            assert self.prev is not None
            got = self._recv(self.prev, KIND_ACT, it, mb)
            inp = got.tensor.to(self.device).requires_grad_(True)
            t_input = got.t_last_ns
        t_start, late_ns = self._gpu_acquire(it, mb, k, t_input)
        self._announce_output(KIND_ACT, it, mb, t_start, spec.hold_forward_ms)
        out = self.module(inp, targets.to(self.device) if self.plan.last else None)
        if self.plan.last:
            losses.append(out.item())    # .item() syncs the device
        self._sync()
        t_compute = time.time_ns()
        _hold(t_start, spec.hold_forward_ms)
        self._compute_done("F", it, mb, k, t_start, compute_ns=t_compute - t_start,
                           late_ns=late_ns)
        if not self.plan.last:
            assert self.next is not None
            self.next.send(KIND_ACT, it, mb, out.detach(), pad_to_bytes=spec.pad_bytes)
        return inp, out

    def backward(self, it: int, mb: int, inp: torch.Tensor, out: torch.Tensor, k: int) -> None:
        cfg, spec = self.cfg, self.spec
        if self.plan.last:
            t_start, late_ns = self._gpu_acquire(it, mb, k)
            self._announce_output(KIND_GRAD, it, mb, t_start, spec.hold_backward_ms)
            (out / cfg.micro_batches).backward()   # mean over this replica's M micro-batches
        else:
            assert self.next is not None
            got = self._recv(self.next, KIND_GRAD, it, mb)
            t_start, late_ns = self._gpu_acquire(it, mb, k, got.t_last_ns)
            self._announce_output(KIND_GRAD, it, mb, t_start, spec.hold_backward_ms)
            out.backward(got.tensor.to(self.device))
        self._sync()
        t_compute = time.time_ns()
        _hold(t_start, spec.hold_backward_ms)
        self._compute_done("B", it, mb, k, t_start, compute_ns=t_compute - t_start,
                           late_ns=late_ns)
        if not self.plan.first:
            assert self.prev is not None and inp.grad is not None
            self.prev.send(KIND_GRAD, it, mb, inp.grad, pad_to_bytes=spec.pad_bytes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="worker spec JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)        # many workers share few cores; one thread each
    # The receiver thread must get the GIL soon after a message lands, not after the default
    # 5 ms switch interval: that delay would sit on the pipeline's critical path at every hop.
    sys.setswitchinterval(0.0005)
    spec = WorkerSpec.load(args.spec)
    demote_on_rttime(f"worker {spec.name}")   # its channel and gloo threads run real-time
    print(f"worker {spec.name}: stage {spec.stage} replica {spec.replica} on {spec.host} "
          f"({spec.ip})", flush=True)
    worker = StageWorker(spec)
    print(f"worker {spec.name}: device {worker.device}, layers {list(worker.plan.layers)}",
          flush=True)
    worker.run()
    print(f"worker {spec.name}: done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
