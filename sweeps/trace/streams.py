"""Record the allocation streams of traced GRPO runs and simulate the caching allocator on them.

    python -m sweeps.trace.streams [--grid core] [--index 0 2 4] [--steps 3] [--out results/streams]
    python -m sweeps.trace.streams --sample SEED N [--tuning | --held-out]
    python -m sweeps.trace.streams --table | --report [--refit] [--step-fit-only]
    python -m sweeps.trace.streams --retrace load_in_4bit --tag TAG
    python -m sweeps.trace.streams --retrace attn_implementation=eager --tag TAG

Per picked config: `<key>.txt.gz` (the event stream, `estimator.hardware.allocator.dump_stream` format) and one
row appended to `index.jsonl`: the config, the traced peak, and the simulation of the stream under the default
allocator, with `expandable_segments:True` and with `max_split_size_mb:128` (source "simulated", stream "traced").
Streams are kept for a handful of representative configs (repo size).

`--sample` traces seeded random configurations (sweeps/trace/random_grid.py, full depth, 2 steps; those this
machine cannot trace in a few minutes are left out, `sample_skip`) and keeps only their simulations, one row each
in `sampled.jsonl`, split "validation" (read while the fallback is changed), with `--tuning` "tuning" (the
generation-regime model is fitted on those of its regime, with the kept streams) or, with `--held-out`, "held-out"
(scored once). The step model is fitted on the kept streams, and for the need also on them with the tuning rows
of the step regime (an eager run takes the larger of the two); `--report` prints the errors of the table the
estimator ships on each split apart (`--refit`: of a fit made anew, not written; `--table` writes it).
Every command resumes: a config whose row exists is skipped. `--retrace FIELD` traces again, in place, the kept
streams and sampled rows whose config has FIELD true, `--retrace FIELD=VALUE` those whose FIELD equals the JSON
VALUE or the bare word (as `grpo-vram-trace retrace --where`), after the tracer's emulation of that setting changed; each
under its own steps, seed, draw, split and variant; the rows say so (`retraced`: TAG) and a rerun with the same
TAG resumes. Refit with `--table` after.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from estimator.hardware.allocator import (
    AllocatorSettings,
    dump_stream,
    load_stream,
    min_device_limit,
    simulate,
    with_empty_cache_steps,
)
from estimator.settings.config import RunConfig
from estimator.terms import allocator_reserve as allocator_term
from sweeps import records
from sweeps.oneline import OneLineParser, shown

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "results" / "streams"
# (grid, index): 0.5B full FT without checkpointing; 1.5B full FT, LoRA, QLoRA, full FT with a reference model; 7B LoRA,
# QLoRA with checkpointing, 7B LoRA without
DEFAULT_PICKS = (
    ("headline", 0),
    ("core", 0),
    ("core", 2),
    ("core", 4),
    ("core", 31),
    ("core", 14),
    ("core", 16),
    ("core", 39),
)
VARIANTS = {
    "default": "",
    "expandable_segments": "expandable_segments:True",
    "max_split_size_mb_128": "max_split_size_mb:128",
}


def stream_key(cfg: RunConfig, steps: int) -> str:
    """Stable file name for a config's stream."""
    return records.make_key(cfg.to_dict(), {"steps": steps, "stream": "alloc"})


def simulate_variants(events: list) -> dict:
    """The stream under each allocator setting of VARIANTS, and with torch_empty_cache_steps=1 (SimResult.to_dict)."""
    out = {
        name: simulate(events, AllocatorSettings.from_conf(conf)).to_dict() for name, conf in VARIANTS.items()
    }
    out["torch_empty_cache_steps_1"] = simulate(with_empty_cache_steps(events, 1)).to_dict()
    return out


SAMPLED = "sampled.jsonl"  # simulations of traced streams not kept on disk (--sample)
SAMPLE_STEPS = 2
# "tuning": the generation model is fitted on them; "validation": read while the fallback is changed; "held-out":
# scored once
SPLITS = ("tuning", "validation", "held-out")
SAMPLE_MAX_PARAMS = 4.5e9  # full-depth traces of larger models take several minutes on 2 cores
SAMPLE_MAX_TOKENS = 3072  # prompt + completion


