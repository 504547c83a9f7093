"""`make tables`: regenerate results/README.md and its PNGs from results/raw/ and results/traced/ only.

Output is deterministic (sorted rows, no timestamps, fixed figure metadata): rerunning on the same rows leaves
git clean.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from estimator.settings.config import RunConfig
from estimator.units import GIB, MIB
from sweeps.oneline import OneLineParser
from sweeps.records import read_rows
from sweeps.report import accuracy, legacy_table, plots
from sweeps.report import frames as rd

REPO = Path(__file__).resolve().parents[2]
FIGURES = {
    "breakdown": "breakdown.png",
    "accuracy": "accuracy.png",
    "num_generations": "memory_vs_generations.png",
    "max_completion_length": "memory_vs_completion_length.png",
}


# ---------------------------------------------------------------- markdown


def gib_text(n: float | None, digits: int = 1) -> str:
    return "—" if n is None or pd.isna(n) else f"{n / GIB:.{digits}f}"


def pct(x: float) -> str:
    return "—" if x is None or pd.isna(x) else f"{x * 100:+.1f}%"


def setting_text(base: RunConfig) -> str:
    """The stated default setting in words."""
    return (
        f"per_device_train_batch_size={base.per_device_train_batch_size}, num_generations={base.num_generations}, "
        f"max_prompt_length={base.max_prompt_length}, max_completion_length={base.max_completion_length}, "
        f"weights {base.dtype}, bf16 autocast={base.bf16}, beta={base.beta}, "
        f"gradient_accumulation_steps={base.gradient_accumulation_steps}, one GPU, no vLLM"
    )


# ---------------------------------------------------------------- sections


def headline_markdown(head: pd.DataFrame, gpu: rd.Card) -> str:
    """model × method table of 'GiB (source)', with '— OOM on 80 GB (verdict source)' where it does not fit."""

    def text(r) -> str:
        oom = f"OOM on {gpu.gb} GB ({r['verdict_source']})"
        alloc = r["peak_allocated_bytes"]
        if alloc is None or pd.isna(alloc):
            return oom
        value = f"{gib_text(alloc)} ({r['source']})"
        return f"{value} — **{oom}**" if r["oom"] else value

    head = head.assign(cell=head.apply(text, axis=1))
    table = head.pivot(index="model", columns="method", values="cell")
    table = table.reindex(index=list(dict.fromkeys(head["model"])), columns=list(rd.METHODS))
    table.insert(0, "model", [f"Qwen2.5-{m}" for m in table.index])
    return rd.md_table(table.reset_index(drop=True))


def needed_markdown(head: pd.DataFrame) -> str:
    """The same grid with the bytes needed on the card (allocated + context + allocator reserve)."""
    head = head.assign(
        cell=[
            f"{gib_text(n)} ({s})" if n is not None and pd.notna(n) else "—"
            for n, s in zip(head["needed_bytes"], head["verdict_source"], strict=True)
        ]
    )
    table = head.pivot(index="model", columns="method", values="cell")
    table = table.reindex(index=list(dict.fromkeys(head["model"])), columns=list(rd.METHODS))
    table.insert(0, "model", [f"Qwen2.5-{m}" for m in table.index])
    return rd.md_table(table.reset_index(drop=True))


def fits_markdown(fits: pd.DataFrame, gpus: Sequence[rd.Card]) -> str:
    out = pd.DataFrame(
        {
            "model": [f"Qwen2.5-{m}" for m in fits["model"]],
            "method": fits["method"],
            "on the card, GiB (estimated)": [gib_text(n) for n in fits["needed_bytes"]],
        }
    )
    for g in gpus:
        out[g.label] = ["fits" if v else "✗" for v in fits[g.label]]
    return rd.md_table(out)


def curve_markdown(curves: pd.DataFrame) -> str:
    """Estimated GiB per x (columns) per method and model, observed points appended as 'obs GiB (source)'."""
    est = curves[curves["source"] == "estimated"]
    obs = curves[curves["source"] != "estimated"]
    recs = []
    for (method, model), g in est.groupby(["method", "model"], sort=False):
        rec = {"method": method, "model": f"Qwen2.5-{model}"}
        for _, r in g.sort_values("x").iterrows():
            o = obs[(obs["method"] == method) & (obs["model"] == model) & (obs["x"] == r["x"])]
            extra = "".join(
                f" / {gib_text(p)} ({s})" for p, s in zip(o["peak_allocated_bytes"], o["source"], strict=True)
            )
            rec[str(r["x"])] = gib_text(r["peak_allocated_bytes"]) + extra
        recs.append(rec)
    return rd.md_table(pd.DataFrame.from_records(recs))


def accuracy_markdown(acc: pd.DataFrame) -> str:
    if acc.empty:
        return "_(no traced or measured rows yet)_"
    out = pd.DataFrame(
        {
            "source": acc["source"],
            "model": acc["model"],
            "method": acc["method"],
            "config": acc["config"],
            "predicted GiB": [gib_text(v, 3) for v in acc["predicted_bytes"]],
            "observed GiB": [gib_text(v, 3) for v in acc["observed_bytes"]],
            "abs error GiB": [f"{v / GIB:+.3f}" for v in acc["predicted_bytes"] - acc["observed_bytes"]],
            "rel error": [pct(v) for v in acc["rel_error"]],
            "peak phase (pred / obs)": [
                f"{p} / {o}" for p, o in zip(acc["predicted_phase"], acc["observed_phase"], strict=True)
            ],
        }
    )
    return rd.md_table(out)


def summary_markdown(summary: pd.DataFrame) -> str:
    if summary.empty:
        return "_(no traced or measured rows yet)_"
    out = summary.copy()
    out["median_abs_rel_error"] = [f"{v * 100:.1f}%" for v in out["median_abs_rel_error"]]
    out["worst_rel_error"] = [pct(v) for v in out["worst_rel_error"]]
    out.columns = [*out.columns[:-3], "rows", "median |rel error|", "worst rel error"]
    return rd.md_table(out)


def environment_markdown(env: pd.DataFrame) -> str:
    if env.empty:
        return "_(no rows yet)_"
    return rd.md_table(env)


# ---------------------------------------------------------------- report


def build(
    rows: Iterable[dict],
    out_dir: str | os.PathLike,
    predict: rd.Predict = rd.DEFAULT_PREDICT,
    predict_dispatch: rd.Predict = rd.DEFAULT_PREDICT_DISPATCH,
) -> Path:
    """Write README.md and the PNGs for `rows` into `out_dir`; returns the README path. `predict` estimates what
    a GPU counts, `predict_dispatch` what the traces and the measured-cpu probe count (the accuracy table)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    frame = rd.rows_frame(rows)
    gpus = rd.cards()
    gpu80 = rd.cards([rd.HEADLINE_GPU_GB])[0]
    base = rd.HEADLINE_BASE
    head = rd.headline_frame(frame, predict, gpu_bytes=gpu80.bytes)
    breakdown = rd.breakdown_frame(predict)
    fits = rd.fits_frame(predict, gpus=gpus)
    curves = {p: rd.curve_frame(p, frame, predict) for p in rd.CURVES}
    acc = accuracy.with_prediction(
        accuracy.accuracy_frame(rows, accuracy.estimate_predictor(predict, predict_dispatch))
    )
    env = rd.environment_frame(frame)

    plots.save(plots.breakdown_figure(breakdown, gpu80, short_setting(base)), out / FIGURES["breakdown"])
    plots.save(plots.accuracy_figure(acc), out / FIGURES["accuracy"])
    for p, c in curves.items():
        plots.save(plots.curve_figure(c, gpus, short_setting(base, p)), out / FIGURES[p])

    splits = accuracy.split_lines_of(acc, rows)
    text = render(frame, head, fits, curves, acc, env, gpus, gpu80, base, splits)
    readme = out / "README.md"
    readme.write_text(text, encoding="utf-8")
    return readme


