"""The data behind results/README.md: result rows and estimates as pandas frames (pure; no files, no plots).

Every frame carries a `source` column: `estimated`, `traced`, `measured-cpu` or `measured-gpu`. The one quantity
tabulated and plotted is the peak *allocated* memory (torch.cuda.max_memory_allocated, or the tensor-storage peak
for traces and CPU runs), which all sources observe alike; whether a run fits a card is judged on that peak plus
the estimator's CUDA context and caching-allocator reserve (or the NVML peak where a GPU run recorded one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache, partial

import pandas as pd

from estimator.model.catalog import SHORTHANDS
from estimator.settings.config import NEWEST_TRL, RunConfig
from estimator.step.estimate import Estimate, estimate
from estimator.terms.optimizer import DISPATCH
from estimator.units import GIB
from sweeps import records

Predict = Callable[[RunConfig], Estimate]

SOURCES = ("measured-gpu", "traced", "measured-cpu", "estimated")
HEADLINE_PRIORITY = ("measured-gpu", "traced")  # best first; `estimated` fills the rest
MODELS = ("0.5B", "1.5B", "3B", "7B", "14B")
FIT_MODELS = (*MODELS, "32B", "72B")
CURVE_MODELS = ("1.5B", "7B", "14B")
GENERATIONS = (2, 4, 8, 16, 32, 64)
COMPLETION_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
FIT_SIZES_GB = (16, 24, 32, 40, 80, 141)
HEADLINE_GPU_GB = 80

# The stated default setting: TRL 1.16's GRPOConfig defaults (batch 8, 8 generations, 512-token completions,
# bf16 autocast, beta 0, fused AdamW) with the weights loaded in bfloat16 and 256-token prompts.
HEADLINE_BASE = RunConfig(model="7B", dtype="bfloat16")
METHODS: dict[str, dict] = {
    "full fine-tune": {"gradient_checkpointing": False},
    "+ 8-bit AdamW": {"gradient_checkpointing": False, "optim": "adamw_bnb_8bit"},
    "+ 8-bit AdamW + grad. ckpt": {"gradient_checkpointing": True, "optim": "adamw_bnb_8bit"},
    "LoRA": {"use_peft": True, "gradient_checkpointing": True},
    "QLoRA": {"use_peft": True, "load_in_4bit": True, "gradient_checkpointing": True},
}
CURVE_METHODS = ("+ 8-bit AdamW + grad. ckpt", "LoRA")
IGNORED_FIELDS = ("gpu_memory_gib",)  # fields that do not change the memory of a non-vLLM run


# ---------------------------------------------------------------- configs


def method_config(model: str, method: str, base: RunConfig = HEADLINE_BASE, **changes) -> RunConfig:
    """The config of `method` (a METHODS label) for `model` on top of `base`, with any further changes."""
    return base.with_(model=model, **METHODS[method], **changes)


def generations_config(cfg: RunConfig, g: int) -> RunConfig:
    """`cfg` with `g` generations per prompt and one prompt's group per micro-batch (batch = g)."""
    return cfg.with_(num_generations=g, per_device_train_batch_size=g)


_DEFAULT_FIELDS = RunConfig().to_dict()


def method_of(config: dict) -> str:
    """A short label for how a config trains: QLoRA, LoRA, or full fine-tune ± 8-bit AdamW ± grad. ckpt (a field
    the row lacks has RunConfig's default)."""
    config = {**_DEFAULT_FIELDS, **config}
    if config.get("use_peft"):
        return "QLoRA" if config.get("load_in_4bit") else "LoRA"
    label = "full fine-tune"
    if "8bit" in str(config.get("optim", "")):
        label = "+ 8-bit AdamW"
    if config.get("gradient_checkpointing"):
        label = "+ 8-bit AdamW + grad. ckpt" if label != "full fine-tune" else "full fine-tune + grad. ckpt"
    return label


