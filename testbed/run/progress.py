"""Progress of a run or a sweep: one tqdm bar over every iteration to train (points x systems x
iterations), with the sweep point and system in its description and tqdm's elapsed time and
ETA, on a terminal; the run's own lines printed above it. Quiet: neither (CI logs stay short).

One job: show progress. The trainer reports "iteration k/N: ..." lines (testbed.run.launch); each
one advances the bar.
"""

from __future__ import annotations

import re
import sys

from tqdm import tqdm

ITERATION_RE = re.compile(r"^iteration (\d+)/(\d+)")


class Progress:
    def __init__(self, total_iterations: int, *, quiet: bool = False) -> None:
        self.quiet = quiet
        # no bar when stderr is not a terminal (CI logs, files): the lines alone
        self.bar = tqdm(total=total_iterations, unit="it", file=sys.stderr,
                        disable=quiet or not sys.stderr.isatty(),
                        dynamic_ncols=True, leave=False,
                        bar_format="{desc} {n_fmt}/{total_fmt} iterations "
                                   "[{elapsed} elapsed, {remaining} left]")

    def where(self, text: str) -> None:
        """What runs now: the sweep point and system."""
        self.bar.set_description_str(text, refresh=True)

    def line(self, text: str) -> None:
        """One of the run's lines: printed above the bar (not when quiet); an iteration line
        advances it."""
        if ITERATION_RE.match(text.strip()):
            self.bar.update(1)
        if not self.quiet:
            tqdm.write(text, file=sys.stdout)

    def say(self, text: str) -> None:
        """A line that is printed even when quiet (one per point, the final summary)."""
        tqdm.write(text, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()
