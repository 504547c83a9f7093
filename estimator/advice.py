"""What to change to make a run fit: single changes re-estimated and ranked, then the smallest set that fits."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from estimator.architecture import Arch
from estimator.config import RunConfig
from estimator.estimate import Estimate
from estimator.solve import EstimateFn, is_valid, largest_fitting

FitsFn = Callable[[RunConfig], bool]
MAX_EXTRA_GPUS = (2, 4, 8)


@dataclass(frozen=True)
class Change:
    """One edit of the run: a short key, what to do (in TRL terms), its cost rank and the resulting config."""

    key: str
    label: str
    cost: int  # 1 = no effect on the result, higher = changes training more (used to break ties)
    config: RunConfig


@dataclass
class Option:
    """A set of changes with its re-estimated nvidia-smi peak and the bytes it saves."""

    changes: tuple[Change, ...]
    peak_device_bytes: int
    saved_bytes: int
    fits: bool | None  # None when there is no budget

    @property
    def label(self) -> str:
        return " + ".join(c.label for c in self.changes)

    @property
    def config(self) -> RunConfig:
        return self.changes[-1].config


@dataclass
class Advice:
    """Single changes ranked by bytes saved, and the smallest set of changes that fits (if one was found)."""

    baseline_bytes: int
    budget_bytes: int | None
    singles: list[Option] = field(default_factory=list)
    plan: Option | None = None


# ---- the single changes; each takes (cfg, arch, fits) and returns the changed config(s) ----


def _load_bf16(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if cfg.dtype != "float32" or cfg.load_in_4bit:
        return []
    return [
        Change("bf16", "load in bf16 (model_init_kwargs dtype: bfloat16)", 1, cfg.with_(dtype="bfloat16"))
    ]


def _grad_ckpt(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if cfg.gradient_checkpointing:
        return []
    return [Change("gc", "--gradient-checkpointing", 1, cfg.with_(gradient_checkpointing=True))]


def _adam8bit(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if cfg.device != "cuda" or cfg.optim not in ("adamw_torch_fused", "adamw_torch", "paged_adamw_32bit"):
        return []
    return [Change("adam8", "--optim adamw_bnb_8bit", 2, cfg.with_(optim="adamw_bnb_8bit"))]


def _lora(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if cfg.use_peft:
        return []
    return [Change("lora", f"--use-peft (LoRA r={cfg.lora_r})", 4, cfg.with_(use_peft=True))]


def _qlora(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if cfg.load_in_4bit or cfg.device != "cuda":
        return []
    return [Change("qlora", "--qlora (LoRA on a 4-bit base)", 5, cfg.with_(use_peft=True, load_in_4bit=True))]


def _vllm_sleep(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if not (cfg.use_vllm and cfg.vllm_mode == "colocate") or cfg.vllm_enable_sleep_mode:
        return []
    return [Change("sleep", "--vllm-enable-sleep-mode", 1, cfg.with_(vllm_enable_sleep_mode=True))]


def _micro_batch(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """Same generation batch and same sequences per optimizer step, in smaller micro-batches."""
    bs = cfg.per_device_train_batch_size
    options = []
    for b in range(bs - 1, 0, -1):
        if bs % b:
            continue
        k = bs // b
        changes: dict = {
            "per_device_train_batch_size": b,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps * k,
        }
        if cfg.steps_per_generation is not None:
            changes["steps_per_generation"] = cfg.steps_per_generation * k
        c = cfg.with_(**changes)
        if is_valid(c):
            options.append(c)
    if not options:
        return []
    pick = next((c for c in options if fits(c)), options[-1]) if fits else options[len(options) // 2]
    b, ga = pick.per_device_train_batch_size, pick.gradient_accumulation_steps
    return [Change("micro", f"--per-device-train-batch-size {b} --gradient-accumulation-steps {ga}", 2, pick)]


def _fewer_generations(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """Fewer completions per prompt, same prompts per generation batch (so fewer sequences at once)."""
    g, seq = cfg.num_generations, cfg.generation_sequences
    options = []
    for g2 in range(g - 1, 1, -1):
        if (seq * g2) % g:
            continue
        c = _with_sequences(cfg.with_(num_generations=g2), seq * g2 // g)
        if c is not None:
            options.append(c)
    if not options:
        return []
    pick = next((c for c in options if fits(c)), None) if fits else options[len(options) // 2]
    if pick is None:
        return []
    return [Change("gens", f"--num-generations {pick.num_generations} ({_geometry(pick)})", 6, pick)]


def _with_sequences(cfg: RunConfig, seq: int) -> RunConfig | None:
    """`cfg` generating `seq` sequences per device: the largest micro-batch <= the current one dividing it."""
    bs = max(b for b in range(1, min(cfg.per_device_train_batch_size, seq) + 1) if seq % b == 0)
    spg = seq // bs
    if cfg.steps_per_generation is None and cfg.generation_batch_size is None:
        c = cfg.with_(per_device_train_batch_size=bs, gradient_accumulation_steps=spg)
    else:
        c = cfg.with_(per_device_train_batch_size=bs, steps_per_generation=spg, generation_batch_size=None)
    return c if is_valid(c) else None


def _geometry(c: RunConfig) -> str:
    return f"bs {c.per_device_train_batch_size}, generation batch {c.generation_sequences}"


def _shorter_completions(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    n = cfg.max_completion_length
    if n <= 1:
        return []
    if fits:
        best = largest_fitting(range(1, n), lambda m: fits(cfg.with_(max_completion_length=m)))
        if best is None:
            return []
    else:
        best = n // 2
    return [Change("len", f"--max-completion-length {best}", 6, cfg.with_(max_completion_length=best))]


def _more_gpus(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if cfg.device != "cuda":
        return []
    sharding = "fsdp" if cfg.sharding == "fsdp" else "zero3"
    options = [cfg.with_(num_gpus=n, sharding=sharding) for n in MAX_EXTRA_GPUS if n > cfg.num_gpus]
    options = [c for c in options if is_valid(c)]
    if not options:
        return []
    pick = next((c for c in options if fits(c)), options[-1]) if fits else options[0]
    how = "--fsdp" if sharding == "fsdp" else "--zero 3"
    return [Change("gpus", f"--gpus {pick.num_gpus} {how}", 3, pick)]


GENERATORS = (
    _load_bf16,
    _grad_ckpt,
    _vllm_sleep,
    _adam8bit,
    _lora,
    _qlora,
    _more_gpus,
    _micro_batch,
    _shorter_completions,
    _fewer_generations,
)
CONFLICTS = ({"lora", "qlora"}, {"bf16", "qlora"})


def single_changes(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """Every single change that applies to `cfg` (sizing changes pick the largest value that fits)."""
    return [ch for gen in GENERATORS for ch in gen(cfg, fits)]


def apply_keys(cfg: RunConfig, keys: tuple[str, ...], fits: FitsFn | None) -> tuple[Change, ...] | None:
    """Apply changes by key in GENERATORS order, each re-derived on the config so far; None if one no longer applies."""
    applied: list[Change] = []
    current = cfg
    for gen in GENERATORS:
        for ch in gen(current, fits):
            if ch.key in keys:
                applied.append(ch)
                current = ch.config
    if len(applied) != len(keys):
        return None
    return tuple(applied)


def advise(
    cfg: RunConfig, arch: Arch, estimate_fn: EstimateFn, budget_bytes: int | None = None, max_set: int = 2
) -> Advice:
    """Rank single changes by bytes saved; with a budget, find the smallest set that fits (exhaustive up to
    `max_set` changes, then greedy)."""
    cache: dict[RunConfig, Estimate] = {}

    def peak(c: RunConfig) -> int:
        if c not in cache:
            cache[c] = estimate_fn(c, arch)
        return cache[c].peak_device_bytes

    fits: FitsFn | None = (lambda c: peak(c) <= budget_bytes) if budget_bytes is not None else None
    base = peak(cfg)

    def option(changes: tuple[Change, ...]) -> Option:
        p = peak(changes[-1].config)
        return Option(changes, p, base - p, (p <= budget_bytes) if budget_bytes is not None else None)

    singles = sorted((option((ch,)) for ch in single_changes(cfg, fits)), key=lambda o: -o.saved_bytes)
    advice = Advice(base, budget_bytes, singles)
    if fits is None or base <= budget_bytes:
        return advice
    keys = [o.changes[0].key for o in singles]
    for size in range(1, max_set + 1):
        found = []
        for combo in itertools.combinations(keys, size):
            if any(pair <= set(combo) for pair in CONFLICTS):
                continue
            changes = apply_keys(cfg, combo, fits)
            if changes is not None and fits(changes[-1].config):
                found.append(option(changes))
        if found:
            advice.plan = min(found, key=lambda o: (sum(c.cost for c in o.changes), o.peak_device_bytes))
            return advice
    advice.plan = _greedy(cfg, fits, option)
    return advice


def _greedy(cfg: RunConfig, fits: FitsFn, option: Callable[[tuple[Change, ...]], Option]) -> Option | None:
    """Add the change that saves most until the run fits or nothing applies; the last set tried."""
    chosen: tuple[str, ...] = ()
    best: Option | None = None
    while True:
        tried = []
        for ch in single_changes(best.config if best else cfg, fits):
            keys = chosen + (ch.key,)
            if ch.key in chosen or any(pair <= set(keys) for pair in CONFLICTS):
                continue
            changes = apply_keys(cfg, keys, fits)
            if changes is not None:
                tried.append(option(changes))
        if not tried:
            return best
        pick = max(tried, key=lambda o: o.saved_bytes)
        if best is not None and pick.saved_bytes <= best.saved_bytes:
            return best
        best, chosen = pick, tuple(c.key for c in pick.changes)
        if best.fits:
            return best