def model_label(name: str) -> str:
    """Shorthand size for a Qwen2.5 model name (e.g. '7B'), else the name itself."""
    by_id = {v.lower(): k for k, v in SHORTHANDS.items()}
    if name.upper() in SHORTHANDS:
        return name.upper()
    return by_id.get(str(name).lower(), str(name))


def normalize_config(config: dict) -> dict:
    """A row's config with the model spelled as its HF id and memory-irrelevant fields dropped."""
    # a field the row predates (e.g. trl_version, absent from rows of the newest release) has its default
    d = {k: v for k, v in {**_DEFAULT_FIELDS, **config}.items() if k not in IGNORED_FIELDS}
    model = str(d.get("model", ""))
    d["model"] = SHORTHANDS.get(model.upper(), model).lower()
    if d.get("lora_target_modules") is not None:
        d["lora_target_modules"] = sorted(d["lora_target_modules"])
    if (
        d.get("trl_version", NEWEST_TRL) == NEWEST_TRL
    ):  # rows from before the field existed: the newest release
        d.pop("trl_version", None)
    return d


def config_id(config: dict | RunConfig) -> str:
    """A string equal for two configs exactly when they describe the same run's memory."""
    d = config.to_dict() if isinstance(config, RunConfig) else config
    return json.dumps(normalize_config(d), sort_keys=True, separators=(",", ":"))


def cached(predict: Predict) -> Predict:
    """`predict` memoized on the (frozen, hashable) config."""
    return lru_cache(maxsize=None)(predict)


DEFAULT_PREDICT: Predict = cached(estimate)
# what a Python dispatch mode counts (the traced and measured-cpu rows: `estimate(tensors="dispatch")`)
DEFAULT_PREDICT_DISPATCH: Predict = cached(partial(estimate, tensors=DISPATCH))


# ---------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class Card:
    """A GPU size class as the tables show it: marketed GB, the model we take for it, and its driver total."""

    gb: int
    name: str
    bytes: int

    @property
    def label(self) -> str:
        return f"{self.gb} GB ({self.name})"


def cards(sizes: Iterable[int] = FIT_SIZES_GB) -> list[Card]:
    """For each marketed size, the catalog GPU (estimator.hardware.gpus) with the smallest driver-reported memory, sized by
    what torch can use on it (`usable_bytes`), as `vram-estimate`'s verdicts are."""
    from estimator.hardware.gpus import GPUS

    out = []
    for gb in sizes:
        same = [g for g in GPUS if round(g.marketed_gb) == gb]
        if not same:
            raise ValueError(f"no {gb} GB GPU in estimator.hardware.gpus")
        g = min(same, key=lambda g: (g.memory_bytes, g.name))
        out.append(Card(gb, g.name, g.usable_bytes))
    return out


# ---------------------------------------------------------------- rows


def _probe(row: dict, name: str) -> dict:
    probes = (row.get("observed") or {}).get("probes") or {}
    p = probes.get(name)
    return p if isinstance(p, dict) else {}


def _first(d: dict, *keys: str) -> int | None:
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return None


def _phase_max(p: dict, *keys: str) -> int | None:
    """A probe's top-level value for the first of `keys`, else the max of it over per-phase dicts."""
    top = _first(p, *keys)
    if top is not None:
        return top
    phases = p.get("phases") if isinstance(p.get("phases"), dict) else p
    vals = [_first(v, *keys) for v in phases.values() if isinstance(v, dict)]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def torch_cuda_peaks(row: dict) -> tuple[int | None, int | None]:
    """(max allocated, max reserved) bytes of a GPU row's torch_cuda probe, over all phases."""
    p = _probe(row, "torch_cuda")
    alloc = _phase_max(
        p, "max_allocated_bytes", "max_allocated", "max_memory_allocated", "peak_allocated_bytes"
    )
    res = _phase_max(p, "max_reserved_bytes", "max_reserved", "max_memory_reserved", "peak_reserved_bytes")
    return alloc, res


