"""Errors the testbed reports to the user as one clear line.

`ScenarioError` is bad input (a scenario file or a flag): it names the field, the value and the
fix. `TestbedError` is a failure while building or running (a tool missing, a delay line that
died). `run_testbed.py` prints either as one line and exits 2 (bad input) or 1 (run failure).
A value from a file goes into a message through `shown`, so that no message grows with its input.
"""

from __future__ import annotations

import difflib
import reprlib
from typing import Any, Iterable

MAX_LINE_CHARS = 300     # the longest error message; longer parts are cut, the fix kept


class ScenarioError(ValueError):
    """Bad scenario or flag value. Message: '<field>: <problem>; <fix>'."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        field, problem, fix = _one_line(field), _one_line(problem), _one_line(fix)
        if len(field) + len(problem) + len(fix) + 4 > MAX_LINE_CHARS:
            field, problem, fix = _cut(field, 80), _cut(problem, 110), _cut(fix, 100)
        msg = f"{field}: {problem}"
        if fix:
            msg += f"; {fix}"
        super().__init__(msg)


class TestbedError(RuntimeError):
    """A run could not be built or did not finish (the message says what and why)."""

    __test__ = False  # not a pytest test class


class _Shown(reprlib.Repr):
    """reprlib's bounded repr; an integer too long for repr (Python refuses over 4300 digits)
    is shown by its size."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<an integer of about {int(x.bit_length() * 0.30103)} digits>"
        return repr(x)


_SHOWN = _Shown()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother = 2, 40, 40
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 4


def shown(value: Any) -> str:
    """repr(value) for an error message, at most about 80 characters whatever the value."""
    return _cut(_SHOWN.repr(value), 80)


def unknown_field(where: str, key: Any, allowed: Iterable[str],
                  problem: str = "unknown field") -> ScenarioError:
    """The error for a key not in `allowed` under `where` (empty at the top): it names the
    nearest allowed key when one is close (difflib), and all of them."""
    allowed = sorted(allowed)
    name = key if isinstance(key, str) else shown(key)
    near = difflib.get_close_matches(name, allowed, n=1) if isinstance(key, str) else []
    fix = (f"did you mean {near[0]}? " if near else "") + f"use {', '.join(allowed)}"
    return ScenarioError(f"{where}.{name}" if where else name, problem, fix)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _one_line(text: str) -> str:
    """Control characters (a newline in a field name, say) escaped: an error stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
