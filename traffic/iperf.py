"""iperf3 between emulated hosts: argv for server and client, and parsing of `iperf3 -J`.

One job: iperf3. A JSON document with an "error" key is a failure even when the exit code is 0
(iperf3 reports errors inside the document), so `parse_iperf` raises on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


class IperfError(RuntimeError):
    pass


@dataclass(frozen=True, kw_only=True, slots=True)
class IperfResult:
    streams: int
    seconds: float
    sent_mbit: float        # goodput as the sender saw it (TCP payload)
    received_mbit: float    # goodput at the receiver: what calibration reports
    retransmits: int


def server_argv(port: int) -> list[str]:
    return ["iperf3", "-s", "-1", "-p", str(port), "--forceflush"]


def client_argv(dst_ip: str, port: int, *, seconds: float, streams: int = 1, omit_s: float = 1.0,
                rate_mbit: float | None = None) -> list[str]:
    """TCP client; -O omits the first seconds (slow start) from the totals."""
    argv = ["iperf3", "-c", dst_ip, "-p", str(port), "-t", f"{seconds:g}", "-O", f"{omit_s:g}",
            "-P", str(streams), "-J"]
    if rate_mbit is not None:
        # Paced per stream: the total is rate_mbit.
        argv += ["-b", f"{rate_mbit / streams * 1e6:.0f}", "--pacing-timer", "100"]
    return argv


def parse_iperf(text: str) -> IperfResult:
    try:
        doc = json.loads(text[text.index("{"):])
    except ValueError:
        raise IperfError(f"iperf3 printed no JSON: {text.strip()[-300:]}") from None
    if "error" in doc:
        raise IperfError(f"iperf3: {doc['error']}")
    end = doc["end"]
    start = doc.get("start", {}).get("test_start", {})
    return IperfResult(
        streams=int(start.get("num_streams", len(end.get("streams", [])) or 1)),
        seconds=float(end["sum_received"]["seconds"]),
        sent_mbit=end["sum_sent"]["bits_per_second"] / 1e6,
        received_mbit=end["sum_received"]["bits_per_second"] / 1e6,
        retransmits=int(end["sum_sent"].get("retransmits", 0)),
    )
