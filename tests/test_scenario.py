"""Scenario files, addressing plan, shaping plan, delay-line specs and traffic parsers (no root).

- the shipped topologies load; every kind of bad input is a ScenarioError naming the field,
  and the CLI prints it as one 'error: <field>: ...' line on stderr with exit code 2;
- queue sizes: packets vs bytes, default >= bandwidth-delay product;
- the plan: names, addresses, routes (a configured link carries its pair; multi-hop by lowest
  total delay only for pairs without one, or for all with routing: shortest-delay),
  interface names within Linux's 15 characters;
- shaping.plan_link as data; QueueSpec parse/format; ping and iperf3 output parsing.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testbed.emulation import shaping
from testbed.emulation.delayline import QueueSpec
from testbed.spec.errors import ScenarioError
from testbed.spec.timescale import TimeScale
from testbed.spec.scenario import (MIN_QUEUE_PACKETS, MTU_BYTES, EmulatedScenario, load_scenario,
                                 parse_scenario)
from testbed.plans.routing import dc_paths, edges_of, next_hops
from testbed.plans.topo import make_plan
from testbed.emulation.tools import iperf, ping

REPO_ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = sorted((REPO_ROOT / "topologies").glob("*.yaml"))
IFNAMSIZ = 15

BASE = {
    "name": "t",
    "dcs": [{"name": "a", "hosts": 2}, {"name": "b", "hosts": 1}],
    "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100}],
}


def bridge_interfaces(plan) -> list[str]:
    """Every bridge, then every bridge's ports (each in its bridge's namespace)."""
    return [*plan.bridges.values(),
            *(p for dc in plan.scenario.dcs for p in plan.bridge_ports(dc.name))]


def scenario(**changes) -> dict:
    """A copy of BASE with top-level keys replaced (None removes the key)."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def with_dc(i: int, **fields) -> dict:
    data = copy.deepcopy(BASE)
    data["dcs"][i].update(fields)
    return data


def with_link(i: int, drop: tuple[str, ...] = (), **fields) -> dict:
    data = copy.deepcopy(BASE)
    data["wan"][i].update(fields)
    for key in drop:
        del data["wan"][i][key]
    return data


# ---- shipped topologies ----------------------------------------------------------------------
@pytest.mark.unit
def test_topologies_are_shipped():
    assert {p.name for p in TOPOLOGIES} >= {"two_dc.yaml", "three_dc.yaml", "four_dc.yaml"}


@pytest.mark.unit
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_shipped_topology_loads(path):
    sc = load_scenario(path)
    raw = yaml.safe_load(path.read_text())
    assert sc.name == raw["name"]
    assert [dc.name for dc in sc.dcs] == [d["name"] for d in raw["dcs"]]
    assert len(sc.wan) == len(raw["wan"])
    for link, d in zip(sc.wan, raw["wan"]):
        assert link.between == tuple(d["between"])
        assert link.delay_ms == d["delay_ms"] and link.rate_mbit == d["rate_mbit"]
        assert link.queue_bytes >= link.bdp_bytes


@pytest.mark.unit
def test_two_dc_values():
    sc = load_scenario(REPO_ROOT / "topologies" / "two_dc.yaml")
    assert sc.backend in ("auto", "netem", "delayline") and sc.scale >= 1.0
    assert sc.host_names() == ["east-h1", "east-h2", "west-h1", "west-h2"]
    (link,) = sc.wan
    assert (link.a, link.b, link.delay_ms, link.rate_mbit) == ("east", "west", 20.0, 100.0)
    assert link.jitter_ms == 0 and link.loss_pct == 0


