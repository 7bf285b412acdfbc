"""A scenario's `sweep:` section -> its points, each a whole scenario. Pure: no root.

    sweep:                                   # one run per point of the product of these lists
      wan.delay_ms: [10, 40, 80]             # every WAN link's (wan.0.delay_ms: the first's)
      training.replicas: [2, 4]
      bubbletea.load.rate_multiplier: [5, 10, 20]
      systems: [[baseline, atlas], [atlas]]  # a list value is one point

One job: expand and check. A key is a dotted path into the scenario document; where the path
meets a list, the rest applies to every element, unless the next part is an index. Every path
must name a field the scenario already sets, so that a typo is an error rather than a new,
ignored field. Points are the product of the lists in the order written (the last key varies
fastest); each point's scenario must pass what `run` checks, or ScenarioError names the point
and the field.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from testbed.spec.errors import ScenarioError, shown

if TYPE_CHECKING:
    pass

MAX_POINTS = 1000
KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+))*")


@dataclass(frozen=True, kw_only=True, slots=True)
class Point:
    index: int
    values: dict[str, Any]       # sweep key -> this point's value
    doc: dict[str, Any]          # the whole scenario document of this point

    @property
    def label(self) -> str:
        """p03-delay_ms=40-replicas=2: for folder names (letters, digits, -_.= only)."""
        parts = [f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in self.values.items()]
        return re.sub(r"[^A-Za-z0-9_.=-]", "_", "-".join([f"p{self.index:02d}", *parts]))[:120]


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "+".join(str(x) for x in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def expand(doc: dict[str, Any]) -> list[Point]:
    """The points of doc's sweep (one point, doc itself without `sweep`, if it has none)."""
    sweep = doc.get("sweep")
    base = {k: v for k, v in doc.items() if k != "sweep"}
    if sweep is None:
        return [Point(index=0, values={}, doc=base)]
    if not isinstance(sweep, dict) or not sweep:
        raise ScenarioError("sweep", "must be a mapping of field paths to lists of values",
                            "e.g. sweep: {wan.delay_ms: [10, 40]}")
    for key, values in sweep.items():
        if not isinstance(key, str) or not KEY_RE.fullmatch(key):
            raise ScenarioError(f"sweep.{shown(key)}", "is not a field path",
                                "use dotted names, e.g. wan.delay_ms or training.replicas")
        if not isinstance(values, list) or not values:
            raise ScenarioError(f"sweep.{key}", "must be a non-empty list of values",
                                f"e.g. {key}: [1, 2]")
        _set(copy.deepcopy(base), key.split("."), values[0], f"sweep.{key}")  # the path exists
    n = 1
    for values in sweep.values():
        n *= len(values)
    if n > MAX_POINTS:
        raise ScenarioError("sweep", f"{n} points", f"use at most {MAX_POINTS}")
    points = []
    for i, combo in enumerate(itertools.product(*sweep.values())):
        point = copy.deepcopy(base)
        for key, value in zip(sweep, combo):
            _set(point, key.split("."), copy.deepcopy(value), f"sweep.{key}")
        points.append(Point(index=i, values=dict(zip(sweep, combo)), doc=point))
    return points


def _set(node: Any, parts: list[str], value: Any, where: str) -> None:
    head, rest = parts[0], parts[1:]
    if isinstance(node, list):
        if head.isdigit():
            if len(head) > 9 or int(head) >= len(node):    # int() refuses 4300 digits
                raise ScenarioError(where, f"index {shown(head)} is past the {len(node)} entries",
                                    f"use 0 to {len(node) - 1}")
            targets, rest = [node[int(head)]], rest
        else:
            targets, rest = node, parts
        if not rest:
            raise ScenarioError(where, "ends at a list", "name a field of its entries")
        for item in targets:
            _set(item, rest, value, where)
        return
    if not isinstance(node, dict) or head not in node:
        near = difflib.get_close_matches(head, [k for k in node if isinstance(k, str)], n=1) \
            if isinstance(node, dict) else []
        raise ScenarioError(where, f"the scenario has no field {shown(head)} there",
                            (f"did you mean {near[0]}? " if near else "")
                            + "sweep only fields the scenario sets (write the base value first)")
    if rest:
        _set(node[head], rest, value, where)
    else:
        node[head] = value