def sample_skip(cfg: RunConfig) -> str | None:
    """Why a random draw is not sampled (the tracer cannot run it here, or it would take minutes), else None."""
    from estimator.model.catalog import resolve_model
    from sweeps.trace.random_grid import skip_reason

    params = resolve_model(cfg.model).total_params
    if why := skip_reason(cfg):
        return why
    if params > SAMPLE_MAX_PARAMS:
        return f"{params / 1e9:.1f}B parameters (more than {SAMPLE_MAX_PARAMS / 1e9:.1f}B take minutes at full depth)"
    if cfg.max_prompt_length + cfg.max_completion_length > SAMPLE_MAX_TOKENS:
        return f"prompt + completion over {SAMPLE_MAX_TOKENS} tokens (minutes at full depth)"
    if cfg.dtype == "float32" and params > 2e9:
        return "float32 above 2B parameters (minutes at full depth)"
    return None


def simulation_row(cfg: RunConfig, events: list, steps: int) -> dict:
    """A config's traced stream as the table keeps it: its simulation under every variant and the smallest
    passing limit of each (the stream itself is not part of the row)."""
    return {
        "key": stream_key(cfg, steps),
        "source": "traced",
        "steps": steps,
        "config": cfg.to_dict(),
        "events": len(events),
        "simulated": simulate_variants(events),
        "min_limits": min_limits(events),
    }


