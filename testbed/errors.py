"""Errors the testbed reports to the user as one clear line.

`ScenarioError` is bad input (a scenario file or a flag): it names the field, the value and the
fix. `TestbedError` is a failure while building or running (a tool missing, a delay line that
died). `run_testbed.py` prints either as one line and exits 2 (bad input) or 1 (run failure).
"""


class ScenarioError(ValueError):
    """Bad scenario or flag value. Message: '<field>: <problem>; <fix>'."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        msg = f"{field}: {problem}"
        if fix:
            msg += f"; {fix}"
        super().__init__(_one_line(msg))


class TestbedError(RuntimeError):
    """A run could not be built or did not finish (the message says what and why)."""

    __test__ = False  # not a pytest test class


def _one_line(text: str) -> str:
    """Control characters (a newline in a field name, say) escaped: an error stays one line."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
