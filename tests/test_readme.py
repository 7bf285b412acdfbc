"""The README stays short, the links in it and in docs/ point at files that exist, and its no-root
quick start runs as written.

The quick start is the ```sh block right after `<!-- quickstart -->`: every line is a command run
from the repository root with this Python in place of `.venv/bin/python` (and a temporary folder
in place of `--out /tmp/reproduced`); each must exit 0. The ```text block after
`<!-- quickstart-output -->` shows some of what they print: `$ COMMAND` lines, each followed by
lines its output must contain (whitespace collapsed, the model's own run time "(0.05 s)" not
compared)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_LINES = 220
TIMEOUT_S = 60

FENCE_RE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE_RE = re.compile(r"`[^`\n]*`")
LINK_RE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING_RE = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


@pytest.mark.unit
def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; keep it within {MAX_LINES} (move detail to docs/)"


# --- links -----------------------------------------------------------------------------------

def markdown_files() -> list[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced blocks and inline code (a link there is not a link)."""
    return INLINE_CODE_RE.sub("", FENCE_RE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to
    '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for m in HEADING_RE.finditer(FENCE_RE.sub("", path.read_text())):
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK_RE.findall(prose(path.read_text()))
            if not re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", t)]       # no http:, mailto:, ...


@pytest.mark.unit
def test_the_link_check_sees_links_and_anchors():
    assert slug("Measured on a real H200 (`bench/bench_gpu_bubbletea.py`)") == \
        "measured-on-a-real-h200-benchbench_gpu_bubbleteapy"
    assert slug("`faults:` and `cross_traffic:`") == "faults-and-cross_traffic"
    assert LINK_RE.findall("see [a](docs/x.md#y) and ![b](c.svg) but `[d](e)`") == \
        ["docs/x.md#y", "c.svg", "e"]
    assert relative_links(README), "README.md has no relative links: the check sees none"
    assert "docs/run-flow.svg" in relative_links(README)


@pytest.mark.unit
@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path):
    bad = []
    for target in relative_links(path):
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.is_relative_to(REPO):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not bad, f"{path.relative_to(REPO)}: " + "; ".join(bad)


# --- the quick start -------------------------------------------------------------------------

def block_after(marker: str, lang: str) -> str:
    m = re.search(rf"<!-- {re.escape(marker)} -->\n```{lang}\n(.*?)^```", README.read_text(),
                  re.S | re.M)
    assert m, f"README.md has no ```{lang} block right after <!-- {marker} -->"
    return m.group(1)


def quickstart_commands() -> list[str]:
    return [line.strip() for line in block_after("quickstart", "sh").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def shown_outputs() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in block_after("quickstart-output", "text").splitlines():
        if line.startswith("$ "):
            current = line[2:].strip()
            out[current] = []
        elif line.strip():
            assert current is not None, f"output before any '$ command' line: {line!r}"
            out[current].append(line)
    return out


def normalized(line: str) -> str:
    line = re.sub(r"\(\d+(\.\d+)? s\)", "(_ s)", line)
    return " ".join(line.split())


def as_run(command: str, out_dir: Path) -> str:
    """The command as this test runs it: this Python for .venv/bin/python, out_dir for the
    README's scratch folder."""
    assert command.startswith(".venv/bin/python "), (
        f"{command!r}: quick-start commands start with .venv/bin/python")
    command = shlex.quote(sys.executable) + command[len(".venv/bin/python"):]
    return command.replace("--out /tmp/reproduced", f"--out {shlex.quote(str(out_dir))}")


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """Every quick-start command, run side by side: command -> (exit code, stdout + stderr)."""
    procs = {}
    for i, command in enumerate(quickstart_commands()):
        out_dir = tmp_path_factory.mktemp(f"quickstart{i}")
        procs[command] = subprocess.Popen(["bash", "-c", as_run(command, out_dir)], cwd=REPO,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True)
    results = {}
    for command, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            out += f"\n(killed after {TIMEOUT_S} s)"
        results[command] = (proc.returncode, out)
    return results


@pytest.mark.unit
def test_quickstart_needs_no_root():
    commands = quickstart_commands()
    assert commands, "the quick start lists no commands"
    for command in commands:
        assert "sudo" not in command.split(), command
        sub = command.split()[2] if len(command.split()) > 2 else ""
        assert sub in ("list", "show", "plan", "predict", "validate", "reproduce"), (
            f"{command!r}: not one of the commands that need no root")
        if sub == "reproduce":
            assert "--no-figures" in command, "reproduce without --no-figures needs matplotlib"


@pytest.mark.loopback
def test_quickstart_commands_exit_0(ran):
    failed = {c: out[-2000:] for c, (rc, out) in ran.items() if rc != 0}
    assert not failed, "\n\n".join(f"$ {c}\n{out}" for c, out in failed.items())


@pytest.mark.loopback
def test_quickstart_prints_what_the_readme_shows(ran):
    shown = shown_outputs()
    assert shown, "the quick-start output block shows nothing"
    for command, lines in shown.items():
        assert command in ran, f"{command!r} is shown but not in the quick-start commands"
        assert lines, f"{command!r} is shown with no output"
        got = {normalized(line) for line in ran[command][1].splitlines()}
        missing = [line for line in lines if normalized(line) not in got]
        assert not missing, (f"$ {command} no longer prints, as the README shows:\n"
                             + "\n".join(missing) + "\n--- it printed:\n" + ran[command][1])


@pytest.mark.loopback
def test_reproduce_in_the_quickstart_gives_the_reference_tables(ran):
    """The quick start's reproduce rebuilds exactly the tables the README shows."""
    command = next(c for c in quickstart_commands() if " reproduce " in c)
    out = ran[command][1]
    for name in ("training.md", "bubbletea.md"):
        table = (REPO / "results" / "reference" / "tables" / name).read_text()
        assert table.strip().splitlines()[2] in out, name
