"""A decode server of one DC: `python -m prefill.decode_server --spec FILE`.

One job: take KV caches that prefill servers hand off and continue each generation from its
cache (docs/bubbletea/design.md). Prefilling is prefill/server.py; the model is prefill/decoder.py,
the framing prefill/wire.py, the accept loop prefill/service.py.

Each connection carries any number of KV messages (header fields: type "kv", id, first_token,
prompt_len, max_new_tokens, shape, dtype, prefill_host; payload: the float32 cache in this
machine's byte order; padding: the target model's extra bytes, dropped). The header is checked
before the payload is read: the shape must be the model's [n_layer, 2, n_head, prompt_len,
head_dim], dtype float32, payload_bytes what the shape makes. Then:
- the ack {"ok": true, "id", "t_kv_done_ns", "host"} goes back as soon as the last byte is in
  (the sender times the transfer on it); a refused message gets {"ok": false, "id", "error"},
  and the connection carries on when the message was consumed (closed otherwise; a header not
  in within wire.HEADER_DEADLINE_S of its first byte is one of those);
- the generation (generate_from_cache, min(max_new_tokens, max_new_tokens_cap) tokens) is
  queued for the one generation thread (one GPU: generations take turns, and receiving never
  waits for them), which writes a DECODE record when it is done.

Record (testbed/host/records.py; host and dc in each):
  DECODE {id, t_kv_start_ns, t_kv_done_ns, t_done_ns, tokens, kv_bytes, pad_bytes,
          prompt_tokens, prefill_host}
"""

from __future__ import annotations

import queue
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from prefill.decoder import InferenceConfig, build_model, generate_from_cache, prefill
from testbed.host.records import RecordLog
from prefill.service import Activity, close_gently, serve_main, start_thread
from testbed.host.specfiles import SpecFile
from prefill.wire import HEADER_DEADLINE_S, WireError, recv_msg, send_msg
from testbed.spec.errors import shown

MAX_ID_CHARS = 64
MAX_PAD_BYTES = 1 << 40          # padding is dropped in chunks, never allocated
STOP_GRACE_S = 10.0              # on SIGTERM: for connections, then for queued generations


@dataclass(frozen=True, kw_only=True, slots=True)
class DecodeSpec(SpecFile):
    host: str
    dc: str
    ip: str
    port: int
    records_path: str
    model: dict = field(default_factory=dict)   # InferenceConfig.to_dict(): the prefill's model
    max_new_tokens_cap: int | None = None       # None: generate what each request asks

    def __post_init__(self) -> None:
        InferenceConfig.from_dict(self.model)
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 1 <= self.port <= 65535:
            raise ValueError(f"port: {self.port!r} is not a port number")
        cap = self.max_new_tokens_cap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_new_tokens_cap: {cap!r} is not null or an integer >= 1")