# ---- bad input: one ScenarioError naming the field ------------------------------------------
BAD = {
    "not a mapping": (["a", "b"], "scenario"),
    "bad name": (scenario(name="has space"), "name"),
    "missing dcs": (scenario(dcs=None), "dcs"),
    "empty dcs": (scenario(dcs=[]), "dcs"),
    "dc not a mapping": (scenario(dcs=["a"]), "dcs[0]"),
    "dc name too long": (with_dc(0, name="abcdefg"), "dcs[0].name"),
    "dc name uppercase": (with_dc(0, name="East"), "dcs[0].name"),
    "dc name starts with digit": (with_dc(0, name="1a"), "dcs[0].name"),
    "dc name not a string": (with_dc(0, name=7), "dcs[0].name"),
    "duplicate dc": (with_dc(1, name="a"), "dcs[1].name"),
    "hosts 0": (with_dc(0, hosts=0), "dcs[0].hosts"),
    "hosts negative": (with_dc(0, hosts=-1), "dcs[0].hosts"),
    "hosts not int": (with_dc(0, hosts="two"), "dcs[0].hosts"),
    "hosts float": (with_dc(0, hosts=2.0), "dcs[0].hosts"),
    "hosts bool": (with_dc(0, hosts=True), "dcs[0].hosts"),
    "hosts over 99": (with_dc(0, hosts=100), "dcs[0].hosts"),
    "dc rate zero": (with_dc(1, rate_mbit=0), "dcs[1].rate_mbit"),
    "unknown top key": (scenario(links=[]), "links"),
    "unknown dc key": (with_dc(1, gpus=8), "dcs[1].gpus"),
    "unknown wan key": (with_link(0, latency_ms=5), "wan[0].latency_ms"),
    "wan not a list": (scenario(wan={"a": "b"}), "wan"),
    "wan between unknown dc": (with_link(0, between=["a", "zz"]), "wan[0].between"),
    "wan between one dc": (with_link(0, between=["a"]), "wan[0].between"),
    "wan self link": (with_link(0, between=["a", "a"]), "wan[0].between"),
    "missing delay_ms": (with_link(0, drop=("delay_ms",)), "wan[0].delay_ms"),
    "missing rate_mbit": (with_link(0, drop=("rate_mbit",)), "wan[0].rate_mbit"),
    "negative delay": (with_link(0, delay_ms=-1), "wan[0].delay_ms"),
    "delay not a number": (with_link(0, delay_ms="20ms"), "wan[0].delay_ms"),
    "rate zero": (with_link(0, rate_mbit=0), "wan[0].rate_mbit"),
    "jitter more than delay": (with_link(0, jitter_ms=11), "wan[0].jitter_ms"),
    "loss over 100": (with_link(0, loss_pct=101), "wan[0].loss_pct"),
    "negative loss": (with_link(0, loss_pct=-0.5), "wan[0].loss_pct"),
    "queue words": (with_link(0, queue="lots"), "wan[0].queue"),
    "queue zero": (with_link(0, queue=0), "wan[0].queue"),
    "queue negative": (with_link(0, queue=-5), "wan[0].queue"),
    "queue unknown unit": (with_link(0, queue="4GB"), "wan[0].queue"),
    "queue no unit": (with_link(0, queue="2.5"), "wan[0].queue"),
    "queue bool": (with_link(0, queue=True), "wan[0].queue"),
    "disconnected": (scenario(dcs=BASE["dcs"] + [{"name": "c", "hosts": 1}]), "wan"),
    "no wan for two dcs": (scenario(wan=None), "wan"),
    "scale below 1": (scenario(scale=0.5), "scale"),
    "bad backend": (scenario(backend="tc"), "backend"),
    "bad systems type": (scenario(systems={"a": 1}), "systems"),
    "empty systems": (scenario(systems=[]), "systems"),
    "unknown system": (scenario(systems=["baseline", "zeus"]), "systems[1]"),
    "training not a mapping": (scenario(training=[1]), "training"),
}


@pytest.mark.unit
@pytest.mark.parametrize("data, field", BAD.values(), ids=BAD.keys())
def test_bad_input_names_the_field(data, field):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data)
    err = info.value
    assert err.field == field, f"{data!r}: {err}"
    assert str(err).startswith(f"{field}: "), str(err)
    assert "\n" not in str(err)


@pytest.mark.unit
def test_duplicate_link_either_order():
    data = copy.deepcopy(BASE)
    data["wan"].append({"between": ["b", "a"], "delay_ms": 5, "rate_mbit": 10})
    with pytest.raises(ScenarioError, match=r"^wan\[1\]\.between: .*listed twice"):
        parse_scenario(data)


@pytest.mark.unit
def test_disconnected_names_the_unreachable_dc():
    data = scenario(dcs=BASE["dcs"] + [{"name": "c", "hosts": 1}, {"name": "d", "hosts": 1}])
    data["wan"].append({"between": ["c", "d"], "delay_ms": 5, "rate_mbit": 10})
    with pytest.raises(ScenarioError, match=r"^wan: no path from 'a' to 'c', 'd'"):
        parse_scenario(data)


@pytest.mark.unit
def test_single_dc_needs_no_wan():
    sc = parse_scenario({"name": "solo", "dcs": [{"name": "a", "hosts": 3}]})
    assert sc.wan == () and len(sc.host_names()) == 3


@pytest.mark.unit
def test_optional_fields():
    sc = parse_scenario(scenario(scale=100, backend="delayline", systems="baseline"))
    assert (sc.scale, sc.backend, sc.systems) == (100.0, "delayline", ("baseline",))
    sc = parse_scenario(with_dc(0, rate_mbit=1000))
    assert sc.dc("a").rate_mbit == 1000.0 and sc.dc("b").rate_mbit is None


@pytest.mark.unit
def test_bad_yaml_syntax(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ndcs: [\n  {name: a, hosts: 1\n")
    with pytest.raises(ScenarioError, match=r"^scenario: .*not valid YAML at line \d+"):
        load_scenario(path)


@pytest.mark.unit
def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match=r"^scenario: no file .*nope\.yaml"):
        load_scenario(tmp_path / "nope.yaml")


@pytest.mark.unit
def test_empty_file(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(ScenarioError, match=r"^scenario: expected a mapping"):
        load_scenario(path)


@pytest.mark.unit
def test_dc_name_with_trailing_newline_is_rejected():
    with pytest.raises(ScenarioError):
        parse_scenario({"name": "x", "dcs": [{"name": "ab\n", "hosts": 1}]})


# ---- the CLI: one line, exit 2, no traceback ------------------------------------------------
CLI_BAD = {
    "dc name": (yaml.safe_dump(with_dc(0, name="East")), "dcs[0].name"),
    "hosts": (yaml.safe_dump(with_dc(1, hosts=100)), "dcs[1].hosts"),
    "unknown key": (yaml.safe_dump(with_link(0, colour="red")), "wan[0].colour"),
    "jitter": (yaml.safe_dump(with_link(0, jitter_ms=50)), "wan[0].jitter_ms"),
    "queue": (yaml.safe_dump(with_link(0, queue="big")), "wan[0].queue"),
    "backend": (yaml.safe_dump(scenario(backend="tc")), "backend"),
    "syntax": ("name: x\ndcs: [\n", "scenario"),
}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "run_testbed.py"), *args],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)


