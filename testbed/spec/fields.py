"""Checks of single scenario values that every section's parser shares.

One job: a field's value, checked and converted, or a ScenarioError naming the field and the fix.
"""

from __future__ import annotations

from typing import Any

from testbed.spec.errors import ScenarioError, shown


def checked_number(value: Any, where: str, *, low: float, high: float) -> float:
    """value as a float if it is a number in [low, high] (NaN never is), else ScenarioError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(where, f"{shown(value)} is not a number", f"use a number from {low:g} to {high:g}")
    if not low <= value <= high:     # compared exactly: float() of a huge integer overflows
        raise ScenarioError(where, f"{shown(value)} is out of range", f"use a number from {low:g} to {high:g}")
    return float(value)
