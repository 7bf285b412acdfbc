"""Cluster files (testbed.spec.cluster, docs/cluster.md): servers, the default and a given
placement of DCs on servers, the WAN links that cross servers, and every bad file as one
ScenarioError line naming the field; `validate` and `plan` with --cluster, in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.spec.cluster import default_placement, load_cluster, place, scenario_placement
from testbed.spec.errors import ScenarioError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
ATLAS = str(ROOT / "topologies" / "atlas_paper.yaml")     # DCs eu, us, asia
TWO = {"servers": "  - {name: s1, address: 10.250.0.1, user: root}\n"
                  "  - {name: s2, address: host-2.example, user: geodc, port: 2222}\n"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def two(tmp_path: Path, extra: str = "") -> Path:
    return write(tmp_path, "servers:\n" + TWO["servers"] + extra)


def test_servers_load_with_defaults_and_mininet_params(tmp_path):
    (tmp_path / "id").write_text("k")
    (tmp_path / "kh").write_text("h")
    c = load_cluster(write(tmp_path, "servers:\n  - {name: a, address: 10.0.0.1, user: root, "
                                     "key: id, known_hosts: kh}\n"))
    s = c.servers[0]
    assert (s.port, s.key, s.known_hosts) == (22, str(tmp_path / "id"), str(tmp_path / "kh"))
    assert s.mininet_params == {"server": "a", "serverIP": "10.0.0.1", "user": "root"}
    assert "-i" in s.ssh_options and f"UserKnownHostsFile={tmp_path / 'kh'}" in s.ssh_options
    assert c.placement is None


def test_default_placement_is_contiguous_blocks_remainder_first():
    assert default_placement(list("abcde"), ["s1", "s2"]) == \
        {"a": "s1", "b": "s1", "c": "s1", "d": "s2", "e": "s2"}
    assert default_placement(list("ab"), ["s1", "s2", "s3"]) == {"a": "s1", "b": "s2"}
    assert default_placement(list("abcd"), ["s1"]) == dict.fromkeys("abcd", "s1")


def test_crossing_links_are_those_between_servers(tmp_path):
    c = load_cluster(two(tmp_path))
    p = place(c, ["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    assert p.dc_server == {"a": "s1", "b": "s1", "c": "s2", "d": "s2"}
    assert p.crossing == (("b", "c", "s1", "s2"), ("d", "a", "s2", "s1"))


def test_given_placement(tmp_path):
    c = load_cluster(two(tmp_path, "placement:\n  s1: [a, c]\n  s2: b\n"))
    p = place(c, ["a", "b", "c"], [("a", "b"), ("a", "c")])
    assert p.dc_server == {"a": "s1", "b": "s2", "c": "s1"} and not p.default
    assert p.crossing == (("a", "b", "s1", "s2"),)


@pytest.mark.parametrize("text, field", [
    ("[1, 2]", "cluster"),
    ("servers: []", "cluster.servers"),
    ("servers:\n  - {name: s1, address: 1.2.3.4}", "cluster.servers[0].user"),
    ("servers:\n  - {name: S1, address: 1.2.3.4, user: r}", "cluster.servers[0].name"),
    ("servers:\n  - {name: s1, address: 'a b', user: r}", "cluster.servers.s1.address"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r, port: 0}", "cluster.servers.s1.port"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r, key: nokey}", "cluster.servers.s1.key"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r, usr: x}", "cluster.servers[0].usr"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r}\n"
     "  - {name: s1, address: 1.2.3.5, user: r}", "cluster.servers"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r}\nplacement: {s9: [a]}",
     "cluster.placement.s9"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r}\nplacment: {}", "cluster.placment"),
    ("servers: [\n", "cluster"),
    ("servers:\n  - {name: s1, address: 'fe80::2%a;reboot', user: r}", "cluster.servers.s1.address"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r}\n"
     "  - {name: s2, address: 1.2.3.4, user: r}", "cluster.servers"),
    ("servers:\n  - {name: s1, address: 1.2.3.4, user: r, key: my key}", "cluster.servers.s1.key"),
])
def test_bad_files_name_the_field(tmp_path, text, field):
    with pytest.raises(ScenarioError) as err:
        load_cluster(write(tmp_path, text))
    assert err.value.field == field and "\n" not in str(err.value)


@pytest.mark.parametrize("placement, field, words", [
    ("  s1: [a, x]\n  s2: [b]\n", "cluster.placement.s1.x", "no such DC"),
    ("  s1: [a, b]\n  s2: [b]\n", "cluster.placement.s2", "also placed"),
    ("  s1: [a]\n", "cluster.placement", "'b' is on no server"),
])
def test_bad_placements(tmp_path, placement, field, words):
    c = load_cluster(two(tmp_path, "placement:\n" + placement))
    with pytest.raises(ScenarioError) as err:
        place(c, ["a", "b"], [("a", "b")])
    assert err.value.field == field and words in str(err.value)


def test_validate_and_plan_show_servers(tmp_path, capsys):
    path = str(two(tmp_path))
    assert main(["validate", ATLAS, "--cluster", path]) == 0
    out = capsys.readouterr().out
    assert "s1 (root@10.250.0.1:22): eu, us" in out and "us-asia: s1 <-> s2" in out
    assert main(["plan", ATLAS, "--cluster", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["dcs"] for s in doc["servers"]["servers"]] == [["eu", "us"], ["asia"]]
    assert {x["link"] for x in doc["servers"]["crossing_links"]} == {"us-asia", "eu-asia"}
    assert main(["plan", ATLAS, "--cluster", str(tmp_path / "none.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cluster: no file") and "\n" not in err


def test_a_scenario_with_faults_of_any_kind_is_refused_on_a_cluster(tmp_path):
    """Every fault kind the shipped scenarios use, refused by the placement (validate, run and
    calibrate all place a scenario before anything is made)."""
    from testbed.spec.scenario import load_scenario
    c = load_cluster(two(tmp_path))
    kinds = set()
    for path in sorted((ROOT / "topologies").rglob("*.yaml")):
        sc = load_scenario(path)
        if sc.faults and len(sc.dcs) >= 1:
            kinds |= {f.kind for f in sc.faults}
            with pytest.raises(ScenarioError) as err:
                scenario_placement(c, sc)
            assert err.value.field == "faults" and "across servers" in str(err.value)
    assert len(kinds) >= 2, kinds