@pytest.mark.loopback
@pytest.mark.parametrize("text, field", CLI_BAD.values(), ids=CLI_BAD.keys())
def test_cli_validate_bad_file(tmp_path, text, field):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    out = run_cli("validate", str(path))
    lines = out.stderr.splitlines()
    assert out.returncode == 2, out
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), out.stderr
    assert "Traceback" not in out.stderr + out.stdout


@pytest.mark.loopback
def test_cli_validate_missing_file(tmp_path):
    out = run_cli("validate", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"error: scenario: no file {str(tmp_path / 'nope.yaml')!r}; "
        "give a scenario file's path or a shipped scenario's name, such as two_dc (run_testbed.py list shows them)"]


@pytest.mark.loopback
def test_cli_validate_shipped_topologies():
    out = run_cli("validate", *map(str, TOPOLOGIES))
    assert out.returncode == 0, out
    heads = [line for line in out.stdout.splitlines() if not line.startswith(" ")]
    assert len(heads) == len(TOPOLOGIES)
    assert all(": ok (" in line for line in heads), out.stdout
    # every ordered DC pair's route is printed, with its RTT
    assert "    east -> west: direct, 1 WAN hop, 20 ms one way, RTT 40 ms" in out.stdout
    n_pairs = sum(len(load_scenario(p).dcs) * (len(load_scenario(p).dcs) - 1) for p in TOPOLOGIES)
    assert out.stdout.count(" ms one way, RTT ") == n_pairs, out.stdout


@pytest.mark.loopback
def test_cli_bad_flag_is_one_line():
    out = run_cli("calibrate", "topologies/two_dc.yaml", "--seconds", "soon")
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--seconds" in lines[0], out.stderr


# ---- queue sizes ----------------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("queue, want", [
    (2000, 2000 * MTU_BYTES),
    ("100 packets", 100 * MTU_BYTES),
    ("50p", 50 * MTU_BYTES),
    ("300pkts", 300 * MTU_BYTES),
    ("4MB", 4_000_000),
    ("1.5mb", 1_500_000),
    ("512KiB", 512 * 1024),
    ("2MiB", 2 * 1024 * 1024),
    ("64kb", 64_000),
    ("9000b", 9000),
])
def test_queue_packets_and_bytes(queue, want):
    assert parse_scenario(with_link(0, queue=queue)).wan[0].queue_bytes == want


@pytest.mark.unit
@pytest.mark.parametrize("delay_ms, rate_mbit, jitter_ms", [
    (20, 100, 0), (50, 1000, 0), (80, 50, 10), (0, 10, 0), (1, 0.5, 0), (200, 10000, 100)])
def test_default_queue_at_least_bdp(delay_ms, rate_mbit, jitter_ms):
    link = parse_scenario(with_link(0, delay_ms=delay_ms, rate_mbit=rate_mbit,
                                    jitter_ms=jitter_ms)).wan[0]
    bdp = rate_mbit * 1e6 / 8 * 2 * (delay_ms + jitter_ms) / 1e3
    assert link.bdp_bytes == pytest.approx(bdp, abs=1)
    assert link.queue_bytes >= bdp, link
    assert link.queue_bytes >= MIN_QUEUE_PACKETS * MTU_BYTES, link


@pytest.mark.unit
def test_explicit_queue_may_be_below_bdp():
    link = parse_scenario(with_link(0, delay_ms=50, rate_mbit=1000, queue=10)).wan[0]
    assert link.queue_bytes == 10 * MTU_BYTES < link.bdp_bytes


# ---- the plan -------------------------------------------------------------------------------
def three_dc_plan():
    return make_plan(load_scenario(REPO_ROOT / "topologies" / "three_dc.yaml").emulated())


@pytest.mark.unit
def test_plan_three_dc_names_and_addresses():
    plan = three_dc_plan()
    assert [(h.name, h.dc, h.ip, h.intf) for h in plan.hosts] == [
        ("east-h1", "east", "10.1.0.1", "east-h1-eth0"),
        ("east-h2", "east", "10.1.0.2", "east-h2-eth0"),
        ("west-h1", "west", "10.2.0.1", "west-h1-eth0"),
        ("west-h2", "west", "10.2.0.2", "west-h2-eth0"),
        ("europe-h1", "europe", "10.3.0.1", "europe-h1-eth0"),
        ("europe-h2", "europe", "10.3.0.2", "europe-h2-eth0"),
    ]
    assert plan.gateways == {"east": "east-gw", "west": "west-gw", "europe": "europe-gw"}
    assert plan.gateway_ips == {"east": "10.1.0.254", "west": "10.2.0.254", "europe": "10.3.0.254"}
    assert plan.subnets == {"east": "10.1.0.0/24", "west": "10.2.0.0/24", "europe": "10.3.0.0/24"}
    assert plan.bridges == {"east": "east-s", "west": "west-s", "europe": "europe-s"}
    ends = [(w.end_a.gateway, w.end_a.intf, w.end_a.ip, w.end_b.gateway, w.end_b.intf, w.end_b.ip)
            for w in plan.wan]
    assert ends == [
        ("east-gw", "east-gw-eth1", "10.254.0.1", "west-gw", "west-gw-eth1", "10.254.0.2"),
        ("east-gw", "east-gw-eth2", "10.254.0.5", "europe-gw", "europe-gw-eth1", "10.254.0.6"),
        ("west-gw", "west-gw-eth2", "10.254.0.9", "europe-gw", "europe-gw-eth2", "10.254.0.10"),
    ]
    assert bridge_interfaces(plan) == [
        "east-s", "west-s", "europe-s",
        "east-s-eth1", "east-s-eth2", "east-s-eth3",
        "west-s-eth1", "west-s-eth2", "west-s-eth3",
        "europe-s-eth1", "europe-s-eth2", "europe-s-eth3",
    ]


