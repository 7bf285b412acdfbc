#!/usr/bin/env python3
"""Entry point users type: `sudo python run_testbed.py SCENARIO` (see `--help`). The commands
live in testbed/cli/main.py; the `geodc` console script runs the same `main`.

Whichever Python starts it (sudo's, the system's), it runs under this checkout's environment
(.venv, made by `make setup`) when that exists; without it, a missing package is one line naming
it and the command that installs it (exit 2, nothing written)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"


def main(argv=None):
    try:
        from testbed.cli.main import main as cli_main
        return cli_main(argv)
    except ModuleNotFoundError as exc:   # before the command line's own handler takes over
        return missing(exc)


def missing(exc: ModuleNotFoundError) -> int:
    where = "is incomplete" if VENV.exists() else "does not exist"
    print(f"error: {sys.executable} has no module {exc.name!r} and {VENV} {where}; run "
          f"`sudo make setup` in {ROOT} (it makes .venv, which this script then uses)",
          file=sys.stderr)
    return 2


def use_project_env() -> None:
    """Re-run this script under .venv's Python if another one started it."""
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() != VENV.resolve() and python.exists():
        os.execv(python, [str(python), str(Path(__file__).resolve()), *sys.argv[1:]])


if __name__ == "__main__":
    use_project_env()
    sys.exit(main())