def short_setting(base: RunConfig, swept: str = "") -> str:
    """The default setting in a few words, leaving out what a curve sweeps."""
    parts = {
        "dtype": f"weights {base.dtype}",
        "max_prompt_length": f"prompt {base.max_prompt_length} tokens",
        "max_completion_length": f"completion {base.max_completion_length} tokens",
        "per_device_train_batch_size": f"batch {base.per_device_train_batch_size}",
        "num_generations": f"{base.num_generations} generations",
    }
    if swept == "num_generations":
        parts.pop("per_device_train_batch_size")
    parts.pop(swept, None)
    return ", ".join(parts.values())


def render(frame, head, fits, curves, acc, env, gpus, gpu80, base, splits: Sequence[str] = ()) -> str:
    """The README text (pure)."""
    counts = frame.groupby("source").size().to_dict() if not frame.empty else {}
    count_text = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none yet"
    methods = "\n".join(f"- **{m}**: `{_changes(c)}`" for m, c in rd.METHODS.items())
    gpu_text = ", ".join(f"{g.label} = {g.bytes / MIB:.0f} MiB" for g in gpus)
    src_counts = head["source"].value_counts().to_dict()
    head_counts = ", ".join(f"{n} {s}" for s, n in sorted(src_counts.items()))
    sections = [
        "# Results: GRPO memory tables",
        "<!-- Generated by `make tables` (sweeps/report/tables.py) from results/raw/ and results/traced/. Do not edit. -->",
        "Every number says where it came from: **estimated** (`estimate()` in `estimator/`, computed for that "
        "exact config), **traced** (a real-size GRPO step under FakeTensorMode, `results/traced/`), "
        "**measured-cpu** or **measured-gpu** (real GRPO steps, `results/raw/`). "
        f"Rows read: {count_text}. Row format: [SCHEMA.md](SCHEMA.md).",
        "Memory here is the **peak allocated** tensor memory of one steady-state GRPO step "
        "(`torch.cuda.max_memory_allocated`; the live tensor-storage peak for traces and CPU runs, which in a full "
        "fine-tune with tied embeddings sum the head's and the embedding's gradients out of place: one [V, H] more "
        "than a GPU holds there, docs/ACCURACY.md), in GiB. "
        "A card holds that plus the CUDA context and the caching allocator's reserve: the OOM / fits verdicts use "
        "the NVML peak where a GPU run recorded one, else the peak plus the estimator's overheads.",
        "## Headline: peak memory by model size and method",
        f"Default setting: {setting_text(base)}. Methods (changes to TRL 1.16's `GRPOConfig` defaults):\n\n"
        f"{methods}",
        f"Cells: peak allocated GiB (source), best available source first (measured-gpu > traced > estimated); "
        f'"OOM on {gpu80.gb} GB" when it does not fit the {gpu80.name} ({gpu80.bytes / MIB:.0f} MiB torch can use, '
        f"as `vram-estimate` decides; an estimated cell adds the validated error band of its regime, a traced "
        "or measured cell does not need one). "
        f"Sources in this table: {head_counts}.",
        headline_markdown(head, gpu80),
        "What the card must hold for the same cells (GiB; allocated + CUDA context + allocator reserve, "
        "source of the verdict):",
        needed_markdown(head),
        f"![Estimated breakdown by component]({FIGURES['breakdown']})",
        legacy_table.seed_markdown(),
        "## Fits on which GPU (estimated)",
        f"Same default setting; each size is the catalog GPU (`estimator/hardware/gpus.py`) with the least memory the "
        f'driver reports, sized by what torch can use on it: {gpu_text}. "fits" = what the card must hold '
        "plus the validated error band (`vram-estimate`'s verdict) ≤ that memory. All estimated.",
        fits_markdown(fits, gpus),
        "## Memory vs num_generations",
        "Estimated peak allocated GiB (columns: num_generations; per_device_train_batch_size = num_generations, "
        "i.e. one prompt's group per micro-batch); any traced / measured row of the exact config follows as "
        "`/ GiB (source)`. Other settings as the headline.",
        curve_markdown(curves["num_generations"]),
        f"![Memory vs num_generations]({FIGURES['num_generations']})",
        "## Memory vs completion length",
        "Estimated peak allocated GiB (columns: max_completion_length), observed rows as above.",
        curve_markdown(curves["max_completion_length"]),
        f"![Memory vs completion length]({FIGURES['max_completion_length']})",
        "## Accuracy of the estimator",
        "Every `ok` traced / measured row, one per (source, key), against the *current* estimator's prediction "
        "for its config (recomputed, not the prediction stored in the row); `make accuracy` prints the same "
        "numbers (`sweeps/report/accuracy.py`). Error = predicted − observed; relative to observed.",
        "### Summary per source",
        summary_markdown(accuracy.summary_frame(acc, ("source",))),
        "### Summary per source and method",
        summary_markdown(accuracy.summary_frame(acc, ("source", "method"))),
        "### In-sample, validation and held-out (traced)",
        _splits_text(),
        "\n".join(f"- `{line}`" for line in splits),
        f"![Predicted vs observed]({FIGURES['accuracy']})",
        "### Every row",
        accuracy_markdown(acc),
        "## Environments",
        "Where each source's rows were made (from the rows' `versions`, `device` and `git_commit`).",
        environment_markdown(env),
    ]
    return "\n\n".join(sections) + "\n"


