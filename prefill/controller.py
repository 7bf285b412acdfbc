"""BubbleTea's controller for one DC: `python -m prefill.controller --spec FILE`.

One job: put the DC's prefill requests into its training hosts' bubbles. It replays the DC's
request load (testbed/features/bubbletea/load.py, written to a file by testbed.features.bubbletea.run)
and hears each training worker's notices (UDP; the protocol, its kinds and fields:
testbed/host/notices.py): a bubble (the GPU idle from t_idle until about t_pred_end, the worker's
own prediction learned from its last iterations, testbed/rules/bubbles.py), and "busy" when
training takes the GPU again. For every bubble it sends the host's prefill server the oldest
waiting request whose predicted time plus guard fits (testbed/rules/admission.py), then the next
one while the bubble lasts (with `pipeline`, sent behind the running one, picked for when that
one is predicted to end). A request waits for a later bubble on any host of the DC until its
time-to-first-token deadline passes (then it is expired and counted). A bubble that outlasts its
prediction (no busy notice 1 ms after the predicted end) is closed, or with extend_bubbles
extended to the next longer gap the worker saw before that op (the gaps are often bimodal: the
WAN slots' order shifts) and closed when none is left. The replay starts with the first notice,
i.e. once training runs. With chunked_prefill (profile mode), a rest no whole request fits may
take a chunk of one; that request then stays with its host, and its next chunks go first into
that host's bubbles (testbed/rules/admission.py), at most one such request per host.

Arrival bound (`arrival_bound`, on by default): a bubble that waits for a neighbour's message
lasts at least until that message's last byte is in. While the bubble notice said the message
was pending and no arrival notice has come since, the bubble counts as lasting until now +
wire_ns (+ made_ns until that neighbour's output notice comes) - margin: it rolls forward. The
arrival and the output notices (the latter kept until the bubble it belongs to is announced, at
most into the next iteration) each give an end_min_ns: the bubble lasts until the latest of
them - margin. While the maker (named in the notice) has not begun that op and sits in the
bubble before it, it begins no sooner than that bubble's own bound: bounds chain, one host back
(the maker's bound without its own maker's; learned predictions do not chain). Never less than
the learned prediction, except that once the message has begun, a prediction past its expected
end (end_max_ns; or, made by a host of this DC, the end of the op making it + spread_ns) is cut
to that: the message is nearly in, and a prefill admitted past it would make training wait (the
admission's guard is the slack). margin (`arrival_margin_ms`, wall clock) covers the notices'
latency, the reader thread's wait for the GIL before it reads the first byte's time, and bytes
that arrive together (HTB's bucket). Bubbles end later than the learned minimum whenever Atlas's
slots come in another order; this is how the controller uses that time. The bound holds as long
as no notice that would lower it is lost: the controller counts the numbers it never saw
(SUMMARY's notices_lost). The Bubble logic is testbed/host/notices.py.

Notices are refused (ignored, and counted as SUMMARY's notices_refused) unless they come from a
training host of this DC, parse (testbed/host/notices.py: types and ranges), name a host of this DC,
carry times within NOTICE_WINDOW_S (x time_scale) of now, and a number at most MAX_SEQ_JUMP past
their sender's last. Every thread runs guarded: one that dies says so on stderr and in a
THREAD_DIED record, its host's bubbles are marked host_down, and the controller exits 1.

Records (JSONL, docs/bubbletea/design.md): REQUEST per request (outcome served | late | expired
| failed | unserved), DISPATCH per message answered, BUBBLE per notice (what went in, and why
the rest stayed empty: no_request, none_fitted, rejected, host_down, used), SUMMARY at the end. SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.host.realtime import demote_on_rttime, set_fifo
from testbed.rules.admission import Admission, Pending, choose, chunk_hold_ns, make_pending
from testbed.host.notices import (MAX_NOTICE_BYTES, ArrivalNotice, Bubble, BusyNotice, Notice,
                                OutputNotice, parse_notice)
from testbed.spec.bubbletea import BubbleTeaConfig
from testbed.rules.prefill_profile import PrefillProfile
from testbed.host.records import RecordLog
from prefill.wire import recv_msg, send_msg
from testbed.host.specfiles import SpecFile
from testbed.spec.timescale import TimeScale

NOTICE_WINDOW_S = 600.0  # a notice's times within this of now, durations under it (x time_scale)
MAX_SEQ_JUMP = 100_000   # a notice numbered further past its sender's last one is refused
MAX_SENDERS = 1024       # notice senders whose numbers are kept
REPLY_MARGIN_S = 10.0    # a prefill server that has not answered prediction + this is down
INITIAL_LATENCY_MS = 1.0  # dispatch to prefill start, before one is measured (x time_scale)
EXTEND_MARGIN_MS = 1.0    # a bubble still open this long after its predicted end is extended
LATENCY_WEIGHT = 0.2      # of the newest sample in the moving average


@dataclass(frozen=True, kw_only=True, slots=True)
class Endpoint:
    host: str
    ip: str
    port: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ControllerSpec(SpecFile):
    dc: str
    host: str
    ip: str
    notice_port: int                 # UDP, bubble notices from the DC's training workers
    records_path: str
    requests_path: str               # JSON list of {id, arrival_s, target_tokens, output_tokens}
    prefill_servers: list[Endpoint]  # one per training host of the DC
    decode_servers: list[Endpoint]
    bubbletea: dict                  # BubbleTeaConfig.to_dict()
    compute: str = "profile"         # the training's: profile | measured
    time_scale: float = 1.0
    connect_timeout_s: float = 60.0
    notice_priority: int | None = None   # SCHED_FIFO of the notice thread (None: as the process)

    @classmethod
    def from_dict(cls, d: dict) -> "ControllerSpec":
        d = dict(d)
        d["prefill_servers"] = [Endpoint(**e) for e in d["prefill_servers"]]
        d["decode_servers"] = [Endpoint(**e) for e in d["decode_servers"]]
        return cls(**d)


def prompt_for(request_id: str, n_tokens: int, vocab_size: int) -> list[int]:
    """The request's prompt: made-up tokens, the same for the same id (the traces carry only
    lengths)."""
    rng = random.Random(request_id)
    return [rng.randrange(vocab_size) for _ in range(n_tokens)]


@dataclass(kw_only=True)
class Job:
    """One prefill message sent to a host's server, awaiting its reply."""
    bubble: Bubble
    request: Pending
    chunk: tuple[int, int] | None
    not_after_ns: int
    pick_at_ns: int
    bubble_end_ns: int
    decode: Endpoint
    predicted_ns: int          # this message's hold (the chunk's when a chunk), dilated
    guard_ns: int
    t_dispatch_ns: int = 0
    behind: bool = False      # sent behind another job (pipelined), picked for when it ends


