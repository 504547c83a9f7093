"""`make band`: compute estimator/band.json from the traced rows of the grids whose split is `validation`
(sweeps/trace/grids.py: the rows read while terms were fixed), never the held-out grid's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sweeps import records
from sweeps.report.accuracy import accuracy_frame
from sweeps.trace.grids import GRIDS

REPO = Path(__file__).resolve().parents[2]
SEEN = tuple(grid.path for grid in GRIDS.values() if grid.split == "validation")
BAND_FILE = REPO / "estimator" / "band.json"


def _stats(err) -> dict:
    return {"low": round(float(err.min()), 4), "high": round(float(err.max()), 4), "n": int(len(err))}


def _source(paths: tuple[Path, ...]) -> str:
    """`traced: results/traced/random/validation.jsonl`: where the band's rows come from."""
    return "traced: " + ", ".join(
        str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in paths
    )


def compute(paths: tuple[Path, ...] = SEEN) -> dict:
    """Per regime (estimator.step.band.regime) and over all rows: low / high relative error of the current estimator
    over the traced ok rows of `paths`, every transformers release's (a user may run any modelled one)."""
    from estimator.settings.config import RunConfig
    from estimator.step.band import REGIMES, regime

    rows = [row for path in paths for row in records.load_rows(path)]
    df = accuracy_frame(rows, release=None)
    df = df[df["rel_error"].notna()]
    if not len(df):
        raise SystemExit(f"no traced rows with a prediction in {', '.join(str(p) for p in paths)}")
    configs = {r["key"]: RunConfig.from_dict(r["config"]) for r in rows if isinstance(r.get("config"), dict)}
    names = df["key"].map(lambda k: regime(configs[k]))
    err = df["rel_error"].astype(float)
    return {
        "regimes": {name: _stats(err[names == name]) for name in REGIMES if (names == name).any()},
        "all": _stats(err),
        "source": _source(paths),
    }


def main() -> int:
    b = compute()
    tmp = BAND_FILE.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(b, indent=1) + "\n")
    tmp.replace(BAND_FILE)
    print(json.dumps(b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