def nvml_peak(row: dict) -> int | None:
    """Peak process (else device) used bytes from a row's NVML probe; None when NVML was unavailable."""
    p = _probe(row, "nvml")
    if p.get("available") is False:
        return None
    proc = _phase_max(p, "peak_process_bytes", "process_peak_bytes", "process_used_bytes", "process_bytes")
    if proc is not None:
        return proc
    return _phase_max(p, "peak_used_bytes", "device_peak_bytes", "peak_device_bytes", "used_bytes")


def rows_frame(rows: Iterable[dict]) -> pd.DataFrame:
    """One line per result row: source, status, model, method, config id, observed peak and environment."""
    recs = []
    for row in rows:
        config = row.get("config") or {}
        observed = row.get("observed") or {}
        device = row.get("device") or {}
        alloc, reserved = torch_cuda_peaks(row)
        recs.append(
            {
                "key": row.get("key"),
                "source": row.get("source"),
                "status": row.get("status"),
                "sweep": row.get("sweep"),
                "model": model_label(str(config.get("model", ""))),
                "method": method_of(config),
                "config_id": config_id(config) if config else "",
                "config": config,
                "hf_config": (row.get("model") or {}).get("config"),  # config.json of models built in code
                "observed_bytes": observed.get("peak_bytes"),
                "observed_phase": observed.get("peak_phase"),
                "max_allocated_bytes": alloc,
                "max_reserved_bytes": reserved,
                "nvml_peak_bytes": nvml_peak(row),
                "device_name": device.get("name"),
                "device_type": device.get("type"),
                "device_bytes": device.get("total_bytes"),
                "versions": row.get("versions") or {},
                "git_commit": row.get("git_commit"),
            }
        )
    cols = ["key", "source", "status", "sweep", "model", "method", "config_id", "config", "observed_bytes"]
    frame = pd.DataFrame.from_records(recs) if recs else pd.DataFrame(columns=cols)
    return frame.sort_values(["source", "sweep", "key"], na_position="last", kind="stable").reset_index(
        drop=True
    )


# ---------------------------------------------------------------- headline


def best_observation(frame: pd.DataFrame, cfg: RunConfig) -> pd.Series | None:
    """The row to show for `cfg`: best source first (measured-gpu > traced); an `ok` row's largest peak, else an OOM."""
    if frame.empty:
        return None
    same = frame[frame["config_id"] == config_id(cfg)]
    for source in HEADLINE_PRIORITY:
        sub = same[same["source"] == source]
        ok = sub[(sub["status"] == "ok") & sub["observed_bytes"].notna()]
        if not ok.empty:
            return ok.sort_values(["observed_bytes", "key"], ascending=[False, True]).iloc[0]
        oom = sub[sub["status"] == "oom"]
        if not oom.empty:
            return oom.sort_values("key").iloc[0]
    return None


def fits_bytes(est: Estimate, allocated: int, nvml: int | None = None) -> int:
    """Bytes the process needs on the card: the NVML peak if measured, else allocated + estimated overheads."""
    if nvml is not None:
        return nvml
    return allocated + est.allocator_overhead_bytes + est.cuda_context_bytes


