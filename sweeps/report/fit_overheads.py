"""`make fit-overheads`: fit the estimator's CUDA-context and allocator-reserve constants from measured-gpu rows.

Model (estimator/terms/overhead.py): reserved = allocated × (1 + f) and nvidia-smi = reserved + C. From each
GPU row's torch counters and NVML peak: f by least squares through the origin on (reserved − allocated) vs
allocated, then C as the median of (NVML peak − reserved). The error before/after compares the estimator's
device peak (its own allocated prediction, with the current and the fitted constants) with the NVML peak.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from estimator.config import RunConfig
from estimator.terms import overhead
from estimator.units import MIB
from sweeps import records
from sweeps.oneline import OneLineParser
from sweeps.report.frames import nvml_peak, torch_cuda_peaks
from sweeps.runner.predict import arch_for

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sample:
    """One measured-gpu run: torch's peaks, the NVML peak, and the estimator's predicted allocated peak."""

    allocated: int
    reserved: int
    nvml: int
    predicted_allocated: int


@dataclass(frozen=True)
class Fit:
    """Fitted constants (`measured-gpu`) and how many rows they come from."""

    cuda_context_bytes: int
    allocator_fraction: float
    rows: int


def fit(samples: Sequence[Sample]) -> Fit:
    """f = Σ(res − alloc)·alloc / Σ alloc²; C = median(nvml − reserved)."""
    num = sum((s.reserved - s.allocated) * s.allocated for s in samples)
    den = sum(s.allocated**2 for s in samples)
    f = num / den if den else 0.0
    c = statistics.median(s.nvml - s.reserved for s in samples)
    return Fit(int(c), f, len(samples))


def device_errors(samples: Iterable[Sample], context: int, fraction: float) -> list[float]:
    """Relative error of predicted_allocated × (1 + fraction) + context against each NVML peak."""
    return [(s.predicted_allocated * (1 + fraction) + context - s.nvml) / s.nvml for s in samples]


def samples_from_rows(rows: Iterable[dict], predict: Callable[[RunConfig, dict | None], int]) -> list[Sample]:
    """Samples from ok measured-gpu rows that have torch counters and an NVML peak."""
    out = []
    for row in rows:
        if row.get("source") != "measured-gpu" or row.get("status") != "ok":
            continue
        alloc, res = torch_cuda_peaks(row)
        nv = nvml_peak(row)
        if alloc is None or res is None or nv is None:
            continue
        cfg = RunConfig.from_dict(row["config"])
        out.append(Sample(alloc, res, nv, predict(cfg, (row.get("model") or {}).get("config"))))
    return out


def _predict(cfg: RunConfig, hf_config: dict | None) -> int:
    from estimator.estimate import estimate

    return estimate(cfg, arch_for(cfg, hf_config)).peak_allocated_bytes


def _summary(errors: list[float]) -> str:
    if not errors:
        return "no rows"
    return f"median {100 * statistics.median(abs(e) for e in errors):.1f}%, worst {100 * max(errors, key=abs):+.1f}%"


def report(samples: Sequence[Sample]) -> tuple[Fit, list[str]]:
    """The fit and the lines to print (every number labelled measured-gpu / estimated)."""
    got = fit(samples)
    before = device_errors(samples, overhead.CUDA_CONTEXT_BYTES, overhead.ALLOCATOR_FRACTION)
    after = device_errors(samples, got.cuda_context_bytes, got.allocator_fraction)
    lines = [
        f"fitted from {got.rows} measured-gpu rows:",
        f"  CUDA context      {got.cuda_context_bytes / MIB:8.0f} MiB (estimator now: {overhead.CUDA_CONTEXT_BYTES / MIB:.0f} MiB)",
        f"  allocator reserve {got.allocator_fraction:8.3f}     (estimator now: {overhead.ALLOCATOR_FRACTION:.3f})",
        f"  estimated nvidia-smi peak vs NVML, current constants: {_summary(before)}",
        f"  estimated nvidia-smi peak vs NVML, fitted constants:  {_summary(after)}",
    ]
    return got, lines


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: grpo-vram-fit-overheads [--raw DIR] [--write FILE]."""
    ap = OneLineParser(prog="grpo-vram-fit-overheads", description=__doc__.splitlines()[0])
    ap.add_argument("--raw", default=str(REPO / "results" / "raw"), help="directory of measured rows")
    ap.add_argument("--write", help="also write the fitted constants as JSON to this file")
    args = ap.parse_args(argv)
    raw = Path(args.raw)
    if not raw.exists():
        print(f"grpo-vram-fit-overheads: no such directory {str(raw)!r}", file=sys.stderr)
        return 2
    samples = samples_from_rows(
        records.latest_rows(records.load_rows(raw)), _predict
    )  # one per (source, key)
    if not samples:
        print("no measured-gpu rows with torch counters and NVML peaks yet: run `make sweep` on a GPU first")
        return 0
    got, lines = report(samples)
    print("\n".join(lines))
    if args.write:
        Path(args.write).write_text(json.dumps({"source": "measured-gpu", **asdict(got)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
