"""traffic.capture without root: the record format, header parsing, and the slot analyses on
synthetic packets and slots with known answers."""

from __future__ import annotations

import socket
import struct

import pytest

from traffic.capture import (MAGIC, Packet, frame_bytes, load, pack, parse_frame, slot_adherence,
                             switch_errors_ms)

pytestmark = pytest.mark.unit

MS = 1_000_000
IPS = {"10.1.0.1": 0, "10.1.0.2": 1}


def slot(d: int, start_ms: float, end_ms: float) -> dict:
    return {"pipeline": d, "t_grant": int(start_ms * MS), "t_end": int(end_ms * MS)}


def pkt(t_ms: float, src: str, length: int) -> Packet:
    return Packet(int(t_ms * MS), src, "10.2.0.1", length)


SLOTS = [slot(0, 1000, 2000), slot(1, 2000, 3000), slot(0, 3500, 4000), slot(1, 4000, 5000)]


def test_adherence_counts_data_bytes_inside_own_slots():
    packets = [
        pkt(1100, "10.1.0.1", 1000), pkt(1500, "10.1.0.1", 1000),   # p0 in its slot
        pkt(2500, "10.1.0.1", 1000),                                # p0 in p1's slot
        pkt(2500, "10.1.0.1", 100),                                 # an ACK: not data
        pkt(2100, "10.1.0.2", 1500), pkt(3000, "10.1.0.2", 500),    # p1, the end is inside
        pkt(2100, "10.9.9.9", 5000),                                # not a pipeline's host
    ]
    got = slot_adherence(packets, SLOTS, IPS)
    assert got == pytest.approx({0: 2 / 3, 1: 1.0})


def test_adherence_boundaries_and_unknown_pipelines():
    packets = [pkt(1000, "10.1.0.1", 300), pkt(2000, "10.1.0.1", 300),   # both ends included
               pkt(999.999, "10.1.0.1", 300), pkt(4000.001, "10.1.0.1", 300)]
    assert slot_adherence(packets, SLOTS, IPS) == pytest.approx({0: 0.5})
    # a pipeline without any slot: none of its bytes are inside
    assert slot_adherence([pkt(1500, "10.1.0.3", 1000)], SLOTS, {"10.1.0.3": 7}) == {7: 0.0}
    assert slot_adherence([], SLOTS, IPS) == {}


def test_switch_errors_known_answer():
    packets = [
        pkt(1000.5, "10.1.0.1", 1500),   # slot A (p0): +0.5 ms
        pkt(1200, "10.1.0.1", 1500),
        pkt(2002, "10.1.0.2", 1500),     # slot B (p1): +2 ms
        pkt(2000.5, "10.1.0.2", 80),     # an ACK, earlier: not data
        pkt(3400, "10.1.0.1", 1500),     # slot C (p0) granted at 3500: data 100 ms early
        pkt(3600, "10.1.0.1", 1500),
    ]                                    # slot D (p1): no data at all
    got = switch_errors_ms(packets, SLOTS, IPS)
    assert got["n"] == 3 and got["missing"] == 1
    assert got["errors_ms"] == pytest.approx([0.5, 2.0, 100.0])
    assert got["median_ms"] == pytest.approx(2.0)
    assert got["p90_ms"] == pytest.approx(100.0)
    assert got["signed_median_ms"] == pytest.approx(0.5)   # of +0.5, +2, -100


def test_switch_errors_look_back_no_further_than_the_previous_slot():
    # p0's packet at 2500 lies in p1's slot B; for slot C (3500) the search starts at B's end
    # (3000) or 100 ms before the grant, whichever is later: it is not C's first packet.
    packets = [pkt(2500, "10.1.0.1", 1500), pkt(3501, "10.1.0.1", 1500)]
    got = switch_errors_ms(packets, [slot(1, 2000, 3000), slot(0, 3500, 4000)], IPS)
    assert got["errors_ms"] == pytest.approx([1.0]) and got["missing"] == 1
    empty = switch_errors_ms([], SLOTS, IPS)
    assert empty["n"] == 0 and empty["missing"] == 4 and empty["median_ms"] is None


def test_records_round_trip(tmp_path):
    packets = [Packet(1_700_000_000_123_456_789, "10.1.0.1", "10.2.0.2", 65000, 5201, 40000, True, 52),
               Packet(1_700_000_000_223_456_789, "10.2.0.2", "10.1.0.1", 52, 40000, 5201, False, 52)]
    path = tmp_path / "cap.bin"
    path.write_bytes(MAGIC + b"".join(pack(p) for p in packets) + b"\x01\x02")  # + a cut record
    assert load(path) == packets
    (tmp_path / "bad.bin").write_bytes(b"nope")
    with pytest.raises(ValueError):
        load(tmp_path / "bad.bin")


def test_parse_frame_reads_ip_and_tcp_headers():
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 4396, 1, 0x4000, 64, socket.IPPROTO_TCP, 0,
                     socket.inet_aton("10.1.0.1"), socket.inet_aton("10.2.0.1"))
    tcp = struct.pack("!HHIIBBHHH", 5201, 40000, 1, 2, 8 << 4, 0x10, 100, 0, 0) + b"\0" * 12
    frame = b"\xaa" * 6 + b"\xbb" * 6 + b"\x08\x00" + ip + tcp
    assert parse_frame(frame) == ("10.1.0.1", "10.2.0.1", 4396, 5201, 40000, 52)
    assert parse_frame(b"\xaa" * 12 + b"\x86\xdd" + ip + tcp) is None        # not IPv4
    udp_ip = ip[:9] + bytes([socket.IPPROTO_UDP]) + ip[10:]
    assert parse_frame(b"\xaa" * 12 + b"\x08\x00" + udp_ip + tcp) is None     # not TCP


def test_frame_bytes_charges_a_super_packet_as_its_segments():
    # 3 full segments of 1448 bytes in one GSO packet: HTB counts 3 frames of 1514 bytes.
    assert frame_bytes(Packet(0, "a", "b", 52 + 3 * 1448)) == 3 * 1514
    assert frame_bytes(Packet(0, "a", "b", 52)) == 66                   # a pure ACK
    assert frame_bytes(Packet(0, "a", "b", 52 + 1448 + 100)) == 1514 + 166