@pytest.mark.unit
def test_plan_three_dc_routes_are_direct():
    routes = {(r.gateway, r.dst): (r.via, r.intf) for r in three_dc_plan().routes}
    assert routes == {
        ("east-gw", "10.2.0.0/24"): ("10.254.0.2", "east-gw-eth1"),
        ("east-gw", "10.3.0.0/24"): ("10.254.0.6", "east-gw-eth2"),
        ("west-gw", "10.1.0.0/24"): ("10.254.0.1", "west-gw-eth1"),
        ("west-gw", "10.3.0.0/24"): ("10.254.0.10", "west-gw-eth2"),
        ("europe-gw", "10.1.0.0/24"): ("10.254.0.5", "europe-gw-eth1"),
        ("europe-gw", "10.2.0.0/24"): ("10.254.0.9", "europe-gw-eth2"),
    }


def routes_of(data: dict, routing: str | None = None) -> dict[tuple[str, str], str]:
    """(gateway, destination DC) -> the gateway the first hop leads to."""
    plan = make_plan(parse_scenario(data if routing is None else dict(data, routing=routing)).emulated())
    owner = {}
    for w in plan.wan:
        for end in w.ends():
            owner[end.ip] = end.gateway
    dc_of = {subnet: dc for dc, subnet in plan.subnets.items()}
    return {(r.gateway, dc_of[r.dst]): owner[r.via] for r in plan.routes}


def dcs(*names: str) -> list[dict]:
    return [{"name": n, "hosts": 1} for n in names]


@pytest.mark.unit
def test_plan_line_routes_via_the_middle():
    data = {"name": "line", "dcs": dcs("a", "b", "c"),
            "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 10},
                    {"between": ["b", "c"], "delay_ms": 10, "rate_mbit": 10}]}
    routes = routes_of(data)
    assert routes[("a-gw", "c")] == "b-gw" and routes[("c-gw", "a")] == "b-gw"
    assert len(routes) == 6


DIAMOND = {"name": "diamond", "dcs": dcs("a", "b", "c", "d"),
           "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 10},
                   {"between": ["b", "d"], "delay_ms": 10, "rate_mbit": 10},
                   {"between": ["a", "c"], "delay_ms": 5, "rate_mbit": 10},
                   {"between": ["c", "d"], "delay_ms": 30, "rate_mbit": 10}]}
TRIANGLE = {"name": "tri", "dcs": dcs("a", "b", "c"),   # a-c (15 ms) is slower than a-b-c (10)
            "wan": [{"between": ["a", "b"], "delay_ms": 5, "rate_mbit": 10},
                    {"between": ["b", "c"], "delay_ms": 5, "rate_mbit": 10},
                    {"between": ["a", "c"], "delay_ms": 15, "rate_mbit": 10}]}


@pytest.mark.unit
def test_plan_takes_lower_total_delay_not_lower_first_hop():
    # a->d has no link: via b is 10+10 = 20 ms; via c the first hop is shorter (5), total 35.
    routes = routes_of(DIAMOND)
    assert routes[("a-gw", "d")] == "b-gw"
    assert routes[("d-gw", "a")] == "b-gw"
    assert routes[("c-gw", "b")] == "a-gw"       # 5+10 = 15 < 30+10
    assert routes[("c-gw", "d")] == "d-gw"       # c-d is a configured link: it carries c<->d


@pytest.mark.unit
def test_plan_shortest_delay_routing_is_explicit():
    routes = routes_of(DIAMOND, routing="shortest-delay")
    assert routes[("c-gw", "d")] == "a-gw"       # 5+10+10 = 25 < 30 direct (three hops)
    assert routes[("d-gw", "c")] == "b-gw"
    assert routes_of(TRIANGLE, routing="shortest-delay")[("a-gw", "c")] == "b-gw"


@pytest.mark.unit
def test_plan_configured_link_carries_its_pair_even_when_slower_than_a_detour():
    routes = routes_of(TRIANGLE)
    assert routes[("a-gw", "c")] == "c-gw" and routes[("c-gw", "a")] == "a-gw"
    assert routes[("a-gw", "b")] == "b-gw" and routes[("b-gw", "c")] == "c-gw"
    paths = {(p.src, p.dst): p for p in dc_paths(parse_scenario(TRIANGLE))}
    assert paths[("a", "c")].dcs == ("a", "c") and paths[("a", "c")].delay_ms == 15


