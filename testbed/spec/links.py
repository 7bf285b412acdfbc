"""A direction of a WAN link (or of any DC-to-DC hop): one type from the scenario to the figures.

`LinkDir("east", "west")` is the east->west direction. It is a tuple (hashable, sorted as its
two names are), and it becomes the string "east->west" only at the JSON and text edge
(`str(d)`, `LinkDir.parse("east->west")` back). DC names ([a-z][a-z0-9]*, testbed.spec.scenario)
never hold "-", so the string is unambiguous and strings sort as the tuples do.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

SEPARATOR = "->"


class LinkDir(NamedTuple):
    src: str
    dst: str

    def __str__(self) -> str:
        return f"{self.src}{SEPARATOR}{self.dst}"

    @property
    def reverse(self) -> LinkDir:
        return LinkDir(self.dst, self.src)

    @classmethod
    def parse(cls, text: str) -> LinkDir:
        src, sep, dst = text.partition(SEPARATOR)
        if not sep or not src or not dst or SEPARATOR in dst:
            raise ValueError(f"{text!r} is not a link direction such as east->west")
        return cls(src, dst)


def hops(dcs: Iterable[str]) -> list[LinkDir]:
    """The link directions a path over these DCs takes, in order."""
    seq = list(dcs)
    return [LinkDir(a, b) for a, b in zip(seq, seq[1:])]


def both(a: str, b: str) -> tuple[LinkDir, LinkDir]:
    """The two directions of the link between a and b: a->b, then b->a."""
    return LinkDir(a, b), LinkDir(b, a)
