"""`plan` at any size: replicas, pipelines and hosts written as ranges (testbed.spec.ranges) that
cover exactly what `--full` lists; the JSON keeps every host; a Poisson load too large to draw
gets its expected counts; `validate -q` leaves out the route lines but still validates."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.cli.main import main
from testbed.cli.planview import STEPS_NOTE, plan_command, replica_ranges
from testbed.features.bubbletea.plan import PLAN_DRAW_LIMIT, expected_requests, make_requests
from testbed.spec.ranges import expand_hosts, expand_numbers, host_list, number_ranges
from testbed.spec.scenario import parse_scenario

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PIECE = re.compile(r"r(\S+) (\S+) \(([a-z0-9]+)\)")
STAGE = re.compile(r"^  stage (\d+): (.*)$")
ROUTE = re.compile(r"^  s(\d+)->s\d+ pipelines (\S+): (.*)$")


def uneven(tmp_path: Path, **training) -> str:
    """DCs of 6 and 8 hosts under P=2 x D=7: scenario-order splits stage 0 over both DCs."""
    data = yaml.safe_load((REPO / "topologies" / "two_dc.yaml").read_text())
    data["dcs"] = [{"name": "a", "hosts": 6}, {"name": "b", "hosts": 8}]
    data["wan"] = [{"between": ["a", "b"], "delay_ms": 20, "rate_mbit": 100}]
    data["training"].update(stages=2, replicas=7, **training)
    path = tmp_path / "uneven.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def placed(text: str) -> dict[str, set[tuple[int, int, str, str]]]:
    """{system: {(stage, replica, host, dc)}} read from plan's text, summarised or full."""
    out: dict[str, set] = {}
    system = None
    for line in text.splitlines():
        if line and not line.startswith((" ", "(")) and ": placement " in line:
            system = line.split(":")[0]
            out[system] = set()
        m = STAGE.match(line)
        if m:
            for piece in PIECE.finditer(m.group(2)):
                reps, hosts = expand_numbers(piece.group(1)), expand_hosts(piece.group(2))
                assert len(reps) == len(hosts), piece.group(0)
                before = len(out[system])
                out[system] |= {(int(m.group(1)), r, h, piece.group(3)) for r, h in zip(reps, hosts)}
                assert len(out[system]) == before + len(reps), f"{piece.group(0)} repeats"
    return out


def routed(text: str) -> dict[str, list[tuple[int, int, str]]]:
    """{system: sorted (boundary, pipeline, where)} read from plan's route lines."""
    out: dict[str, list] = {}
    system = None
    for line in text.splitlines():
        if ": placement " in line and not line.startswith(" "):
            system = line.split(":")[0]
            out[system] = []
        m = ROUTE.match(line)
        if m:
            out[system] += [(int(m.group(1)), p, m.group(3)) for p in expand_numbers(m.group(2))]
    return {k: sorted(v) for k, v in out.items()}


def test_uneven_split_over_dcs_shows_the_right_ranges(tmp_path):
    text = plan_command(uneven(tmp_path), ["baseline", "dp-across-dcs"])
    lines = text.splitlines()
    # scenario-order: s0r0..s0r5 fill a, s0r6 and all of stage 1 go to b
    assert "  stage 0: r0-5 a-h[1-6] (a), r6 b-h1 (b)" in lines
    assert "  stage 1: r0-6 b-h[2-8] (b)" in lines
    assert any(line.startswith("  s0->s1 pipelines 0-5: a->b over a->b") for line in lines)
    assert "  s0->s1 pipelines 6: inside b" in lines
    # dp-across-dcs: pipelines alternate a, b, a, b, ...; a fills after 3, so r6 is in b
    assert "  stage 0: r0-4/2 a-h[1-5/2] (a), r1-5/2 b-h[1-5/2] (b), r6 b-h7 (b)" in lines
    assert "  stage 1: r0-4/2 a-h[2-6/2] (a), r1-5/2 b-h[2-6/2] (b), r6 b-h8 (b)" in lines
    assert ("  all-reduce over the WAN: stages 0-1 (a, b) (a flat ring, one connection a hop)"
            in lines)
    assert lines[1] == STEPS_NOTE       # said once, as there are stepped ranges
    assert STEPS_NOTE not in plan_command(uneven(tmp_path), ["baseline"])


PINNED = [["a-h6", "a-h5", "a-h1", "a-h2", "a-h3", "b-h8", "b-h1"],     # hosts in no order
          ["b-h2", "b-h3", "b-h4", "b-h6", "b-h5", "b-h7", "a-h4"]]