def sample(
    seed: int, n: int, out: Path, split: str = "validation", generation_peaked: bool = False
) -> list[dict]:
    """Trace the first `n` draws of `random_configs(seed)` that `sample_skip` keeps and append their simulation
    rows to `out/sampled.jsonl` under `split` (one of SPLITS); skips rows already there. `generation_peaked`: only
    the draws whose estimate puts the peak in transformers' generate (`allocator_term.GENERATION_AT_PEAK`, any
    checkpointing), where the reserve is least known; their rows say so (`drawn`)."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} (accepted: {', '.join(SPLITS)})")
    from sweeps.trace import step
    from sweeps.trace.random_grid import random_configs

    path = out / SAMPLED
    done = {(r.get("seed"), r.get("draw")) for r in records.read_index(path)[0]}
    rows = []
    for i, cfg in enumerate(random_configs(seed, n)):
        cfg = cfg.with_(device="cuda")
        if (seed, i) in done:
            continue
        if why := sample_skip(cfg) or (generation_peaked and _not_generation_peaked(cfg)):
            print(f"draw {seed}/{i}: skipped: {why}", flush=True)
            continue
        try:
            res = step.run(cfg, fake=True, steps=SAMPLE_STEPS, max_micro=2)
        except Exception as e:  # noqa: BLE001 - one draw the tracer cannot run must not stop the others
            print(f"draw {seed}/{i}: not traced: {type(e).__name__}: {shown(str(e))}", flush=True)
            continue
        row = (
            simulation_row(cfg, res.events, SAMPLE_STEPS)
            | {
                "seed": seed,
                "draw": i,
                "split": split,
                "variant": {"max_micro": 2, "decode": "fast-forward", "k": 2},
            }
            | ({"drawn": "generation-peaked"} if generation_peaked else {})
        )
        records.append_row(path, row)
        d = row["simulated"]["default"]
        print(
            f"draw {seed}/{i} {cfg.model} (traced, simulated): allocated {d['peak_allocated'] / 2**30:.2f} GiB, reserve "
            f"{100 * d['fragmentation_fraction']:.1f}%, need "
            f"{100 * (row['min_limits']['default'] - d['peak_allocated']) / d['peak_allocated']:.1f}%",
            flush=True,
        )
        rows.append(row)
    return rows


UNCACHED = "uncached.jsonl"  # simulations of configurations traced without a KV cache (--uncached)
# Generation without a KV cache, traced after `generation.uncached_generation_segments` was written from the r01,
# r02 (sdpa) and r08 (eager) streams and never tuned on: other families, methods, batch and lengths ("validation")
UNCACHED_CONFIGS = (
    {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": "bfloat16", "use_peft": True, "max_prompt_length": 512,
     "max_completion_length": 128, "per_device_train_batch_size": 8, "num_generations": 8},
    {"model": "meta-llama/Llama-3.2-1B-Instruct", "dtype": "bfloat16", "use_peft": True, "load_in_4bit": True,
     "max_prompt_length": 384, "max_completion_length": 192, "per_device_train_batch_size": 16,
     "num_generations": 16},
    {"model": "Qwen/Qwen2.5-1.5B-Instruct", "dtype": "bfloat16", "max_prompt_length": 256,
     "max_completion_length": 256, "per_device_train_batch_size": 4, "num_generations": 4},
    # eager attention, traced after its score count was written from r08's stream
    {"model": "meta-llama/Llama-3.2-1B-Instruct", "dtype": "bfloat16", "use_peft": True, "attn_implementation": "eager",
     "max_prompt_length": 256, "max_completion_length": 128, "per_device_train_batch_size": 8, "num_generations": 8},
    {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": "float32", "bf16": False, "attn_implementation": "eager",
     "max_prompt_length": 384, "max_completion_length": 96, "per_device_train_batch_size": 4, "num_generations": 4},
)  # fmt: skip


def uncached(out: Path) -> list[dict]:
    """Trace each of UNCACHED_CONFIGS without a KV cache, every token decoded (what fragments the allocator), and
    append its simulation row to `out/uncached.jsonl` (split "validation"); skips rows already there. Minutes a
    configuration on one core; the streams themselves are not kept (every-token streams run to megabytes)."""
    from sweeps.trace import step

    path = out / UNCACHED
    done = {r.get("key") for r in records.read_index(path)[0]}
    rows = []
    for d in UNCACHED_CONFIGS:
        cfg = RunConfig.from_dict(d | {"generation_use_cache": False, "device": "cuda"})
        if stream_key(cfg, SAMPLE_STEPS) in done:
            continue
        res = step.run(cfg, fake=True, steps=SAMPLE_STEPS, decode_k=cfg.max_completion_length)
        row = simulation_row(cfg, res.events, SAMPLE_STEPS) | {
            "split": "validation",
            "variant": {"decode": "full"},
        }
        records.append_row(path, row)
        print(
            f"{cfg.model}: reserved {row['simulated']['default']['peak_reserved'] / 2**30:.2f} GiB (traced, simulated)"
        )
        rows.append(row)
    return rows


def retrace(out: Path, field: str, tag: str) -> tuple[int, int]:
    """Trace again, in place, every kept stream (`index.jsonl` and its `.txt.gz`) and sampled row whose config
    has `field` true, or, for `field=value`, that value (`sweeps.trace.retrace`'s condition); returns (retraced,
    not traced). A sampled row keeps its seed, draw, split and variant; each
    row gets `retraced: tag`, and a rerun with the same tag skips it (resumes). A row the tracer cannot run is
    named on one line and kept as it was. The table is not refitted here (`--table`)."""
    from sweeps.trace import step
    from sweeps.trace.retrace import matches

    def wanted(config: dict) -> bool:
        return matches(config, field) if "=" in field else config.get(field) is True

    done = failed = 0
    for name in ("index.jsonl", SAMPLED):
        path = out / name
        for old in records.read_index(path)[0]:
            if not wanted(old["config"]) or _retraced(path, old["key"], tag):
                continue
            cfg = RunConfig.from_dict(old["config"])
            var = old.get("variant") or {}
            try:
                res = step.run(
                    cfg,
                    fake=True,
                    steps=old["steps"],
                    decode_k=var.get("k", 2),
                    max_micro=var.get("max_micro"),
                )
            except Exception as e:  # noqa: BLE001 - one row the tracer cannot run must not stop the others
                print(f"{old['key']}: not traced: {type(e).__name__}: {shown(str(e))}", flush=True)
                failed += 1
                continue
            if "stream" in old:  # a kept stream: the events themselves, then its index row
                dump_stream(res.events, out / old["stream"])  # written to a temp file and replaced
                new = old | {
                    "events": len(res.events),
                    "traced_peak_bytes": res.observed["peak_bytes"],
                    "simulated": simulate_variants(res.events),
                }
            else:
                kept = {k: old[k] for k in ("seed", "draw", "split", "variant", "drawn") if k in old}
                new = simulation_row(cfg, res.events, old["steps"]) | kept
            new = new | {"retraced": tag, "written_at": records.utc_now()}
            records.replace_row(path, new)
            done += 1
            _say_retraced(old, new)
    return done, failed


def _retraced(path: Path, key: str, tag: str) -> bool:
    """Whether the row `key` in `path` is, as the file is now, already retraced under `tag` (by this run's earlier
    pass or by another run beside it)."""
    return any(r.get("key") == key and r.get("retraced") == tag for r in records.read_index(path)[0])


def _say_retraced(old: dict, new: dict) -> None:
    a, b = (r["simulated"]["default"]["peak_allocated"] / 2**30 for r in (old, new))
    print(
        f"{old['key']} {old['config'].get('model')}: allocated peak {a:.3f} -> {b:.3f} GiB (traced, simulated)",
        flush=True,
    )


def _not_generation_peaked(cfg: RunConfig) -> str | None:
    """Why `cfg` is not a run whose peak transformers' generate sets (estimated), else None."""
    if cfg.use_vllm:
        return "vLLM generates (not through torch's allocator)"
    share = shares(cfg).generation
    if share < allocator_term.GENERATION_AT_PEAK:
        return f"generation's working memory is {100 * share:.0f} % of the peak phase's (estimated)"
    return None


