"""The committed reference runs (results/reference/, made by scripts/make_reference.py):
`reproduce` on them gives the committed tables byte for byte, and docs/experiments.md's tables
are those tables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "results" / "reference"
TABLES = ("training.md", "training.csv", "bubbletea.md", "bubbletea.csv")


def reference_runs() -> list[str]:
    return [str(p.relative_to(REPO)) for p in sorted(REFERENCE.iterdir())
            if p.is_dir() and p.name != "tables"]


def test_reference_runs_are_shipped():
    names = [Path(r).name for r in reference_runs()]
    for scenario in ("two_dc", "atlas_bubbletea", "atlas_paper", "sweep_delay-sweep",
                     "sweep_bubbletea_rate-sweep", "paper_testbed", "sweep_paper_testbed-sweep"):
        assert any(n.startswith(scenario + "-") for n in names), names


def test_reproduce_gives_the_committed_tables(tmp_path, monkeypatch, capsys):
    from run_testbed import main
    monkeypatch.chdir(REPO)
    assert main(["reproduce", *reference_runs(), "--out", str(tmp_path), "--no-figures"]) == 0
    for name in TABLES:
        assert (tmp_path / name).read_bytes() == (REFERENCE / "tables" / name).read_bytes(), name
    assert main(["reproduce", *reference_runs(), "--out", str(tmp_path / "again"),
                 "--no-figures"]) == 0
    for name in TABLES:
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / name).read_bytes()


def test_the_docs_tables_are_reproduce_s():
    readme = (REPO / "docs" / "experiments.md").read_text()
    for name in ("training.md", "bubbletea.md"):
        block = re.search(rf"<!-- reproduce: {re.escape(name)} -->\n(.*?)<!-- /reproduce -->",
                          readme, re.S)
        assert block, f"docs/experiments.md has no <!-- reproduce: {name} --> block"
        assert block.group(1) == (REFERENCE / "tables" / name).read_text(), (
            f"docs/experiments.md's {name} table differs from results/reference/tables/{name}: "
            "regenerate with scripts/make_reference.py or reproduce, and paste it")


def test_schema_1_and_its_schema_2_equivalent_give_the_same_tables(tmp_path):
    """A schema 1 run (a system's compute-only schedule under `predicted`) reproduces to the
    same bytes as the same run in schema 2 (`compute_only`), the references' own, and both
    load as schema 2."""
    import json
    import shutil

    from testbed.analysis.reproduce import SCHEMA_VERSION, load_runs, reproduce

    assert SCHEMA_VERSION == 2
    names = [p.name for p in sorted(REFERENCE.iterdir())
             if p.name.startswith(("atlas_paper-", "atlas_bubbletea-"))]
    assert len(names) == 2, names
    for version in (1, 2):
        for name in names:
            src, dst = REFERENCE / name, tmp_path / f"v{version}" / name
            dst.mkdir(parents=True)
            shutil.copy(src / "scenario.resolved.yaml", dst)
            doc = json.loads((src / "metrics.json").read_text())
            assert doc["schema_version"] == 2
            assert all("compute_only" in m and "predicted" not in m
                       for m in doc["systems"].values())
            if version == 1:        # as a schema 1 run wrote it
                doc["schema_version"] = 1
                doc["systems"] = {n: {("predicted" if k == "compute_only" else k): v
                                      for k, v in m.items()} for n, m in doc["systems"].items()}
            (dst / "metrics.json").write_text(json.dumps(doc))
    out = {}
    for version in (1, 2):
        folders = [str(tmp_path / f"v{version}" / n) for n in names]
        for run in load_runs(folders):
            assert run.metrics["schema_version"] == 2
            for m in run.metrics["systems"].values():
                assert "predicted" not in m and m["compute_only"]["iteration_time_s"] > 0
        text, written = reproduce(folders, tmp_path / f"out{version}", figures=False)
        out[version] = (text, {p.name: p.read_bytes() for p in written})
    assert set(out[1][1]) == {"training.md", "training.csv", "bubbletea.md", "bubbletea.csv"}
    assert out[1] == out[2]
