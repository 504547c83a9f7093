"""`make fit-overheads`: fit two overhead constants from measured-gpu rows and compare them with the estimator's own.

Fitted model: reserved = allocated × (1 + f) and nvidia-smi = reserved + C. From each GPU row's torch counters and
NVML peak: f by least squares through the origin on (reserved − allocated) vs allocated, then C as the median of
(NVML peak − reserved). The estimator does not use such constants: it itemizes the memory outside the allocator
(CUDA context, lazily loaded modules, NCCL: `Estimate.outside_allocator_bytes`, estimator/terms/overhead.py) and
simulates the reserve from the config's allocation stream. The report puts both side by side: C against the
estimator's items outside the allocator, and the NVML peak against the estimator's own nvidia-smi peak
(`peak_device_bytes`) and against its allocated prediction with the fitted constants.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from estimator.settings.config import RunConfig
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
    predicted_device: int | None = None  # the estimator's own nvidia-smi peak (itemized overheads)
    predicted_outside: int | None = (
        None  # the estimator's items outside the allocator (context, modules, NCCL)
    )


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


def samples_from_rows(
    rows: Iterable[dict], predict: Callable[[RunConfig, dict | None], int | tuple[int, int, int]]
) -> list[Sample]:
    """Samples from ok measured-gpu rows that have torch counters and an NVML peak. `predict` gives the predicted
    allocated peak, or (allocated, nvidia-smi peak, outside the allocator) as `_predict` does."""
    out = []
    for row in rows:
        if row.get("source") != "measured-gpu" or row.get("status") != "ok":
            continue
        alloc, res = torch_cuda_peaks(row)
        nv = nvml_peak(row)
        if alloc is None or res is None or nv is None:
            continue
        cfg = RunConfig.from_dict(row["config"])
        got = predict(cfg, (row.get("model") or {}).get("config"))
        out.append(Sample(alloc, res, nv, *got) if isinstance(got, tuple) else Sample(alloc, res, nv, got))
    return out


def _predict(cfg: RunConfig, hf_config: dict | None) -> tuple[int, int, int]:
    from estimator.step.estimate import estimate

    est = estimate(cfg, arch_for(cfg, hf_config))
    return est.peak_allocated_bytes, est.peak_device_bytes, est.outside_allocator_bytes


def _summary(errors: list[float]) -> str:
    if not errors:
        return "no rows"
    return f"median {100 * statistics.median(abs(e) for e in errors):.1f}%, worst {100 * max(errors, key=abs):+.1f}%"


def report(samples: Sequence[Sample]) -> tuple[Fit, list[str]]:
    """The fit and the lines to print (every number labelled measured-gpu / estimated)."""
    got = fit(samples)
    after = device_errors(samples, got.cuda_context_bytes, got.allocator_fraction)
    own = [(s.predicted_device - s.nvml) / s.nvml for s in samples if s.predicted_device is not None]
    outside = sorted({s.predicted_outside for s in samples if s.predicted_outside is not None})
    estimated = "/".join(f"{o / MIB:.0f}" for o in outside) if outside else "?"
    lines = [
        f"fitted from {got.rows} measured-gpu rows (nvidia-smi = allocated × (1 + f) + C):",
        f"  C, outside the allocator  {got.cuda_context_bytes / MIB:8.0f} MiB (fitted); the estimator itemizes "
        f"{estimated} MiB (estimated: context, lazily loaded modules, NCCL)",
        f"  f, reserve beyond allocated {got.allocator_fraction:6.3f} (fitted); the estimator simulates it per "
        "config (estimator/terms/allocator_reserve.py)",
        f"  the estimator's nvidia-smi peak vs NVML: {_summary(own)}",
        f"  allocated (estimated) with the fitted C and f vs NVML: {_summary(after)}",
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