def _lstsq(xs: list[list[float]], ys: list[float]) -> list[float]:
    """Least squares with a ridge of 1e-9 (normal equations, Gauss-Jordan): stdlib, for a handful of columns."""
    k = len(xs[0])
    a = [[sum(r[i] * r[j] for r in xs) + (1e-9 if i == j else 0.0) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * y for r, y in zip(xs, ys, strict=True)) for i in range(k)]
    for c in range(k):
        p = max(range(c, k), key=lambda r: abs(a[r][c]))
        a[c], a[p], b[c], b[p] = a[p], a[c], b[p], b[c]
        for r in range(k):
            if r != c and a[c][c]:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c], strict=True)]
                b[r] -= f * b[c]
    return [b[i] / a[i][i] if a[i][i] else 0.0 for i in range(k)]


def fit_variant(rows: list[tuple[dict[str, float], float]]) -> dict:
    """Fit extra/allocated = intercept + sum(coef * feature) over (features, simulated fraction) rows, with its
    in-sample and leave-one-out errors (absolute, in fraction of the allocated peak): the estimator adds the
    worst LOO under-prediction (`allocator_term.fitted_from`)."""
    names = list(rows[0][0])

    def design(sub):
        return [[1.0] + [x[n] for n in names] for x in sub]

    def solve(sub):
        return _lstsq(design([x for x, _ in sub]), [y for _, y in sub])

    w = solve(rows)
    pred = [sum(a * b for a, b in zip(w, x, strict=True)) for x in design([x for x, _ in rows])]
    loo = []
    for i in range(len(rows)):
        wi = solve(rows[:i] + rows[i + 1 :]) if len(rows) > len(w) else w
        xi = design([rows[i][0]])[0]
        loo.append(sum(a * b for a, b in zip(wi, xi, strict=True)) - rows[i][1])
    errs = [p - y for p, (_, y) in zip(pred, rows, strict=True)]
    return {
        "intercept": w[0],
        "coef": dict(zip(names, w[1:], strict=True)),
        "n": len(rows),
        "in_sample_max_abs": max(abs(e) for e in errs),
        "loo_max_abs": max(abs(e) for e in loo),
        "loo_errors": loo,
        "source": "fitted (sweeps.trace.streams --table) over simulated traced streams",
    }


def shares(cfg: RunConfig) -> allocator_term.Shares:
    """Where the estimator puts `cfg`'s peak (`allocator_term.shares_of` its phases): what the fallback sees at
    estimate time, not the trace's."""
    from estimator.step.estimate import estimate

    return allocator_term.shares_of(estimate(cfg).phases)