@pytest.mark.unit
def test_paths_follow_each_gateways_own_next_hop():
    """A pair without a link takes a multi-hop path, and the DCs on the way forward it along
    their own routes (no loops, every hop a configured link), for every pair of a bigger mesh."""
    data = {"name": "mesh", "dcs": dcs("a", "b", "c", "d", "e"),
            "wan": [{"between": ["a", "b"], "delay_ms": 50, "rate_mbit": 10},
                    {"between": ["a", "c"], "delay_ms": 5, "rate_mbit": 10},
                    {"between": ["c", "b"], "delay_ms": 5, "rate_mbit": 10},
                    {"between": ["b", "d"], "delay_ms": 5, "rate_mbit": 10},
                    {"between": ["d", "e"], "delay_ms": 5, "rate_mbit": 10},
                    {"between": ["c", "e"], "delay_ms": 40, "rate_mbit": 10}]}
    scenario = parse_scenario(data)
    links = {frozenset(w.between) for w in scenario.wan}
    hops = next_hops([d.name for d in scenario.dcs], edges_of(scenario), "direct")
    for p in dc_paths(scenario):
        if frozenset((p.src, p.dst)) in links:
            assert p.dcs == (p.src, p.dst), p
        for x, y in zip(p.dcs, p.dcs[1:]):
            assert frozenset((x, y)) in links and hops[(x, p.dst)] == y, p
        assert len(set(p.dcs)) == len(p.dcs), p
    paths = {(p.src, p.dst): p for p in dc_paths(scenario)}
    assert paths[("a", "d")].dcs == ("a", "c", "b", "d")   # 15 ms; a-b (50) + b-d is 55
    assert paths[("a", "e")].dcs == ("a", "c", "e")   # c-e is c's own link to e (40)


@pytest.mark.unit
def test_shipped_triangle_keeps_its_slow_direct_link():
    sc = load_scenario(REPO_ROOT / "topologies" / "triangle.yaml")
    direct = {(p.src, p.dst): p.dcs for p in dc_paths(sc)}
    assert direct[("east", "europe")] == ("east", "europe")
    detour = {(p.src, p.dst): p.dcs for p in dc_paths(parse_scenario(dict(sc.raw, routing="shortest-delay")))}
    assert detour[("east", "europe")] == ("east", "west", "europe")


@pytest.mark.unit
def test_routing_field_is_checked():
    with pytest.raises(ScenarioError, match="^routing: 'fastest' is not one of direct, "
                                            "shortest-delay; use one of"):
        parse_scenario(dict(TRIANGLE, routing="fastest"))


def all_interface_names(plan) -> list[str]:
    names = list(bridge_interfaces(plan)) + [h.intf for h in plan.hosts]
    names += [f"{gw}-eth0" for gw in plan.gateways.values()]
    names += [end.intf for w in plan.wan for end in w.ends()]
    return names


@pytest.mark.unit
@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_interface_names_fit_ifnamsiz_shipped(path):
    names = all_interface_names(make_plan(load_scenario(path).emulated()))
    assert max(map(len, names)) <= IFNAMSIZ, [n for n in names if len(n) > IFNAMSIZ]
    assert len(names) == len(set(names))


@pytest.mark.unit
def test_interface_names_fit_ifnamsiz_longest_dc_names():
    data = {"name": "big", "dcs": [{"name": f"dcnam{c}", "hosts": 99} for c in "abc"],
            "wan": [{"between": ["dcnama", "dcnamb"], "delay_ms": 1, "rate_mbit": 1},
                    {"between": ["dcnamb", "dcnamc"], "delay_ms": 1, "rate_mbit": 1},
                    {"between": ["dcnama", "dcnamc"], "delay_ms": 1, "rate_mbit": 1}]}
    names = all_interface_names(make_plan(parse_scenario(data).emulated()))
    assert max(map(len, names)) <= IFNAMSIZ, [n for n in names if len(n) > IFNAMSIZ]
    assert "dcnama-s-eth100" in names and "dcnama-h99-eth0" in names


def star_with(n_links: int) -> dict:
    spokes = [f"s{i}" for i in range(n_links)]
    return {"name": "star", "dcs": [{"name": "hubdcx", "hosts": 1}] + dcs(*spokes),
            "wan": [{"between": ["hubdcx", s], "delay_ms": 1, "rate_mbit": 1} for s in spokes]}


@pytest.mark.unit
def test_interface_names_fit_ifnamsiz_hub_with_99_links():
    names = all_interface_names(make_plan(parse_scenario(star_with(99)).emulated()))
    assert max(map(len, names)) <= IFNAMSIZ, [n for n in names if len(n) > IFNAMSIZ]


@pytest.mark.unit
def test_hub_with_100_links_is_refused():
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(star_with(100))
    assert str(exc.value).startswith("wan:") and "hubdcx" in str(exc.value)


# ---- shaping plan ---------------------------------------------------------------------------
@pytest.mark.unit
def test_plan_link_htb_tree_with_bfifo():
    ops = shaping.plan_link("x-gw-eth1", 20, 150_000)
    assert [(op.command, op.kind, op.intf) for op in ops] == [
        ("add", "htb", "x-gw-eth1"), ("add-class", "htb", "x-gw-eth1"), ("add", "bfifo", "x-gw-eth1")]
    root, cls, leaf = ops
    assert root.handle == shaping.ROOT_HANDLE == 0x10000
    assert root.params["default"] == 0x10
    assert cls.handle == shaping.CLASS_HANDLE == 0x10010
    assert cls.params["parent"] == shaping.ROOT_HANDLE
    assert cls.params["rate"] == cls.params["ceil"] == "20000000bit"
    assert cls.params["burst"] == cls.params["cburst"] == shaping.burst_bytes(20e6)
    assert leaf.handle == shaping.LEAF_HANDLE and leaf.params["parent"] == shaping.CLASS_HANDLE
    assert leaf.params == {"parent": shaping.CLASS_HANDLE, "limit": 150_000}


