"""The prefill server of one training host: `python -m prefill.server --spec FILE`.

One job: serve prefill requests on the host's GPU when training leaves it idle, and hand each
request's KV cache to the decode server the request names (docs/bubbletea/design.md). Which
request goes where and when is the controller's job (prefill/controller.py); the model is
prefill/decoder.py, the framing prefill/wire.py, the accept loop prefill/service.py, the KV
hand-off prefill/kv.py.

Per connection, one request at a time (fields: design.md "Prefill server protocol"):
1. validate it; any problem -> {"ok": false, "id", "error": "<field>: ...", "retry": false}.
2. try_acquire the host's GpuLock (never wait for training) -> else "gpu busy", retry true.
3. not_after_ns: if now + the predicted hold ends after it -> release, "does not fit before
   not_after_ns", retry true. Predicted hold: profile mode, prefill_ms(target_tokens) x
   time_scale; measured mode, the last prefill's compute time per token x the prompt's tokens
   (0 before the first).
4. run the real prefill; profile mode: hold the lock until prefill_ms(target_tokens) x
   time_scale after the start; release; PREFILL record; success reply.
4a. chunked prefill (profile mode; "chunk": {"start", "end"} in target tokens): the request's
   prefix stays in this server's memory between chunks (at most MAX_PARTIAL requests, the
   oldest dropped); a chunk must start where the last one of that id ended, with the same
   prompt, else "chunk: ..." (no retry). A chunk that does not fit before not_after_ns is cut
   to the longest that does (testbed/rules/admission.py's chunk_end: at least the profile's shortest
   prompt, leaving no shorter rest), and refused only if none does; the reply's "chunk" is what
   ran. The hold is PrefillProfile.chunk_ms(start, end) x
   time_scale; the real model prefills the prompt's matching share of real tokens (all of them by
   the last chunk), continuing the cached prefix. A chunk that is not the last replies
   {"ok": true, "partial": true, ...} with no first token and no hand-off; the last one replies
   and hands off as a whole request does.
5. queue the KV cache for the decode server: one sender thread and one persistent connection per
   decode address (reconnecting when it fails); a request may name only one of the spec's
   decode_servers (else "decode: ...", no retry), so no peer can make it open others.
   Profile mode pads the message so that payload + padding = int(kv_cache_bytes(target_tokens)
   x kv_fraction / scale) (no padding when the real KV is larger). The sender waits for the
   decode server's ack; KV_SEND record, with the error when it failed (a failed hand-off
   never stops the server).
Every failure reply is also a REJECT record. A malformed message (its header not in within
wire.HEADER_DEADLINE_S of its first byte included) is answered and its connection closed (the
stream is out of step); a client that goes away ends only its connection. A connection over the
service's cap gets "busy: ..." (retry true) and is closed.

Records (testbed/host/records.py; host and dc in each):
  PREFILL {id, t_start_ns, t_end_ns, prompt_tokens, target_tokens, hold_ms, compute_ns,
           chunk_start, chunk_end, final}
  KV_SEND {id, t_enqueue_ns, t_start_ns, t_end_ns, bytes, payload_bytes, pad_bytes, wire_bytes,
           decode_host, decode_addr, connected, attempt, error}   (prefill/kv.py)
  REJECT  {id, error, retry}
In two threads of this process both would get the flock (it belongs to the open file), so an
in-process lock is taken first: one prefill at a time per host, whatever the connections.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from collections import OrderedDict

import torch

from testbed.rules.admission import chunk_end
from prefill.kv import KvJob, KvSender
from testbed.rules.kvcache import kv_target_bytes
from prefill.decoder import InferenceConfig, InferenceGPT, build_model, prefill, prefill_chunk
from testbed.rules.prefill_profile import PrefillProfile
from testbed.host.records import RecordLog
from prefill.service import Activity, close_gently, serve_main
from prefill.wire import HEADER_DEADLINE_S, WireError, recv_msg, send_msg
from testbed.spec.errors import shown
from testbed.host.gpulock import GpuLock
from testbed.host.specfiles import SpecFile
from testbed.spec.timescale import TimeScale

COMPUTE_MODES = ("measured", "profile")
MAX_ID_CHARS = 64
STOP_GRACE_S = 5.0      # on SIGTERM: for requests in progress, then for queued KV sends
MAX_PARTIAL = 8         # chunked requests whose prefix this server keeps between chunks


@dataclass(frozen=True, kw_only=True, slots=True)
class PrefillSpec(SpecFile):
    host: str
    dc: str
    ip: str
    port: int
    gpu_lock_path: str
    records_path: str
    model: dict = field(default_factory=dict)   # InferenceConfig.to_dict()
    compute: str = "measured"                   # measured | profile
    profile: str = "h200-transformer.json"      # prefill time and KV bytes (profile mode)
    time_scale: float = 1.0      # multiplies every profile hold (the emulated world is slower)
    scale: float = 1.0           # divides the padded KV bytes (the emulated WAN is scaled down)
    kv_fraction: float = 1.0     # share of the target's KV cache that is shipped
    decode_servers: list[dict]       # [{"ip", "port"}]: the only addresses KV caches go to
    connect_timeout_s: float = 5.0   # connecting to a decode server
    ack_timeout_s: float = 60.0      # a KV message's sending and its ack

    def __post_init__(self) -> None:
        InferenceConfig.from_dict(self.model)
        if self.compute not in COMPUTE_MODES:
            raise ValueError(f"compute: {self.compute!r}, use one of {', '.join(COMPUTE_MODES)}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 1 <= self.port <= 65535:
            raise ValueError(f"port: {self.port!r} is not a port number")
        for name in ("time_scale", "scale", "kv_fraction", "connect_timeout_s", "ack_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name}: {value!r} is not a number > 0")
        decode_targets(self.decode_servers)

    @property
    def dilation(self) -> TimeScale:
        """time_scale (a number in the spec file) as the object that converts."""
        return TimeScale(self.time_scale)


def decode_targets(servers: Any) -> frozenset[tuple[str, int]]:
    """The (ip, port) pairs of a spec's decode_servers, or ValueError naming the bad entry."""
    if not isinstance(servers, list) or not servers:
        raise ValueError(f"decode_servers: {shown(servers)} is not a non-empty list of "
                         f"{{\"ip\": str, \"port\": int}}")
    out = set()
    for i, e in enumerate(servers):
        ip, port = (e.get("ip"), e.get("port")) if isinstance(e, dict) else (None, None)
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise ValueError(f"decode_servers[{i}]: {shown(e)} has no IP address \"ip\"") \
                from None
        if not _int(port) or not 1 <= port <= 65535:
            raise ValueError(f"decode_servers[{i}]: {shown(e)} has no port number \"port\"")
        out.add((ip, port))
    return frozenset(out)