def min_limits(events: list) -> dict[str, int]:
    """Per variant, the smallest allocator limit (64 MiB steps) at which the stream runs: what the card must hold
    for the tensors once the allocator frees its cache and retries before an OOM."""
    out = {
        name: min_device_limit(events, AllocatorSettings.from_conf(conf))[0]
        for name, conf in VARIANTS.items()
    }
    out["torch_empty_cache_steps_1"] = min_device_limit(with_empty_cache_steps(events, 1))[0]
    return out


KEEP = (
    "peak_reserved",
    "peak_allocated",
    "fragmentation",
    "fragmentation_at_peak",
    "peak_label",
    "step_peaks",
)


def build_table(out: Path) -> dict:
    """Re-simulate every kept stream under every variant (unlimited, and its smallest passing limit); the
    estimator's table with the fitted models: the step model of both (`fit[variant]`, `fit["need:" + variant]`)
    over the kept streams, and the generation-regime model of the need (`fit["generation:need:" + variant]`)
    over the kept streams and the sampled rows of split "tuning" in that regime (`allocator_term.regime`), and
    the step model of the need again over the kept streams and the tuning rows of the step regime
    (`fit["sampled:need:" + variant]`; for eager attention the estimator takes the larger of the two step fits). The other sampled
    rows are not fitted: `sampled_errors` scores the fits on them."""
    streams, step_rows, generation_rows, sampled_step_rows = [], {}, {}, {}
    for idx in records.read_index(out / "index.jsonl")[0]:
        events = load_stream(out / idx["stream"])
        cfg = RunConfig.from_dict(idx["config"])
        limits = min_limits(events)
        variants = {}
        for name, r in simulate_variants(events).items():
            variants[name] = {k: r[k] for k in KEEP} | {
                "stream": idx["stream"],
                "source": "simulated",
                "min_limit": limits[name],
            }
        streams.append({"config": idx["config"], "events": len(events), "variants": variants})
        row = {"config": idx["config"], "simulated": variants, "min_limits": limits}
        for key, _, pa, _, y in _targets(row):
            step_rows.setdefault(key, []).append((allocator_term.features(cfg, pa), y))
            if key.startswith("need:"):
                sampled_step_rows.setdefault(key, []).append((allocator_term.features(cfg, pa), y))
        _generation_targets(row, generation_rows)
    for row in records.read_index(out / SAMPLED)[0]:
        if row.get("split") == "tuning":
            _generation_targets(row, generation_rows)
            _step_targets(row, sampled_step_rows)
    fit = {key: fit_variant(rows) for key, rows in step_rows.items()}
    for key, rows in sampled_step_rows.items():
        fit[allocator_term.SAMPLED_STEP + key] = fit_variant(rows) | {
            "model": "kept + tuning step",
            "source": "fitted (sweeps.trace.streams --table) over the simulated streams and the tuning rows where "
            "the step sets the peak",
        }
    for key, rows in generation_rows.items():
        fit["generation:" + key] = fit_variant([(x, y) for x, y, _ in rows]) | {
            "model": "generation-regime",
            "working_cap": max(y / w for _, y, w in rows if w > 0),
            "source": "fitted (sweeps.trace.streams --table) over the simulated streams and tuning rows where "
            "transformers' generate sets the peak",
        }
    src = "simulated (estimator.hardware.allocator) on traced streams (results/streams)"
    return {"source": src, "streams": streams, "fit": fit}


def with_step_fit_only(shipped: dict, fresh: dict) -> dict:
    """`shipped` with the step regime's kept + tuning need fits (`allocator_term.SAMPLED_STEP`) of `fresh` (a
    `build_table`) in place of its own, every other fit and stream as shipped: the kept streams' own refit moves
    the fits it does not concern (it lowers measured-gpu rows; docs/HISTORY.md) and is not adopted with it."""
    fit = {k: v for k, v in shipped["fit"].items() if not k.startswith(allocator_term.SAMPLED_STEP)}
    fit |= {k: v for k, v in fresh["fit"].items() if k.startswith(allocator_term.SAMPLED_STEP)}
    return shipped | {"fit": fit}


