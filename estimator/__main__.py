"""`python -m estimator ...` is `vram-estimate ...`."""

import sys

from estimator.interface.cli import main

sys.exit(main(sys.argv[1:]))
