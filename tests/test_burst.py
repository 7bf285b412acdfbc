"""traffic.burst over loopback (no root): every message arrives whole, the records add up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from traffic import burst

REPO_ROOT = Path(__file__).resolve().parent.parent


def _start_receiver(out: Path, connections: int, messages: int, size: int,
                    extra: list[str] | None = None) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "traffic.burst", "recv", "--port", "0", "--bind", "127.0.0.1",
         "--connections", str(connections), "--messages", str(messages), "--bytes", str(size),
         "--out", str(out), "--timeout-s", "30", *(extra or [])],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise AssertionError(f"receiver did not start: {line!r} {proc.stderr.read()}")
    return proc, int(line.split()[1])


def _send(port: int, connections: int, messages: int, size: int, gap_s: float,
          extra: list[str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "traffic.burst", "send", "--host", "127.0.0.1", "--port", str(port),
         "--connections", str(connections), "--messages", str(messages), "--bytes", str(size),
         "--gap-s", str(gap_s), "--timeout-s", "30", *(extra or [])],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.unit
def test_chunk_sizes_stripe_evenly():
    assert burst.chunk_sizes(10, 3) == [4, 3, 3]
    assert burst.chunk_sizes(9, 3) == [3, 3, 3]
    assert burst.chunk_sizes(2, 4) == [1, 1, 0, 0]
    assert sum(burst.chunk_sizes(33554432, 7)) == 33554432


@pytest.mark.loopback
@pytest.mark.parametrize("connections", [1, 3])
def test_messages_arrive_whole_and_records_agree(tmp_path, connections):
    messages, size, gap_s = 5, 300_007, 0.05
    out = tmp_path / "recv.jsonl"
    recv, port = _start_receiver(out, connections, messages, size, ["--verify"])
    try:
        sent = _send(port, connections, messages, size, gap_s, ["--verify"])
        assert recv.wait(timeout=30) == 0, recv.stderr.read()
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    assert sent.returncode == 0, sent.stderr
    got = burst.read_records(out)
    sends = burst.parse_send_records(sent.stdout)
    assert [r.msg for r in got] == list(range(messages))
    assert [s.msg for s in sends] == list(range(messages))
    want_chunks = tuple(burst.chunk_sizes(size, connections))
    for r, s in zip(got, sends):
        assert r.bytes == size and r.connections == connections
        assert r.chunk_bytes == want_chunks
        assert r.verified is True                      # every payload byte as sent
        assert r.send_start_ns == s.send_start_ns      # the header carried the sender's stamp
        assert r.send_start_ns <= r.first_byte_ns <= r.recv_end_ns
        assert r.recv_end_ns == max(r.chunk_end_ns)
        assert all(r.first_byte_ns <= e for e in r.chunk_end_ns)
        assert r.transfer_ms == pytest.approx((r.recv_end_ns - r.send_start_ns) / 1e6, abs=1e-3)
        assert 0 < r.transfer_ms < 5000
        assert s.send_start_ns <= s.written_ns <= s.ack_ns
        assert r.recv_end_ns <= s.ack_ns               # acknowledged only once all of it arrived
    for prev, nxt in zip(sends, sends[1:]):           # idle gap_s after each acknowledgement
        assert nxt.send_start_ns - prev.ack_ns >= gap_s * 1e9 * 0.95


@pytest.mark.loopback
def test_wrong_message_size_is_an_error(tmp_path):
    recv, port = _start_receiver(tmp_path / "recv.jsonl", 1, 2, 1000)
    try:
        sent = _send(port, 1, 2, 999, 0.0)
        rc = recv.wait(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait()
    assert rc == 1
    assert "chunk of 999 bytes" in recv.stderr.read()
    assert sent.returncode == 1 and sent.stderr.startswith("error: ")


@pytest.mark.loopback
def test_unknown_congestion_control_is_one_line(tmp_path):
    sent = _send(9, 1, 1, 10, 0.0, ["--cc", "nosuchcc"])
    assert sent.returncode == 1
    assert sent.stderr.strip().startswith("error: cannot set congestion control 'nosuchcc'")
    assert len(sent.stderr.strip().splitlines()) == 1


@pytest.mark.loopback
def test_receiver_listens_only_where_it_is_told():
    """No --bind: one line naming it, exit 2 (no listening on every interface)."""
    out = subprocess.run([sys.executable, "-m", "traffic.burst", "recv", "--port", "0",
                          "--messages", "1", "--bytes", "10", "--out", "/dev/null",
                          "--timeout-s", "1"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "--bind" in out.stderr and "READY" not in out.stdout, out