def _targets(row: dict) -> list[tuple[str, RunConfig, int, allocator_term.Shares, float]]:
    """A simulated row's fit targets: (fit key, config, peak allocated, shares, simulated fraction) for the
    reserve and the need of every variant."""
    cfg = RunConfig.from_dict(row["config"])
    where = shares(cfg)
    out = []
    for name, v in row["simulated"].items():
        pa = v["peak_allocated"]
        out.append((name, cfg, pa, where, v["fragmentation"] / pa))
        out.append(("need:" + name, cfg, pa, where, (row["min_limits"][name] - pa) / pa))
    return out


def _generation_targets(row: dict, into: dict) -> None:
    """Add a row's need targets to the generation model's rows when the config is in its regime: (features, the
    need as a fraction of generation's phase total, generation's working share of that total)."""
    for key, cfg, pa, where, y in _targets(row):
        if key.startswith("need:") and allocator_term.regime(cfg, where) == "generation":
            # the card holds the peak + y = generation's total + y_gen
            y_gen = (1 + y) / where.generation_total - 1
            into.setdefault(key, []).append(
                (allocator_term.generation_features(where, pa), y_gen, where.generation_working)
            )


def _step_targets(row: dict, into: dict) -> None:
    """Add a sampled row's need targets to the step model's rows (`allocator_term.SAMPLED_STEP`) when the config
    is in the step regime: (features, the need as a fraction of the allocated peak)."""
    for key, cfg, pa, where, y in _targets(row):
        if key.startswith("need:") and allocator_term.regime(cfg, where) == "step":
            into.setdefault(key, []).append((allocator_term.features(cfg, pa), y))


def sampled_errors(table: dict, rows: list[dict]) -> dict:
    """Per split of the sampled rows ("tuning": the generation model's; "validation", "held-out": not fitted)
    and fitted model: the fallback's error (prediction - simulation, in fraction of the allocated peak) on each
    row, and the same for the rows of the generation regime alone (key "generation:" + model). Held-out rows
    are kept apart per seed ("held-out <seed>"): a seed scored once stays apart from later ones."""
    errors: dict = {}
    for row in rows:
        split = row["split"] + (f" {row['seed']}" if row["split"] == "held-out" and "seed" in row else "")
        for key, cfg, pa, where, y in _targets(row):
            if key in table["fit"]:
                e = allocator_term.predicted_fraction(table["fit"], key, cfg, pa, where) - y
                by_key = errors.setdefault(split, {})
                by_key.setdefault(key, []).append(e)
                if allocator_term.regime(cfg, where) == "generation":
                    by_key.setdefault("generation:" + key, []).append(e)
    return errors


