"""Progress of a long model computation (`predict`, `whatif`) on standard error, without tqdm
(the no-root quick start needs only ruamel.yaml).

One job: say what is being computed once the work has run AFTER_S seconds: on a terminal one
line rewritten in place and cleared at the end; elsewhere (CI logs, files) a line at most every
EVERY_S seconds. Standard output keeps only the result.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

AFTER_S = 2.0
EVERY_S = 5.0


class Ticker:
    def __init__(self, what: str, stream: TextIO | None = None, after_s: float = AFTER_S):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.monotonic()
        self.after_s = after_s
        self.last = -EVERY_S
        self.shown = False

    def __call__(self, text: str) -> None:
        """What runs now."""
        now = time.monotonic() - self.t0
        if now < self.after_s or (not self.tty and now - self.last < EVERY_S):
            return
        self.last = now
        line = f"{self.what}: {text} ({now:.0f} s)"
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown and self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()