def headline_frame(
    frame: pd.DataFrame,
    predict: Predict = DEFAULT_PREDICT,
    models: Iterable[str] = MODELS,
    base: RunConfig = HEADLINE_BASE,
    gpu_bytes: int | None = None,
) -> pd.DataFrame:
    """model × method: peak allocated bytes, its source, the bytes needed on the card, and whether it OOMs."""
    if gpu_bytes is None:
        gpu_bytes = cards([HEADLINE_GPU_GB])[0].bytes
    recs = []
    for model in models:
        for method in METHODS:
            cfg = method_config(model, method, base)
            est = predict(cfg)
            obs = best_observation(frame, cfg)
            if obs is not None and obs["status"] == "oom":
                total = obs["device_bytes"] if pd.notna(obs["device_bytes"]) else None
                oom = total is None or total <= gpu_bytes * 1.02
                recs.append(_cell(model, method, obs["source"], None, None, oom, obs["source"], obs["key"]))
                continue
            if obs is not None:
                alloc = int(obs["observed_bytes"])
                nv = obs["nvml_peak_bytes"] if obs["source"] == "measured-gpu" else None
                nv = None if nv is None or pd.isna(nv) else int(nv)
                need = fits_bytes(est, alloc, nv)
                vsrc = "measured-gpu" if nv is not None else f"{obs['source']} + estimated overheads"
                recs.append(
                    _cell(model, method, obs["source"], alloc, need, need > gpu_bytes, vsrc, obs["key"])
                )
            else:
                need = est.fit_bytes  # what vram-estimate's verdict compares: need + the regime's error band
                recs.append(
                    _cell(
                        model,
                        method,
                        "estimated",
                        est.peak_allocated_bytes,
                        need,
                        need > gpu_bytes,
                        "estimated",
                    )
                )
    return pd.DataFrame.from_records(recs)


def _cell(model, method, source, alloc, need, oom, verdict_source, key=None) -> dict:
    return {
        "model": model,
        "method": method,
        "source": source,
        "peak_allocated_bytes": alloc,
        "needed_bytes": need,
        "oom": bool(oom),
        "verdict_source": verdict_source,
        "row_key": key,
    }


# ---------------------------------------------------------------- breakdown, curves, fits


def breakdown_frame(
    predict: Predict = DEFAULT_PREDICT, models: Iterable[str] = MODELS, base: RunConfig = HEADLINE_BASE
) -> pd.DataFrame:
    """Estimated bytes per component in the peak phase, per model and method (long format)."""
    recs = []
    for model in models:
        for method in METHODS:
            est = predict(method_config(model, method, base))
            phase = est.peak_phase
            for comp, b in sorted(est.phases[phase].items()):
                recs.append(
                    {"model": model, "method": method, "phase": phase, "component": comp, "bytes": int(b)}
                )
    return pd.DataFrame.from_records(recs)


CURVES = {
    "num_generations": (GENERATIONS, generations_config),
    "max_completion_length": (COMPLETION_LENGTHS, lambda cfg, n: cfg.with_(max_completion_length=n)),
}


def curve_frame(
    param: str,
    frame: pd.DataFrame,
    predict: Predict = DEFAULT_PREDICT,
    models: Iterable[str] = CURVE_MODELS,
    methods: Iterable[str] = CURVE_METHODS,
    base: RunConfig = HEADLINE_BASE,
) -> pd.DataFrame:
    """Estimated peak allocated (and on-card) bytes along `param`, plus any observed rows of the same configs."""
    values, make = CURVES[param]
    recs = []
    for method in methods:
        for model in models:
            for x in values:
                cfg = make(method_config(model, method, base), x)
                est = predict(cfg)
                recs.append(_curve_rec(param, method, model, x, "estimated", est.peak_allocated_bytes, est))
                obs = best_observation(frame, cfg)
                if obs is not None and obs["status"] == "ok":
                    recs.append(
                        _curve_rec(param, method, model, x, obs["source"], int(obs["observed_bytes"]))
                    )
    return pd.DataFrame.from_records(recs)


def _curve_rec(param, method, model, x, source, alloc, est: Estimate | None = None) -> dict:
    return {
        "param": param,
        "method": method,
        "model": model,
        "x": x,
        "source": source,
        "peak_allocated_bytes": alloc,
        "needed_bytes": est.peak_device_bytes if est is not None else None,
    }


def fits_frame(
    predict: Predict = DEFAULT_PREDICT,
    models: Iterable[str] = FIT_MODELS,
    base: RunConfig = HEADLINE_BASE,
    gpus: list[Card] | None = None,
) -> pd.DataFrame:
    """model × method: estimated bytes on the card and, per GPU size, whether that fits (all `estimated`)."""
    gpus = cards() if gpus is None else gpus
    recs = []
    for model in models:
        for method in METHODS:
            need = predict(
                method_config(model, method, base)
            ).fit_bytes  # as vram-estimate's verdict, band included
            rec = {"model": model, "method": method, "source": "estimated", "needed_bytes": need}
            rec.update({g.label: need <= g.bytes for g in gpus})
            recs.append(rec)
    return pd.DataFrame.from_records(recs)


