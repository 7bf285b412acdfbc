#!/usr/bin/env python3
"""Entry point users type: `sudo python run_testbed.py SCENARIO` (see `--help`). The commands
live in geodc/cli/main.py; the `geodc` console script runs the same `main`."""

import sys

from geodc.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
