"""`python -m sweeps.trace`: the trace command (sweeps/trace/cli.py)."""

import sys

from sweeps.trace.cli import main

sys.exit(main())
