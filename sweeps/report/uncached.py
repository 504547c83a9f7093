"""Generation without a KV cache: the estimate's reserved and nvidia-smi lines against the first lease's no-cache
GPU runs (measured-gpu trials of the lineup's rows with `cache: false`) and against the configurations traced
without a cache for validation (`results/streams/uncached.jsonl`, traced and simulated). `make accuracy` prints
them on lines of their own."""

from __future__ import annotations

import json
from pathlib import Path

from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate

REPO = Path(__file__).resolve().parents[2]
TRIALS = REPO / "results" / "raw" / "trials" / "mincard.jsonl"
UNCACHED = REPO / "results" / "streams" / "uncached.jsonl"
GPU_ROWS = ("r01", "r02")  # lineup rows with a finished no-cache run (a reserved peak) in the trials


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def gpu_errors(trials: Path = TRIALS) -> dict[str, tuple[float, float]]:
    """Row -> (reserved, nvidia-smi) error of the estimate against the row's no-cache run at its largest limit."""
    from sweeps.mincard import lineup
    from sweeps.runner.predict import predict

    runs = [json.loads(line) for line in trials.read_text().splitlines()] if trials.exists() else []
    out = {}
    for row in GPU_ROWS:
        (entry,) = lineup.entries([row], overrides=[f"+mincard.rows.{row}.cache=false"])
        done = [r for r in runs if r["key"] == entry.job.key and "result" in r]
        if not done:
            continue
        probes = max(done, key=lambda r: r["trial"]["limit_bytes"])["result"]["observed"]["probes"]
        est, _ = predict(entry.job.config.to_dict())
        out[row] = (
            est["peak_reserved_bytes"] / probes["torch_cuda"]["peak_reserved_bytes"] - 1,
            est["peak_device_bytes"] / probes["nvml"]["peak_process_bytes"] - 1,
        )
    return out


def validation_errors(path: Path = UNCACHED) -> list[float]:
    """The estimate's reserved line against each validation stream's simulated reserved peak."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [
        estimate(RunConfig.from_dict(r["config"]), tensors="dispatch").peak_reserved_bytes
        / r["simulated"]["default"]["peak_reserved"]
        - 1
        for r in rows
    ]


def lines(trials: Path = TRIALS, path: Path = UNCACHED) -> list[str]:
    out = []
    gpu = gpu_errors(trials)
    if gpu:
        each = ", ".join(f"{row} {_pct(r)} / {_pct(s)}" for row, (r, s) in gpu.items())
        out.append(
            f"reserve[no KV cache, measured-gpu, in-sample]: reserved / nvidia-smi vs the GPU's: {each}"
        )
    errs = sorted(validation_errors(path))
    if errs:
        out.append(
            f"reserve[no KV cache, validation, simulated]: {len(errs)} configs, reserved vs the simulated peak: "
            f"median {_pct(errs[len(errs) // 2])}, min {_pct(errs[0])}, max {_pct(errs[-1])}, "
            f"below: {sum(e < 0 for e in errs)}"
        )
    return out
