"""The figures the queue-regime benchmark (bench/bench_queue_regime.py) reads: the summed burst
of a WAN direction (testbed.analysis.bursts) and a namespace's TCP counters
(testbed.emulation.losscounters), from the /proc files or, as for a node on another server,
from their text and `tc -s -j`'s."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.analysis.bursts import summed_burst_bytes
from testbed.cli.planview import load_training
from testbed.emulation.losscounters import (TCP_FIELDS, parse_proc_net, queue_counters_of_tc,
                                          tcp_counters, tcp_fields)
from testbed.features.temporal.plan import plan_slots
from testbed.plans.placement import place_for_system
from testbed.plans.systems import window_bytes
from testbed.spec.scenario import ETH_FRAME_BYTES, TCP_MSS_BYTES, parse_scenario
from testbed.spec.systems import get_system

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("connections", [1, 4, 16])
def test_summed_burst_is_every_pipelines_first_round(connections: int) -> None:
    D, n_embd, seq, mb = 3, 1024, 64, 2     # measured mode: a message is mb x seq x n_embd floats
    sc = parse_scenario({
        "name": "bursts", "scale": 100, "connections": connections,
        "dcs": [{"name": "ea", "hosts": D}, {"name": "we", "hosts": D}],
        "wan": [{"between": ["ea", "we"], "delay_ms": 20, "rate_mbit": 100}],
        "training": {"model": {"n_layer": 2, "n_embd": n_embd, "n_head": 4, "seq_len": seq,
                               "vocab_size": 64},
                     "stages": 2, "replicas": D, "micro_batches": 2, "micro_batch_size": mb}})
    cfg, system = load_training(sc), get_system("multitcp")
    plan = plan_slots(sc, cfg, place_for_system(sc, cfg, system), system)
    payload = mb * seq * n_embd * 4
    first = min(payload, connections * window_bytes(100)) * ETH_FRAME_BYTES / TCP_MSS_BYTES
    got = {str(k): v for k, v in summed_burst_bytes(plan).items()}
    assert got == {"ea->we": pytest.approx(D * first, abs=D), "we->ea": pytest.approx(D * first, abs=D)}


def test_tcp_counters_are_read_from_this_machines_proc_files() -> None:
    sections = {}
    for name in ("snmp", "netstat"):
        sections.update(parse_proc_net(Path(f"/proc/net/{name}").read_text()))
    assert sections["Tcp"]["RetransSegs"] >= 0 and sections["Tcp"]["OutSegs"] >= 0
    for section, field in TCP_FIELDS.values():
        assert isinstance(sections[section][field], int)
    assert parse_proc_net("Tcp: A B\nTcp: 1 x\n") == {}      # a bad value line is no section


def test_tcp_fields_of_the_texts_equal_those_read_by_pid() -> None:
    import os
    texts = [Path(f"/proc/{os.getpid()}/net/{name}").read_text() for name in ("snmp", "netstat")]
    by_text, by_pid = tcp_fields(*texts), tcp_counters(os.getpid())
    assert set(by_text) == set(TCP_FIELDS)
    # the counters may move between the two readings (this machine's other connections)
    assert all(0 <= by_pid[k] - by_text[k] < 10_000 for k in TCP_FIELDS), (by_text, by_pid)


def test_queue_counters_of_tc_json() -> None:
    # `tc -s -j qdisc show dev X` of testbed.emulation.shaping's tree (iproute2 6.1), after traffic
    text = ('[{"kind":"htb","handle":"1:","root":true,"refcnt":3,"options":{"r2q":10,'
            '"default":"0x10","direct_packets_stat":0,"direct_qlen":1000},"bytes":9000,'
            '"packets":6,"drops":0,"overlimits":0,"requeues":0,"backlog":0,"qlen":0},'
            '{"kind":"bfifo","handle":"10:","parent":"1:10","options":{"limit":10000},'
            '"bytes":9000,"packets":6,"drops":2,"overlimits":0,"requeues":0,"backlog":0,"qlen":0}]')
    assert queue_counters_of_tc(text) == {"drops": 2, "packets": 6, "bytes": 9000, "leaves": 1}
    assert queue_counters_of_tc("[]") == {"drops": 0, "packets": 0, "bytes": 0, "leaves": 0}


def test_the_loss_line_says_how_many_retransmits_were_spurious() -> None:
    """Retransmits the receiver reported it already had (DSACK) are named as reordering, not
    loss; without any, the line is as before."""
    from testbed.run.systemrun import loss_lines
    links = {"a->b": {"queue": {"drops": 0}}}
    tcp = {"out_segments": 452_692, "retransmitted_segments": 392, "timeouts": 0,
           "dsack_received_segments": 392, "reordering_detected": 63}
    [line] = loss_lines({"tcp": tcp, "wan_links": links})
    assert line == ("losses over the run: TCP retransmitted 392 of 452,692 segments (0 timeouts, "
                    "392 of them spurious (the receiver already had them: reordered on the way, "
                    "not lost; 63 reorderings seen)); WAN queue drops: none")
    [line] = loss_lines({"tcp": dict(tcp, dsack_received_segments=0), "wan_links": links})
    assert line.endswith("segments (0 timeouts); WAN queue drops: none")
