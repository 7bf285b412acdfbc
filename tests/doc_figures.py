"""Figures quoted in the docs carry their date, or come from a command the suite checks.

A measured figure written into prose drifts silently when the code changes (docs/testing.md,
"Figures in the docs"). This module finds the blocks of a markdown text that quote one and have
none of the three things that keep it honest; tests/test_doc_figures.py applies it to README.md
and docs/ (docs/notebook/ aside: its pages are dated by their file names).

- A **block** is a paragraph, a list item, a table or a fenced block: a run of lines outside
  fences that a blank line, a heading or a new top-level list item ends.
- A **figure** is a number with a unit (s, ms, us, ns, min, Mbit/s, Gbit/s, tokens/s, req/s, %,
  points) or a factor (17x, x1.03), outside inline code, link targets and HTML comments.
- A block that quotes one passes when any of these holds:
  (a) **dated**: a date (YYYY-MM-DD) is in the block, in its caption (the block right before
      it, when that ends in ':'), in the heading of the section it is in, or in that section's
      lead (its first block that is not a fenced one: a section that opens by dating what it
      reports);
  (b) **checked**: it lies between `<!-- reproduce: NAME -->` and `<!-- /reproduce -->`
      (scripts/make_reference.py writes those tables, tests/test_reference.py compares them), or
      the line right above it is `<!-- figures: checked by tests/test_X.py -->` (the test file
      must exist and name the markdown file);
  (c) **inputs**: the line right above it is `<!-- figures: inputs -->`: its figures are set,
      not measured (a scenario's settings, limits, tolerances, the paper's published figures).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

UNITS = r"(?:s|ms|us|µs|ns|min|[kMG]bit/s|tokens/s|req/s|requests/s|%|points?)"
FIGURE_RE = re.compile(rf"(?<![\w.])(?:\d[\d,]*(?:\.\d+)?[ ]?{UNITS}(?![\w/])"
                       rf"|\d+(?:\.\d+)?x(?!\w)|x\d+\.\d+(?!\w))")
DATE_RE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
FENCE_RE = re.compile(r"^\s*(```|~~~)")
HEADING_RE = re.compile(r"^#{1,6}\s")
ITEM_RE = re.compile(r"^(?:[-*+]|\d+\.)\s")
MARKER_RE = re.compile(r"^\s*<!--\s*figures:\s*(.*?)\s*-->\s*$")
REPRODUCE_OPEN_RE = re.compile(r"^\s*<!--\s*reproduce:.*-->\s*$")
REPRODUCE_CLOSE_RE = re.compile(r"^\s*<!--\s*/reproduce\s*-->\s*$")
COMMENT_RE = re.compile(r"^\s*<!--.*-->\s*$")
STRIP_RE = re.compile(r"`[^`\n]*`|<!--.*?-->|\]\([^)]*\)")


@dataclass
class Block:
    start: int                  # 1-based line number of its first line
    lines: list[str]
    heading: str                # the heading of the section it is in ('' before any)
    caption: str                # the block right before it when that ends in ':', else ''
    lead: str                   # the first unfenced block of its section ('' for that block)
    marker: str                 # the `<!-- figures: ... -->` right above it, else ''
    generated: bool             # inside a <!-- reproduce --> block

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def figures(text: str) -> list[str]:
    """The figures a text quotes, outside inline code, link targets and HTML comments."""
    return FIGURE_RE.findall(STRIP_RE.sub(" ", text))


def blocks(text: str) -> list[Block]:
    """The markdown text's blocks, in order, headings left out."""
    out: list[Block] = []
    heading = ""
    marker = ""
    generated = False
    current: list[str] = []
    start = 0
    previous: Block | None = None           # the block before the one being read
    lead = ""
    fence = ""

    def close() -> None:
        nonlocal current, marker, previous, lead
        if current:
            caption = previous.text if previous and previous.text.rstrip().endswith(":") else ""
            block = Block(start, current, heading, caption, lead, marker, generated)
            out.append(block)
            if not lead and not FENCE_RE.match(current[0]):
                lead = block.text
            previous = block
            marker = ""
        current = []

    for n, line in enumerate(text.splitlines(), 1):
        if fence:                                   # inside a fenced block: it is one block
            current.append(line)
            if line.strip().startswith(fence):
                fence = ""
                close()
            continue
        if m := FENCE_RE.match(line):
            close()
            fence, start, current = m.group(1), n, [line]
            continue
        if REPRODUCE_OPEN_RE.match(line) or REPRODUCE_CLOSE_RE.match(line):
            close()
            generated = bool(REPRODUCE_OPEN_RE.match(line))
            continue
        if m := MARKER_RE.match(line):
            close()
            marker = m.group(1)
            continue
        if COMMENT_RE.match(line):                  # another tool's marker: seen through
            continue
        if not line.strip():
            close()
            continue
        if HEADING_RE.match(line):
            close()
            heading, previous, marker, lead = line, None, "", ""
            continue
        if current and ITEM_RE.match(line):         # a new top-level list item
            close()
        if not current:
            start = n
        current.append(line)
    close()
    return out


def passes(block: Block, checked_by: set[str] = frozenset()) -> bool:
    """Whether a block with figures is dated, checked or marked as inputs. `checked_by`: the
    markers `checked by tests/...` found valid for this file."""
    if block.generated or block.marker == "inputs" or block.marker in checked_by:
        return True
    return any(DATE_RE.search(t) for t in (block.text, block.caption, block.heading, block.lead))


def undated(text: str, checked_by: set[str] = frozenset()) -> list[Block]:
    """The blocks that quote a figure and pass none of the three ways."""
    return [b for b in blocks(text) if figures(b.text) and not passes(b, checked_by)]


def valid_checked_by(text: str, name: str, repo: Path) -> tuple[set[str], list[str]]:
    """The `checked by tests/X.py` markers of a file that hold (the test file exists and names
    the markdown file `name`), and a line per marker that does not or is unknown."""
    ok: set[str] = set()
    bad: list[str] = []
    for line in text.splitlines():
        if not (m := MARKER_RE.match(line)) or m.group(1) == "inputs":
            continue
        kind = m.group(1)
        path = kind.removeprefix("checked by ").strip()
        if not kind.startswith("checked by ") or not re.fullmatch(r"tests/test_\w+\.py", path):
            bad.append(f"unknown marker <!-- figures: {kind} -->: "
                       "use 'inputs' or 'checked by tests/test_X.py'")
        elif not (repo / path).is_file() or name not in (repo / path).read_text():
            bad.append(f"<!-- figures: {kind} -->: {path} does not exist or never names {name}")
        else:
            ok.add(kind)
    return ok, bad
