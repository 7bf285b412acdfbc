"""Long lists as short text: numbers as ranges, host names as Slurm-style host lists.

- Numbers: `0-249,300,310-390/10` is 0 to 249, then 300, then 310, 320, ..., 390 (a step after
  "/", as in cron). Runs are found greedily in the given order; only rising runs of three or more
  (or two in a row) become ranges.
- Host names "<prefix><number>" (`usw-h1`): `usw-h[1-250]`, `usw-h[1-1981/20]`; names that do not
  end in a number, or that break the run, stand alone.

`expand_numbers` and `expand_hosts` read the text back (the views' tests check the round trip).
"""

from __future__ import annotations

import re
from typing import Sequence

def runs(values: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first, count, step) runs covering values in order: rising arithmetic runs, greedily."""
    out: list[tuple[int, int, int]] = []
    i, n = 0, len(values)
    while i < n:
        if i + 1 < n and values[i + 1] > values[i]:
            step = values[i + 1] - values[i]
            j = i + 1
            while j + 1 < n and values[j + 1] - values[j] == step:
                j += 1
            count = j - i + 1
            if count >= 3 or step == 1:
                out.append((values[i], count, step))
                i = j + 1
                continue
        out.append((values[i], 1, 1))
        i += 1
    return out


def _run_text(first: int, count: int, step: int) -> str:
    if count == 1:
        return str(first)
    last = first + (count - 1) * step
    return f"{first}-{last}" if step == 1 else f"{first}-{last}/{step}"


def number_ranges(values: Sequence[int]) -> str:
    """`0-249,300` for [0, 1, ..., 249, 300] (module docstring)."""
    return ",".join(_run_text(*r) for r in runs(values))


def expand_numbers(text: str) -> list[int]:
    """number_ranges' text back to the numbers."""
    out: list[int] = []
    for part in text.split(","):
        span, _, step = part.partition("/")
        first, _, last = span.partition("-")
        out += range(int(first), int(last or first) + 1, int(step or 1))
    return out


def split_host(name: str) -> tuple[str, int | None]:
    """("usw-h", 12) for "usw-h12"; (name, None) when it does not end in a number."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem):]
    if not digits or (len(digits) > 1 and digits.startswith("0")):
        return name, None          # no number, or one with leading zeros (kept as written)
    return stem, int(digits)


def host_groups(names: Sequence[str]) -> list[tuple[str, list[int] | None]]:
    """Consecutive names with one prefix: (prefix, numbers), or (name, None) for a name alone."""
    out: list[tuple[str, list[int] | None]] = []
    for name in names:
        prefix, num = split_host(name)
        if num is None:
            out.append((name, None))
        elif out and out[-1][1] is not None and out[-1][0] == prefix:
            out[-1][1].append(num)
        else:
            out.append((prefix, [num]))
    return out


def host_list(names: Sequence[str]) -> str:
    """`usw-h[1-250],use-h[1-4,9]` for those hosts in that order (module docstring)."""
    parts = []
    for prefix, nums in host_groups(names):
        if nums is None:
            parts.append(prefix)
        elif len(nums) == 1:
            parts.append(f"{prefix}{nums[0]}")
        else:
            parts.append(f"{prefix}[{number_ranges(nums)}]")
    return ",".join(parts)


def expand_hosts(text: str) -> list[str]:
    """host_list's text back to the names."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", text):
        prefix, bracket, rest = part.partition("[")
        out += ([f"{prefix}{n}" for n in expand_numbers(rest.rstrip("]"))] if bracket
                else [prefix])
    return out
