"""grpo-vram-accuracy: the current estimator against every measured and traced row (`make accuracy`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from estimator.config import NEWEST_TRL
from estimator.trl_versions import profile
from estimator.units import MIB
from sweeps import records
from sweeps.runner.predict import predict

SOURCES = ("traced", "measured-cpu", "measured-gpu")
DEFAULT_DIRS = ("results/raw", "results/traced")

Predictor = Callable[[dict, dict | None], tuple[dict | None, str | None]]


def latest_ok_rows(rows: list[dict]) -> list[dict]:
    """The last row per (source, key), kept only when its status is ok."""
    last: dict[tuple, dict] = {}
    for r in rows:
        if "key" in r:
            last[(r.get("source"), r["key"])] = r
    return [
        r for r in last.values() if r.get("status") == "ok" and (r.get("observed") or {}).get("peak_bytes")
    ]


def _summary(cfg: dict) -> str:
    """A short config label: model, method, dtype, geometry, GC, optimizer."""
    method = "qlora" if cfg.get("load_in_4bit") else "lora" if cfg.get("use_peft") else "full"
    parts = [
        str(cfg.get("model")),
        method,
        str(cfg.get("dtype")),
        f"bs{cfg.get('per_device_train_batch_size')}",
        f"G{cfg.get('num_generations')}",
        f"P{cfg.get('max_prompt_length')}+C{cfg.get('max_completion_length')}",
        "gc" if cfg.get("gradient_checkpointing") else "nogc",
        str(cfg.get("optim")),
    ]
    if cfg.get("beta"):
        parts.append(f"beta{cfg['beta']}")
    if cfg.get("trl_version", NEWEST_TRL) != NEWEST_TRL:
        parts.append(f"TRL {cfg['trl_version']}")
    if cfg.get("use_vllm"):
        parts.append("vllm-sleep" if cfg.get("vllm_enable_sleep_mode") else "vllm")
    return " ".join(parts)


def _nvml_peak(observed: dict) -> int | None:
    """Peak device-used bytes from the NVML probe (this process when NVML lists it), else None."""
    nv = (observed.get("probes") or {}).get("nvml") or {}
    if not nv.get("available"):
        return None
    return nv.get("peak_process_bytes") or nv.get("peak_device_bytes")


def accuracy_frame(rows: list[dict], predictor: Predictor = predict) -> pd.DataFrame:
    """One line per ok row: prediction recomputed now, observed peak, abs / relative error, peak phases."""
    out = []
    for r in latest_ok_rows(rows):
        obs = r["observed"]
        model = r.get("model") or {}
        pred, err = predictor(r["config"], model.get("config"))
        predicted = pred["peak_allocated_bytes"] if pred else None
        observed = int(obs["peak_bytes"])
        line = {
            "source": r.get("source"),
            "trl_version": r["config"].get("trl_version", NEWEST_TRL),
            "sweep": r.get("sweep"),
            "key": r["key"],
            "config": _summary(r["config"]),
            "predicted_bytes": predicted,
            "observed_bytes": observed,
            "abs_error_bytes": (predicted - observed) if predicted is not None else None,
            "rel_error": (predicted - observed) / observed if predicted is not None else None,
            "predicted_phase": pred.get("peak_phase") if pred else None,
            "observed_phase": obs.get("peak_phase"),
            "prediction_error": err,
            "predicted_device_bytes": pred.get("peak_device_bytes") if pred else None,
            "nvml_bytes": None,
            "device_rel_error": None,
        }
        if r.get("source") == "measured-gpu":
            nv = _nvml_peak(obs)
            line["nvml_bytes"] = nv
            if nv and pred:
                line["device_rel_error"] = (pred["peak_device_bytes"] - nv) / nv
        out.append(line)
    return pd.DataFrame(out, columns=_COLUMNS)


_COLUMNS = [
    "source",
    "trl_version",
    "sweep",
    "key",
    "config",
    "predicted_bytes",
    "observed_bytes",
    "abs_error_bytes",
    "rel_error",
    "predicted_phase",
    "observed_phase",
    "prediction_error",
    "predicted_device_bytes",
    "nvml_bytes",
    "device_rel_error",
]


def summary_lines(df: pd.DataFrame) -> list[str]:
    """`accuracy[<source>]: N configs, median X%, worst Y%` per source present (|relative error|)."""
    lines = []
    for source in SOURCES:
        sub = df[(df["source"] == source) & df["rel_error"].notna()] if len(df) else df
        if not len(sub):
            continue
        err = sub["rel_error"].astype(float).abs() * 100
        lines.append(
            f"accuracy[{source}]: {len(sub)} configs, median {err.median():.1f}%, worst {err.max():.1f}%"
        )
    if len(df):  # rows measured under older TRL releases, one line per modelled range
        old = df[(df["trl_version"] != NEWEST_TRL) & df["rel_error"].notna()]
        for label, sub in old.groupby(old["trl_version"].map(lambda v: profile(v).label), sort=False):
            err = sub["rel_error"].astype(float) * 100
            lines.append(
                f"accuracy[{'/'.join(sorted(set(sub['source'])))}, TRL {label}]: {len(sub)} configs, "
                f"median |error| {err.abs().median():.1f}%, worst {err.abs().max():.1f}%, "
                f"lowest {err.min():+.1f}%"
            )
    return lines


def format_table(df: pd.DataFrame) -> str:
    """The per-config table in MiB with signed relative errors."""
    if not len(df):
        return "(no ok rows)"
    t = pd.DataFrame(
        {
            "source": df["source"],
            "config": df["config"],
            "estimated MiB": (df["predicted_bytes"].astype(float) / MIB).round(1),
            "observed MiB (source)": (df["observed_bytes"].astype(float) / MIB).round(1),
            "error MiB": (df["abs_error_bytes"].astype(float) / MIB).round(1),
            "rel %": (df["rel_error"].astype(float) * 100).round(1),
            "peak phase (pred/obs)": df["predicted_phase"].fillna("-")
            + "/"
            + df["observed_phase"].fillna("-"),
        }
    )
    if df["nvml_bytes"].notna().any():
        t["pred dev MiB"] = (df["predicted_device_bytes"].astype(float) / MIB).round(1)
        t["nvml MiB"] = (df["nvml_bytes"].astype(float) / MIB).round(1)
        t["dev rel %"] = (df["device_rel_error"].astype(float) * 100).round(1)
    with pd.option_context("display.width", 250, "display.max_rows", None, "display.max_colwidth", 90):
        return t.to_string(index=False)


def main(argv: list[str] | None = None) -> int:
    """Print the accuracy table and one summary line per source."""
    parser = argparse.ArgumentParser(prog="grpo-vram-accuracy", description=__doc__)
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_DIRS), help="result dirs or .jsonl files")
    args = parser.parse_args(argv)
    missing = [p for p in args.paths if not Path(p).exists() and p not in DEFAULT_DIRS]
    if missing:
        print(
            f"grpo-vram-accuracy: no such file or directory {missing[0]!r}; give result dirs or .jsonl files",
            file=sys.stderr,
        )
        return 2
    df = accuracy_frame(records.load_rows(args.paths))
    print(format_table(df))
    failed = df[df["prediction_error"].notna()] if len(df) else df
    for _, r in failed.iterrows():
        print(f"no prediction for {r['config']}: {r['prediction_error']}")
    for line in summary_lines(df):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
