"""The smallest card, measured, against the estimator: per mincard row (results/raw/mincard.jsonl), the measured
smallest passing torch limit (`min_torch_bytes`, measured-gpu) beside the estimator's two figures for the same
quantity (estimated, `estimator/step/estimate.py`): the torch-limit figure `need_bytes − outside_allocator_bytes`
and the fit figure `fit_bytes − outside_allocator_bytes` (the band added). Target: never below, within 3 % above.

    python -m sweeps.report.mincard [ROWS.jsonl ...] [--markdown results/MINCARD.md] [--traced DIR] [--trace-missing]
        [--lineup]

Where the row's configuration was traced (`--traced`, default results/streams/mincard/: a folder of its own, which
the reserve fits never read; `--trace-missing` traces the rows without one, CPU, under a minute each), the table adds
a third figure: the smallest limit the allocator simulation passes the traced stream under, plus the cuBLAS
workspaces the trace does not hold (traced, simulated). Beside the measured minimum it tells the trace's and the
simulator's error apart from the estimator's own.

A second table splits each row's distance from the measured minimum into its parts (`breakdown`): the tensor
peak's error against the GPU's `max_memory_allocated`, the reserve model's least-squares value against what the GPU
needed above its tensors and workspaces, the model's safety margin, and the band.

`--lineup` adds a forecast for the lineup's configurations not measured yet (`+experiment=mincard`): the fit figure
beside each one's trace's need, both made on CPU before the GPU measures them (with `--trace-missing`, traced first).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from estimator.settings.config import RunConfig
from estimator.units import GIB, MIB
from sweeps import records
from sweeps.oneline import OneLineParser
from sweeps.report import row_traces
from sweeps.report.stranding import Stranding, describe, stranding
from sweeps.runner.predict import arch_for

DEFAULT_ROWS = records.REPO / "results" / "raw" / "mincard.jsonl"
TRACED = records.REPO / "results" / "streams" / "mincard"
SOURCE = row_traces.SOURCE
PROG = "python -m sweeps.report.mincard"

Figures = Callable[[dict], "tuple[int, int] | None"]  # row -> (torch-limit figure, fit figure), estimated


def estimated_figures(row: dict) -> tuple[int, int] | None:
    """(need − outside the allocator, fit − outside the allocator) of the row's config (estimated), or None
    when the estimator cannot size it."""
    from estimator.step.estimate import estimate

    try:
        cfg = RunConfig.from_dict(row["config"])
        est = estimate(cfg, arch_for(cfg, (row.get("model") or {}).get("config")))
    except (
        Exception
    ):  # an estimator that cannot size the row leaves it out of the comparison, never the report
        return None
    return est.need_bytes - est.outside_allocator_bytes, est.fit_bytes - est.outside_allocator_bytes


def breakdown(row: dict) -> dict | None:
    """The row's fit figure less its measured minimum, in bytes, split into parts that sum to it: `tensors`, the
    estimated tensor peak less the GPU's `max_memory_allocated` at its baseline limit (measured-gpu); `central`,
    the reserve model's least-squares extra (the model that sets the need: step or generation, no margin) less
    what the GPU needed above its tensors and workspaces (the measured minimum less that peak and the estimated
    workspaces); `margin`, the model's safety margin (its worst leave-one-out under-prediction; with the generation
    model, its cap too); `band`, the validated band on the tensor peak. None where the estimator cannot size the
    row, where the need is a simulation of the config's own stream (no model), or without a baseline peak."""
    from estimator.step.estimate import estimate
    from estimator.terms import allocator_reserve as allocator_term

    try:
        cfg = RunConfig.from_dict(row["config"])
        est = estimate(cfg, arch_for(cfg, (row.get("model") or {}).get("config")))
    except Exception:  # an estimator that cannot size the row leaves it out, as `estimated_figures` does
        return None
    gpu_peak = ((row.get("mincard") or {}).get("baseline") or {}).get("peak_allocated_bytes")
    variant = allocator_term.config_variant(cfg)
    if not gpu_peak or allocator_term.simulated(cfg, variant) is not None or est.need_extra_bytes is None:
        return None
    if est.need_extra_bytes != est.allocator_overhead_bytes and not cfg.generation_use_cache:
        return (
            None  # generation without a cache: the reserve's segments sit above the models (not split here)
        )
    shares = allocator_term.shares_of(est.phases)
    parts = allocator_term.need_parts(cfg, est.peak_allocated_bytes, variant, shares)
    if not parts:
        return None
    model = parts[parts["model"]]
    peak = est.peak_allocated_bytes
    measured = row["mincard"]["min_torch_bytes"]
    gpu_need = measured - gpu_peak - est.in_reserved_bytes
    central = int(model["central"] * peak)
    return {
        "config": label(row["config"]),
        "key": row["key"],
        "model": parts["model"],
        "measured_bytes": measured,
        "gpu_peak_bytes": gpu_peak,
        "gpu_need_bytes": gpu_need,
        "peak_bytes": peak,
        "workspace_bytes": est.in_reserved_bytes,
        "central_fraction": model["central"],
        "margin_fraction": model["fraction"] - model["central"],
        "tensors": peak - gpu_peak,
        "central": central - gpu_need,
        "margin": est.need_extra_bytes - central,
        "band": est.band_bytes,
        "fit_torch_bytes": est.fit_bytes - est.outside_allocator_bytes,
    }


