"""Run the hostile-input corpus (tests/contracts/hostile_inputs.py) and count what happened, per class.

    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/hostile_inputs.py [--write] [--verbose]

Prints a table: inputs tried, clean (the expected clean class), accepted-wrong (bad input answered),
refused-wrong (good input refused), refused-unclear (exit 2/3 but not one clean line, or the wrong code), hangs,
tracebacks, skipped. --write also writes benchmarks/hostile-inputs.md with the table, the date, the machine and
the cases that are not clean. Counts are as found: cases of a known defect count as what they are, not as clean.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "contracts")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hostile_inputs import CLASSES, corpus, counts, expected_outcomes, run_all  # noqa: E402

COLUMNS = [
    ("tried", "tried"),
    ("clean", "clean"),
    ("accepted-wrong", "accepted-wrong"),
    ("refused-wrong", "refused-wrong"),
    ("refused-unclear", "refused-unclear"),
    ("hang", "hangs"),
    ("traceback", "tracebacks"),
    ("skipped", "skipped"),
]


def table(rows: dict[str, dict[str, int]]) -> list[str]:
    lines = ["| class | " + " | ".join(h for _, h in COLUMNS) + " |", "|---|" + "---:|" * len(COLUMNS)]
    total = {k: 0 for k, _ in COLUMNS}
    for name in CLASSES:
        row = rows.get(name, {})
        lines.append(f"| {name} | " + " | ".join(str(row.get(k, 0)) for k, _ in COLUMNS) + " |")
        for k, _ in COLUMNS:
            total[k] += row.get(k, 0)
    lines.append("| **all** | " + " | ".join(f"**{total[k]}**" for k, _ in COLUMNS) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hostile_inputs", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write benchmarks/hostile-inputs.md")
    ap.add_argument("--verbose", action="store_true", help="print every case that is not clean as it runs")
    args = ap.parse_args(argv)

    def progress(case, r):
        if args.verbose and r.outcome not in expected_outcomes(case) and r.outcome != "skipped":
            print(f"  {case.id}: {r.outcome} (exit {r.code}) {r.detail}", file=sys.stderr)

    t0 = time.monotonic()
    results = run_all(corpus(), progress)
    seconds = time.monotonic() - t0
    lines = table(counts(results))
    print("\n".join(lines))
    print(f"{len(results)} cases in {seconds:.0f} s")
    bad = [(c, r) for c, r in results if r.outcome not in expected_outcomes(c) and r.outcome != "skipped"]
    skipped = [(c, r) for c, r in results if r.outcome == "skipped"]
    if args.write:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        md = [
            "# Hostile inputs: counts",
            "",
            f"Run {now} on {platform.node() or 'this machine'} ({os.cpu_count()} CPU cores, Python "
            f"{platform.python_version()}, {platform.system()}), {len(results)} cases in {seconds:.0f} s.",
            "",
            "The corpus is tests/contracts/hostile_inputs.py; tests/contracts/test_hostile_inputs.py asserts every "
            "case is in its expected clean class (known defects are xfail(strict=True)). Rerun:",
            "",
            "    PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/hostile_inputs.py --write",
            "",
            "clean = one line `vram-estimate: error: ...` (or `grpo-vram-trace: error:`), at most 400 characters,"
            " no raw control characters, exit 2 (3 when the answer cannot be written), or for good input an answer"
            " with only notes on stderr. A case of a known defect counts as what it is, not as clean.",
            "",
            *lines,
            "",
            "The same corpus on 2026-11-25 before the defects it found were fixed (commit e2c9aba): 435 tried, 411"
            " clean, 9 accepted-wrong, 1 refused-wrong, 14 refused-unclear, 0 hangs, 0 tracebacks (measured).",
            "",
            "Classes: " + "; ".join(f"{k}: {v}" for k, v in CLASSES.items()) + ".",
            "",
            "## Not clean",
            "",
            *(
                [
                    f"- `{c.id}`: {r.outcome} (exit {r.code}) {r.detail}"
                    + (f" [{c.defect}]" if c.defect else "")
                    for c, r in bad
                ]
                or ["none"]
            ),
            "",
            "## Skipped",
            "",
            *([f"- `{c.id}`: {r.detail}" for c, r in skipped] or ["none"]),
            "",
        ]
        (REPO / "benchmarks" / "hostile-inputs.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