@pytest.mark.unit
def test_plan_link_netem_leaf():
    ops = shaping.plan_link("x-gw-eth1", 100, 3_000_000,
                            netem={"delay_ms": 20, "jitter_ms": 2.5, "loss_pct": 1.5})
    assert [op.kind for op in ops] == ["htb", "htb", "netem"]
    leaf = ops[2]
    assert leaf.params == {"parent": shaping.CLASS_HANDLE, "delay": 20_000, "jitter": 2_500,
                           "loss": 1.5, "limit": 3_000_000 // MTU_BYTES}
    assert ops[1].params["rate"] == "100000000bit"


@pytest.mark.unit
def test_plan_link_netem_limit_floor():
    (*_, leaf) = shaping.plan_link("i", 1, 15_000, netem={"delay_ms": 1})
    assert leaf.params["limit"] == 1000 and leaf.params["jitter"] == 0 and leaf.params["loss"] == 0


@pytest.mark.unit
@pytest.mark.parametrize("rate_mbit", [0.5, 20, 100, 1000, 10000])
def test_burst_is_1ms_at_the_rate_and_at_least_two_frames(rate_mbit):
    burst = shaping.burst_bytes(rate_mbit * 1e6)
    assert burst >= 2 * 1500
    assert abs(burst - max(3000, rate_mbit * 1e6 / 8 / 1000)) <= 1


@pytest.mark.unit
def test_plan_link_fractional_rate():
    ops = shaping.plan_link("i", 0.5, 150_000)
    assert ops[1].params["rate"] == "500000bit"
    assert ops[0].params["r2q"] >= 1


# ---- delay line specs -----------------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("spec", [
    QueueSpec(num=1, delay_ms=20),
    QueueSpec(num=7, delay_ms=12.5, jitter_ms=2.25, loss_pct=0.1, maxlen=2666),
    QueueSpec(num=65535, delay_ms=0, jitter_ms=0, loss_pct=100, maxlen=1),
])
def test_queuespec_roundtrip(spec):
    text = spec.format()
    assert QueueSpec.parse(text) == spec
    assert text.count(":") == 4


@pytest.mark.unit
def test_queuespec_format_text():
    assert QueueSpec(num=3, delay_ms=20.0, jitter_ms=0.0, loss_pct=0.5, maxlen=1024).format() == \
        "3:20:0:0.5:1024"


@pytest.mark.unit
@pytest.mark.parametrize("text", ["1:20:0:0", "1:20:0:0:10:9", "x:20:0:0:10", "1:a:0:0:10", ""])
def test_queuespec_parse_rejects(text):
    with pytest.raises(ValueError):
        QueueSpec.parse(text)


# ---- ping output ----------------------------------------------------------------------------
PING_OK = """PING 10.2.0.1 (10.2.0.1) 56(84) bytes of data.
64 bytes from 10.2.0.1: icmp_seq=1 ttl=62 time=10.5 ms
64 bytes from 10.2.0.1: icmp_seq=3 ttl=62 time=10.2 ms
64 bytes from 10.2.0.1: icmp_seq=2 ttl=62 time=10.3 ms

--- 10.2.0.1 ping statistics ---
4 packets transmitted, 3 received, 25% packet loss, time 301ms
rtt min/avg/max/mdev = 10.204/10.333/10.536/0.136 ms
"""

PING_NONE = """PING 10.2.0.1 (10.2.0.1) 56(84) bytes of data.

--- 10.2.0.1 ping statistics ---
3 packets transmitted, 0 received, 100% packet loss, time 2030ms

"""


@pytest.mark.unit
def test_parse_ping_summary():
    r = ping.parse_ping(PING_OK)
    assert (r.sent, r.received) == (4, 3)
    assert (r.min_ms, r.avg_ms, r.max_ms, r.mdev_ms) == (10.204, 10.333, 10.536, 0.136)
    assert r.samples_ms == (10.5, 10.3, 10.2)  # in icmp_seq order
    assert r.loss_pct == pytest.approx(25.0)


@pytest.mark.unit
def test_parse_ping_no_replies():
    with pytest.raises(ValueError, match="no replies"):
        ping.parse_ping(PING_NONE)


@pytest.mark.unit
def test_parse_ping_garbage():
    with pytest.raises(ValueError):
        ping.parse_ping("ping: connect: Network is unreachable\n")


@pytest.mark.unit
def test_ping_argv():
    assert ping.ping_argv("10.1.0.2", 5, 0.05) == ["ping", "-n", "-c", "5", "-i", "0.05", "10.1.0.2"]


# ---- iperf3 output --------------------------------------------------------------------------
def interval(start: float, seconds: float, nbytes: int, omitted: bool = False) -> dict:
    return {"sum": {"start": start, "end": start + seconds, "seconds": seconds, "bytes": nbytes,
                    "bits_per_second": nbytes * 8 / seconds, "omitted": omitted}}


def iperf_doc(server_intervals: list[dict], **extra) -> dict:
    doc = {
        "start": {"test_start": {"num_streams": 2}},
        "intervals": [],
        "end": {"sum_sent": {"bits_per_second": 21e6, "retransmits": 7},
                "sum_received": {"bits_per_second": 25e6}},
        "server_output_json": {"intervals": server_intervals},
    }
    doc.update(extra)
    return doc


