"""The one accuracy computation: the current estimator against every measured and traced row.

`make accuracy` (`sweeps/report/accuracy_cli.py`), `make tables` (results/README.md), notebooks/analysis.ipynb, the README's
accuracy paragraph and the tests all call `accuracy_frame` and `summary_frame`, so they show the same numbers for
the same rows. Rows are deduplicated by (source, key) with `records.latest_rows`: a measurement beats a failed
retry, then the latest `written_at` wins, never the file name. Summaries are per source and per (source,
method), so traced and measured rows are never mixed. Each row is compared with the estimate as its own counter
sees it: traced and measured-cpu rows through a Python dispatch mode (`predict.tensors_of`), measured-gpu rows with
the workspaces that torch's `max_memory_allocated` counts beside the tensors (`workspaces`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pandas as pd

from estimator.settings.config import NEWEST_TRL, RunConfig
from estimator.settings.trl_versions import profile
from estimator.settings.versions import MODELLED_TRANSFORMERS, NEWEST_TRANSFORMERS, RECORDS_TRANSFORMERS
from estimator.step.estimate import Estimate, estimate
from estimator.terms.optimizer import REAL
from estimator.units import MIB
from sweeps import records
from sweeps.report.frames import method_of, model_label, summarize_config
from sweeps.runner.predict import arch_for, config_of, predict, tensors_of
from sweeps.trace.grids import SPLITS, split_of

SOURCES = ("traced", "measured-cpu", "measured-gpu")
SETS = {  # set name -> (source, sweep), reported on its own line as well
    "multi-gpu": ("traced", "multigpu"),  # rank 0 of N FSDP2 ranks
    "padded": (
        "measured-cpu",
        "padded",
    ),  # left-padded GSM8K prompts, natural lengths, estimated at the maxima
    # DeepSpeed ZeRO with CPU offload rehearsed on DeepSpeed's CPU accelerator: host and device are one memory
    # there, so the live tensors count the offloaded master weights, gradients and Adam states that a GPU run
    # keeps in host RAM; a check that the path runs, not a like-for-like error of the GPU estimate
    "zero-offload on CPU": ("measured-cpu", "zero-cpu"),
    # DDP over 2 gloo ranks on CPU (sweeps/runner/ranks.py): the largest rank's tensors, DDP's buckets among them
    "DDP, 2 ranks on CPU": ("measured-cpu", "ddp-cpu"),
}
# sets compared only on their own line: the padded runs are estimated at the maximum lengths on purpose (an upper
# bound of natural-length batches) and the ZeRO rehearsal counts host state as device memory, so neither is a
# like-for-like error and both stay out of the per-source summaries
OWN_LINE_ONLY = {SETS["padded"], SETS["zero-offload on CPU"]}
# what a set's own line is, where its error is not the estimate's (printed in place of the under-prediction count)
NOT_AN_ERROR = {
    "zero-offload on CPU": "a path rehearsal, not an error: DeepSpeed's CPU accelerator keeps the offloaded "
    "host state on the one device the probe counts, which the estimate's device figure leaves out"
}
DEFAULT_DIRS = tuple(str(p) for p in records.RESULT_DIRS)

# (row config dict, stored config.json of a model built in code, what counted the row's tensors: "real" or
# "dispatch") -> (Estimate.to_dict()-like dict, error)
Predictor = Callable[[dict, dict | None, str], tuple[dict | None, str | None]]

COLUMNS = [
    "source",
    "set",
    "trl_version",
    "transformers_version",
    "sweep",
    "key",
    "model",
    "method",
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
NUMERIC = [
    "predicted_bytes",
    "observed_bytes",
    "abs_error_bytes",
    "rel_error",
    "predicted_device_bytes",
    "nvml_bytes",
    "device_rel_error",
]


def estimate_predictor(
    fn: Callable[[RunConfig], Estimate], dispatch: Callable[[RunConfig], Estimate] | None = None
) -> Predictor:
    """A Predictor from RunConfig -> Estimate functions (e.g. a cached or toy `estimate`): `fn` for rows a device's
    own counters measured, `dispatch` (default `fn`) for rows counted through a Python dispatch mode (traced,
    measured-cpu); models built in code are sized from their stored config.json with the real estimator."""
    dispatch = dispatch or fn

    def run(config: dict, hf_config: dict | None, tensors: str = REAL) -> tuple[dict | None, str | None]:
        try:
            cfg = RunConfig.from_dict(config)
            arch = arch_for(cfg, hf_config or None)
            if arch is not None:
                est = estimate(cfg, arch, tensors)
            else:
                est = (fn if tensors == REAL else dispatch)(cfg)
        except Exception as exc:  # a row whose model or fields this estimator cannot size
            msg = (str(exc).strip().splitlines() or [""])[0]
            return None, f"{type(exc).__name__}: {msg}"[:300]
        return {
            "peak_allocated_bytes": est.peak_allocated_bytes,
            "allocator_overhead_bytes": est.allocator_overhead_bytes,
            "peak_reserved_bytes": est.peak_reserved_bytes,
            "peak_device_bytes": est.peak_device_bytes,
            "peak_phase": est.peak_phase,
        }, None

    return run


def workspaces(pred: dict) -> int:
    """The cuBLAS / cuBLASLt workspaces of an estimate (`Estimate.to_dict()`-like): allocated through the caching
    allocator, so `max_memory_allocated` counts them beside the tensors (peak reserved less the tensor peak and
    the allocator's reserve; 0 where the prediction does not say)."""
    if "peak_reserved_bytes" not in pred:
        return 0
    return (
        pred["peak_reserved_bytes"] - pred["peak_allocated_bytes"] - pred.get("allocator_overhead_bytes", 0)
    )


def _nvml_peak(observed: dict) -> int | None:
    """Peak device-used bytes from the NVML probe (this process when NVML lists it), else None."""
    nv = (observed.get("probes") or {}).get("nvml") or {}
    if not nv.get("available"):
        return None
    return nv.get("peak_process_bytes") or nv.get("peak_device_bytes")


def release_of(row: dict) -> str:
    """The transformers release a row was made under, as its config says (rows from before the setting: 5.23)."""
    config = row.get("config") if isinstance(row.get("config"), dict) else {}
    return str(config.get("transformers_version", RECORDS_TRANSFORMERS))


def release_view(rows: Iterable[dict], release: str) -> list[dict]:
    """The rows as one set under transformers `release`: each row made under it, and each row made under
    another release that no row made under `release` retraces (`retrace_of`, sweeps.trace.retrace --beside)
    and that is no retrace itself. A config retraced for a new release counts once, at that release."""
    rows = list(rows)
    at = [r for r in rows if release_of(r) == release]
    replaced = {r.get("retrace_of") for r in at}
    return at + [
        r
        for r in rows
        if release_of(r) != release and r.get("key") not in replaced and not r.get("retrace_of")
    ]


def compared_rows(rows: Iterable[dict], release: str | None = NEWEST_TRANSFORMERS) -> list[dict]:
    """The rows accuracy compares: one per (source, key) (records.latest_rows), status ok, with a peak; with
    `release`, the set as it stands under that transformers release (`release_view`), else every row."""
    if release is not None:
        rows = release_view(rows, release)
    out = []
    for r in records.latest_rows(rows):
        peak = (r.get("observed") or {}).get("peak_bytes") if isinstance(r.get("observed"), dict) else None
        if (
            r.get("status") == "ok"
            and isinstance(peak, (int, float))
            and peak > 0
            and isinstance(r.get("config"), dict)
        ):
            out.append(r)
    return out


def accuracy_frame(
    rows: Iterable[dict], predictor: Predictor = predict, release: str | None = NEWEST_TRANSFORMERS
) -> pd.DataFrame:
    """One line per compared row (`compared_rows`: by default the set under the newest transformers release
    modelled): prediction recomputed now, observed peak, abs / relative error, peak phases.

    A row the estimator cannot size stays in the frame with `prediction_error` set and no error numbers."""
    out = []
    for r in compared_rows(rows, release):
        obs = r["observed"]
        config = config_of(r)
        pred, err = predictor(config, (r.get("model") or {}).get("config"), tensors_of(r))
        predicted = pred["peak_allocated_bytes"] if pred else None
        if predicted is not None and r.get("source") == "measured-gpu":
            predicted += workspaces(pred)  # torch's allocated counts them
        observed = int(obs["peak_bytes"])
        line = {
            "source": r.get("source"),
            "trl_version": str(config.get("trl_version", NEWEST_TRL)),
            "transformers_version": release_of(r),
            "set": set_of(r.get("source"), r.get("sweep")),
            "sweep": r.get("sweep"),
            "key": r["key"],
            "model": model_label(str(config.get("model", ""))),
            "method": method_of(config),
            "config": summarize_config(config),
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
    df = pd.DataFrame(out, columns=COLUMNS)
    for c in NUMERIC:
        df[c] = pd.to_numeric(df[c], errors="coerce").astype(float)
    df["prediction_error"] = df["prediction_error"].astype(object).where(df["prediction_error"].notna(), None)
    return df.sort_values(["source", "model", "method", "config", "key"], kind="stable").reset_index(
        drop=True
    )


def with_prediction(acc: pd.DataFrame) -> pd.DataFrame:
    """The lines of `acc` that have a prediction (an error to report)."""
    return acc[acc["rel_error"].notna()].reset_index(drop=True)


def summary_frame(acc: pd.DataFrame, by: Sequence[str] = ("source", "method")) -> pd.DataFrame:
    """Per group of `by` (source, or source and method): count, median |rel error| and the worst (largest |rel|)
    signed error, over the lines with a prediction."""
    by = list(by)
    cols = [*by, "count", "median_abs_rel_error", "worst_rel_error"]
    acc = with_prediction(acc)
    if (
        len(acc) and "sweep" in acc
    ):  # the own-line-only sets (OWN_LINE_ONLY) are summarised by `summary_lines`
        own = acc.apply(lambda r: (r["source"], r["sweep"]) in OWN_LINE_ONLY, axis=1)
        if own.any() and not own.all():
            acc = acc[~own]
    if acc.empty:
        return pd.DataFrame(columns=cols)
    recs = []
    for value, g in acc.groupby(by, sort=True):
        values = value if isinstance(value, tuple) else (value,)
        absrel = g["rel_error"].abs()
        recs.append(
            {
                **dict(zip(by, values, strict=True)),
                "count": len(g),
                "median_abs_rel_error": float(absrel.median()),
                "worst_rel_error": float(g.loc[absrel.idxmax(), "rel_error"]),
            }
        )
    return pd.DataFrame.from_records(recs, columns=cols)


def summary_lines(acc: pd.DataFrame) -> list[str]:
    """`accuracy[<source>]: N configs, median X%, worst Y%` per source present, then the same per method."""
    lines = []
    per_source = summary_frame(acc, ("source",)).set_index("source")
    per_method = summary_frame(acc, ("source", "method"))
    for source in SOURCES:
        if source not in per_source.index:
            continue
        s = per_source.loc[source]
        lines.append(f"accuracy[{source}]: {_stats(s)}")
        for _, m in per_method[per_method["source"] == source].iterrows():
            lines.append(f"accuracy[{source}, {m['method']}]: {_stats(m)}")
    old = with_prediction(acc)
    old = old[old["trl_version"] != NEWEST_TRL]
    if len(
        old
    ):  # rows measured under older TRL releases: one line per modelled range of estimator/settings/trl_versions.py
        old = old.assign(release=old["trl_version"].map(lambda v: f"TRL {profile(v).label}"))
        for _, m in summary_frame(old, ("source", "release")).iterrows():
            lines.append(f"accuracy[{m['source']}, {m['release']}]: {_stats(m)}")
    for name, (source, sweep) in SETS.items():  # sets reported on their own line as well
        sub = with_prediction(acc)
        sub = sub[(sub["source"] == source) & (sub["sweep"] == sweep)]
        if len(sub):
            s = summary_frame(sub.assign(set=name), ("set",)).iloc[0]
            low = int((sub["rel_error"] < -0.02).sum())
            tail = NOT_AN_ERROR.get(name, f"{low} under-predicted by more than 2%")
            lines.append(f"accuracy[{source}, {name}]: {_stats(s)}, {tail}")
    return lines


def _stats(s) -> str:
    return (
        f"{int(s['count'])} configs, median {100 * s['median_abs_rel_error']:.1f}%, "
        f"worst {100 * abs(s['worst_rel_error']):.1f}%"
    )


UNDER_LIMIT = 0.02  # an under-prediction beyond 2 % is the failure the accuracy targets count


def split_summary(name: str, rel_errors: pd.Series, after_band: pd.Series | None = None) -> str:
    """`<set>: N configs, median |error| X%, worst signed Y%, Z% under-predicted by > 2%` (traced or measured),
    and, with `after_band`, the share still under by > 2 % once the regime's validated band is applied. Shares
    keep one decimal, so a single row of a few hundred does not print as 0 %."""
    err = rel_errors.astype(float)
    if not len(err):
        return f"accuracy[{name}]: no rows"
    worst = err.iloc[int(err.abs().to_numpy().argmax())]
    under = float((err < -UNDER_LIMIT).mean() * 100)
    line = (
        f"accuracy[{name}]: {len(err)} configs, median |error| {err.abs().median() * 100:.1f}%, "
        f"worst signed {worst * 100:+.1f}%, {under:.1f}% under-predicted by > 2%"
    )
    if after_band is not None and len(after_band):
        still = float((after_band.astype(float) < -UNDER_LIMIT).mean() * 100)
        line += f"; after the band {still:.1f}%"
    return line


def set_of(source: str | None, sweep: str | None) -> str:
    """The set a row is reported in: a SETS entry (multi-gpu, padded), else in-sample / validation / held-out
    for traced rows (by the grid that wrote them, sweeps/trace/grids.py), else its source's own rows (measured
    rows were never tuned on one by one)."""
    for name, key in SETS.items():
        if (source, sweep) == key:
            return name
    return split_of(sweep) if source == "traced" else str(source)


def split_lines_of(acc: pd.DataFrame, rows: Iterable[dict]) -> list[str]:
    """One summary line per set (in-sample, validation, held-out) over the traced lines of `acc`, before and
    after the validated band of each row's regime (estimator/step/band.py)."""
    from estimator.step.band import margin

    configs = {
        (r.get("source"), r.get("key")): r.get("config") for r in rows if isinstance(r.get("config"), dict)
    }
    df = acc[(acc["source"] == "traced") & acc["rel_error"].notna()] if len(acc) else acc
    by_split: dict[str, list[float]] = {s: [] for s in SPLITS}
    banded: dict[str, list[float]] = {s: [] for s in SPLITS}
    for _, line in df.iterrows():
        split = split_of(line["sweep"])
        by_split[split].append(line["rel_error"])
        m = margin(RunConfig.from_dict(configs[("traced", line["key"])]))
        raised = line["predicted_bytes"] * (1 + m)
        banded[split].append((raised - line["observed_bytes"]) / line["observed_bytes"])
    return [
        split_summary(s, pd.Series(v, dtype=float), pd.Series(banded[s], dtype=float))
        for s, v in by_split.items()
    ]


def release_lines(rows: list[dict], predictor: Predictor = predict) -> list[str]:
    """The three traced sets and the measured-gpu rows as they stand under each modelled transformers release
    (`release_view`), side by side: `accuracy[transformers 5.23, validation]: ...`."""
    out = []
    for release in MODELLED_TRANSFORMERS:
        acc = accuracy_frame(rows, predictor, release)
        for line in split_lines_of(acc, rows):
            out.append(line.replace("accuracy[", f"accuracy[transformers {release}, ", 1))
        gpu = with_prediction(acc)
        gpu = gpu[gpu["source"] == "measured-gpu"]
        if len(gpu):
            out.append(split_summary(f"transformers {release}, measured-gpu", gpu["rel_error"]))
    return out


def split_lines(paths: list[str], predictor: Predictor = predict) -> list[str]:
    """`split_lines_of` over the rows of `paths` (result dirs or .jsonl files)."""
    rows = records.read_rows(paths).rows
    return split_lines_of(accuracy_frame(rows, predictor), rows)


def format_table(df: pd.DataFrame) -> str:
    """The per-config table in MiB with signed relative errors."""
    if not len(df):
        return "(no ok rows)"
    t = pd.DataFrame(
        {
            "source": df["source"],
            "model": df["model"],
            "method": df["method"],
            "config": df["config"],
            "estimated MiB": (df["predicted_bytes"] / MIB).round(1),
            "observed MiB (source)": (df["observed_bytes"] / MIB).round(1),
            "error MiB": (df["abs_error_bytes"] / MIB).round(1),
            "rel %": (df["rel_error"] * 100).round(1),
            "peak phase (pred/obs)": df["predicted_phase"].fillna("-")
            + "/"
            + df["observed_phase"].fillna("-"),
        }
    )
    if df["nvml_bytes"].notna().any():
        t["pred dev MiB"] = (df["predicted_device_bytes"] / MIB).round(1)
        t["nvml MiB"] = (df["nvml_bytes"] / MIB).round(1)
        t["dev rel %"] = (df["device_rel_error"] * 100).round(1)
    with pd.option_context("display.width", 250, "display.max_rows", None, "display.max_colwidth", 90):
        return t.to_string(index=False)
