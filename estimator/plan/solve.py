"""Reverse solve: the largest num_generations / max_completion_length / per_device_train_batch_size that fits."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.settings.validate import InvalidConfig, check_combination, check_geometry
from estimator.step.estimate import Estimate

EstimateFn = Callable[[RunConfig, Arch], Estimate]
SOLVABLE = (
    "num_generations",
    "max_completion_length",
    "per_device_train_batch_size",
    "vllm_gpu_memory_utilization",
)
MAX_GENERATIONS = 512
MAX_BATCH = 4096
DEFAULT_MAX_CONTEXT = 131072


@dataclass
class Solution:
    """The largest value of `knob` that fits `budget_bytes` (None if even the smallest does not)."""

    knob: str
    value: int | None
    config: RunConfig | None
    peak_device_bytes: int | None  # the estimated nvidia-smi peak at `value`
    budget_bytes: int
    note: str = ""
    need_bytes: int | None = (
        None  # what the card must hold at `value` (release-and-retry): compared with budget
    )
    tried: bool = (
        True  # False where no value could be tried at all (a prompt that fills the context): see note
    )


class PeakCache:
    """Memoized estimates of configs of one model (advice and solve re-estimate the same configs); called, the
    bytes a fit verdict compares with the card: what it must hold (`Estimate.need_bytes`: allocated + the smallest
    allocator reserve the step passes with, the allocator freeing its cache and retrying before an OOM, + the
    non-tensor items)."""

    def __init__(self, arch: Arch, estimate_fn: EstimateFn):
        self.arch, self.estimate_fn = arch, estimate_fn
        self.cache: dict[RunConfig, Estimate] = {}

    def estimate(self, cfg: RunConfig) -> Estimate:
        if cfg not in self.cache:
            self.cache[cfg] = self.estimate_fn(cfg, self.arch)
        return self.cache[cfg]

    def __call__(self, cfg: RunConfig) -> int:
        """What fits are decided on: what the card must hold + the regime's error band (Estimate.fit_bytes)."""
        return self.estimate(cfg).fit_bytes


def is_valid(cfg: RunConfig) -> bool:
    """True if TRL's GRPOConfig would accept the batch geometry of `cfg` and its options go together (vLLM's
    tensor parallel size dividing the GPUs, offload with sharding, ...: `check_combination` without the model)."""
    try:
        check_geometry(cfg)
        check_combination(cfg, None)
    except InvalidConfig:
        return False
    return True


