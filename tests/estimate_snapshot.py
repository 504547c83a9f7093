"""The estimate of every committed result row, frozen: a refactor must leave all of them unchanged.

    python tests/estimate_snapshot.py            # rewrite tests/data/estimate_snapshot.json (a deliberate change)

`tests/contracts/test_estimate_snapshot.py` recomputes every row and compares it with the stored file. A change to a term
that is meant to move estimates regenerates the file in the same commit, so the diff shows which rows moved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere
SNAPSHOT = REPO / "tests" / "data" / "estimate_snapshot.json"


def current() -> dict[str, dict]:
    """source|key -> the estimate's peak allocated bytes and per-phase totals (or its error) for every row."""
    from sweeps import records
    from sweeps.runner.predict import predict

    out: dict[str, dict] = {}
    for path in sorted((REPO / "results").glob("*/*.jsonl")) + sorted(
        (REPO / "results").glob("traced/*/*.jsonl")
    ):
        for row in records.load_rows(path):
            if not isinstance(row.get("config"), dict):
                continue
            pred, err = predict(row["config"], (row.get("model") or {}).get("config"))
            entry = (
                {"error": err}
                if pred is None
                else {
                    "peak_allocated_bytes": pred["peak_allocated_bytes"],
                    "phase_totals": pred["phase_totals"],
                }
            )
            out[f"{row.get('source')}|{row.get('key')}"] = entry
    return dict(sorted(out.items()))


def main() -> int:
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(json.dumps(current(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
