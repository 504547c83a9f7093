"""The layers above the tensors on real GPU runs: the estimator's reserved and nvidia-smi figures against torch's
`max_memory_reserved` and NVML's process peak, per measured-gpu row.

The tensor peak is compared by `sweeps/report/accuracy.py`; this module compares the two layers users see on top of
it (`Estimate.peak_reserved_bytes`: allocated + the caching allocator's reserve + cuBLAS workspaces;
`Estimate.peak_device_bytes`: reserved + the CUDA context and what else lives outside the allocator). Measured
figures come from the rows' `torch_cuda` and `nvml` probes (measured-gpu); predictions are recomputed now
(estimated). `make accuracy` prints `reserve_lines`.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from estimator.units import MIB
from sweeps.report.accuracy import UNDER_LIMIT, Predictor, compared_rows
from sweeps.report.frames import method_of, model_label, summarize_config
from sweeps.runner.predict import predict, tensors_of

LAYERS = ("reserved", "nvidia-smi")
COLUMNS = [
    "key",
    "model",
    "method",
    "config",
    "allocated_bytes",
    "reserved_bytes",
    "predicted_reserved_bytes",
    "reserved_rel_error",
    "nvml_bytes",
    "predicted_device_bytes",
    "nvml_rel_error",
]


def measured_layers(observed: dict) -> dict[str, int | None]:
    """Peak allocated and reserved from the torch_cuda probe, and NVML's peak for this process (else the
    device's) from the nvml probe; None where a probe was off or unavailable."""
    probes = observed.get("probes") or {}
    tc = probes.get("torch_cuda") or {}
    nv = probes.get("nvml") or {}
    on = bool(tc.get("available"))
    return {
        "allocated": tc.get("peak_allocated_bytes") if on else None,
        "reserved": tc.get("peak_reserved_bytes") if on else None,
        "nvidia-smi": (nv.get("peak_process_bytes") or nv.get("peak_device_bytes"))
        if nv.get("available")
        else None,
    }


def _rel(predicted: int | None, measured: int | None) -> float | None:
    return (predicted - measured) / measured if predicted is not None and measured else None


def reserve_frame(rows: Iterable[dict], predictor: Predictor = predict) -> pd.DataFrame:
    """One line per measured-gpu row compared (`accuracy.compared_rows`): measured allocated / reserved / NVML
    peaks, the estimator's reserved and nvidia-smi figures, and the signed relative error of each."""
    out = []
    for r in compared_rows(rows):
        if r.get("source") != "measured-gpu":
            continue
        got = measured_layers(r["observed"])
        pred, _ = predictor(r["config"], (r.get("model") or {}).get("config"), tensors_of(r))
        pred_reserved = pred.get("peak_reserved_bytes") if pred else None
        pred_device = pred.get("peak_device_bytes") if pred else None
        out.append(
            {
                "key": r["key"],
                "model": model_label(str(r["config"].get("model", ""))),
                "method": method_of(r["config"]),
                "config": summarize_config(r["config"]),
                "allocated_bytes": got["allocated"],
                "reserved_bytes": got["reserved"],
                "predicted_reserved_bytes": pred_reserved,
                "reserved_rel_error": _rel(pred_reserved, got["reserved"]),
                "nvml_bytes": got["nvidia-smi"],
                "predicted_device_bytes": pred_device,
                "nvml_rel_error": _rel(pred_device, got["nvidia-smi"]),
            }
        )
    df = pd.DataFrame(out, columns=COLUMNS)
    for c in COLUMNS[4:]:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    return df.sort_values(["model", "method", "config", "key"], kind="stable").reset_index(drop=True)


def layer_line(layer: str, errors: pd.Series) -> str:
    """`reserve[measured-gpu, <layer>]: N configs, median |error| X%, worst signed Y%, Z under by > 2%`."""
    err = errors.dropna().astype(float)
    name = f"reserve[measured-gpu, {layer}]"
    if not len(err):
        return f"{name}: no rows (measured-gpu rows with the torch_cuda and nvml probes: make gpu-validate)"
    worst = err.iloc[int(err.abs().to_numpy().argmax())]
    under = int((err < -UNDER_LIMIT).sum())
    return (
        f"{name}: {len(err)} configs, median |error| {err.abs().median() * 100:.1f}%, "
        f"worst signed {worst * 100:+.1f}%, {under} under-predicted by > 2%"
    )


def reserve_lines(frame: pd.DataFrame) -> list[str]:
    """The reserved and nvidia-smi lines of `make accuracy` (estimated against measured-gpu)."""
    return [
        layer_line("reserved", frame["reserved_rel_error"]),
        layer_line("nvidia-smi", frame["nvml_rel_error"]),
    ]


def format_reserve_table(frame: pd.DataFrame) -> str:
    """Per row, in MiB: allocated, reserved and NVML peaks (measured-gpu) beside the estimated layers."""
    if not len(frame):
        return "(no measured-gpu rows)"
    t = pd.DataFrame(
        {
            "model": frame["model"],
            "method": frame["method"],
            "config": frame["config"],
            "allocated MiB (measured)": (frame["allocated_bytes"] / MIB).round(1),
            "reserved MiB (measured)": (frame["reserved_bytes"] / MIB).round(1),
            "reserved MiB (estimated)": (frame["predicted_reserved_bytes"] / MIB).round(1),
            "reserved %": (frame["reserved_rel_error"] * 100).round(1),
            "nvidia-smi MiB (measured)": (frame["nvml_bytes"] / MIB).round(1),
            "nvidia-smi MiB (estimated)": (frame["predicted_device_bytes"] / MIB).round(1),
            "nvidia-smi %": (frame["nvml_rel_error"] * 100).round(1),
        }
    )
    with pd.option_context("display.width", 250, "display.max_rows", None, "display.max_colwidth", 70):
        return t.to_string(index=False)