# ---------------------------------------------------------------- config labels and environment
# (accuracy itself: sweeps/report/accuracy.py, the one implementation)


def summarize_config(config: dict) -> str:
    """The fields that set memory, compactly: batch, generations, lengths, dtype, optimizer, flags (a field the
    row lacks has RunConfig's default)."""
    config = {**_DEFAULT_FIELDS, **config}
    parts = [
        f"bs{config.get('per_device_train_batch_size')}",
        f"G{config.get('num_generations')}",
        f"P{config.get('max_prompt_length')}",
        f"C{config.get('max_completion_length')}",
        str(config.get("dtype")),
        str(config.get("optim")),
    ]
    if config.get("gradient_checkpointing"):
        parts.append("gc")
    if config.get("use_peft"):
        parts.append(f"lora-r{config.get('lora_r')}")
    if config.get("load_in_4bit"):
        parts.append("4bit")
    if config.get("beta"):
        parts.append(f"beta{config.get('beta')}")
    if (config.get("steps_per_generation") or 1) != 1:
        parts.append(f"spg{config.get('steps_per_generation')}")
    if config.get("gradient_accumulation_steps") != 1:
        parts.append(f"ga{config.get('gradient_accumulation_steps')}")
    if config.get("device") == "cpu":
        parts.append("cpu")
    if (config.get("num_gpus") or 1) > 1:
        sharding = config.get("sharding") or "none"
        parts.append(f"{config['num_gpus']}x{'ddp' if sharding == 'none' else sharding}")
        if config.get("fsdp_sharding_strategy"):
            parts.append(str(config["fsdp_sharding_strategy"]))
    return " ".join(parts)


def environment_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Per source and sweep: row count, device, the package versions and commits the rows were made with."""
    if frame.empty:
        return pd.DataFrame(columns=["source", "sweep", "rows", "device"])
    recs = []
    for (source, sweep), g in frame.groupby(["source", "sweep"], sort=True, dropna=False):
        rec = {"source": source, "sweep": sweep, "rows": len(g), "device": _device_text(g)}
        for v in records.VERSION_FIELDS:
            rec[v] = _joined(g["versions"].map(lambda d, v=v: d.get(v)))
        rec["git_commit"] = _joined(g["git_commit"].map(lambda c: c[:12] if isinstance(c, str) else c))
        recs.append(rec)
    return pd.DataFrame.from_records(recs)


def _joined(values: pd.Series) -> str:
    vals = sorted({str(v) for v in values if v is not None and not (isinstance(v, float) and pd.isna(v))})
    return ", ".join(vals) if vals else "—"


def _device_text(g: pd.DataFrame) -> str:
    out = set()
    for _, r in g.iterrows():
        name = next(
            (v for v in (r.get("device_name"), r.get("device_type")) if isinstance(v, str) and v), "?"
        )
        if r.get("device_type") == "fake-cuda":
            name = "FakeTensorMode on CPU, CUDA semantics"
        total = r.get("device_bytes")
        size = f" ({total / GIB:.1f} GiB)" if isinstance(total, (int, float)) and pd.notna(total) else ""
        out.add(f"{r.get('device_type') or '?'}: {name}{size}")
    return "; ".join(sorted(out))


# ---------------------------------------------------------------- markdown


def md_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table of `df` (index ignored; cells already formatted or str()-ed)."""
    if df.empty:
        return "_(no rows)_"
    cols = [str(c) for c in df.columns]
    lines = [
        "| " + " | ".join(c.replace("|", "\\|") for c in cols) + " |",
        "|" + "|".join("---" for _ in cols) + "|",
    ]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_md_cell(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


def _md_cell(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)
