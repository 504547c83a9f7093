"""The estimator's validated error band, and "fits" decided on its safe side.

The band is data (`estimator/band.json`), computed by `make band` (`python -m sweeps.report.band`) from the
traced rows of the out-of-sample validation grid (`results/traced/validation.jsonl`, seed A of
`sweeps/trace/random_grid.py`): the lowest and highest (estimated − traced) / traced over those rows. A
negative `low` is the worst under-prediction seen; `--gpu`, `--solve`, the advice and the "fits on" list
compare the estimate with the GPU's memory shrunk by that margin, so a run the band says might not fit is
never reported as fitting. The held-out grid (seed B) checks that the band holds on configs nobody tuned on.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

BAND_FILE = Path(__file__).with_name("band.json")


@lru_cache(maxsize=1)
def band() -> dict:
    """{"low", "high", "n", "source"}: relative errors of the estimate on the validation rows."""
    return json.loads(BAND_FILE.read_text())


def margin() -> float:
    """Safe-side margin m: estimate × (1 + m) covers the worst under-prediction, m = 1 / (1 + low) − 1 (0 if none)."""
    low = float(band()["low"])
    return 1.0 / (1.0 + low) - 1.0 if low < 0 else 0.0


def usable_bytes(memory_bytes: int) -> int:
    """GPU memory an estimate may use and still be called a fit: memory / (1 + margin)."""
    return int(memory_bytes / (1.0 + margin()))


def describe() -> str:
    """One line for the output and --help: the band, its size and where it comes from."""
    b = band()
    return (
        f"error band: {b['low'] * 100:+.1f}% / {b['high'] * 100:+.1f}% on {b['n']} off-grid traces "
        f"({b['source']}); fits are decided with the estimate raised by {margin() * 100:.1f}%"
    )
