"""Every measured figure quoted in README.md and docs/ carries its date, comes from a command the
suite checks, or is marked as an input (the rule: tests/doc_figures.py; docs/testing.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_figures import blocks, figures, undated, valid_checked_by

REPO = Path(__file__).resolve().parent.parent


def scanned_files() -> list[Path]:
    """README.md and docs/**/*.md but docs/notebook/ (its pages are dated by their names)."""
    docs = sorted(p for p in (REPO / "docs").rglob("*.md") if "notebook" not in p.parts)
    return [REPO / "README.md", *docs]


@pytest.mark.unit
def test_the_scanner_sees_figures_and_not_settings_in_code():
    assert figures("took 2.664 s, 12302 tokens/s, bubble 79.7%, 42x, x1.03, 3.4 points") == [
        "2.664 s", "12302 tokens/s", "79.7%", "42x", "x1.03", "3.4 points"]
    assert figures("`delay_ms: 25`, [a link](x.md#a-20-ms-link) <!-- 30 ms -->") == []
    assert figures("P = 2 stages x D = 2, 1F1B, 64 MiB, issue 37, h200") == []


@pytest.mark.unit
def test_an_undated_figure_fails_and_a_dated_one_passes():
    bad = "# Runs\n\nAtlas ran 42x faster than the baseline.\n"
    assert [b.start for b in undated(bad)] == [3]
    assert undated("# Runs\n\nAtlas ran 42x faster (measured 2026-12-07 at 38ed202).\n") == []
    assert undated("# Runs (2026-12-07)\n\nIntro.\n\nAtlas ran 42x faster.\n") == []


@pytest.mark.unit
def test_nearby_is_the_block_its_caption_its_heading_or_its_section_lead():
    table = "| system | s |\n|---|---|\n| atlas | 0.429 s |\n"
    assert len(undated(f"# T\n\nIntro.\n\nThe table:\n\n{table}")) == 1
    assert undated(f"# T\n\nIntro.\n\nMeasured 2026-12-01 at fa257b3:\n\n{table}") == []
    assert undated(f"# T\n\nRun on 2026-12-01.\n\nText.\n\n{table}") == []       # the lead
    # a date elsewhere in the section (not the lead, not the caption) does not count
    assert len(undated(f"# T\n\nIntro.\n\nOn 2026-12-01 it ran.\n\nText.\n\n{table}")) == 1
    # nor one under an earlier heading
    assert len(undated("# A (2026-12-01)\n\n## B\n\nIntro.\n\nAtlas ran 42x.\n")) == 1
    # each top-level list item is its own block
    items = "# T\n\nIntro.\n\n- a run: 2.5 s (2026-12-01)\n- another: 3.1 s\n"
    assert [b.lines[0] for b in undated(items)] == ["- another: 3.1 s"]
    fence = "# T\n\nIntro.\n\nA run at 38ed202 on 2026-12-07:\n\n```text\niteration 2.664 s\n```\n"
    assert undated(fence) == []
    assert len(undated(fence.replace(" on 2026-12-07", ""))) == 1


@pytest.mark.unit
def test_generated_and_input_blocks_pass():
    assert undated("# T\n\nIntro.\n\n<!-- reproduce: training.md -->\n| a | 2.5 s |\n"
                   "<!-- /reproduce -->\n") == []
    assert undated("# T\n\nIntro.\n\n<!-- figures: inputs -->\nOne link, 20 ms and 100 Mbit/s.\n") == []
    checked = "# T\n\nIntro.\n\n<!-- figures: checked by tests/test_readme.py -->\n```\n2.684 s\n```\n"
    assert len(undated(checked)) == 1
    assert undated(checked, {"checked by tests/test_readme.py"}) == []
    # a marker applies to the one block right below it
    assert len(undated("# T\n\nIntro.\n\n<!-- figures: inputs -->\nA 20 ms link.\n\nRan 2.5 s.\n")) == 1


@pytest.mark.unit
def test_checked_by_markers_must_name_a_test_that_reads_the_file():
    ok, bad = valid_checked_by("<!-- figures: checked by tests/test_readme.py -->", "README.md", REPO)
    assert ok == {"checked by tests/test_readme.py"} and bad == []
    _, bad = valid_checked_by("<!-- figures: checked by tests/test_readme.py -->", "nosuchpage.md", REPO)
    assert bad and "never names nosuchpage.md" in bad[0]
    _, bad = valid_checked_by("<!-- figures: close enough -->", "README.md", REPO)
    assert bad and "unknown marker" in bad[0]


@pytest.mark.unit
@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_quoted_figures_are_dated_checked_or_inputs(path):
    text = path.read_text()
    checked_by, bad = valid_checked_by(text, path.name, REPO)
    assert not bad, f"{path.relative_to(REPO)}: " + "; ".join(bad)
    found = undated(text, checked_by)
    assert not found, (
        f"{path.relative_to(REPO)}: figures with no date nearby (docs/testing.md, 'Figures in the "
        "docs'): put the date and commit of the measurement in the paragraph, e.g. '(measured "
        "2026-12-07 at 38ed202)', or in a table's caption line, or mark configured values with "
        "<!-- figures: inputs --> on the line above:\n" + "\n".join(
            f"  line {b.start}: {', '.join(figures(b.text)[:6])}: {b.lines[0][:80]}" for b in found))


@pytest.mark.unit
def test_the_scan_covers_the_docs():
    names = {str(p.relative_to(REPO)) for p in scanned_files()}
    assert {"README.md", "docs/model.md", "docs/experiments.md"} <= names
    assert not any(n.startswith("docs/notebook/") for n in names)
    assert sum(len(blocks(p.read_text())) for p in scanned_files()) > 400