@pytest.mark.parametrize("scenario,systems", [
    ("uneven", ["baseline", "dp-across-dcs"]),
    ("pinned", ["baseline", "temporal"]),
    ("topologies/paper/gpt70b_3dc.yaml", ["baseline", "dp-across-dcs"]),   # 3 DCs, 16 x 128
])
def test_ranges_cover_exactly_the_hosts_full_lists(tmp_path, scenario, systems):
    path = (uneven(tmp_path) if scenario == "uneven" else
            uneven(tmp_path, placement=PINNED) if scenario == "pinned" else str(REPO / scenario))
    short, full = plan_command(path, systems), plan_command(path, systems, full=True)
    if scenario.startswith("topologies"):
        assert len(short) * 5 < len(full)
    doc = json.loads(plan_command(path, systems, as_json=True))
    for name in systems:
        pl = doc["systems"][name]["placement"]
        every = {(s, r, h, pl["stage_dcs"][s][r]) for s, row in enumerate(pl["hosts"])
                 for r, h in enumerate(row)}
        assert placed(full)[name] == every          # --full lists every host
        assert placed(short)[name] == every         # and the ranges cover exactly those
        assert routed(short)[name] == routed(full)[name]
        assert len(routed(full)[name]) == (len(pl["hosts"]) - 1) * len(pl["hosts"][0])


def test_json_keeps_every_host_and_the_order_in_messages():
    path = str(REPO / "topologies" / "atlas_paper.yaml")
    short = json.loads(plan_command(path, ["atlas"], as_json=True))["systems"]["atlas"]
    full = json.loads(plan_command(path, ["atlas"], as_json=True, full=True))["systems"]["atlas"]
    assert short["placement"] == full["placement"]
    links = [lk for lk in full["slot_plan"]["links"] if lk["order"]]
    assert links
    for lk, lk_short in zip(full["slot_plan"]["links"], short["slot_plan"]["links"]):
        assert "order" not in lk_short and lk_short["messages"] == lk["messages"]
        expanded = [{"boundary": m["boundary"], "kind": m["kind"], "micro_batch": m["micro_batch"],
                     "pipeline": p, "slot_ms": lk["crossings"][m["crossing"]]["slot_ms"]}
                    for m in lk["messages"] for p in lk["crossings"][m["crossing"]]["pipelines"]]
        assert expanded == lk["order"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=40))
def test_number_ranges_read_back(values):
    assert (expand_numbers(number_ranges(values)) if values else []) == values


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_replica_ranges_read_back_for_any_host_grid(data):
    d = data.draw(st.integers(1, 30))
    names = [f"{dc}-{kind}{n}" for dc in ("a", "b1") for kind in "hd" for n in range(1, 25)]
    hosts = data.draw(st.lists(st.sampled_from(names + ["x-h07", "gw"]), min_size=d, max_size=d))
    dcs = [h.split("-")[0] for h in hosts]
    got = []
    for piece in replica_ranges(hosts, dcs):
        m = PIECE.fullmatch(piece)
        assert m, piece
        got += [(r, h, m.group(3)) for r, h in zip(expand_numbers(m.group(1)),
                                                   expand_hosts(m.group(2)), strict=True)]
    assert sorted(got) == sorted(zip(range(d), hosts, dcs))
    assert expand_hosts(host_list(hosts)) == hosts


def test_a_load_too_large_to_draw_gets_its_expected_counts(tmp_path):
    text = plan_command(str(REPO / "topologies" / "paper" / "gpt7b_2dc.yaml"), ["atlas+bubbletea"])
    load = [line for line in text.splitlines() if line.startswith("  bubbletea load:")]
    assert load and load[0].startswith("  bubbletea load: about 1800000 requests")   # 30000/s x 60 s
    # the expectation against a drawn load small enough to draw (within 4 standard deviations)
    sc = parse_scenario(dict(yaml.safe_load((REPO / "topologies" / "paper" / "gpt7b_2dc.yaml")
                                            .read_text()), predict_only=True))
    cfg = sc.bubbletea
    from dataclasses import replace
    small = replace(cfg, load=replace(cfg.load, poisson_per_s=500.0, window_s=40.0))
    assert 500 * 40 <= PLAN_DRAW_LIMIT
    dcs = {"us": 3, "eu": 1}
    drawn, expected = make_requests(small, "profile", dcs), expected_requests(small, "profile", dcs)
    n = 500 * 40
    assert expected["requests"] == n and expected["kept"] == sum(expected["per_dc"].values())
    assert abs(drawn["requests"] - n) < 4 * math.sqrt(n)
    for dc, share in (("us", 0.75), ("eu", 0.25)):
        assert abs(len(drawn["per_dc"][dc]) - expected["per_dc"][dc]) < 4 * math.sqrt(n * share)
    assert abs(drawn["truncated"] - expected["truncated"]) <= 4 * math.sqrt(expected["truncated"]) + 2


def test_validate_quiet_leaves_out_the_routes_but_still_validates(tmp_path, capsys):
    good = str(REPO / "topologies" / "three_dc.yaml")
    assert main(["validate", good]) == 0
    loud = capsys.readouterr().out.splitlines()
    assert main(["validate", "-q", good]) == 0
    quiet = capsys.readouterr().out.splitlines()
    assert quiet == loud[:1] and quiet[0].startswith(f"{good}: ok (3 DCs")
    assert any("routes (" in line for line in loud) and len(loud) > 3
    data = yaml.safe_load(Path(good).read_text())
    data["wan"][0]["delay_ms"] = -5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    assert main(["validate", "-q", good, str(bad)]) == 2
    out = capsys.readouterr()
    assert out.out.splitlines() == quiet
    assert out.err.startswith(f"error: {bad}: wan[0].delay_ms") and len(out.err.splitlines()) == 1
