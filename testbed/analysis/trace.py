"""One system's run as a Chrome trace (the trace event format's JSON), to open in Perfetto
(ui.perfetto.dev) or chrome://tracing and zoom into any micro-batch.

One job: turn a run's records into trace events. Pure: reads records, returns a document.
- a process per training host ("<host>: stage s, replica r"), a thread per kind of span:
  compute (F, B, OPT), wait (GPU_WAIT: training waited for a prefill), recv (RECV_F, RECV_B:
  from asking for the input to having it), send (SEND_F, SEND_B, with bytes), all-reduce,
  announced bubbles (IDLE), prefill (BubbleTea's PREFILL spans, with the request and tokens);
- a process per WAN link direction with temporal slots (the arbiters' logs): a thread of slots
  (grant to end, with pipeline and wire bytes) and a counter of the bytes each slot carried.
Times are real time (emulated time / time_scale, as metrics.json), in microseconds from the
run's first record.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from testbed.spec.timescale import TimeScale


THREADS = {"F": "compute", "B": "compute", "OPT": "compute", "GPU_WAIT": "wait",
           "RECV_F": "recv", "RECV_B": "recv", "SEND_F": "send", "SEND_B": "send",
           "ALLREDUCE": "all-reduce", "IDLE": "bubbles (announced)", "PREFILL": "prefill"}
THREAD_ORDER = ["compute", "wait", "recv", "send", "all-reduce", "bubbles (announced)",
                "prefill"]
ARGS = ("iteration", "microbatch", "bytes", "op", "id", "target_tokens", "chunk_start",
        "chunk_end")


def trace_events(spans: Sequence[dict], prefill: Sequence[dict] = (),
                 slots: Iterable[dict] = (), *, time_scale: TimeScale | float = TimeScale(),
                 title: str = "") -> dict[str, Any]:
    """The trace document (module docstring) of one system's spans, prefill records and slot
    records (the arbiters' "slot" lines)."""
    ts = TimeScale.of(time_scale)
    records = [r for r in spans if r.get("name") in THREADS]
    records += [r for r in prefill if r.get("name") == "PREFILL"]
    slots = [s for s in slots if s.get("kind") == "slot"]
    starts = [r["t_start_ns"] for r in records] + [s["t_grant"] for s in slots]
    t0 = min(starts, default=0)

    def us(t_ns: int) -> float:
        return round(ts.real_span((t_ns - t0) / 1e3), 3)

    where = {r["host"]: (r["stage"], r["replica"]) for r in spans if "stage" in r
             and r.get("host")}
    hosts = sorted(where, key=lambda h: where[h]) + sorted(
        {r["host"] for r in records} - set(where))
    pid = {h: i + 1 for i, h in enumerate(hosts)}
    events: list[dict] = []
    for h in hosts:
        name = f"{h}: stage {where[h][0]}, replica {where[h][1]}" if h in where else h
        events.append({"ph": "M", "name": "process_name", "pid": pid[h], "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid[h],
                       "args": {"sort_index": pid[h]}})
        for tid, thread in enumerate(THREAD_ORDER, start=1):
            events.append({"ph": "M", "name": "thread_name", "pid": pid[h], "tid": tid,
                           "args": {"name": thread}})
    tids = {t: i for i, t in enumerate(THREAD_ORDER, start=1)}
    for r in sorted(records, key=lambda r: r["t_start_ns"]):
        label = r["name"]
        if r.get("microbatch") is not None and label in ("F", "B", "SEND_F", "SEND_B",
                                                         "RECV_F", "RECV_B"):
            label = f"{label}{r['microbatch']}"
        events.append({"ph": "X", "name": label, "cat": THREADS[r["name"]],
                       "pid": pid[r["host"]], "tid": tids[THREADS[r["name"]]],
                       "ts": us(r["t_start_ns"]),
                       "dur": max(0.0, round(ts.real_span((r["t_end_ns"] - r["t_start_ns"])
                                                          / 1e3), 3)),
                       "args": {k: r[k] for k in ARGS if r.get(k) is not None}})
    links = sorted({s["link"] for s in slots})
    for i, link in enumerate(links, start=len(hosts) + 1):
        events.append({"ph": "M", "name": "process_name", "pid": i,
                       "args": {"name": f"WAN {link}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": i,
                       "args": {"sort_index": i}})
        events.append({"ph": "M", "name": "thread_name", "pid": i, "tid": 1,
                       "args": {"name": "slots"}})
        for s in sorted((s for s in slots if s["link"] == link), key=lambda s: s["t_grant"]):
            end = s.get("t_end") or s.get("t_done") or s["t_grant"]
            events.append({"ph": "X", "name": f"pipeline {s.get('pipeline')}", "cat": "slot",
                           "pid": i, "tid": 1, "ts": us(s["t_grant"]),
                           "dur": max(0.0, round(ts.real_span((end - s["t_grant"]) / 1e3), 3)),
                           "args": {k: s[k] for k in ("slot", "pipeline", "wire_bytes",
                                                      "expected_bytes") if k in s}})
            events.append({"ph": "C", "name": "bytes per slot", "pid": i,
                           "ts": us(s["t_grant"]), "args": {"wire_bytes": s.get("wire_bytes", 0)}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"title": title, "time": "real (emulated / time_scale)",
                          "time_scale": ts.factor}}