def breakdown_markdown(parts: list[dict]) -> str:
    """The breakdowns as a markdown section, GiB and points of the measured minimum."""
    if not parts:
        return ""

    def cell(b: int, measured: int) -> str:
        return f"{b / GIB:+.2f} GiB ({100 * b / measured:+.1f} %)"

    lines = [
        "",
        "## Where each fit figure's distance from the measured minimum comes from",
        "",
        "Parts that sum to fit figure − measured minimum (GiB, and % of the minimum). GPU need: the measured minimum",
        "less the GPU's `max_memory_allocated` at the baseline limit (whole blocks) and the estimated workspaces",
        "(measured-gpu). Tensor peak: the estimated one less that `max_memory_allocated`.",
        "Reserve model: the fitted model that sets the need (step, or generation where generate sets the peak), its",
        "least-squares value and its safety margin (worst leave-one-out under-prediction), in % of the estimated",
        "peak (estimated).",
        "",
        "| config | GPU need above the tensors | reserve model: value + margin | tensor peak vs GPU's | model value vs GPU need | "
        "margin | band | fit figure − minimum |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for p in parts:
        m = p["measured_bytes"]
        total = p["tensors"] + p["central"] + p["margin"] + p["band"]
        lines.append(
            f"| {p['config']} | {p['gpu_need_bytes'] / GIB:.2f} GiB ({100 * p['gpu_need_bytes'] / p['peak_bytes']:.1f} % "
            f"of the peak) | {p['model']}: {100 * p['central_fraction']:.1f} % + {100 * p['margin_fraction']:.1f} % | "
            f"{cell(p['tensors'], m)} | {cell(p['central'], m)} | {cell(p['margin'], m)} | {cell(p['band'], m)} | "
            f"{cell(total, m)} |"
        )
    return "\n".join(lines) + "\n"


def simulated_figure(row: dict, streams: dict[str, Path]) -> int | None:
    """The smallest limit the simulated allocator passes the traced stream of the row's configuration under
    (`sweeps.trace.rows.simulated_need`: tied gradients summed in place as real tensors sum them), plus the
    workspaces allocated through the caching allocator that the trace lacks (traced, simulated); None without a
    stream."""
    from estimator.hardware.allocator import load_stream
    from estimator.step.estimate import estimate
    from sweeps.trace.rows import simulated_need

    path = streams.get(row_traces.config_id(row["config"]))
    if path is None or not path.exists():
        return None
    cfg, arch = row_traces.config_and_arch(row["config"], (row.get("model") or {}).get("config"))
    return (
        simulated_need(cfg, load_stream(path), arch)["min_limit_bytes"]
        + estimate(cfg, arch).in_reserved_bytes
    )


def stranded(row: dict, streams: dict[str, Path]) -> Stranding | None:
    """What the allocator cannot give back just below the need of the row's traced stream (traced,
    simulated; `sweeps.report.stranding`): the stream replayed as `simulated_figure` replays it. None without a
    stream."""
    from estimator.hardware.allocator import load_stream
    from sweeps.trace.rows import NEED_RESOLUTION, replay_inputs

    path = streams.get(row_traces.config_id(row["config"]))
    if path is None or not path.exists():
        return None
    cfg, arch = row_traces.config_and_arch(row["config"], (row.get("model") or {}).get("config"))
    events, settings = replay_inputs(cfg, load_stream(path), arch)
    return stranding(events, settings, NEED_RESOLUTION)


def stranding_markdown(found: list[tuple[str, Stranding | None]], top: int = 3) -> str:
    """Per measured row, where its trace's need sits above the allocated bytes: the free space that live blocks
    hold inside segments made for larger requests (traced, simulated), largest groups first."""
    if not found:
        return ""
    out = [
        "",
        "## What the allocator cannot give back at each trace's need",
        "",
        "Under a limit less than 8 MiB below its trace's need, the request that fails, and the free bytes held inside segments a "
        "live block still occupies, by the phase and size each segment was made for and the largest block in it "
        "(traced, simulated; `python -m sweeps.report.stranding` on the stream). Under a limit the allocator gives "
        "back every segment without a live block and retries; these it cannot.",
        "",
        "| config | fails at | request | stranded | largest groups: segments x size (made in) held by block (made in) |",
        "|---|---|---:|---:|---|",
    ]
    for config, s in found:
        if s is None:
            continue
        groups = "; ".join(f"{describe(p)}: {p.stranded_bytes / GIB:.2f} GiB" for p in s.pinned[:top])
        out.append(
            f"| {config} | {s.phase or '(none)'} | {s.request_bytes / MIB:,.1f} MiB | "
            f"{s.stranded_bytes / GIB:.2f} GiB | {groups} |"
        )
    return "\n".join(out) + "\n"


def label(config: dict) -> str:
    """`model method pPROMPT cCOMPLETION` for one config."""
    method = "qlora" if config.get("load_in_4bit") else "lora" if config.get("use_peft") else "full"
    return f"{config.get('model')} {method} p{config.get('max_prompt_length')} c{config.get('max_completion_length')}"


def _pct(figure: int, measured: int) -> float:
    return (figure - measured) / measured * 100


def table(
    rows: Iterable[dict],
    figures: Figures = estimated_figures,
    source: str = SOURCE,
    simulated: Callable[[dict], int | None] = lambda row: None,
) -> list[dict]:
    """One dict per finished mincard row of `source` (latest per key): the measured minimum, the two estimated
    figures and the error of each against it in percent (positive: the estimate is above), and the traced,
    simulated figure where `simulated` gives one."""
    out = []
    for row in records.latest_rows(r for r in rows if r.get("source") == source):
        measured = (row.get("mincard") or {}).get("min_torch_bytes")
        if row.get("status") != "ok" or not measured:
            continue
        figs = figures(row)
        if figs is None:
            continue
        limit_fig, fit_fig = figs
        out.append(
            {
                "config": label(row["config"]),
                "key": row["key"],
                "measured_bytes": measured,
                "measured_source": source,
                "max_failing_bytes": row["mincard"].get("max_failing_bytes"),
                "torch_limit_bytes": limit_fig,
                "fit_torch_bytes": fit_fig,
                "estimate_source": "estimated",
                "torch_limit_error_pct": _pct(limit_fig, measured),
                "fit_error_pct": _pct(fit_fig, measured),
            }
        )
        sim = simulated(row)
        if sim is not None:
            out[-1].update(simulated_bytes=sim, simulated_error_pct=_pct(sim, measured))
    return out


def summary_lines(
    rows: Iterable[dict],
    figures: Figures = estimated_figures,
    simulated: Callable[[dict], int | None] = lambda row: None,
) -> list[str]:
    """How the fit figure compares with the measured minimum over every row; a second line for the rows' traces
    replayed through the allocator simulation, where `simulated` gives any."""
    t = table(rows, figures, simulated=simulated)
    if not t:
        return [f"mincard[{SOURCE}]: no rows yet (make gpu-mincard on a GPU)"]

    def spread(errs: list[float]) -> str:
        below = sum(1 for e in errs if e < 0)
        return (
            f"median {statistics.median(errs):+.1f} %, min {min(errs):+.1f} %, max {max(errs):+.1f} %, "
            f"below: {below}"
        )

    lines = [
        f"mincard[{SOURCE}]: {len(t)} configs, fit figure vs measured minimum: "
        + spread([r["fit_error_pct"] for r in t])
    ]
    sims = [r["simulated_error_pct"] for r in t if "simulated_error_pct" in r]
    if sims:
        lines.append(
            f"mincard[traced, simulated]: {len(sims)} configs, its trace's need vs measured minimum: "
            + spread(sims)
        )
    return lines


def markdown(t: list[dict]) -> str:
    """The table as markdown, every number labelled with its source."""
    if not t:
        return (
            f"No {SOURCE} min-card rows yet: `make gpu-mincard` on a GPU writes results/raw/mincard.jsonl.\n"
        )
    lines = [
        "| config | min torch limit (measured-gpu) | torch-limit figure (estimated) | error | "
        "fit figure (estimated) | error | its trace's need (traced, simulated) | error |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in t:
        sim = r.get("simulated_bytes")
        traced = f"{sim / GIB:.2f} GiB | {r['simulated_error_pct']:+.1f} %" if sim is not None else "- | -"
        lines.append(
            f"| {r['config']} | {r['measured_bytes'] / GIB:.2f} GiB | {r['torch_limit_bytes'] / GIB:.2f} GiB | "
            f"{r['torch_limit_error_pct']:+.1f} % | {r['fit_torch_bytes'] / GIB:.2f} GiB | {r['fit_error_pct']:+.1f} % "
            f"| {traced} |"
        )
    return "\n".join(lines) + "\n"


def lineup_rows(names: list[str] | None = None) -> list[dict]:
    """The lineup's configurations (`+experiment=mincard`, composed as the search composes them) as rows not yet
    measured: {"row", "key", "config", "variant"}."""
    from sweeps.mincard import lineup

    return [
        {"row": e.row, "key": e.job.key, "config": e.job.config.to_dict(), "variant": e.job.variant}
        for e in lineup.entries(names)
    ]


def unmeasured(lineup: Iterable[dict], rows: Iterable[dict]) -> list[dict]:
    """The lineup rows whose configuration no finished measured row covers yet."""
    finished = {
        row_traces.config_id(r["config"])
        for r in records.latest_rows(x for x in rows if x.get("source") == SOURCE)
        if r.get("status") == "ok" and (r.get("mincard") or {}).get("min_torch_bytes")
    }
    return [row for row in lineup if row_traces.config_id(row["config"]) not in finished]


def preview(
    lineup: Iterable[dict],
    rows: Iterable[dict],
    figures: Figures = estimated_figures,
    simulated: Callable[[dict], int | None] = lambda row: None,
) -> list[dict]:
    """The lineup's configurations that no finished measured row covers yet, each with the estimator's fit figure
    beside its trace's need (traced, simulated): a forecast made on CPU before the GPU measures them. A fit figure
    below the trace's need predicts an estimate too low."""
    out = []
    for row in unmeasured(lineup, rows):
        figs = figures(row)
        if figs is None:
            continue
        sim = simulated(row)
        out.append(
            {
                "row": row["row"],
                "config": label(row["config"]),
                "torch_limit_bytes": figs[0],
                "fit_torch_bytes": figs[1],
                "estimate_source": "estimated",
                "simulated_bytes": sim,
                "fit_vs_trace_pct": None if sim is None else _pct(figs[1], sim),
            }
        )
    return out


def preview_line(p: list[dict]) -> str:
    """One line: the fit figure against its trace's need over the lineup's unmeasured configurations."""
    errs = [r["fit_vs_trace_pct"] for r in p if r["fit_vs_trace_pct"] is not None]
    head = f"mincard[lineup, not measured yet]: {len(p)} configs"
    if not errs:
        return head + ", none traced (--trace-missing traces them)"
    below = sum(1 for e in errs if e < 0)
    return (
        f"{head}, fit figure vs its trace's need (traced, simulated) on {len(errs)}: median "
        f"{statistics.median(errs):+.1f} %, min {min(errs):+.1f} %, max {max(errs):+.1f} %, below: {below}"
    )


def preview_markdown(p: list[dict]) -> str:
    """The forecast as a markdown section."""
    if not p:
        return ""
    lines = [
        "",
        "## The rest of the lineup, before its GPU run",
        "",
        "Not measured yet. Beside the estimator's figures, the smallest torch limit under which the allocator",
        "simulation passes the configuration's traced stream (CPU, fake tensors; the tied gradients summed in place",
        "and the cuBLAS workspaces added, as in the table above). A fit figure below its trace's need would predict",
        "an estimate too low; the measured rows replace these as the lease measures them.",
        "",
        "| row | config | torch-limit figure (estimated) | fit figure (estimated) | its trace's need (traced, "
        "simulated) | fit figure vs trace's need |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in p:
        sim = r["simulated_bytes"]
        traced = "- | -" if sim is None else f"{sim / GIB:.2f} GiB | {r['fit_vs_trace_pct']:+.1f} %"
        lines.append(
            f"| {r['row']} | {r['config']} | {r['torch_limit_bytes'] / GIB:.2f} GiB | "
            f"{r['fit_torch_bytes'] / GIB:.2f} GiB | {traced} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the summary line (and write the markdown table when asked)."""
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    row_traces.add_arguments(p, DEFAULT_ROWS, TRACED, "mincard")
    p.add_argument("--markdown", help="write the table to this file")
    p.add_argument(
        "--lineup",
        action="store_true",
        help="also forecast the lineup's configurations not measured yet (with --trace-missing, trace them first)",
    )
    args = p.parse_args(argv)

    def body() -> None:
        rows = row_traces.read_rows(args, DEFAULT_ROWS, "mincard")
        lineup = lineup_rows() if args.lineup else []
        if lineup and args.trace_missing:
            pending = [(r["config"], int(r["variant"].get("steps", 2))) for r in unmeasured(lineup, rows)]
            for key in row_traces.trace_configs(pending, Path(args.traced)):
                print(f"traced {key} into {args.traced}")
        streams, replayed = row_traces.traced_streams(Path(args.traced)), {}

        def simulated(row: dict) -> int | None:  # each stream replayed once (a bisection of simulations)
            if row["key"] not in replayed:
                replayed[row["key"]] = simulated_figure(row, streams)
            return replayed[row["key"]]

        for line in summary_lines(rows, simulated=simulated):
            print(line)
        forecast = preview(lineup, rows, simulated=simulated)
        if args.lineup:
            print(preview_line(forecast))
        if args.markdown:
            finished = records.latest_rows(r for r in rows if r.get("source") == SOURCE)
            parts = [b for r in finished if r.get("status") == "ok" and (b := breakdown(r)) is not None]
            found = [(label(r["config"]), stranded(r, streams)) for r in finished if r.get("status") == "ok"]
            text = (
                markdown(table(rows, simulated=simulated))
                + breakdown_markdown(parts)
                + stranding_markdown(found)
                + preview_markdown(forecast)
            )
            Path(args.markdown).write_text(text)

    return row_traces.guarded("mincard", body)


if __name__ == "__main__":
    sys.exit(main())