def _median(xs: list[float]) -> float:
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def report(table: dict, sampled: dict | None = None) -> str:
    """Simulated fragmentation per variant (min / median / max over the kept streams) and the fits' errors: the
    unlimited reserve (max_memory_reserved - max_memory_allocated) and the need (smallest passing limit - peak
    allocated), both as fractions of the allocated peak, and the generation-regime need model; then, per split
    of the sampled rows (`sampled_errors`), how many the fallback predicts low, the worst and the median error,
    on all rows and on the generation regime's."""
    lines = []
    for name in allocator_term.VARIANTS:
        for kind, label in (("reserve", "reserve"), ("need", "need   ")):
            fr = []
            for s in table["streams"]:
                v = s["variants"][name]
                extra = v["fragmentation"] if kind == "reserve" else v["min_limit"] - v["peak_allocated"]
                fr.append(extra / v["peak_allocated"])
            fr.sort()
            f = table["fit"][name if kind == "reserve" else "need:" + name]
            lines.append(
                f"{name:26s} {label} over {len(fr)} traced streams (simulated): min {100 * fr[0]:.1f}% "
                f"median {100 * _median(fr):.1f}% max {100 * fr[-1]:.1f}% of peak allocated; fitted model: "
                f"in-sample max error {100 * f['in_sample_max_abs']:.1f} pts, leave-one-out max "
                f"{100 * f['loo_max_abs']:.1f} pts"
            )
        k = table["fit"].get(allocator_term.SAMPLED_STEP + "need:" + name)
        if k:
            lines.append(
                f"{name:26s} need, step regime: fitted model over {k['n']} rows (kept + tuning; an eager run's need takes the "
                f"larger of it and the kept streams' model); in-sample max error {100 * k['in_sample_max_abs']:.1f} "
                f"pts, leave-one-out max {100 * k['loo_max_abs']:.1f} pts, margin "
                f"{100 * allocator_term.margin_of(k):.1f} pts"
            )
        g = table["fit"].get("generation:need:" + name)
        if g:
            lines.append(
                f"{name:26s} need, generation regime: fitted model over {g['n']} rows (kept + tuning); in-sample max "
                f"error {100 * g['in_sample_max_abs']:.1f} pts, leave-one-out max {100 * g['loo_max_abs']:.1f} "
                f"pts, margin {100 * max(0.0, -min(g['loo_errors'])):.1f} pts, capped at "
                f"{g['working_cap']:.2f} x the working memory"
            )
    keys = [
        (key, label)
        for name in allocator_term.VARIANTS
        for key, label in (
            (name, "reserve"),
            ("need:" + name, "need   "),
            ("generation:need:" + name, "need, generation regime"),
        )
    ]
    for split, by_key in sorted((sampled or {}).items()):
        for key, label in keys:
            errs = sorted(by_key.get(key, []))
            if errs:
                lines.append(
                    f"{split:15s} {key.split(':')[-1]:26s} {label} {len(errs)} sampled streams (simulated): "
                    f"{sum(e < 0 for e in errs)} "
                    f"predicted low, worst {100 * errs[0]:+.1f} pts, median {100 * _median(errs):+.1f} pts"
                )
    return "\n".join(lines)


