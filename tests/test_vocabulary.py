"""The shared vocabulary (testbed.spec.timescale, testbed.spec.links): conversions bit for bit the
expressions they replace, link directions round-trip through their string form."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.spec.links import LinkDir, both, hops
from testbed.spec.timescale import TimeScale

pytestmark = pytest.mark.unit

factors = st.floats(min_value=1.0, max_value=100.0, allow_nan=False)
values = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)


@given(factors, values)
def test_conversions_are_the_hand_written_expressions_bit_for_bit(t: float, x: float) -> None:
    ts = TimeScale(t)
    assert ts.emulated_span(x) == x * t and ts.emulated_rate(x) == x / t
    assert ts.real_span(x) == x / t and ts.real_rate(x) == x * t
    # there and back is the value (to rounding: one multiply and one divide)
    assert math.isclose(ts.real_span(ts.emulated_span(x)), x, rel_tol=1e-15, abs_tol=1e-300)


def test_time_scale_bounds_and_identity() -> None:
    assert not TimeScale().dilated and TimeScale(6).dilated and str(TimeScale(6)) == "6"
    for bad in (0.5, 0.0, 101.0, float("nan")):
        with pytest.raises(ValueError, match="outside 1..100"):
            TimeScale(bad)


dc = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)


@given(dc, dc)
def test_link_directions_round_trip_and_name_both_ends(a: str, b: str) -> None:
    d = LinkDir(a, b)
    assert str(d) == f"{a}->{b}" and LinkDir.parse(str(d)) == d and d.reverse == LinkDir(b, a)
    assert both(a, b) == (d, d.reverse)
    assert {d: 1}[LinkDir(a, b)] == 1          # hashable, equal by value


@given(st.lists(st.tuples(dc, dc), min_size=2, max_size=8))
def test_link_directions_sort_as_their_strings_do(pairs: list[tuple[str, str]]) -> None:
    dirs = [LinkDir(a, b) for a, b in pairs]
    assert [str(d) for d in sorted(dirs)] == sorted(str(d) for d in dirs)


def test_hops_and_refused_strings() -> None:
    assert hops(["a", "b", "c"]) == [LinkDir("a", "b"), LinkDir("b", "c")] and hops(["a"]) == []
    for bad in ("east", "->west", "east->", "a->b->c"):
        with pytest.raises(ValueError, match="not a link direction"):
            LinkDir.parse(bad)


def test_time_scale_of_takes_the_object_or_the_number() -> None:
    ts = TimeScale(4)
    assert TimeScale.of(ts) is ts and TimeScale.of(4) == ts and TimeScale.of(1.0) == TimeScale()
    with pytest.raises(ValueError, match="outside 1..100"):
        TimeScale.of(0.5)


# ---- no vocabulary by hand --------------------------------------------------------------------
# The scans below read testbed/, trainer/, prefill/, traffic/ and bench/. LEGACY_* would name files still written the old way by
# hand (none are left);
# a file listed there may hold no more than its count.

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("testbed", "trainer", "prefill", "traffic", "bench")

LEGACY_LINK_IDS: set[str] = set()

# file -> how many hand-written time_scale / T multiplications and divisions it may still hold
LEGACY_TIME_ARITHMETIC: dict[str, int] = {}

TIME_NAMES = {"time_scale", "T"}          # the bare factor, however it is spelled
TIME_ATTRS = {"time_scale", "T", "factor"}


def _sources() -> list[tuple[str, ast.Module]]:
    out = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            out.append((path.relative_to(REPO).as_posix(), ast.parse(path.read_text())))
    return out


def _hand_built_link_ids(tree: ast.Module) -> list[int]:
    """Lines with f"{x}->{y}", "->".join(...) or ... + "->" + ...: a link id by hand."""
    lines = []
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            v = n.values
            if any(isinstance(a, ast.FormattedValue) and isinstance(s, ast.Constant)
                   and s.value == "->" and isinstance(b, ast.FormattedValue)
                   for a, s, b in zip(v, v[1:], v[2:])):
                lines.append(n.lineno)
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and any(
                isinstance(x, ast.Constant) and x.value == "->" for x in (n.left, n.right)):
            lines.append(n.lineno)
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr == "join" and isinstance(n.func.value, ast.Constant)
              and n.func.value.value == "->"):
            lines.append(n.lineno)
    return sorted(set(lines))


_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of one scope, not those of the functions inside it."""
    out, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        n = todo.pop()
        out.append(n)
        if not isinstance(n, _SCOPES):
            todo.extend(ast.iter_child_nodes(n))
    return out


def _time_arithmetic(tree: ast.Module) -> list[int]:
    """Lines that multiply or divide by time_scale by hand: a name time_scale or T, an attribute
    .time_scale, .T or .factor, or a name assigned straight from one of those (in its scope or
    an enclosing one)."""
    lines: list[int] = []

    def scan(scope: ast.AST, outer: frozenset[str]) -> None:
        nodes = _own_nodes(scope)
        names = set(outer)
        for n in nodes:
            if isinstance(n, ast.Assign) and (
                    (isinstance(n.value, ast.Name) and n.value.id in names)
                    or (isinstance(n.value, ast.Attribute) and n.value.attr in TIME_ATTRS)):
                names |= {t.id for t in n.targets if isinstance(t, ast.Name)}

        def is_time(x: ast.expr) -> bool:
            return ((isinstance(x, ast.Name) and x.id in names)
                    or (isinstance(x, ast.Attribute) and x.attr in TIME_ATTRS))

        for n in nodes:
            if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Div, ast.FloorDiv)) \
                    and (is_time(n.left) or is_time(n.right)):
                lines.append(n.lineno)
            elif isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Mult, ast.Div)) \
                    and is_time(n.value):
                lines.append(n.lineno)
            elif isinstance(n, _SCOPES):
                scan(n, frozenset(names))

    scan(tree, frozenset(TIME_NAMES))
    return sorted(lines)


def test_no_link_id_is_built_by_hand() -> None:
    """"a->b" is LinkDir's (str(LinkDir(a, b)), testbed.spec.links) and nobody else's."""
    found = {f"{name}:{line}" for name, tree in _sources()
             if name != "testbed/spec/links.py" and name not in LEGACY_LINK_IDS
             for line in _hand_built_link_ids(tree)}
    assert not found, f"link ids built by hand (use testbed.spec.links.LinkDir): {sorted(found)}"


def test_no_time_scale_arithmetic_by_hand() -> None:
    """Configured <-> emulated <-> real is TimeScale's (testbed.spec.timescale) and nobody
    else's; the legacy files hold no more than they did."""
    counts = {}
    for name, tree in _sources():
        if name != "testbed/spec/timescale.py":
            lines = _time_arithmetic(tree)
            if len(lines) > LEGACY_TIME_ARITHMETIC.get(name, 0):
                counts[name] = sorted(lines)
    assert not counts, f"time_scale multiplied or divided by hand (use TimeScale): {counts}"


def test_the_scans_see_the_forms_they_refuse() -> None:
    tree = ast.parse('a = f"{x}->{y}"\nb = "->".join(p)\nc = x + "->" + y\nd = f"{x} -> {y}"\n')
    assert _hand_built_link_ids(tree) == [1, 2, 3]
    tree = ast.parse("def f(s, time_scale):\n    t = s.time_scale\n    a = 2 * t\n"
                     "    b = x / time_scale\n    c = y * s.dilation.factor\n    x *= s.T\n"
                     "    e = ts.emulated_span(x)\n    g = lambda v: v * t\n")
    assert _time_arithmetic(tree) == [3, 4, 5, 6, 8]