@pytest.mark.unit
def test_parse_iperf_steady_goodput_from_server_intervals():
    ivs = [interval(0, 1, 5_000_000), interval(1, 1, 2_500_000), interval(2, 1, 2_400_000),
           interval(3, 1, 2_200_000), interval(4, 0.2, 900_000)]   # the tail is < 0.5 s: left out
    text = "warning: something\n" + json.dumps(iperf_doc(ivs), indent=1)
    r = iperf.parse_iperf(text)
    assert r.received_mbit == pytest.approx((2_400_000 + 2_200_000) * 8 / 2 / 1e6)
    assert r.seconds == pytest.approx(2.0)
    assert r.streams == 2 and r.retransmits == 7
    assert r.sent_mbit == pytest.approx(21.0)
    assert r.intervals_mbit == (40.0, 20.0, 19.2, 17.6, 36.0)


@pytest.mark.unit
def test_parse_iperf_skips_omitted_intervals():
    ivs = [interval(0, 1, 9_000_000, omitted=True), interval(2, 1, 1_000_000),
           interval(3, 1, 3_000_000)]
    r = iperf.parse_iperf(json.dumps(iperf_doc(ivs)))
    assert r.received_mbit == pytest.approx(16.0)
    assert r.intervals_mbit == (8.0, 24.0)


@pytest.mark.unit
def test_parse_iperf_steady_from():
    ivs = [interval(0, 1, 1_000_000), interval(1, 1, 2_000_000), interval(2, 1, 3_000_000)]
    assert iperf.parse_iperf(json.dumps(iperf_doc(ivs)), steady_from_s=1.0).received_mbit == \
        pytest.approx(20.0)


@pytest.mark.unit
def test_steady_cut_leaves_two_whole_intervals():
    # client_argv's -t is seconds + 1 s omitted; the receiver's clock restarts after the omit,
    # so its intervals run to seconds + 1: the cut leaves two whole ones, never slow start's.
    for seconds, cut in [(2, 1.0), (2.5, 1.5), (3, 2.0), (6, 2.0)]:
        assert iperf.steady_cut_s(seconds) == cut
        assert seconds + 1 - cut >= 2


@pytest.mark.unit
def test_parse_iperf_error_key():
    with pytest.raises(iperf.IperfError, match="unable to connect"):
        iperf.parse_iperf(json.dumps({"start": {}, "intervals": [], "end": {},
                                      "error": "unable to connect to server: Connection refused"}))


@pytest.mark.unit
def test_parse_iperf_server_error_key():
    doc = iperf_doc([interval(2, 1, 1)])
    doc["server_output_json"] = {"error": "the client has terminated"}
    with pytest.raises(iperf.IperfError, match="server: the client has terminated"):
        iperf.parse_iperf(json.dumps(doc))


@pytest.mark.unit
def test_parse_iperf_no_json():
    with pytest.raises(iperf.IperfError, match="no JSON"):
        iperf.parse_iperf("iperf3: error - unable to connect\n")


@pytest.mark.unit
def test_parse_iperf_too_short():
    # What a late interval timer leaves: nothing whole past the cut. The error lists them.
    ivs = [interval(0, 1, 1), interval(1, 1.6, 1), interval(2.6, 0.4, 1)]
    with pytest.raises(iperf.IperfError,
                       match=r"after 2 s \(its intervals, start\+seconds: 0.00\+1.00, 1.00\+1.60, "
                             r"2.60\+0.40\)"):
        iperf.parse_iperf(json.dumps(iperf_doc(ivs)))


@pytest.mark.unit
def test_iperf_client_argv():
    argv = iperf.client_argv("10.2.0.1", 5202, seconds=2, streams=4, rate_mbit=40)
    assert argv[:4] == ["iperf3", "-c", "10.2.0.1", "-p"]
    assert argv[argv.index("-t") + 1] == "3" and argv[argv.index("-O") + 1] == "1"
    assert argv[argv.index("-P") + 1] == "4" and "--get-server-output" in argv
    assert argv[argv.index("--fq-rate") + 1] == "10000000"
    assert iperf.server_argv(5202) == ["iperf3", "-s", "-1", "-J", "-p", "5202"]


@pytest.mark.unit
def test_listening_unknown_pid():
    assert iperf.listening(2**22 + 12345, 5201) is False


# ---- time_scale, congestion_control -----------------------------------------------------------
@pytest.mark.unit
def test_time_scale_dilates_delays_and_rates_but_not_bytes():
    data = dict(TRIANGLE, time_scale=10)
    data["dcs"] = [dict(d, rate_mbit=1000) for d in data["dcs"]]
    data["wan"] = [dict(w, jitter_ms=1) for w in data["wan"]]
    sc = parse_scenario(data)
    em = sc.emulated()
    assert sc.time_scale == 10 and em.time_scale == 10
    for w, e in zip(sc.wan, em.wan):
        assert (e.delay_ms, e.jitter_ms, e.rate_mbit) == (w.delay_ms * 10, 10, w.rate_mbit / 10)
        assert e.queue_bytes == w.queue_bytes and e.bdp_bytes == w.bdp_bytes  # bytes kept
    assert [d.rate_mbit for d in em.dcs] == [100] * 3
    plain = parse_scenario(TRIANGLE)                  # T = 1: the same values, its own type
    assert isinstance(plain.emulated(), EmulatedScenario) and not isinstance(plain, EmulatedScenario)
    assert all(getattr(plain.emulated(), f) == getattr(plain, f) for f in ("wan", "dcs", "name"))
    assert em.emulated() is em                         # emulating twice never dilates twice
    with pytest.raises(TypeError, match="pass scenario.emulated"):
        make_plan(plain)
    with pytest.raises(ScenarioError, match="^time_scale: 0.5 is not a valid time_scale.*a number 1..100 or auto"):
        parse_scenario(dict(TRIANGLE, time_scale=0.5))