@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    id: str
    prompt: list[int]
    target_tokens: int
    max_new_tokens: int
    decode_ip: str
    decode_port: int
    not_after_ns: int | None
    chunk: tuple[int, int] | None = None     # [start, end) in target tokens; None: all


@dataclass(kw_only=True)
class Partial:
    """A chunked request's prefix: its real KV cache (None while no real token is in it)."""
    prompt: list[int]
    kv: torch.Tensor | None
    real_done: int
    target_done: int


def real_end(end: int, target: int, n_real: int) -> int:
    """Real prompt tokens a chunk ending at target token `end` has prefilled: the same share
    of the real prompt, all of it at the end."""
    return n_real if end >= target else end * n_real // target


class RequestError(ValueError):
    """A request this server refuses: the reply's one-line error and whether to retry."""

    def __init__(self, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _valid_id(value: Any) -> str | None:
    """A request id as replies and records carry it: None unless it is a valid id."""
    return value if isinstance(value, str) and 1 <= len(value) <= MAX_ID_CHARS else None


def parse_request(h: dict[str, Any], cfg: InferenceConfig, profile: PrefillProfile | None,
                  decoders: frozenset[tuple[str, int]]) -> Request:
    """The request in header h, or RequestError naming the first bad field. profile: None in
    measured mode (target_tokens must then be absent or len(prompt)); decoders: the (ip, port)
    pairs a request may name as its decode server."""
    if h.get("type") != "prefill":
        raise RequestError(f"type: {shown(h.get('type'))}, expected 'prefill'")
    rid = h.get("id")
    if not isinstance(rid, str) or not 1 <= len(rid) <= MAX_ID_CHARS:
        raise RequestError(f"id: {shown(rid)} is not a string of 1..{MAX_ID_CHARS} characters")
    prompt = h.get("prompt")
    if not isinstance(prompt, list):
        raise RequestError(f"prompt: a {type(prompt).__name__}, not a list of token ids")
    if not prompt:
        raise RequestError("prompt: empty")
    if len(prompt) > cfg.context:
        raise RequestError(f"prompt: {len(prompt)} tokens, over the model's context "
                           f"{cfg.context}")
    for i, tok in enumerate(prompt):
        if not _int(tok) or not 0 <= tok < cfg.vocab_size:
            raise RequestError(f"prompt[{i}]: {shown(tok)} is not a token id in "
                               f"[0, {cfg.vocab_size})")
    target = h.get("target_tokens")
    if profile is not None:
        if not _int(target) or not 1 <= target <= profile.max_tokens:
            raise RequestError(f"target_tokens: {shown(target)} is not an integer in "
                               f"1..{profile.max_tokens} (the profile's longest prompt)")
    elif target is None:
        target = len(prompt)
    elif not _int(target) or target != len(prompt):
        raise RequestError(f"target_tokens: {shown(target)}, but measured mode prefills the "
                           f"prompt's {len(prompt)} tokens (leave it out or set that)")
    max_new = h.get("max_new_tokens")
    if not _int(max_new) or max_new < 1:
        raise RequestError(f"max_new_tokens: {shown(max_new)} is not an integer >= 1")
    decode = h.get("decode")
    if not isinstance(decode, dict):
        raise RequestError(f"decode: {shown(decode)} is not {{\"ip\": str, \"port\": int}}")
    ip, port = decode.get("ip"), decode.get("port")
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        raise RequestError(f"decode.ip: {shown(ip)} is not an IP address") from None
    if not _int(port) or not 1 <= port <= 65535:
        raise RequestError(f"decode.port: {shown(port)} is not a port number")
    if (ip, port) not in decoders:
        raise RequestError(f"decode: {ip}:{port} is not a decode server of this run; name one "
                           f"of {', '.join(f'{a}:{b}' for a, b in sorted(decoders))}")
    not_after = h.get("not_after_ns")
    if not_after is not None and not _int(not_after):
        raise RequestError(f"not_after_ns: {shown(not_after)} is not an integer or null")
    arrival = h.get("t_arrival_ns")
    if arrival is not None and not _int(arrival):
        raise RequestError(f"t_arrival_ns: {shown(arrival)} is not an integer or null")
    chunk = h.get("chunk")
    if chunk is not None:
        if profile is None:
            raise RequestError("chunk: chunked prefill is for profile mode only (leave it out)")
        start = chunk.get("start") if isinstance(chunk, dict) else None
        end = chunk.get("end") if isinstance(chunk, dict) else None
        if not (_int(start) and _int(end) and 0 <= start < end <= target):
            raise RequestError(f"chunk: {shown(chunk)} is not {{\"start\": s, \"end\": e}} with "
                               f"0 <= s < e <= target_tokens {target}")
        chunk = (start, end)
    return Request(id=rid, prompt=prompt, target_tokens=target, max_new_tokens=max_new,
                   decode_ip=ip, decode_port=port, not_after_ns=not_after, chunk=chunk)


def _hold(t_start_ns: int, hold_ms: float) -> None:
    """Sleep until hold_ms after t_start_ns (no-op if already past)."""
    left_s = (t_start_ns + int(hold_ms * 1e6) - time.time_ns()) / 1e9
    if left_s > 0:
        time.sleep(left_s)


# Fault injection for tests: with this variable set to "<host>:N", that host's server exits
# (code 3) in the middle of its N-th prefill, holding the GPU lock, as a crash would.
FAULT_EXIT_ENV = "BUBBLETEA_FAULT_PREFILL_EXIT_AFTER"
FAULT_EXIT_CODE = 3


class PrefillServer:
    def __init__(self, spec: PrefillSpec) -> None:
        self.spec = spec
        self.cfg = InferenceConfig.from_dict(spec.model)
        self.model: InferenceGPT = build_model(self.cfg)
        self.profile = PrefillProfile.load(spec.profile) if spec.compute == "profile" else None
        self.gpu = GpuLock(spec.gpu_lock_path)
        self._busy = threading.Lock()           # this process's threads (module docstring)
        self._ns_per_token = 0.0                # measured mode: the last prefill's rate
        self._prefills = 0
        self._partial: OrderedDict[str, Partial] = OrderedDict()   # chunked requests, by id
        host, _, n = os.environ.get(FAULT_EXIT_ENV, "").rpartition(":")
        self._exit_after = int(n) if n.isdigit() and host == spec.host else 0
        self.records = RecordLog(spec.records_path, {"host": spec.host, "dc": spec.dc})
        self._decoders = decode_targets(spec.decode_servers)
        self._senders: dict[tuple[str, int], KvSender] = {}
        self._senders_lock = threading.Lock()
        prefill(self.model, [0])                # warm up: the first call is slow

    # ---- connections ----------------------------------------------------------------------
    def handle(self, conn: socket.socket, peer: str, activity: Activity) -> None:  # noqa: ARG002
        while True:
            activity.idle()
            try:
                msg = recv_msg(conn, max_payload_bytes=0, max_pad_bytes=0,
                               header_deadline_s=HEADER_DEADLINE_S,
                               on_first_byte=activity.busy)
            except WireError as exc:
                self._fail(conn, _valid_id(exc.header.get("id") if exc.header else None),
                           f"bad message: {exc}", retry=False)
                if not exc.in_sync:
                    close_gently(conn)
                    return
                continue
            if msg is None:
                return
            send_msg(conn, self.serve(msg.header))

    def refuse(self, conn: socket.socket, why: str) -> None:
        """The reply to a connection over the service's cap (prefill/service.py); no REJECT
        record, so a flood of connections cannot grow the records file (the service counts and
        prints the refusals)."""
        send_msg(conn, {"ok": False, "id": None, "error": f"busy: {why}", "retry": True})

    def _fail(self, conn: socket.socket | None, rid: str | None, error: str,
              retry: bool) -> dict:
        self.records.write("REJECT", id=rid, error=error, retry=retry)
        reply = {"ok": False, "id": rid, "error": error, "retry": retry}
        if conn is not None:
            send_msg(conn, reply)
        return reply

    # ---- one request ------------------------------------------------------------------------
    def serve(self, header: dict[str, Any]) -> dict:
        """The reply to one request header (design.md protocol)."""
        rid = _valid_id(header.get("id"))
        try:
            req = parse_request(header, self.cfg, self.profile, self._decoders)
        except RequestError as exc:
            return self._fail(None, rid, str(exc), exc.retry)
        start, end = req.chunk if req.chunk is not None else (0, req.target_tokens)
        if not self._busy.acquire(blocking=False):
            return self._fail(None, req.id, "gpu busy", True)
        try:
            part = self._partial.get(req.id) if start > 0 else None
            if start > 0 and (part is None or part.target_done != start
                              or part.prompt != req.prompt):
                have = "none" if part is None else f"{part.target_done}"
                return self._fail(None, req.id, f"chunk: starts at {start}, but this server "
                                  f"holds {have} prefilled tokens of this request's prompt",
                                  False)
            if not self.gpu.try_acquire():
                return self._fail(None, req.id, "gpu busy", True)
            try:
                predicted_ms = self._predicted_hold_ms(req)
                now = time.time_ns()
                if req.chunk is not None and req.not_after_ns is not None and \
                        now + int(predicted_ms * 1e6) > req.not_after_ns:
                    req, end = self._cut(req, req.not_after_ns - now)
                    predicted_ms = self._predicted_hold_ms(req)
                if req.not_after_ns is not None and \
                        now + int(predicted_ms * 1e6) > req.not_after_ns:
                    return self._fail(None, req.id, f"does not fit before not_after_ns "
                                      f"(predicted hold {predicted_ms:.3f} ms)", True)
                t_start_ns = now       # the instant the fit was checked at
                kv, first_token = self._compute(req, part, end)
                compute_ns = time.time_ns() - t_start_ns
                self._prefills += 1
                if self._prefills == self._exit_after:
                    # fault injection (FAULT_EXIT_ENV): die mid-prefill, GPU lock held; the
                    # kernel releases the flock, training must go on
                    os._exit(FAULT_EXIT_CODE)
                if self.profile is not None:
                    hold_ms = predicted_ms
                    _hold(t_start_ns, hold_ms)
                else:
                    hold_ms = compute_ns / 1e6
                    self._ns_per_token = compute_ns / len(req.prompt)
                t_end_ns = time.time_ns()
            finally:
                self.gpu.release()
        finally:
            self._busy.release()
        final = end == req.target_tokens
        self.records.write("PREFILL", id=req.id, t_start_ns=t_start_ns, t_end_ns=t_end_ns,
                           prompt_tokens=len(req.prompt), target_tokens=req.target_tokens,
                           hold_ms=hold_ms, compute_ns=compute_ns, chunk_start=start,
                           chunk_end=end, final=final)
        reply = {"ok": True, "id": req.id, "t_start_ns": t_start_ns, "t_end_ns": t_end_ns,
                 "hold_ms": hold_ms, "prompt_tokens": len(req.prompt),
                 "target_tokens": req.target_tokens, "chunk": [start, end], "partial": not final}
        if final:
            assert kv is not None and first_token is not None
            self._hand_off(req, kv, first_token, t_end_ns)
            reply["first_token"] = first_token
        return reply

    def _compute(self, req: Request, part: Partial | None, end: int
                 ) -> tuple[torch.Tensor | None, int | None]:
        """Prefill the request's real tokens up to target token `end` (module docstring 4a);
        keeps the prefix of a chunk that is not the last. Under the locks."""
        if req.chunk is None:
            return prefill(self.model, req.prompt)
        done = part.real_done if part is not None else 0
        past = part.kv if part is not None else None
        upto = real_end(end, req.target_tokens, len(req.prompt))
        kv, token = past, None
        if upto > done:
            kv, token = prefill_chunk(self.model, req.prompt[done:upto], past)
        self._partial.pop(req.id, None)
        if end < req.target_tokens:
            self._partial[req.id] = Partial(prompt=req.prompt, kv=kv, real_done=upto,
                                            target_done=end)
            while len(self._partial) > MAX_PARTIAL:
                self._partial.popitem(last=False)
            return kv, None
        return kv, token

    def _cut(self, req: Request, room_ns: int) -> tuple[Request, int]:
        """req with its chunk cut to the longest that fits in room_ns (unchanged if none)."""
        assert self.profile is not None and req.chunk is not None
        start, end = req.chunk
        ts = self.spec.dilation
        cut = chunk_end(start, req.target_tokens, room_ns,
                        lambda a, b: int(ts.emulated_span(self.profile.chunk_ms(a, b)) * 1e6),
                        self.profile.min_chunk_tokens, upto=end)
        if cut is None or cut == end:
            return req, end
        return dataclasses.replace(req, chunk=(start, cut)), cut

    def _predicted_hold_ms(self, req: Request) -> float:
        if self.profile is not None:
            if req.chunk is not None:
                return self.spec.dilation.emulated_span(self.profile.chunk_ms(*req.chunk))
            return self.spec.dilation.emulated_span(self.profile.prefill_ms(req.target_tokens))
        return self._ns_per_token * len(req.prompt) / 1e6

    def _hand_off(self, req: Request, kv: torch.Tensor, first_token: int, t_end_ns: int) -> None:
        payload = memoryview(kv.contiguous().reshape(-1).view(torch.uint8).numpy())
        pad = 0
        if self.profile is not None:
            want = kv_target_bytes(self.profile, req.target_tokens, self.spec.kv_fraction,
                                   self.spec.scale)
            pad = max(0, want - len(payload))
        header = {"type": "kv", "id": req.id, "first_token": first_token,
                  "prompt_len": len(req.prompt), "max_new_tokens": req.max_new_tokens,
                  "shape": list(kv.shape), "dtype": "float32", "prefill_host": self.spec.host}
        key = (req.decode_ip, req.decode_port)
        with self._senders_lock:
            sender = self._senders.get(key)
            if sender is None:
                sender = self._senders[key] = KvSender(
                    req.decode_ip, req.decode_port, self.records, self.spec.connect_timeout_s,
                    self.spec.ack_timeout_s)
        sender.put(KvJob(header=header, payload=payload, pad_bytes=pad, t_enqueue_ns=t_end_ns))

    def close(self, grace_s: float) -> None:
        """Send the queued KV caches (up to grace_s), then close the records and the lock."""
        deadline = time.monotonic() + grace_s
        with self._senders_lock:
            senders = list(self._senders.values())
        for sender in senders:
            sender.close(max(0.0, deadline - time.monotonic()))
        self.records.close()
        self.gpu.close()


def main(argv: list[str] | None = None) -> int:
    return serve_main(argv, __doc__.splitlines()[0], "prefill server", PrefillSpec, PrefillServer, STOP_GRACE_S)


if __name__ == "__main__":
    sys.exit(main())