def record(cfg: RunConfig, out: Path, steps: int) -> dict | None:
    """Trace `cfg` for `steps` steps, write its stream and return its index row (None if already there)."""
    from sweeps.trace import step

    key = stream_key(cfg, steps)
    path = out / f"{key}.txt.gz"
    index = out / "index.jsonl"
    if path.exists() and index.exists() and key in index.read_text():
        return None
    # without a cache every generation step is a little longer than the last, which is what fragments the
    # allocator's segments: the stream decodes every token (`generate._generate_without_cache`)
    decode_k = 2 if cfg.generation_use_cache else cfg.max_completion_length
    res = step.run(cfg, fake=True, steps=steps, decode_k=decode_k)
    dump_stream(res.events, path)
    row = {
        "key": key,
        "source": "traced",
        "stream": path.name,
        "steps": steps,
        "config": cfg.to_dict(),
        "events": len(res.events),
        "traced_peak_bytes": res.observed["peak_bytes"],
        "simulated": simulate_variants(res.events),
    }
    with index.open("a") as fh:  # one line per config, appended whole
        fh.write(json.dumps(row, sort_keys=True) + "\n")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=None, help="grid name (with --index); default: the built-in picks")
    ap.add_argument("--index", type=int, nargs="*", default=None, help="config indices in --grid")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--table", action="store_true", help=f"write {allocator_term.TABLE.name} from the streams"
    )
    ap.add_argument(
        "--report",
        action="store_true",
        help=f"print the fragmentation and the errors of the estimator's {allocator_term.TABLE.name} as it is",
    )
    ap.add_argument(
        "--refit",
        action="store_true",
        help="with --report: fit anew from the streams, without writing the table",
    )
    ap.add_argument(
        "--step-fit-only",
        action="store_true",
        help="with --table or --refit: fit anew only the step regime's kept + tuning need model (sampled:need:*), "
        "keeping the table's other fits and streams",
    )
    ap.add_argument(
        "--sample",
        type=int,
        nargs=2,
        metavar=("SEED", "N"),
        help=f"trace the first N random draws of SEED and keep their simulations ({SAMPLED})",
    )
    marks = ap.add_mutually_exclusive_group()
    marks.add_argument("--held-out", action="store_true", help="with --sample: rows the fit never sees")
    marks.add_argument(
        "--tuning", action="store_true", help="with --sample: rows the generation model is fitted on"
    )
    ap.add_argument(
        "--generation-peaked",
        action="store_true",
        help="with --sample: only draws whose estimated peak is in generation",
    )
    ap.add_argument(
        "--retrace",
        metavar="FIELD[=VALUE]",
        help="trace again the kept and sampled rows whose config has FIELD true (or FIELD equal to VALUE)",
    )
    ap.add_argument("--tag", default="retrace", help="with --retrace: what the retraced rows record")
    ap.add_argument(
        "--uncached",
        action="store_true",
        help=f"trace the no-KV-cache validation configurations ({UNCACHED})",
    )
    a = ap.parse_args(argv)
    if a.uncached:
        a.out.mkdir(parents=True, exist_ok=True)
        uncached(a.out)
        return 0
    if a.retrace:
        if a.retrace.partition("=")[0] not in RunConfig.field_names():
            ap.error(
                f"--retrace {shown(a.retrace)}: not a setting (accepted: a RunConfig field, e.g. load_in_4bit, "
                "or FIELD=VALUE, e.g. attn_implementation=eager)"
            )
        done, failed = retrace(a.out, a.retrace, a.tag)
        print(f"{done} rows retraced, {failed} not traced (kept as they were)")
        return 1 if failed else 0
    for flag, on in (
        ("--held-out", a.held_out),
        ("--tuning", a.tuning),
        ("--generation-peaked", a.generation_peaked),
    ):
        if on and not a.sample:
            ap.error(f"{flag} applies to the rows of --sample SEED N; give --sample too")
    if a.sample:
        seed, n = a.sample
        if n < 1:
            ap.error(f"--sample N: {n} (accepted: 1 or more)")
        a.out.mkdir(parents=True, exist_ok=True)
        split = "held-out" if a.held_out else "tuning" if a.tuning else "validation"
        sample(seed, n, a.out, split, a.generation_peaked)
        return 0
    if a.step_fit_only and not (a.table or a.refit):
        ap.error("--step-fit-only applies to --table or --report --refit; give one of them too")
    if a.refit and not a.report:
        ap.error("--refit applies to --report; give --report too (--table refits and writes)")
    if a.table or a.report:
        table = build_table(a.out) if a.table or a.refit else json.loads(allocator_term.TABLE.read_text())
        if a.step_fit_only:
            table = with_step_fit_only(json.loads(allocator_term.TABLE.read_text()), table)
        if a.table:
            tmp = allocator_term.TABLE.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
            tmp.replace(allocator_term.TABLE)
        sampled, bad = records.read_index(a.out / SAMPLED)
        if bad:
            print(f"{SAMPLED}: {bad} line(s) skipped: not a row", file=sys.stderr)
        print(report(table, sampled_errors(table, sampled)))
        return 0
    from sweeps.trace.grids import grid_configs as _grid

    def grid_configs(name: str) -> list[RunConfig]:
        """The trace grids, plus "cli": the estimator's defaults as `vram-estimate --model 7B [--lora]` sees them."""
        return [RunConfig(model="7B", use_peft=True), RunConfig(model="7B")] if name == "cli" else _grid(name)

    picks = [(a.grid, i) for i in a.index] if a.grid and a.index is not None else list(DEFAULT_PICKS)
    a.out.mkdir(parents=True, exist_ok=True)
    for grid, i in picks:
        try:
            cfg = grid_configs(grid)[i]
        except (KeyError, IndexError) as e:
            print(f"grid {grid!r} index {i}: {e}", file=sys.stderr)
            return 2
        row = record(cfg, a.out, a.steps)
        if row is None:
            print(f"{grid}[{i}]: already recorded")
            continue
        d = row["simulated"]["default"]
        print(
            f"{grid}[{i}] {cfg.model} peft={cfg.use_peft} 4bit={cfg.load_in_4bit} gc={cfg.gradient_checkpointing}: "
            f"{row['events']} events, allocated {d['peak_allocated'] / 2**30:.2f} GiB, reserved "
            f"{d['peak_reserved'] / 2**30:.2f} GiB (+{100 * d['fragmentation_fraction']:.1f}%)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