@pytest.mark.unit
def test_metrics_in_real_time_divide_times_and_multiply_rates():
    from testbed.rules.figures import in_real_time

    m = {"iteration_time_s": 20.0, "tokens_per_s": 100.0, "model_tokens_per_s": 10.0,
         "bubble_fraction": 0.5, "stages": [{"compute_s": 10.0, "forward_ms": 40.0,
                                              "backward_ms": 80.0}],
         "communication": {"SEND_F": {"count": 2, "bytes": 5, "total_s": 4.0}},
         "compute_only": {"iteration_time_s": 10.0}}
    out = in_real_time(m, 10.0)
    assert (out["iteration_time_s"], out["tokens_per_s"], out["model_tokens_per_s"]) == (2, 1000, 100)
    assert out["bubble_fraction"] == 0.5 and out["compute_only"]["iteration_time_s"] == 1.0
    assert out["stages"][0] == {"compute_s": 1.0, "forward_ms": 4.0, "backward_ms": 8.0}
    assert out["communication"]["SEND_F"] == {"count": 2, "bytes": 5, "total_s": 0.4}
    assert out["time_scale"] == 10.0


@pytest.mark.unit
@pytest.mark.parametrize("cc", ["cubic", "reno", "bbr"])
def test_congestion_control_field(cc):
    assert parse_scenario(dict(TRIANGLE, congestion_control=cc)).congestion_control == cc
    assert parse_scenario(TRIANGLE).congestion_control == "cubic"   # the Linux default


@pytest.mark.unit
def test_congestion_control_field_refuses_unknown():
    with pytest.raises(ScenarioError, match="^congestion_control: 'vegas' is not one of"):
        parse_scenario(dict(TRIANGLE, congestion_control="vegas"))


@pytest.mark.unit
def test_launch_dilates_holds_and_passes_congestion_control(tmp_path):
    from testbed.spec.training import TrainConfig
    from testbed.plans.workers import HostInfo, WorkerSetup, plan_workers
    from testbed.spec.timescale import TimeScale

    sc = load_scenario(REPO_ROOT / "topologies" / "two_dc.yaml")
    cfg = TrainConfig.from_dict(sc.training)
    hosts = [HostInfo(name=n, ip=f"10.0.0.{i}", dc=n.split("-")[0])
             for i, n in enumerate(sc.host_names(), 1)]
    one = plan_workers(cfg, hosts, tmp_path, WorkerSetup(scale=100))
    ten = plan_workers(cfg, hosts, tmp_path, WorkerSetup(scale=100, time_scale=TimeScale(10),
                                                         congestion_control="bbr"))
    for a, b in zip(one, ten):
        assert b.hold_forward_ms == pytest.approx(10 * a.hold_forward_ms) and a.hold_forward_ms > 0
        assert b.hold_backward_ms == pytest.approx(10 * a.hold_backward_ms)
        assert (b.pad_bytes, b.allreduce_pad_bytes) == (a.pad_bytes, a.allreduce_pad_bytes)
        assert (a.congestion_control, b.congestion_control) == (None, "bbr")


@pytest.mark.unit
def test_host_sysctls_real_server_buffers_at_every_scale_and_dilated_rto_min():
    from testbed.emulation.network import host_tcp_sysctls

    one = host_tcp_sysctls(1.0)
    assert one["net.ipv4.tcp_rmem"].endswith(" 6291456")       # a real server's, not 16 MiB
    assert host_tcp_sysctls(100.0)["net.ipv4.tcp_rmem"].endswith(" 62914")
    assert "net.ipv4.tcp_rto_min_us" not in one
    assert host_tcp_sysctls(100.0, TimeScale(10.0))["net.ipv4.tcp_rto_min_us"] == "2000000"


@pytest.mark.unit
def test_bottleneck_is_the_lowest_rate_on_the_routed_path():
    from testbed.plans.systems import arrival_bounds_hold, host_path_rate_mbit as bottleneck_mbit
    data = {"name": "line", "dcs": [{"name": "a", "hosts": 1, "rate_mbit": 1000},
                                     {"name": "b", "hosts": 1},
                                     {"name": "c", "hosts": 1, "rate_mbit": 40}],
            "wan": [{"between": ["a", "b"], "delay_ms": 10, "rate_mbit": 100},
                    {"between": ["b", "c"], "delay_ms": 10, "rate_mbit": 50}],
            "time_scale": 4}
    sc = parse_scenario(data)
    assert bottleneck_mbit(sc, "a", "b") == 100          # a's host link is faster
    assert bottleneck_mbit(sc, "a", "c") == 40           # via b: 100, 50, then c's 40
    assert bottleneck_mbit(sc, "a", "a") == 1000         # one DC: its host links
    assert bottleneck_mbit(sc, "b", "b") is None         # unshaped veths
    assert bottleneck_mbit(sc.emulated(), "a", "c") == 10   # what the network shapes (/4)
    # where bytes can come faster than the configured rates, there is no arrival bound
    assert arrival_bounds_hold(sc) is None
    data["wan"][1]["jitter_ms"] = 2
    assert arrival_bounds_hold(parse_scenario(data)) == "jitter on b-c"
    data["wan"][1]["jitter_ms"] = 0
    data["faults"] = [{"kind": "rate", "link": ["a", "b"], "at_s": 1, "rate_mbit": 500}]
    assert arrival_bounds_hold(parse_scenario(data)) == "rate faults"
