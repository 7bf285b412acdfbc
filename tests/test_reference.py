"""The committed reference runs (results/reference/, made by scripts/make_reference.py):
`reproduce` on them gives the committed tables byte for byte, and the README's tables are those
tables."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "results" / "reference"
TABLES = ("training.md", "training.csv", "bubbletea.md", "bubbletea.csv")


def reference_runs() -> list[str]:
    return [str(p.relative_to(REPO)) for p in sorted(REFERENCE.iterdir())
            if p.is_dir() and p.name != "tables"]


def test_reference_runs_are_shipped():
    names = [Path(r).name for r in reference_runs()]
    for scenario in ("two_dc", "atlas_bubbletea", "atlas_paper", "sweep_delay-sweep",
                     "sweep_bubbletea_rate-sweep"):
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


def test_readme_tables_are_reproduce_s():
    readme = (REPO / "README.md").read_text()
    for name in ("training.md", "bubbletea.md"):
        block = re.search(rf"<!-- reproduce: {re.escape(name)} -->\n(.*?)<!-- /reproduce -->",
                          readme, re.S)
        assert block, f"README has no <!-- reproduce: {name} --> block"
        assert block.group(1) == (REFERENCE / "tables" / name).read_text(), (
            f"README's {name} table differs from results/reference/tables/{name}: regenerate "
            "with scripts/make_reference.py or reproduce, and paste it")
