"""The measured-gpu rows against their configurations' traced streams replayed through the allocator simulation.

Each row's configuration is traced (fake tensors on CPU) into a folder of streams (`results/streams/gpu-validate/`
for the `gpu-validate` rows); the stream, with its tied gradients' sum made in place as the GPU runs it
(`sweeps.trace.tied_sums.as_real`), is replayed by `estimator.hardware.allocator.simulate`, and the estimate's
workspaces (allocated through the caching allocator, absent from a trace) are added. What comes out is set beside
torch's own `max_memory_allocated` and `max_memory_reserved` on the GPU: it says whether the GPU holds anything the
traces miss, independently of the estimator's terms (traced, simulated, against measured-gpu).

    python -m sweeps.report.replay [ROWS.jsonl ...] [--traced DIR] [--trace-missing]

`make tables` runs it with `--trace-missing`, so rows a lease brings back get their traces (CPU, minutes each).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from estimator.hardware.allocator import load_stream, simulate
from estimator.step.estimate import estimate
from sweeps.oneline import OneLineParser, shown
from sweeps.report import row_traces
from sweeps.report.row_traces import config_id

REPO = Path(__file__).resolve().parents[2]
TRACED = REPO / "results" / "streams" / "gpu-validate"
DEFAULT_ROWS = REPO / "results" / "raw" / "gpu-validate.jsonl"
COLUMNS = [
    "key",
    "config",
    "allocated_bytes",
    "replayed_allocated_bytes",
    "traced_allocated_bytes",
    "reserved_bytes",
    "replayed_reserved_bytes",
]


def replay_frame(rows: Iterable[dict], traced_dir: Path = TRACED) -> pd.DataFrame:
    """One line per measured-gpu row whose configuration has a stream in `traced_dir`: measured allocated and
    reserved peaks, the replayed ones with the tied sums in place plus the workspaces (`replayed_*`), and the
    replayed allocated peak of the stream as traced, its sums out of place (`traced_allocated_bytes`)."""
    streams = row_traces.traced_streams(Path(traced_dir))
    out = []
    for r in rows:
        path = streams.get(config_id(r["config"])) if r.get("source") == row_traces.SOURCE else None
        if path is None or not path.exists():
            continue
        cfg, arch = row_traces.config_and_arch(r["config"], (r.get("model") or {}).get("config"))
        real = simulate(row_traces.real_events(path, cfg, arch))
        workspaces = estimate(cfg, arch).in_reserved_bytes
        measured = r["observed"]["probes"]["torch_cuda"]
        out.append(
            {
                "key": r["key"],
                "config": config_id(r["config"]),
                "allocated_bytes": measured["peak_allocated_bytes"],
                "replayed_allocated_bytes": real.peak_allocated + workspaces,
                "traced_allocated_bytes": simulate(load_stream(path)).peak_allocated + workspaces,
                "reserved_bytes": measured["peak_reserved_bytes"],
                "replayed_reserved_bytes": real.peak_reserved + workspaces,
            }
        )
    return pd.DataFrame(out, columns=COLUMNS)


def replay_lines(frame: pd.DataFrame) -> list[str]:
    """`replay[measured-gpu, allocated|reserved]: N rows, ...` (signed error of the replay against the GPU)."""
    if not len(frame):
        return []
    lines = []
    for layer in ("allocated", "reserved"):
        err = 100 * (frame[f"replayed_{layer}_bytes"] / frame[f"{layer}_bytes"] - 1)
        lines.append(
            f"replay[measured-gpu, {layer}]: {len(frame)} rows, their traces replayed (tied sums in place, "
            f"+ workspaces) against max_memory_{layer}: median {err.median():+.2f} %, "
            f"from {err.min():+.2f} % to {err.max():+.2f} % (traced, simulated)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the replay lines for the rows files (tracing the configurations without a stream when asked)."""
    p = OneLineParser(prog="python -m sweeps.report.replay", description=__doc__.splitlines()[0])
    row_traces.add_arguments(p, DEFAULT_ROWS, TRACED, "measured-gpu")
    args = p.parse_args(argv)

    def body() -> None:
        rows = row_traces.read_rows(args, DEFAULT_ROWS, "measured-gpu")
        lines = replay_lines(replay_frame(rows, Path(args.traced)))
        for line in lines or [f"replay: no measured-gpu row has a traced stream in {shown(args.traced)}"]:
            print(line)

    return row_traces.guarded("replay", body)


if __name__ == "__main__":
    sys.exit(main())
