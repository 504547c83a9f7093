"""grpo-vram-accuracy: the current estimator against every measured and traced row (`make accuracy`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from sweeps import records
from sweeps.runner.predict import predict

SOURCES = ("traced", "measured-cpu", "measured-gpu")
DEFAULT_DIRS = ("results/raw", "results/traced")
MIB = 2**20

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
    return lines


SPLITS = ("in-sample", "validation", "held-out")
OUT_OF_SAMPLE_FILES = {"validation": "validation", "heldout": "held-out"}  # results/traced/<stem>.jsonl
UNDER_LIMIT = 0.02  # an under-prediction beyond 2 % is the failure issue 9 counts


def split_of(path: str | Path) -> str:
    """Which accuracy set a result file's rows belong to, by file name: validation.jsonl (seed A, seen while
    fixing terms), heldout.jsonl (seed B, never used to change a term), anything else in-sample (tuned grids)."""
    return OUT_OF_SAMPLE_FILES.get(Path(path).stem, "in-sample")


def split_summary(name: str, rel_errors: pd.Series) -> str:
    """`<set>: N configs, median |error| X%, worst signed Y%, Z% under-predicted by > 2%` (traced or measured)."""
    err = rel_errors.astype(float)
    if not len(err):
        return f"accuracy[{name}]: no rows"
    worst = err.iloc[int(err.abs().to_numpy().argmax())]
    under = float((err < -UNDER_LIMIT).mean() * 100)
    return (
        f"accuracy[{name}]: {len(err)} configs, median |error| {err.abs().median() * 100:.1f}%, "
        f"worst signed {worst * 100:+.1f}%, {under:.0f}% under-predicted by > 2%"
    )


def split_lines(paths: list[str], predictor: Predictor = predict) -> list[str]:
    """One summary line per set (in-sample, validation, held-out) over the traced rows of `paths`."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.jsonl")) if p.is_dir() else [p] if p.exists() else []
    by_split: dict[str, list[float]] = {s: [] for s in SPLITS}
    for f in files:
        df = accuracy_frame(records.load_rows(f), predictor)
        if len(df):
            df = df[(df["source"] == "traced") & df["rel_error"].notna()]
            by_split[split_of(f)] += list(df["rel_error"])
    return [split_summary(s, pd.Series(v, dtype=float)) for s, v in by_split.items()]


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
    for line in split_lines(args.paths):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