def _changes(c: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in c.items())


def _splits_text() -> str:
    """What the in-sample, validation and held-out sets are, from the grids' registry (sweeps/trace/grids.py)."""
    from sweeps.trace.grids import GRIDS

    def files(split: str) -> str:
        return ", ".join(f"`results/traced/{g.out}`" for g in GRIDS.values() if g.split == split)

    return (
        "In-sample: the grids the estimator was refined on; validation: seeded random grids over every axis "
        f"({files('validation')}, each row with its `seed`), used while fixing terms and for the error band; "
        f"held-out: a seed of its own ({files('held-out')}), never used to change a term. `after the band`: the "
        "share still under-predicted by more than 2 % once each row's regime band (`estimator/step/band.py`) is "
        "applied."
    )


def result_dirs(raw: str | os.PathLike, traced: str | os.PathLike) -> list[Path]:
    """The raw directory, and the traced directory with each of its folders (tuned/, random/)."""
    traced = Path(traced)
    return [Path(raw), traced, *sorted(d for d in traced.iterdir() if d.is_dir())]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: grpo-vram-tables [--raw DIR] [--traced DIR] [--out DIR]."""
    ap = OneLineParser(prog="grpo-vram-tables", description=__doc__.splitlines()[0])
    ap.add_argument("--raw", default=str(REPO / "results" / "raw"))
    ap.add_argument("--traced", default=str(REPO / "results" / "traced"))
    ap.add_argument("--out", default=str(REPO / "results"))
    args = ap.parse_args(argv)
    for name in ("raw", "traced"):
        if not Path(getattr(args, name)).is_dir():
            print(f"grpo-vram-tables: --{name} {getattr(args, name)!r} is not a directory", file=sys.stderr)
            return 2
    loaded = read_rows(result_dirs(args.raw, args.traced))
    for line in loaded.report_lines():
        print(line, file=sys.stderr)
    rows = loaded.rows
    readme = build(rows, args.out)
    print(f"wrote {readme} and {len(FIGURES)} PNGs from {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
