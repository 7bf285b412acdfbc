"""Scenario files read as strict YAML: one document of plain mappings, lists and scalars.

ruamel.yaml (pure Python, its safe loader) rather than PyYAML, for three reasons: it reads
YAML 1.2, where `no`, `on` and `off` are strings (a DC named `no` stays `no`) and `1e2` is a
number; it refuses a key written twice, naming the key and its line, where PyYAML keeps the
last silently; and its errors carry the line. On top of it this module refuses anchors and
aliases (a few hundred bytes of nested aliases expand to gigabytes) and caps nesting depth;
`testbed.spec.inputfile` caps the size and reads only regular files. Every bad file is one
ScenarioError line. `dump_yaml` writes what the runs record (scenario.resolved.yaml, a sweep's
points) so that it reads back the same.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.composer import Composer, MaxDepthExceededError
from ruamel.yaml.constructor import DuplicateKeyError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.events import AliasEvent

from testbed.spec.errors import ScenarioError, shown
from testbed.spec.inputfile import read_text

MAX_FILE_BYTES = 1 << 18    # 256 KiB: the largest shipped scenario is under 3 KB, a generated 1,000-DC ring about 100 KB
MAX_DEPTH = 20              # the deepest shipped scenario nests 5 levels


class _NoAnchors(Composer):
    """ruamel's composer, refusing any anchor (&a) or alias (*a)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.parser.peek_event()
        if isinstance(event, AliasEvent) or event.anchor is not None:
            raise _Refused(event.start_mark.line, f"anchor or alias {shown(event.anchor)}",
                           "write each value out in full (anchors and aliases are not read)")
        return super().compose_node(parent, index)


class _Refused(Exception):
    def __init__(self, line: int, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.line, self.problem, self.fix = line, problem, fix


def load_yaml(path: str | Path, fix: str, field: str = "scenario") -> Any:
    """One YAML 1.2 document from a scenario file (module docstring); ScenarioError(field)
    naming the file and line on any problem (field: "cluster" for a cluster file)."""
    text = read_text(path, field, MAX_FILE_BYTES, fix)
    yaml = YAML(typ="safe", pure=True)
    yaml.Composer = _NoAnchors
    yaml.allow_duplicate_keys = False
    yaml.max_depth = MAX_DEPTH
    name = repr(str(path))
    try:
        return yaml.load(text)
    except _Refused as exc:
        raise ScenarioError(field, f"{name} line {exc.line + 1}: {exc.problem}",
                            exc.fix) from None
    except DuplicateKeyError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        key = re.search(r'duplicate key "(.*?)" with value', exc.problem or "")
        raise ScenarioError(field, f"{name} line {line}: key "
                            f"{shown(key.group(1)) if key else '?'} appears twice in one mapping",
                            "keep one of them") from None
    except MaxDepthExceededError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 0
        raise ScenarioError(field, f"{name} line {line}: nested deeper than {MAX_DEPTH} "
                            "levels", "flatten it") from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}" if mark else ""
        problem = _first_line(exc.problem or exc.context)
        raise ScenarioError(field, f"{name} is not valid YAML{where}: {problem}",
                            "fix the syntax") from None
    except ValueError as exc:   # an integer of over 4300 digits, a date like 2024-13-01
        raise ScenarioError(field, f"{name} holds a value that cannot be read "
                            f"({_first_line(str(exc))[:60]})", "correct or quote it") from None
    except TypeError:           # a mapping key that is itself a mapping (? {a: 1} : x)
        raise ScenarioError(field, f"{name} has a key that is a mapping",
                            "use plain names as keys") from None
    except (YAMLError, RecursionError) as exc:
        raise ScenarioError(field, f"{name} is not valid YAML: "
                            f"{_first_line(str(exc))}", "fix the syntax") from None


def dump_yaml(data: Any) -> str:
    """data as YAML 1.2 text that load_yaml reads back as data: keys in their order, a string
    that would read as another type quoted (PyYAML's 1.1 dumper leaves `1e2` bare, which 1.2
    reads as a number)."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.representer.sort_base_mapping_type_on_output = False
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0][:100] if lines else "?"