def with_generations(cfg: RunConfig, g: int) -> RunConfig | None:
    """`cfg` with num_generations = g, growing the generation batch (minimally) until it holds full groups."""
    bs, procs = cfg.per_device_train_batch_size, cfg.num_gpus
    if g < 2:
        return None
    if cfg.generation_batch_size is not None:
        step = math.lcm(bs * procs, g)
        gbs = -(-cfg.generation_batch_size // step) * step
        out = cfg.with_(num_generations=g, generation_batch_size=gbs)
    else:
        spg = cfg.resolved_steps_per_generation
        need = g // math.gcd(bs * procs, g)  # steps_per_generation must be a multiple of this
        spg = -(-spg // need) * need
        if cfg.steps_per_generation is not None:
            out = cfg.with_(num_generations=g, steps_per_generation=spg)
        else:  # TRL default: steps_per_generation = gradient_accumulation_steps
            out = cfg.with_(num_generations=g, gradient_accumulation_steps=spg)
    return out if is_valid(out) else None


def valid_batch_sizes(cfg: RunConfig, cap: int = MAX_BATCH) -> list[int]:
    """per_device_train_batch_size values TRL accepts with the rest of `cfg` unchanged, ascending."""
    return [b for b in range(1, cap + 1) if is_valid(cfg.with_(per_device_train_batch_size=b))]


def largest_fitting(values, fits: Callable[[object], bool]):
    """Largest v in ascending `values` with fits(v), assuming fits is monotone (bisection); None if none."""
    lo, hi = 0, len(values) - 1
    best = None
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(values[mid]):
            best, lo = values[mid], mid + 1
        else:
            hi = mid - 1
    return best


def context_length(arch: Arch) -> int:
    """The model's context: config max_position_embeddings (DEFAULT_MAX_CONTEXT where it gives none)."""
    return int((arch.extra or {}).get("config", {}).get("max_position_embeddings") or DEFAULT_MAX_CONTEXT)


def max_context(cfg: RunConfig, arch: Arch) -> int:
    """Longest completion the model's context allows after the expected prompt: 0 or less when the prompt alone
    fills the context."""
    return context_length(arch) - cfg.max_prompt_length


def solve(
    cfg: RunConfig,
    arch: Arch,
    knob: str,
    budget_bytes: int,
    estimate_fn: EstimateFn,
    starts: Callable[[RunConfig, Arch], bool] | None = None,
    others_fit: Callable[[RunConfig, Arch], bool] | None = None,
    host_fits: Callable[[RunConfig, Arch], bool] | None = None,
) -> Solution:
    """Largest value of `knob` whose estimate of what the card must hold (`PeakCache`) is within `budget_bytes`
    (the memory torch can use on the card: `GPU.usable_bytes`) and, with `starts` (layout.starts_on), at which
    vLLM's own start-up checks pass, with `others_fit` (layout.others_fit_on) the roles' own GPUs hold them, and
    with `host_fits` the host holds what the run offloads and loads there (--host-ram)."""
    peak = PeakCache(arch, estimate_fn)

    def starts_(c: RunConfig) -> bool:
        return starts is None or starts(c, arch)

    def others_(c: RunConfig) -> bool:
        return others_fit is None or others_fit(c, arch)

    def host_(c: RunConfig) -> bool:
        return host_fits is None or host_fits(c, arch)

    def fits(c: RunConfig) -> bool:
        return peak(c) <= budget_bytes and starts_(c) and others_(c) and host_(c)

    note = ""
    best_cfg: RunConfig | None = None
    if knob == "max_completion_length":
        cap = max_context(cfg, arch)
        lengths = range(1, cap + 1)  # empty when the prompt alone fills the context
        best = largest_fitting(lengths, lambda n: fits(cfg.with_(max_completion_length=n)))
        best_cfg = cfg.with_(max_completion_length=best) if best else None
        if cap < 1:
            note = (
                f"the {cfg.max_prompt_length}-token prompt alone fills the model's context (max_position_embeddings "
                f"{context_length(arch)}): no completion length fits in it"
            )
        elif best == cap:
            note = f"capped by the model's context ({cap} = max_position_embeddings - max_prompt_length)"
    elif knob == "per_device_train_batch_size":
        sizes = valid_batch_sizes(cfg)
        best = largest_fitting(sizes, lambda b: fits(cfg.with_(per_device_train_batch_size=b)))
        best_cfg = cfg.with_(per_device_train_batch_size=best) if best else None
        note = "only sizes whose generation batch holds whole groups of num_generations"
        if best is not None and best == sizes[-1]:
            note += f"; capped at {best}, the largest size searched (larger ones may fit too)"
    elif knob == "vllm_gpu_memory_utilization":
        if not (cfg.use_vllm and cfg.vllm_mode == "colocate"):
            raise ValueError(
                "vllm_gpu_memory_utilization is solved for vLLM colocate (--use-vllm --vllm-mode colocate)"
            )
        # vLLM starts from the share that holds one max_model_len request up to the share free at start-up; in
        # that range the step's need grows with the share, so the bisection runs there
        shares = [u / 100 for u in range(1, 100) if starts_(cfg.with_(vllm_gpu_memory_utilization=u / 100))]
        best = largest_fitting(shares, lambda u: fits(cfg.with_(vllm_gpu_memory_utilization=u)))
        best_cfg = cfg.with_(vllm_gpu_memory_utilization=best) if best else None
        note = "vLLM's share of the card in steps of 0.01"
        if starts is not None:
            note += (
                f"; vLLM starts from {shares[0]} to {shares[-1]} (one max_model_len request, free at start-up)"
                if shares
                else "; no share lets vLLM start: the layout says why"
            )
    elif knob == "num_generations":
        best_cfg, capped = _solve_generations(cfg, fits)
        best = best_cfg.num_generations if best_cfg else None
        notes = []
        if best_cfg is not None and best_cfg.global_generation_batch != cfg.global_generation_batch:
            notes.append(
                f"generation batch grown to {best_cfg.global_generation_batch} sequences ({_how(cfg, best_cfg)})"
            )
        if best_cfg is not None and capped:
            notes.append(
                f"capped at {best}: the search stops at num_generations {MAX_GENERATIONS} "
                "without having found a value that does not fit (larger ones may fit too)"
            )
        note = "; ".join(notes)
    else:
        raise ValueError(f"cannot solve for {knob!r}; accepted: {', '.join(SOLVABLE)}")
    if knob == "max_completion_length" and max_context(cfg, arch) < 1:
        pass  # the context's note stands: no length is tried
    elif best_cfg is None and knob != "vllm_gpu_memory_utilization" and not starts_(cfg):
        note = "vLLM does not start at this configuration, whatever the value: the layout says why"
    elif best_cfg is None and not host_(cfg):
        note = "the host RAM (--host-ram) is short whatever the value: the host RAM line says by how much"
    elif best_cfg is None and not others_(cfg):
        note = "a GPU of a role placed on its own does not hold it, whatever the value: the layout says which"
    device = peak.estimate(best_cfg).peak_device_bytes if best_cfg else None
    tried = not (knob == "max_completion_length" and max_context(cfg, arch) < 1)
    need = peak(best_cfg) if best_cfg else None
    return Solution(knob, best, best_cfg, device, budget_bytes, note, need, tried)


def _how(before: RunConfig, after: RunConfig) -> str:
    """Which TRL option grew the generation batch."""
    if before.generation_batch_size is not None:
        return f"generation_batch_size {after.generation_batch_size}"
    if before.steps_per_generation is not None:
        return f"steps_per_generation {after.steps_per_generation}"
    return f"gradient_accumulation_steps {after.gradient_accumulation_steps}"


def _solve_generations(cfg: RunConfig, fits: Callable[[RunConfig], bool]) -> tuple[RunConfig | None, bool]:
    """Scan num_generations upward; a generation batch that failed bounds every later one (memory grows with it).

    Returns the largest fitting config and whether the scan hit MAX_GENERATIONS with everything still fitting."""
    best: RunConfig | None = None
    fail_gbs = math.inf
    for g in range(2, MAX_GENERATIONS + 1):
        if g >= fail_gbs:
            break
        c = with_generations(cfg, g)
        if c is None or c.global_generation_batch >= fail_gbs:
            continue
        if fits(c):
            best = c
        else:
            fail_gbs = c.global_generation_batch
    return best, fail_gbs == math.inf