def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_kv_header(h: dict[str, Any], cfg: InferenceConfig) -> None:
    """ValueError naming the first field of a KV message header that this model cannot take."""
    if h.get("type") != "kv":
        raise ValueError(f"type: {shown(h.get('type'))}, expected 'kv'")
    rid = h.get("id")
    if not isinstance(rid, str) or not 1 <= len(rid) <= MAX_ID_CHARS:
        raise ValueError(f"id: {shown(rid)} is not a string of 1..{MAX_ID_CHARS} characters")
    n = h.get("prompt_len")
    if not _int(n) or not 1 <= n <= cfg.context:
        raise ValueError(f"prompt_len: {shown(n)} is not an integer in 1..{cfg.context}")
    if h.get("shape") != cfg.kv_shape(n):
        raise ValueError(f"shape: {shown(h.get('shape'))}, this model's KV cache of {n} tokens is "
                         f"{cfg.kv_shape(n)}")
    if h.get("dtype") != "float32":
        raise ValueError(f"dtype: {shown(h.get('dtype'))}, expected 'float32'")
    if h["payload_bytes"] != cfg.kv_bytes(n):
        raise ValueError(f"payload_bytes: {h['payload_bytes']}, the shape makes "
                         f"{cfg.kv_bytes(n)}")
    tok = h.get("first_token")
    if not _int(tok) or not 0 <= tok < cfg.vocab_size:
        raise ValueError(f"first_token: {shown(tok)} is not a token id in [0, {cfg.vocab_size})")
    m = h.get("max_new_tokens")
    if not _int(m) or m < 1:
        raise ValueError(f"max_new_tokens: {shown(m)} is not an integer >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class GenJob:
    id: str
    kv: torch.Tensor
    first_token: int
    max_new_tokens: int
    t_kv_start_ns: int
    t_kv_done_ns: int
    kv_bytes: int
    pad_bytes: int
    prefill_host: Any


class DecodeServer:
    def __init__(self, spec: DecodeSpec) -> None:
        self.spec = spec
        self.cfg = InferenceConfig.from_dict(spec.model)
        self.model = build_model(self.cfg)
        self.records = RecordLog(spec.records_path, {"host": spec.host, "dc": spec.dc})
        self._jobs: queue.Queue[GenJob | None] = queue.Queue()
        kv, tok = prefill(self.model, [0])         # warm up: the first calls are slow
        generate_from_cache(self.model, kv, tok, 2)
        self._worker = start_thread("decode", self._generate)

    def handle(self, conn: socket.socket, peer: str, activity: Activity) -> None:  # noqa: ARG002
        while True:
            activity.idle()
            try:
                msg = recv_msg(conn, max_payload_bytes=self.cfg.kv_bytes(self.cfg.context),
                               max_pad_bytes=MAX_PAD_BYTES,
                               check=lambda h: check_kv_header(h, self.cfg),
                               header_deadline_s=HEADER_DEADLINE_S,
                               on_first_byte=activity.busy)
            except WireError as exc:
                rid = exc.header.get("id") if exc.header else None
                send_msg(conn, {"ok": False, "id": rid if isinstance(rid, str) else None,
                                "error": f"bad message: {exc}", "host": self.spec.host})
                if not exc.in_sync:
                    close_gently(conn)
                    return
                continue
            if msg is None:
                return
            h = msg.header
            send_msg(conn, {"ok": True, "id": h["id"], "t_kv_done_ns": msg.t_last_ns,
                            "host": self.spec.host})
            kv = torch.frombuffer(msg.payload, dtype=torch.float32).view(h["shape"])
            cap = self.spec.max_new_tokens_cap
            self._jobs.put(GenJob(
                id=h["id"], kv=kv, first_token=h["first_token"],
                max_new_tokens=h["max_new_tokens"] if cap is None else
                min(cap, h["max_new_tokens"]),
                t_kv_start_ns=msg.t_first_ns, t_kv_done_ns=msg.t_last_ns,
                kv_bytes=h["payload_bytes"], pad_bytes=msg.pad_bytes,
                prefill_host=h.get("prefill_host")))

    def refuse(self, conn: socket.socket, why: str) -> None:
        """The reply to a connection over the service's cap (prefill/service.py)."""
        send_msg(conn, {"ok": False, "id": None, "error": f"busy: {why}",
                        "host": self.spec.host})

    def _generate(self) -> None:
        while (job := self._jobs.get()) is not None:
            tokens = generate_from_cache(self.model, job.kv, job.first_token, job.max_new_tokens)
            self.records.write("DECODE", id=job.id, t_kv_start_ns=job.t_kv_start_ns,
                               t_kv_done_ns=job.t_kv_done_ns, t_done_ns=time.time_ns(),
                               tokens=tokens, kv_bytes=job.kv_bytes, pad_bytes=job.pad_bytes,
                               prompt_tokens=job.kv.size(3), prefill_host=job.prefill_host)

    def close(self, grace_s: float) -> None:
        """Finish the queued generations (up to grace_s), then close the records."""
        self._jobs.put(None)
        self._worker.join(grace_s)
        self.records.close()


def main(argv: list[str] | None = None) -> int:
    return serve_main(argv, __doc__.splitlines()[0], "decode server", DecodeSpec, DecodeServer,
                      STOP_GRACE_S)


if __name__ == "__main__":
    sys.exit(main())
