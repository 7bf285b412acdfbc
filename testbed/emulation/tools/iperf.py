"""iperf3 between emulated hosts: argv for server and client, and parsing of `iperf3 -J`.

One job: iperf3. A JSON document with an "error" key is a failure even when the exit code is 0
(iperf3 reports errors inside the document), so `parse_iperf` raises on it.

Goodput is taken at the receiver, from the server's own 1 s intervals (`--get-server-output`),
in steady state: the median of the intervals starting at or after `steady_from_s`. A loss in
slow start makes the receiving application see a dip and then a burst above the link rate (the
out-of-order data is delivered at once when the retransmission lands), so a plain total over a
few seconds, or iperf3's `sum_received` with -O (which also counts data queued when the warm-up
ended), is off by up to a queue's worth; the median of intervals is not.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path


class IperfError(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class IperfResult:
    streams: int
    seconds: float           # length of the steady-state window the goodput is over
    received_mbit: float     # steady-state goodput at the receiver (TCP payload)
    sent_mbit: float         # the sender's own total, for reference
    retransmits: int
    intervals_mbit: tuple[float, ...]   # receiver, per interval
    congestion_control: str = ""        # what the sender's sockets ran, as iperf3 reports it


def server_argv(port: int) -> list[str]:
    return ["iperf3", "-s", "-1", "-J", "-p", str(port)]


def client_argv(dst_ip: str, port: int, *, seconds: float, streams: int = 1, omit_s: float = 1.0,
                rate_mbit: float | None = None, congestion_control: str | None = None) -> list[str]:
    """TCP client for omit_s + seconds; the server's report comes back in the same document.
    congestion_control sets the senders' TCP congestion control (-C) per socket."""
    argv = ["iperf3", "-c", dst_ip, "-p", str(port), "-t", f"{seconds + omit_s:g}",
            "-O", f"{omit_s:g}", "-P", str(streams), "-J", "--get-server-output"]
    if congestion_control is not None:
        argv += ["-C", congestion_control]
    if rate_mbit is not None:
        # Paced by the kernel (SO_MAX_PACING_RATE) per stream, so TCP also sizes its GSO
        # bursts to the rate (~1 ms each) instead of sending 64 KB at once: the total is rate_mbit.
        argv += ["--fq-rate", f"{rate_mbit / streams * 1e6:.0f}"]
    return argv


def listening(pid: int, port: int) -> bool:
    """Is there a TCP listener on port in the network namespace of process pid?"""
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
        lines += Path(f"/proc/{pid}/net/tcp6").read_text().splitlines()[1:]
    except (FileNotFoundError, ProcessLookupError):
        return False
    for line in lines:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            return True
    return False


def steady_cut_s(seconds: float) -> float:
    """Where the steady window starts, on the receiver's clock (which restarts at 0 after the
    omitted warm-up), for a client_argv test of `seconds` whose -t is seconds + 1 s of omit: 2 s
    in, or earlier for a short test, so that two whole intervals always lie past it. With one,
    a receiver whose interval timer fires late (a busy machine) leaves only a short tail, which
    is no measurement. Never before 1 s: slow start is left out."""
    return max(1.0, min(2.0, seconds - 1.0))


def parse_iperf(text: str, steady_from_s: float = 2.0) -> IperfResult:
    try:
        doc = json.loads(text[text.index("{"):])
    except ValueError:
        raise IperfError(f"iperf3 printed no JSON: {text.strip()[-300:]}") from None
    if "error" in doc:
        raise IperfError(f"iperf3: {doc['error']}")
    server = doc.get("server_output_json") or {}
    if "error" in server:
        raise IperfError(f"iperf3 server: {server['error']}")
    intervals = [i["sum"] for i in server.get("intervals", []) if not i["sum"].get("omitted")]
    steady = [s for s in intervals if s["start"] >= steady_from_s - 1e-3 and s["seconds"] >= 0.5]
    if not steady:
        got = ", ".join(f"{i['start']:.2f}+{i['seconds']:.2f}" for i in intervals) or "none"
        raise IperfError(f"iperf3 server reported no interval of 0.5 s or more starting at or "
                         f"after {steady_from_s:g} s (its intervals, start+seconds: {got}); "
                         "run longer")
    secs = sum(s["seconds"] for s in steady)
    end = doc["end"]
    return IperfResult(
        streams=int(doc.get("start", {}).get("test_start", {}).get("num_streams", 1)),
        seconds=secs,
        received_mbit=statistics.median(s["bits_per_second"] for s in steady) / 1e6,
        sent_mbit=end["sum_sent"]["bits_per_second"] / 1e6,
        retransmits=int(end["sum_sent"].get("retransmits", 0)),
        intervals_mbit=tuple(round(s["bits_per_second"] / 1e6, 3) for s in intervals),
        congestion_control=str(end.get("sender_tcp_congestion", "")),
    )
