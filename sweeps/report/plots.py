"""The published figures, drawn from report_data frames with matplotlib and saved byte-for-byte reproducibly.

Figures are built with matplotlib's object API (`Figure`, no pyplot), so nothing selects a backend: `savefig`
renders PNGs with Agg, and a notebook shows the returned figures through its own display hook.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from estimator.units import GIB
from sweeps.report.frames import Card

DPI = 100
SOURCE_STYLE = {  # colour and marker per source, the same in every figure
    "estimated": ("tab:gray", "o"),
    "traced": ("tab:blue", "s"),
    "measured-cpu": ("tab:green", "^"),
    "measured-gpu": ("tab:red", "D"),
}
SET_COLOURS = ("tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:green", "tab:olive", "tab:cyan")
RC = {
    "svg.hashsalt": "grpo-vram",
    "path.simplify": False,
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
    "figure.dpi": DPI,
}


def save(fig: Figure, path: str | os.PathLike) -> None:
    """Write `fig` as a PNG with fixed dpi and no software/time metadata."""
    with matplotlib.rc_context(RC):
        fig.savefig(path, dpi=DPI, metadata={"Software": None})


def _capacity(gpu: Card) -> str:
    """A card's line on a GiB axis, in GiB: what torch can use on it (the card's name keeps its marketed GB)."""
    return f"{gpu.bytes / GIB:.1f} GiB: what torch can use on the {gpu.name}"


def _figure(w: float, h: float, nrows: int = 1, ncols: int = 1, **kw):
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(w, h))
        return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


# ---------------------------------------------------------------- breakdown


def breakdown_figure(breakdown: pd.DataFrame, gpu: Card | None = None, setting: str = "") -> Figure:
    """Stacked bars: estimated bytes per component in the peak phase, one panel per model, one bar per method."""
    with matplotlib.rc_context(RC):
        models = list(dict.fromkeys(breakdown["model"]))
        methods = list(dict.fromkeys(breakdown["method"]))
        comps = sorted(set(breakdown["component"]))
        colors = dict(
            zip(comps, matplotlib.colormaps["tab20"](np.linspace(0, 1, max(len(comps), 2))), strict=False)
        )
        fig, axes = _figure(3.0 * len(models), 5.4, 1, len(models))
        for ax, model in zip(axes[0], models, strict=True):
            sub = breakdown[breakdown["model"] == model]
            bottom = np.zeros(len(methods))
            for comp in comps:
                vals = np.array(
                    [
                        sub[(sub["method"] == m) & (sub["component"] == comp)]["bytes"].sum() / GIB
                        for m in methods
                    ]
                )
                ax.bar(range(len(methods)), vals, bottom=bottom, color=colors[comp], label=comp, width=0.7)
                bottom += vals
            for i, total in enumerate(bottom):
                ax.text(i, total, f"{total:.1f}", ha="center", va="bottom", fontsize=7)
            if gpu is not None and bottom.max() > gpu.bytes / GIB * 0.6:
                ax.axhline(gpu.bytes / GIB, color="black", ls="--", lw=0.8, label=_capacity(gpu))
            ax.set_title(f"Qwen2.5-{model}")
            ax.set_xticks(range(len(methods)))
            ax.set_xticklabels(methods, rotation=40, ha="right")
            ax.set_ylim(0, max(bottom.max(), 1e-3) * 1.15)
        axes[0][0].set_ylabel("peak allocated memory (GiB)")
        handles, labels = {}, []
        for ax in axes[0]:
            for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(lab, h)
        labels = list(handles)
        fig.legend(
            [handles[k] for k in labels],
            labels,
            loc="lower center",
            ncol=min(len(labels), 8),
            fontsize=9,
            title="component",
            frameon=False,
        )
        phases = ", ".join(sorted(set(breakdown["phase"])))
        sub = f"\none GPU, {setting}" if setting else ""
        fig.suptitle(f"Estimated memory by component at the peak phase ({phases}) — source: estimated{sub}")
        fig.tight_layout(rect=(0, 0.14, 1, 0.95))
    return fig


# ---------------------------------------------------------------- accuracy


def accuracy_figure(acc: pd.DataFrame, band: float = 0.05) -> Figure:
    """Left: predicted vs observed GiB (log-log, y = x, ±band); right: relative error vs observed, by source."""
    with matplotlib.rc_context(RC):
        fig, axes = _figure(12.0, 5.6, 1, 2)
        ax, er = axes[0]
        fig.suptitle(
            "Estimator accuracy: predicted (estimated) vs observed (traced / measured) peak allocated memory"
        )
        ax.set_title("predicted vs observed")
        ax.set_xlabel("observed peak allocated (GiB, log scale; traced / measured)")
        ax.set_ylabel("predicted peak allocated (GiB, log scale; estimated)")
        er.set_title("relative error = (predicted − observed) / observed")
        er.set_xlabel("observed peak allocated (GiB, log scale)")
        er.set_ylabel("relative error (%)")
        if acc.empty:
            for a in (ax, er):
                a.text(
                    0.5,
                    0.5,
                    "no traced or measured rows yet",
                    ha="center",
                    va="center",
                    transform=a.transAxes,
                )
            lo, hi, emax = 0.1, 100.0, 2 * band * 100
        else:
            obs = acc["observed_bytes"].to_numpy(float) / GIB
            pred = acc["predicted_bytes"].to_numpy(float) / GIB
            rel = 100 * acc["rel_error"].to_numpy(float)
            lo = float(min(obs.min(), pred.min())) / 1.5
            hi = float(max(obs.max(), pred.max())) * 1.5
            emax = max(float(np.abs(rel).max()) * 1.15, 2 * band * 100)
            groups = (
                acc[["source", "set"]].drop_duplicates().sort_values(["source", "set"])
                if "set" in acc
                else None
            )
            keys = (
                list(groups.itertuples(index=False, name=None))
                if groups is not None
                else [(src, src) for src in sorted(set(acc["source"]))]
            )
            for i, (source, subset) in enumerate(keys):
                m = (acc["source"] == source).to_numpy().copy()
                if groups is not None:
                    m &= (acc["set"] == subset).to_numpy()
                # marker per source (as in every figure); colour per set, so tuned and out-of-sample rows differ
                color, marker = SET_COLOURS[i % len(SET_COLOURS)], SOURCE_STYLE.get(source, ("black", "x"))[1]
                label = (
                    f"{source}, {subset} ({m.sum()} rows)"
                    if subset != source
                    else f"{source} ({m.sum()} rows)"
                )
                # measured rows are few among hundreds of traces: drawn on top, larger, outlined; the held-out
                # traces above the validation ones that would otherwise cover them
                style = {"s": 22, "zorder": 3}
                if subset == "held-out":
                    style = {"s": 30, "zorder": 3.5, "edgecolors": "black", "linewidths": 0.4}
                if source.startswith("measured"):
                    style = {"s": 40, "zorder": 4, "edgecolors": "black", "linewidths": 0.6}
                ax.scatter(obs[m], pred[m], c=color, marker=marker, label=label, **style)
                er.scatter(obs[m], rel[m], c=color, marker=marker, label=label, **style)
        xs = np.geomspace(lo, hi, 50)
        ax.plot(xs, xs, color="black", lw=0.8, label="y = x")
        ax.fill_between(xs, xs * (1 - band), xs * (1 + band), color="gold", alpha=0.35, label=f"±{band:.0%}")
        er.axhline(0, color="black", lw=0.8, label="exact")
        er.axhspan(-100 * band, 100 * band, color="gold", alpha=0.35, label=f"±{band:.0%}")
        for a in (ax, er):
            a.set_xscale("log")
            a.set_xlim(lo, hi)
            a.grid(True, which="both", lw=0.3, alpha=0.5)
            a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_yscale("log")
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        er.set_ylim(-emax, emax)
        ax.legend(loc="upper left", title="source, set")
        # the sets are named in the left panel's legend; here only the reference line and band, in the empty
        # lower-left corner, so no legend box hides an under-prediction
        handles = [
            (h, lab)
            for h, lab in zip(*er.get_legend_handles_labels(), strict=True)
            if lab in ("exact", f"±{band:.0%}")
        ]
        er.legend(*zip(*handles, strict=True), loc="lower left")
        fig.tight_layout()
    return fig


# ---------------------------------------------------------------- curves

CURVE_TEXT = {
    "num_generations": ("num_generations (per_device_train_batch_size = num_generations)", 2),
    "max_completion_length": ("max_completion_length (tokens)", 2),
}


def curve_figure(curves: pd.DataFrame, gpus: Iterable[Card], setting: str = "") -> Figure:
    """Estimated peak allocated GiB along one parameter, one panel per method, GPU capacities as lines."""
    param = curves["param"].iloc[0]
    xlabel, base = CURVE_TEXT[param]
    gpus = list(gpus)
    with matplotlib.rc_context(RC):
        methods = list(dict.fromkeys(curves["method"]))
        models = list(dict.fromkeys(curves["model"]))
        colors = dict(
            zip(models, matplotlib.colormaps["viridis"](np.linspace(0, 0.85, len(models))), strict=True)
        )
        fig, axes = _figure(6.0 * len(methods), 5.8, 1, len(methods), sharey=True)
        est = curves[curves["source"] == "estimated"]
        top = est["peak_allocated_bytes"].max() / GIB
        lo_y = est["peak_allocated_bytes"].min() / GIB / 1.5
        for ax, method in zip(axes[0], methods, strict=True):
            for model in models:
                sub = est[(est["method"] == method) & (est["model"] == model)].sort_values("x")
                ax.plot(
                    sub["x"],
                    sub["peak_allocated_bytes"] / GIB,
                    color=colors[model],
                    marker="o",
                    ms=3,
                    label=f"Qwen2.5-{model} (estimated)",
                )
                for source in sorted(set(curves["source"]) - {"estimated"}):
                    pts = curves[
                        (curves["source"] == source)
                        & (curves["method"] == method)
                        & (curves["model"] == model)
                    ]
                    if not pts.empty:
                        _, mk = SOURCE_STYLE.get(source, ("black", "x"))
                        ax.scatter(
                            pts["x"],
                            pts["peak_allocated_bytes"] / GIB,
                            marker=mk,
                            s=60,
                            facecolor="none",
                            edgecolor=colors[model],
                            lw=1.5,
                            zorder=4,
                            label=f"Qwen2.5-{model} ({source})",
                        )
            shown = [g for g in gpus if lo_y <= g.bytes / GIB <= top * 1.5]
            for g in shown:
                ax.axhline(g.bytes / GIB, color="black", ls=":", lw=0.8)
            ax.set_xscale("log", base=base)
            ax.set_yscale("log")
            ticks = sorted(set(curves["x"]))
            ax.set_xticks(ticks)
            ax.set_xticklabels([str(t) for t in ticks])
            ax.minorticks_off()
            yt = [t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500) if lo_y <= t <= top * 1.5]
            ax.set_yticks(yt)
            ax.set_yticklabels([str(t) for t in yt])
            ax.set_title(method)
            ax.set_xlabel(xlabel)
            ax.grid(True, lw=0.3, alpha=0.5)
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, fontsize=8, frameon=False)
            ax.set_ylim(lo_y, top * 1.5)
            gpu_axis = ax.twinx()
            gpu_axis.set_yscale("log")
            gpu_axis.set_ylim(ax.get_ylim())
            gpu_axis.set_yticks([g.bytes / GIB for g in shown])
            gpu_axis.set_yticklabels([f"{g.bytes / GIB:.1f} GiB ({g.name})" for g in shown], fontsize=7)
            gpu_axis.minorticks_off()
        axes[0][0].set_ylabel("peak allocated memory (GiB, log scale)")
        fig.suptitle(
            f"Peak allocated memory vs {param} — lines estimated, hollow markers traced/measured\n"
            f"one GPU, {setting}; dotted lines: what torch can use on each card, in GiB (a card also holds "
            "CUDA context + allocator reserve)",
            fontsize=9,
        )
        fig.tight_layout()
    return fig