class Controller:
    def __init__(self, spec: ControllerSpec) -> None:
        self.spec = spec
        self.cfg = BubbleTeaConfig.from_settings(spec.bubbletea)
        self.profile = PrefillProfile.load(self.cfg.profile)
        self.log = RecordLog(spec.records_path, {"dc": spec.dc})
        self.queue = Admission()
        self.cv = threading.Condition()
        self.stop = threading.Event()
        self.started = threading.Event()
        self.bubbles: dict[str, Bubble | None] = {e.host: None for e in spec.prefill_servers}
        self.counts = {k: 0 for k in ("arrived", "served", "late", "expired", "failed",
                                      "unserved", "retried", "notices", "notices_lost",
                                      "notices_refused")}
        self.ts = TimeScale(spec.time_scale)
        self.window_ns = int(self.ts.emulated_span(NOTICE_WINDOW_S) * 1e9)
        self.worker_ips = {e.ip for e in spec.prefill_servers}   # notices come from these
        self.died: list[str] = []        # threads of this controller that died (_guarded)
        self.dead_hosts: set[str] = set()   # hosts whose agent died: their bubbles stay empty
        self.last_seq: dict[object, int] = {}   # per sender: the highest number heard
        self.notice_realtime = "off"     # what the notice thread got (notice_priority)
        self._decode_rr = 0
        self.waiting = 0      # host agents waiting for an arrival inside an open bubble
        self.extend_margin_ns = int(self.ts.emulated_span(EXTEND_MARGIN_MS) * 1e6)
        self.arrival_margin_ns = int(self.cfg.arrival_margin_ms * 1e6)   # wall clock
        # per host: output notices that came before the bubble awaiting them, awaits -> end_min
        self.pending_bounds: dict[str, dict[tuple[int, int, int], int]] = {
            e.host: {} for e in spec.prefill_servers}
        # per host: dispatch-to-prefill-start latency (moving average), added to `now` when
        # picking, so that a request picked to fill the bubble still fits when it starts
        self.latency_ns = {e.host: int(self.ts.emulated_span(INITIAL_LATENCY_MS) * 1e6)
                           for e in spec.prefill_servers}
        self.requests = json.loads(Path(spec.requests_path).read_text())
        # chunked prefill: the request each host holds a prefix of (testbed/rules/admission.py)
        self.partial: dict[str, Pending | None] = {e.host: None for e in spec.prefill_servers}
        self.chunking = self.cfg.chunked_prefill and spec.compute == "profile"
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((spec.ip, spec.notice_port))
        self._sock.settimeout(0.2)

    # -- records ----------------------------------------------------------------------------
    def _request_record(self, r: Pending, outcome: str, **extra: Any) -> None:
        self.counts[outcome] += 1
        self.log.write("REQUEST", id=r.id, t_arrival_ns=r.t_arrival_ns,
                       deadline_ns=r.deadline_ns, target_tokens=r.target_tokens,
                       output_tokens=r.output_tokens, predicted_ms=r.predicted_ns / 1e6,
                       guard_ms=r.guard_ns / 1e6, attempts=r.attempts,
                       truncated_from=r.truncated_from, outcome=outcome, **extra)

    def _bubble_record(self, host: str, b: Bubble) -> None:
        self.log.write("BUBBLE", host=host, t_idle_ns=b.t_idle_ns,
                       t_pred_end_ns=b.t_pred_end_ns, iteration=b.iteration, op=b.op,
                       dispatched=b.dispatched, end=b.reason, extended=b.extended,
                       t_first_pred_end_ns=b.t_first_pred_end_ns, wire_ns=b.wire_ns,
                       made_ns=b.made_ns, end_min_ns=b.end_min_ns, end_max_ns=b.end_max_ns,
                       t_bound_end_ns=b.t_bound_end_ns or None,
                       t_cap_end_ns=b.t_cap_end_ns or None)

    def end_of(self, b: Bubble, now_ns: int) -> int:   # under self.cv
        """b's end as admission sees it now (with the arrival bound where it is on). While the
        message b awaits is not yet being made by a host of this DC that is itself in the
        bubble before the op making it, that op starts no sooner than that bubble's own bound
        (the bound chains; predictions do not)."""
        if not self.cfg.arrival_bound:
            return b.t_pred_end_ns
        maker_from = None
        if b.pending and not b.made and b.maker is not None:
            host, iteration, op = b.maker
            mb = self.bubbles.get(host)
            if mb is not None and not mb.closed and (mb.iteration, mb.op) == (iteration, op):
                maker_from = mb.bound_ns(now_ns, self.arrival_margin_ns)
        return b.end_ns(now_ns, self.arrival_margin_ns, maker_from)

    def _close(self, host: str, b: Bubble) -> None:   # under self.cv
        if self.bubbles[host] is b:
            self.bubbles[host] = None
        b.closed = True
        if not b.in_flight:
            self._bubble_record(host, b)

    def _expire(self, now_ns: int) -> None:   # under self.cv
        for r in self.queue.expire(now_ns):
            self._request_record(r, "expired")

    # -- threads ----------------------------------------------------------------------------
    def notices(self) -> None:
        if self.spec.notice_priority is not None:
            self.notice_realtime = set_fifo(self.spec.notice_priority)
        while not self.stop.is_set():
            try:
                data, sender = self._sock.recvfrom(MAX_NOTICE_BYTES)
            except socket.timeout:
                continue
            except OSError:
                continue
            n, seq = self._parse(data, sender)
            if n is None:
                with self.cv:
                    self.counts["notices_refused"] += 1
                continue
            with self.cv:
                if seq is not None and not self._count_lost(sender, seq):
                    self.counts["notices_refused"] += 1
                    continue
                self._on_notice(n)

    def _parse(self, data: bytes, sender: tuple) -> tuple[Notice | None, int | None]:
        """(the notice, its number or None), or (None, None) for one that is refused: not from
        a training host of this DC, malformed (testbed/host/notices.py), naming a host this
        controller does not serve, or with times outside the window around now."""
        if sender[0] not in self.worker_ips:
            return None, None
        try:
            raw = json.loads(data)
            if not isinstance(raw, dict):
                return None, None
            n = parse_notice(raw)
        except (ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
            return None, None     # training never waits on us: ignored, and counted
        seq = raw.get("seq")
        if n.host not in self.bubbles or n.out_of_window(time.time_ns(), self.window_ns) or \
                (seq is not None and (isinstance(seq, bool) or not isinstance(seq, int)
                                      or seq < 0)):
            return None, None
        return n, seq

    def _count_lost(self, sender: object, seq: int) -> bool:   # under self.cv
        """Per sender (a worker's socket address: an output notice names another host), the
        numbers skipped. False (nothing counted) for a number more than MAX_SEQ_JUMP past the
        sender's last, or a new sender past MAX_SENDERS."""
        last = self.last_seq.get(sender, -1)   # workers start after the controller: from 0
        if seq > last + MAX_SEQ_JUMP or (sender not in self.last_seq
                                         and len(self.last_seq) >= MAX_SENDERS):
            return False
        if seq > last + 1:
            self.counts["notices_lost"] += seq - last - 1
        self.last_seq[sender] = max(last, seq)
        return True

    def _on_notice(self, n: Notice) -> None:   # under self.cv
        host, old = n.host, self.bubbles[n.host]
        if isinstance(n, BusyNotice):      # training took the GPU: that bubble is over
            if old is not None and old.t_idle_ns <= n.busy_ns:
                self._close(host, old)
            return
        if isinstance(n, ArrivalNotice):   # the awaited message began to arrive
            if old is not None and old.t_idle_ns == n.t_idle_ns:
                old.arrived(n.end_min_ns, n.end_max_ns)
                self.cv.notify_all()
            return
        if isinstance(n, OutputNotice):    # the neighbour began the op whose output this host awaits
            if old is not None and old.awaits == n.awaits:
                old.made_at(n.end_min_ns)
                self.cv.notify_all()
            else:                   # it may come before the host goes idle
                pending = self.pending_bounds[host]
                pending[n.awaits] = max(pending.get(n.awaits, 0), n.end_min_ns)
            return
        self.counts["notices"] += 1
        if old is not None:
            self._close(host, old)
        b = Bubble(n.t_idle_ns, n.t_pred_end_ns, n.iteration, n.op, n.gaps_ns,
                   t_first_pred_end_ns=n.t_pred_end_ns, awaits=n.awaits, pending=n.pending,
                   wire_ns=n.wire_ns, made_ns=n.made_ns, maker=n.maker,
                   spread_ns=n.spread_ns, end_max_ns=n.end_max_ns)
        b.raise_end_min(n.end_min_ns)
        if n.awaits is not None and n.awaits in self.pending_bounds[host]:
            b.made_at(self.pending_bounds[host].pop(n.awaits))
        if n.iteration is not None:   # output notices for iterations before the last are stale
            pending = self.pending_bounds[host]
            for key in [k for k in pending if k[1] < n.iteration - 1]:
                del pending[key]
        if host in self.dead_hosts:
            b.reason = "host_down"
        self.bubbles[host] = b
        self.started.set()
        self.cv.notify_all()

    def replay(self) -> None:
        while not self.started.wait(0.2):
            if self.stop.is_set():
                return
        t0 = time.time_ns()
        deadline_ms = self.cfg.ttft_deadline_ms
        for seq, q in enumerate(self.requests):
            due = t0 + int(self.ts.emulated_span(q["arrival_s"]) * 1e9)
            while not self.stop.is_set():
                left = (due - time.time_ns()) / 1e9
                if left <= 0:
                    break
                time.sleep(min(left, 0.2))
            if self.stop.is_set():
                return
            r = make_pending(id=q["id"], seq=seq, t_arrival_ns=due,
                             target_tokens=q["target_tokens"], output_tokens=q["output_tokens"],
                             deadline_ms=deadline_ms, predict_ms=self.predict_ms,
                             guard_ms=self.cfg.guard_for_ms, time_scale=self.ts,
                             truncated_from=q.get("truncated_from"))
            with self.cv:
                self.counts["arrived"] += 1
                self._expire(time.time_ns())
                self.queue.arrive(r)
                if self.waiting:          # only agents in an open bubble can use it now
                    self.cv.notify_all()

    def predict_ms(self, target_tokens: int) -> float:
        if self.spec.compute != "profile":
            return 0.0   # measured mode: no profile to predict from; the guard alone
        return self.profile.prefill_ms(target_tokens)

    def chunk_ns(self, done: int, end: int) -> tuple[int, int]:
        """A chunk's predicted hold and its guard, dilated (ns)."""
        return chunk_hold_ns(self.profile, self.cfg, done, end, time_scale=self.ts)

    def _choose(self, host: str, pick_at: int, bubble_end: int
                ) -> tuple[Pending | None, tuple[int, int] | None, int, str]:
        """(request, chunk or None for all of it, not_after_ns, reason if none). Under self.cv.
        The host's chunked request first; then a whole request; then a first chunk."""
        c = choose(self.queue, self.partial[host], pick_at, bubble_end, self.chunk_ns,
                   self.profile.min_chunk_tokens, self.chunking)
        if c.first_chunk:
            self.partial[host] = c.request
        return c.request, c.chunk, c.not_after_ns, c.reason

    def host_agent(self, server: Endpoint) -> None:
        """Fill `server.host`'s bubbles until stopped: one prefill in flight, and with
        `pipeline` a second whole request sent behind it (the server reads it when it replies
        to the first, so no controller round trip sits between the two on the GPU)."""
        sock = self._connect(server)
        host = server.host
        while not self.stop.is_set():
            with self.cv:
                b = self.bubbles[host]
                now = time.time_ns()
                if sock is None:
                    if b is not None:
                        b.reason = "host_down"
                    self.cv.wait(0.2)
                    continue
                bubble_end = None if b is None else self.end_of(b, now)
                if b is not None and now >= bubble_end + self.extend_margin_ns:
                    # past the predicted end and no busy notice: the GPU is still idle
                    if self.cfg.extend_bubbles and b.extend(now, self.extend_margin_ns):
                        bubble_end = self.end_of(b, now)
                    else:
                        self._close(host, b)
                        b = None
                if b is None or now >= bubble_end:
                    self.cv.wait(0.05 if b is None else 0.002)
                    continue
                self._expire(now)
                # the prefill starts one message later: pick as of then
                pick_at = now + self.latency_ns[host]
                r, chunk, not_after, reason = self._choose(host, pick_at, bubble_end)
                if r is None:
                    b.reason = reason
                    # wait for an arrival or a notice, at most until the bubble's end as of now
                    self.waiting += 1
                    self.cv.wait(max(0.0, (bubble_end - now) / 1e9))
                    self.waiting -= 1
                    continue
                jobs = [self._job(b, r, chunk, not_after, pick_at, bubble_end)]
            try:
                sock.settimeout(r.predicted_ns / 1e9 + REPLY_MARGIN_S)
                if _closed_by_peer(sock):
                    # the server closed this idle connection (it makes room at its connection
                    # cap): the request goes on a new one
                    sock.close()
                    sock = self._connect(server) or sock
                    if sock.fileno() < 0:
                        raise ConnectionError("the prefill server closed the idle connection "
                                              "and cannot be reached again")
                    sock.settimeout(r.predicted_ns / 1e9 + REPLY_MARGIN_S)
                send_msg(sock, self._message(jobs[0]))
                jobs[0].t_dispatch_ns = time.time_ns()
                behind = self._behind(host, jobs[0]) if self.cfg.pipeline else None
                if behind is not None:
                    send_msg(sock, self._message(behind))
                    behind.t_dispatch_ns = time.time_ns()
                    jobs.append(behind)
                while jobs:
                    got = recv_msg(sock, max_payload_bytes=0, max_pad_bytes=0)
                    if got is None:
                        raise ConnectionError("the prefill server closed the connection")
                    with self.cv:
                        self._on_reply(host, jobs.pop(0), got.header)
            except (OSError, ValueError, KeyError, TypeError) as exc:   # a bad reply too
                with self.cv:
                    for job in jobs:
                        self._lost(host, job)
                    self.log.write("HOST_DOWN", host=host, t_ns=time.time_ns(),
                                   error=str(exc)[:200])
                sock.close()
                sock = None

    def _job(self, b: Bubble, r: Pending, chunk: tuple[int, int] | None, not_after: int,
             pick_at: int, bubble_end: int) -> Job:      # under self.cv
        r.attempts += 1
        b.in_flight += 1
        decode = self.spec.decode_servers[self._decode_rr % len(self.spec.decode_servers)]
        self._decode_rr += 1
        predicted, guard = (r.predicted_ns, r.guard_ns) if chunk is None \
            else self.chunk_ns(*chunk)
        return Job(bubble=b, request=r, chunk=chunk, not_after_ns=not_after, pick_at_ns=pick_at,
                   bubble_end_ns=bubble_end, decode=decode, predicted_ns=predicted,
                   guard_ns=guard)

    def _behind(self, host: str, first: Job) -> Job | None:
        """A whole request to run right after `first` (predicted to start when it ends) in the
        same bubble, if one fits; None when first is a chunk that leaves more of its request
        (it was cut to fill the bubble) or the bubble is over."""
        r = first.request
        if first.chunk is not None and first.chunk[1] < r.target_tokens:
            return None
        with self.cv:
            b = first.bubble
            if b.closed or self.bubbles[host] is not b:
                return None
            hold = first.predicted_ns + first.guard_ns
            start = max(first.t_dispatch_ns + self.latency_ns[host], first.pick_at_ns)
            pick_at = start + hold + self.latency_ns[host] // 4
            end = self.end_of(b, time.time_ns())
            pick = self.queue.pick(pick_at, end)
            if pick.request is None:
                return None
            job = self._job(b, pick.request, None, pick.not_after_ns, pick_at, end)
            job.behind = True
            return job

    def _message(self, job: Job) -> dict:
        r = job.request
        n_prompt = min(r.target_tokens, self.cfg.model["context"])
        msg = {"type": "prefill", "id": r.id,
               "prompt": prompt_for(r.id, n_prompt, self.cfg.model["vocab_size"]),
               "target_tokens": r.target_tokens if self.spec.compute == "profile"
               else n_prompt,
               "max_new_tokens": max(1, r.output_tokens), "not_after_ns": job.not_after_ns,
               "decode": {"ip": job.decode.ip, "port": job.decode.port},
               "t_arrival_ns": r.t_arrival_ns}
        if job.chunk is not None:
            msg["chunk"] = {"start": job.chunk[0], "end": job.chunk[1]}
        return msg

    def _done(self, host: str, b: Bubble) -> None:   # under self.cv: one job of b answered
        b.in_flight -= 1
        if b.closed and not b.in_flight:   # closed (a busy or newer notice) meanwhile
            self._bubble_record(host, b)

    def _lost(self, host: str, job: Job) -> None:   # under self.cv: no reply, server down
        r, b = job.request, job.bubble
        if self.partial[host] is r:      # its prefix died with the server
            self.partial[host] = None
            r.done_tokens, r.chunks, r.t_first_start_ns = 0, 0, None
        self.queue.requeue(r)
        b.reason = "host_down"
        self._done(host, b)

    def _on_reply(self, host: str, job: Job, reply: dict) -> None:
        """Book one reply (under self.cv)."""
        r, b, chunk = job.request, job.bubble, job.chunk
        self.log.write("DISPATCH", id=r.id, host=host, chunk=list(chunk) if chunk else None,
                       predicted_ms=job.predicted_ns / 1e6, guard_ms=job.guard_ns / 1e6,
                       t_pick_at_ns=job.pick_at_ns, t_dispatch_ns=job.t_dispatch_ns,
                       bubble_t_idle_ns=b.t_idle_ns, bubble_end_ns=job.bubble_end_ns,
                       not_after_ns=job.not_after_ns, behind=job.behind,
                       ok=bool(reply.get("ok")), error=reply.get("error"),
                       ran=reply.get("chunk"))
        if reply.get("ok"):
            b.dispatched.append(r.id)
            b.reason = "used"
            t_first = int(reply["t_end_ns"])
            if not job.behind:       # a job sent behind another waited for it on purpose
                self.latency_ns[host] = int(
                    (1 - LATENCY_WEIGHT) * self.latency_ns[host]
                    + LATENCY_WEIGHT * max(0, int(reply["t_start_ns"]) - job.t_dispatch_ns))
            if chunk is not None:
                r.chunks += 1
                r.done_tokens = int(reply["chunk"][1])    # the server may have cut it
                if r.t_first_start_ns is None:
                    r.t_first_start_ns = int(reply["t_start_ns"])
            if not reply.get("partial"):
                if self.partial[host] is r:
                    self.partial[host] = None
                self._request_record(r, "served" if t_first <= r.deadline_ns else "late",
                                     host=host, decode_host=job.decode.host,
                                     t_dispatch_ns=job.t_dispatch_ns,
                                     t_pick_at_ns=job.pick_at_ns,
                                     bubble_end_ns=job.bubble_end_ns,
                                     bubble_t_idle_ns=b.t_idle_ns, not_after_ns=job.not_after_ns,
                                     t_prefill_start_ns=r.t_first_start_ns
                                     or int(reply["t_start_ns"]),
                                     t_first_token_ns=t_first, chunks=r.chunks,
                                     behind=job.behind)
        elif reply.get("retry"):
            self.counts["retried"] += 1
            if self.partial[host] is not r:   # a chunked one stays with its host
                self.queue.requeue(r)
            b.reason = "rejected"
            # GPU busy: the bubble ended sooner than predicted, nothing more goes into it. Too
            # late to fit (the dispatch took longer than expected): a shorter request may still
            # fit, so the loop picks again.
            if "busy" in str(reply.get("error")) and not b.closed:
                self._close(host, b)
        else:
            if self.partial[host] is r:
                self.partial[host] = None
            self._request_record(r, "failed", host=host, error=str(reply.get("error"))[:200])
        self._done(host, b)

    def _connect(self, server: Endpoint) -> socket.socket | None:
        deadline = time.monotonic() + self.spec.connect_timeout_s
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                s = socket.create_connection((server.ip, server.port), timeout=2.0)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return s
            except OSError:
                time.sleep(0.1)
        self.log.write("HOST_DOWN", host=server.host, t_ns=time.time_ns(),
                       error="prefill server not reachable")
        return None

    def _guarded(self, name: str, target, *args) -> threading.Thread:
        """A thread of target(*args); should it die, one line to stderr and a THREAD_DIED
        record, its host (an agent's) counts as down, and main exits 1."""
        host = args[0].host if args else None

        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # noqa: BLE001 - recorded, and it fails the run
                line = f"controller {self.spec.dc}: thread {name} died: " \
                       f"{type(exc).__name__}: {str(exc)[:200]}"
                print(line, file=sys.stderr, flush=True)
                with self.cv:
                    self.died.append(line)
                    if host is not None:
                        self.dead_hosts.add(host)
                        b = self.bubbles.get(host)
                        if b is not None:
                            b.reason = "host_down"
                    self.log.write("THREAD_DIED", thread=name, host=host, t_ns=time.time_ns(),
                                   error=line)

        return threading.Thread(target=run, name=name, daemon=True)

    def run(self) -> None:
        threads = [self._guarded("notices", self.notices), self._guarded("replay", self.replay)]
        threads += [self._guarded(f"agent-{e.host}", self.host_agent, e)
                    for e in self.spec.prefill_servers]
        for t in threads:
            t.start()
        try:
            while not self.stop.wait(0.2):
                with self.cv:
                    self._expire(time.time_ns())
        finally:
            self.stop.set()
            with self.cv:
                self.cv.notify_all()
            for t in threads:
                t.join(timeout=REPLY_MARGIN_S)
            with self.cv:
                for r in self.queue.drain() + [r for r in self.partial.values() if r]:
                    self._request_record(r, "unserved")
                for host, b in self.bubbles.items():
                    if b is not None and not b.closed:
                        self._bubble_record(host, b)
                self.log.write("SUMMARY", notice_realtime=self.notice_realtime,
                               threads_died=len(self.died), hosts_down=sorted(self.dead_hosts),
                               **self.counts)
            self.log.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the peer has closed this connection (its end of stream is waiting), without
    reading or blocking."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="controller spec JSON")
    args = parser.parse_args(argv)
    spec = ControllerSpec.load(args.spec)
    ctl = Controller(spec)
    signal.signal(signal.SIGTERM, lambda *_: ctl.stop.set())
    signal.signal(signal.SIGINT, lambda *_: ctl.stop.set())
    demote_on_rttime(f"controller {spec.dc}")   # its notice thread runs real-time
    print(f"controller {spec.dc}: {len(ctl.requests)} requests, "
          f"{len(spec.prefill_servers)} prefill servers, notices on {spec.ip}:{spec.notice_port}",
          flush=True)
    ctl.run()
    print(f"controller {spec.dc}: {ctl.counts}", flush=True)
    if ctl.died:
        print(f"controller {spec.dc}: failed: {ctl.died[0]}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

