"""`grpo-vram-accuracy` (`make accuracy`): the current estimator against every measured and traced row, printed.

The tensor peak per row and per set (`sweeps/report/accuracy.py`), then the layers above it on real GPU runs
(`sweeps/report/reserve.py`: reserved and nvidia-smi; `sweeps/report/uncached.py` for generation without a KV
cache), the host RAM line against the process's RSS (`sweeps/report/host.py`), and the smallest card a run needs, measured against the fit
figure (`sweeps/report/mincard.py`), with the GPU rows' traces replayed against the GPU's own counters
(`sweeps/report/replay.py`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from sweeps import records
from sweeps.oneline import OneLineParser
from sweeps.report import host, mincard, replay, row_traces, uncached
from sweeps.report.accuracy import (
    DEFAULT_DIRS,
    accuracy_frame,
    format_table,
    release_lines,
    split_lines_of,
    summary_lines,
)
from sweeps.report.reserve import format_reserve_table, reserve_frame, reserve_lines


def main(argv: list[str] | None = None) -> int:
    """Print the accuracy table, what was skipped while reading, the summary lines, the reserve layers and the
    min-card line."""
    parser = OneLineParser(prog="grpo-vram-accuracy", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_DIRS), help="result dirs or .jsonl files")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not Path(p).exists() and p not in DEFAULT_DIRS]
    if missing:
        print(
            f"grpo-vram-accuracy: no such file or directory {missing[0]!r}; give result dirs or .jsonl files",
            file=sys.stderr,
        )
        return 2
    loaded = records.read_rows(args.paths)
    df = accuracy_frame(loaded.rows)
    print(format_table(df))
    for line in loaded.report_lines():
        print(line, file=sys.stderr)
    for _, r in df[df["prediction_error"].notna()].iterrows():
        print(f"no prediction for {r['model']} {r['method']} {r['config']}: {r['prediction_error']}")
    for line in summary_lines(df):
        print(line)
    for line in split_lines_of(df, loaded.rows):
        print(line)
    for line in release_lines(loaded.rows):
        print(line)
    layers = reserve_frame(loaded.rows)
    if len(layers):
        print(format_reserve_table(layers))
    for line in reserve_lines(layers):
        print(line)
    for line in host.host_lines(loaded.rows):
        print(line)
    if list(args.paths) == list(DEFAULT_DIRS):  # the committed no-cache trials and validation rows
        for line in uncached.lines():
            print(line)
    for line in replay.replay_lines(replay.replay_frame(loaded.rows)):
        print(line)
    streams = row_traces.traced_streams(mincard.TRACED)
    for line in mincard.summary_lines(loaded.rows, simulated=lambda r: mincard.simulated_figure(r, streams)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
