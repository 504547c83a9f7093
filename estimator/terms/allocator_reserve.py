"""The allocator's reserve (max_memory_reserved - max_memory_allocated) for a config, and what settings save.

Where the config's allocation stream was traced and simulated (`sweeps.trace.streams` -> the table
`estimator/data/allocator_streams.json`), the reserve is that simulation's. Otherwise it comes from small
models fitted over those simulations (`fit` in the same table, written by `python -m sweeps.trace.streams
--table`): a step model for the peak, and a generation model for generation's phase (`predicted_fraction`). The fits'
errors against the simulations are stored next to them and printed by `python -m sweeps.trace.streams
--report`. Stdlib only: the estimator never replays a stream at run time (a 7B stream takes ~0.3 s; the table
holds the results).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

from estimator.settings.config import NEWEST_TRL, RunConfig
from estimator.settings.versions import MODELLED_TRANSFORMERS
from estimator.terms.generation import value_cache_dtype

TABLE = Path(__file__).resolve().parents[1] / "data" / "allocator_streams.json"
VARIANTS = ("default", "expandable_segments", "max_split_size_mb_128", "torch_empty_cache_steps_1")
# fields that do not change the recorded stream: the allocator settings select a simulated variant of it instead
IGNORED_FIELDS = ("gpu_memory_gib", "pytorch_cuda_alloc_conf", "torch_empty_cache_steps")


@dataclass(frozen=True)
class Reserve:
    """Reserve beyond the allocated peak, and where the number came from."""

    bytes: int
    fraction: float  # of the allocated peak
    source: str  # "simulated (traced stream <key>)" or "fitted (...)"
    margin_bytes: int = 0  # of `bytes`, what the fitted models' leave-one-out margins add (0 where simulated)


@cache
def _table() -> dict:
    if not TABLE.exists():
        return {"streams": [], "fit": {}}
    return json.loads(TABLE.read_text())


def _release_free(cfg: RunConfig) -> bool:
    """Whether this config's step is the same under every modelled transformers release: the releases differ
    only in the value cache's dtype (estimator/settings/versions.py), so a stream traced under one stands for all."""
    return len({value_cache_dtype(cfg.with_(transformers_version=v)) for v in MODELLED_TRANSFORMERS}) == 1


def _match_key(cfg: RunConfig | dict) -> tuple:
    if isinstance(cfg, RunConfig):
        try:
            return _config_match_key(cfg)
        except TypeError:  # a field given an unhashable value (a list for a tuple): the same key, uncached
            return _dict_match_key(cfg.to_dict(), cfg)
    return _dict_match_key(cfg)


@lru_cache(maxsize=4096)
def _config_match_key(cfg: RunConfig) -> tuple:
    return _dict_match_key(cfg.to_dict(), cfg)


def _dict_match_key(d: dict, cfg: RunConfig | None = None) -> tuple:
    """The fields a traced stream is matched on: the config less the fields that do not change its stream."""
    d = dict(d)
    if _release_free(cfg if cfg is not None else RunConfig.from_dict(d)):
        d.pop("transformers_version", None)
    for f in IGNORED_FIELDS:
        d.pop(f, None)
    if (
        d.get("trl_version") == NEWEST_TRL
    ):  # streams recorded before trl_version existed are the newest release's
        d.pop("trl_version")
    return tuple(sorted((k, json.dumps(v)) for k, v in d.items()))


@cache
def _streams_by_key() -> dict[tuple, dict]:
    """The table's traced streams by `_match_key` (the first stream of a key, as a scan in table order finds):
    built once, so an answer that prices hundreds of configs (advice, `--solve`) looks each up in O(1)."""
    out: dict[tuple, dict] = {}
    for s in _table()["streams"]:
        out.setdefault(_match_key(s["config"]), s)
    return out


def simulated(cfg: RunConfig, variant: str = "default") -> dict | None:
    """The simulation of this exact config's traced stream under `variant`, if one was recorded."""
    s = _streams_by_key().get(_match_key(cfg))
    return None if s is None else s["variants"].get(variant)


# generation's working memory within 10 % of the peak phase's: generation sets the peak
GENERATION_AT_PEAK = 0.90


@dataclass(frozen=True)
class Shares:
    """Where the estimate's memory sits, as the fallback sees it ("working memory" is a phase's total less what
    every phase holds, component by component: weights, adapters, optimizer state, other roles' resident part).
    `generation`: generation's working memory over the peak phase's (1.0 where generation sets the peak);
    `generation_total`: generation's phase total over the peak phase total; `generation_activations` and
    `generation_working`: generation's activations (a prefill's per-layer transients or a decode step's) and its
    working memory, each over generation's phase total."""

    generation: float
    generation_total: float
    generation_activations: float
    generation_working: float


# shares not given: generation sets the peak and all of it comes and goes, the side that errs high
UNKNOWN = Shares(1.0, 1.0, 1.0, 1.0)
NO_GENERATION = Shares(0.0, 0.0, 0.0, 0.0)  # a device that runs no generation (a reward model on its own GPU)


def shares_of(phases: dict[str, dict[str, int]], peak: int | None = None) -> Shares:
    """`Shares` of an estimate's per-phase component bytes (`Estimate.phases`); `peak`: the GPU's allocated peak
    where something outside these phases sets it (a role's own pass beside the policy), else their largest."""
    totals = {p: sum(c.values()) for p, c in phases.items()}
    peak = max([*totals.values(), peak or 0], default=0)
    gen = phases.get("generate")
    if not peak or not gen or not totals["generate"]:
        return NO_GENERATION
    held = sum(min(c.get(k, 0) for c in phases.values()) for k in set().union(*phases.values()))
    total = totals["generate"]
    generation = (total - held) / (peak - held) if peak > held else 0.0
    return Shares(generation, total / peak, gen.get("activations", 0) / total, (total - held) / total)


def regime(cfg: RunConfig, shares: Shares = UNKNOWN) -> str:
    """ "generation" where transformers' generate sets the peak, else "step": the rows the generation model is
    fitted on (`predicted_fraction` applies it to every config that generates through torch's allocator).

    In the simulated streams the largest needs (up to 38 % of the allocated peak in the tuning rows) are all in
    this regime, with gradient checkpointing or without: a prefill's per-layer transients (eager scores and their
    fp32 softmax, q/k/v) are carved from segments that the growing cache pins layer by layer, so the next layer's
    transients need fresh segments (the QLoRA Llama-3.2-1B row with 80 eager prefills of 781 tokens needs 7.3 GiB
    above 19.1 GiB allocated; results/streams/REPORT.txt). The 10 % tolerance covers the estimate's own error on
    the working memory, a smaller base than the total.
    """
    at_peak = shares.generation >= GENERATION_AT_PEAK
    # vLLM generates in its own preallocated pool, not through torch's caching allocator
    return "generation" if at_peak and not cfg.use_vllm else "step"


def features(cfg: RunConfig, peak_allocated: int) -> dict[str, float]:
    """What the step model sees: checkpointing, PEFT, 4-bit, and 1 / allocated peak in GiB (a fixed-bytes part
    of the reserve: the fraction falls as the peak grows, as the simulations show from 0.5B to 7B)."""
    return {
        "gradient_checkpointing": float(cfg.gradient_checkpointing),
        "peft": float(cfg.use_peft),
        "4bit": float(cfg.load_in_4bit),
        "inv_peak_gib": 2**30 / max(peak_allocated, 2**30),
    }


def generation_features(shares: Shares, peak_allocated: int) -> dict[str, float]:
    """What the generation model sees: generation's activations over its phase total (the transients whose
    segments the cache pins), and 1 / generation's total in GiB."""
    return {
        "generation_activations": shares.generation_activations,
        "inv_peak_gib": 2**30 / max(peak_allocated * shares.generation_total, 2**30),
    }


def fitted_fraction(
    cfg: RunConfig, peak_allocated: int, variant: str = "default", shares: Shares = UNKNOWN
) -> float:
    """Extra / allocated peak from the models fitted over the simulated streams (constants in the table), each
    raised by its worst leave-one-out under-prediction so that none of the rows it was fitted on is predicted low
    when left out. `variant` may be "need:<variant>": the fit of (smallest passing limit - peak allocated) /
    peak allocated.

    Fitted (`sweeps.trace.streams --table`), one set per allocator variant, least squares plus the LOO margin:
    the step model (`features`) over the kept streams (for the need, the larger of that and the same model over
    the kept streams and the step regime's tuning rows, `fit["sampled:" + variant]`: `_step`), and the
    generation model (`generation_features`) over the rows of the generation regime (`regime`) among the kept streams and the tuning rows
    (`fit["generation:" + variant]`). The card must hold the larger of the peak with the step model's extra and
    generation's phase total with the generation model's, the latter at most `working_cap` times generation's
    working memory (the largest need those rows show as a multiple of it: fragmentation comes from what comes and
    goes, not from the weights, so a weight-heavy step is not charged a fraction of its weights). As generation's
    total falls below the peak, its requirement falls below the step's smoothly: no threshold to cross. Both err
    high by up to their `loo_max_abs + margin` (results/streams/REPORT.txt has the current figures).
    """
    return predicted_fraction(_table()["fit"], variant, cfg, peak_allocated, shares)


def predicted_fraction(
    fits: dict, variant: str, cfg: RunConfig, peak_allocated: int, shares: Shares = UNKNOWN
) -> float:
    """`fitted_fraction` from the fitted models in `fits` (a table's "fit")."""
    return _predict(fits, variant, cfg, peak_allocated, shares)[0]


def _predict(
    fits: dict, variant: str, cfg: RunConfig, peak_allocated: int, shares: Shares, margin: bool = True
) -> tuple[float, dict]:
    """The fraction, and the fit that set it (`margin` False: every model without its safety margin). A reserve
    is never below the need: an allocator with room reserves at least what it needs at its limit."""
    fit = fits.get(variant)
    if not fit:
        return 0.07, {}  # no table: AgileRL arena's measured slack
    frac, source = _step(fits, variant, features(cfg, peak_allocated), cfg.attn_implementation, margin)
    gen = fits.get("generation:" + variant)
    if gen and not cfg.use_vllm and shares.generation_total:  # vLLM generates in its own pool, not torch's
        model = fitted_from(gen, generation_features(shares, peak_allocated), margin)
        extra = min(model, gen.get("working_cap", math.inf) * shares.generation_working)
        frac, source = max(
            (frac, source), (shares.generation_total * (1 + extra) - 1, gen), key=lambda t: t[0]
        )
    if not variant.startswith("need:") and "need:" + variant in fits:
        need_frac, need_source = _predict(fits, "need:" + variant, cfg, peak_allocated, shares, margin)
        frac, source = max((frac, source), (need_frac, need_source), key=lambda t: t[0])
    return frac, source


# the table's key prefix of the step model fitted over the kept streams and the step regime's tuning rows
SAMPLED_STEP = "sampled:"


def _step(
    fits: dict, variant: str, x: dict[str, float], attention: str, margin: bool = True
) -> tuple[float, dict]:
    """The step model's fraction at `x`, and the fit that set it. The fit over the kept streams (`fits[variant]`)
    has seen sdpa attention only, and sets every other run's figure. With eager attention it is the larger of that
    and, where the table has one, the fit over the kept streams and the step regime's sampled tuning rows
    (`fits["sampled:" + variant]`, the need only), which bring eager runs: their per-layer [B, heads, T, T] fp32
    temporaries (recomputed under checkpointing) are carved from segments that smaller blocks then pin, which no
    kept stream shows. The larger of the two errs high, and is never below the kept streams' fit."""
    fit = fits[variant]
    out = (fitted_from(fit, x, margin), fit)
    other = fits.get(SAMPLED_STEP + variant) if attention == "eager" else None
    if other:
        out = max(out, (fitted_from(other, x, margin), other), key=lambda t: t[0])
    return out


def fitted_from(fit: dict, x: dict[str, float], margin: bool = True) -> float:
    """One fitted model's fraction at features `x`: intercept + coefficients · x, + its LOO margin (unless
    `margin` is False), at least 0."""
    return max(0.0, central_of(fit, x) + (margin_of(fit) if margin else 0.0))


def central_of(fit: dict, x: dict[str, float]) -> float:
    """One fitted model's least-squares value at features `x` (intercept + coefficients · x), no margin."""
    return fit["intercept"] + sum(fit["coef"][k] * x[k] for k in fit["coef"])


def margin_of(fit: dict) -> float:
    """One fitted model's safety margin: its worst leave-one-out under-prediction (0 where none is low)."""
    return max(0.0, -min(fit["loo_errors"]))


def need_parts(
    cfg: RunConfig, peak_allocated: int, variant: str = "default", shares: Shares = UNKNOWN
) -> dict:
    """Where the fallback's need fraction (`need` where no stream of `cfg` was simulated) comes from, in fractions
    of `peak_allocated`: per model, its least-squares value alone ("central") and with its margin ("fraction", the
    generation model's capped at `working_cap` times generation's working memory and taken over generation's
    total), and "model", the one that sets the need (the larger). The same arithmetic as `_predict`, kept apart
    so that a report can say how much of a figure is the models' margins."""
    fits, key = _table()["fit"], "need:" + variant
    out: dict = {}
    step = fits.get(key)
    if not step:
        return out
    x = features(cfg, peak_allocated)
    step = _step(fits, key, x, cfg.attn_implementation)[1]
    out["step"] = {
        "central": max(0.0, central_of(step, x)),
        "margin": margin_of(step),
        "fraction": fitted_from(step, x),
    }
    out["model"] = "step"
    gen = fits.get("generation:" + key)
    if gen and not cfg.use_vllm and shares.generation_total:
        g = generation_features(shares, peak_allocated)
        cap = gen.get("working_cap", math.inf) * shares.generation_working
        out["generation"] = {
            "central": shares.generation_total * (1 + min(max(0.0, central_of(gen, g)), cap)) - 1,
            "margin": margin_of(gen),
            "cap": cap,
            "fraction": shares.generation_total * (1 + min(fitted_from(gen, g), cap)) - 1,
        }
        if out["generation"]["fraction"] > out["step"]["fraction"]:
            out["model"] = "generation"
    return out


def variant_for(alloc_conf: str = "", torch_empty_cache_steps: int | None = None) -> str:
    """The simulated variant nearest a user's settings: expandable segments win (they change every segment),
    then `torch_empty_cache_steps` = 1 (the only value simulated; a larger N keeps the default allocator's
    figure, which errs high: between two emptyings the cache builds up as without them), then
    `max_split_size_mb` (simulated at 128 MiB), else the default allocator."""
    conf = alloc_conf.replace(" ", "").lower()
    if "expandable_segments:true" in conf:
        return "expandable_segments"
    if torch_empty_cache_steps == 1:
        return "torch_empty_cache_steps_1"
    if "max_split_size_mb" in conf:
        return "max_split_size_mb_128"
    return "default"


def config_variant(cfg: RunConfig) -> str:
    """The simulated variant for the allocator settings `cfg` carries (`pytorch_cuda_alloc_conf`,
    `torch_empty_cache_steps`)."""
    return variant_for(cfg.pytorch_cuda_alloc_conf, cfg.torch_empty_cache_steps)


def reserve(
    cfg: RunConfig, peak_allocated: int, variant: str = "default", shares: Shares = UNKNOWN
) -> Reserve:
    """The reserve for `cfg` at `peak_allocated` (max_memory_reserved - max_memory_allocated on a card with
    room): simulated where its stream exists, else fitted and never below `need`. `shares`: `shares_of` the
    estimate's phases (not given: the side that errs high)."""
    return _extra(cfg, peak_allocated, variant, shares, need=False)


def need(cfg: RunConfig, peak_allocated: int, variant: str = "default", shares: Shares = UNKNOWN) -> Reserve:
    """What the card must hold beyond `peak_allocated` for the run not to OOM: the smallest allocator limit at
    which the simulated stream passes (the allocator frees its cache and retries before failing), minus the
    allocated peak. At most `reserve`; the fit verdict should use this one."""
    return _extra(cfg, peak_allocated, variant, shares, need=True)


def _extra(cfg: RunConfig, peak_allocated: int, variant: str, shares: Shares, need: bool) -> Reserve:
    sim = simulated(cfg, variant)
    if sim is not None:
        extra = sim["min_limit"] - sim["peak_allocated"] if need else sim["fragmentation"]
        frac = extra / sim["peak_allocated"]
        return Reserve(int(frac * peak_allocated), frac, f"simulated (traced stream {sim['stream']})")
    key = "need:" + variant if need else variant
    frac, fit = _predict(_table()["fit"], key, cfg, peak_allocated, shares)
    central = _predict(_table()["fit"], key, cfg, peak_allocated, shares, margin=False)[0] if fit else frac
    note = (
        f"fitted over {fit.get('n', 0)} simulated streams, {fit.get('model', 'step')} model (+ worst LOO "
        f"under-prediction; LOO max error {100 * fit.get('loo_max_abs', 0.0):.1f} pts)"
    )
    total = int(frac * peak_allocated)
    return Reserve(total, frac, note, min(total, max(0, total - int(central * peak_allocated))))


@dataclass(frozen=True)
class SettingSaving:
    """What one allocator setting saves on the reserve for a config (bytes; negative = costs)."""

    setting: str  # as a user writes it
    saves_bytes: int  # on what the card must hold (`need`): the number for "will it fit"
    saves_reserved_bytes: int  # on max_memory_reserved with room to spare (`reserve`); can be negative
    source: str
    caveat: str = ""


SETTINGS = {
    "expandable_segments": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "max_split_size_mb_128": "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128",
    "torch_empty_cache_steps_1": "GRPOConfig(torch_empty_cache_steps=1)",
}


def setting_savings(cfg: RunConfig, peak_allocated: int, shares: Shares = UNKNOWN) -> list[SettingSaving]:
    """For each fragmentation setting, the reserve it saves against the default allocator at this config.

    `expandable_segments` cannot apply inside vLLM's own memory pool (CuMemAllocator) in colocate mode
    (pytorch#147851; NeMo-RL #2319, #2471; vLLM >= 0.20.1 turns it off around its pool): the saving shown is
    the trainer's. `torch_empty_cache_steps` empties the cache after the loss of every step where
    global_step % N == 0 (transformers Trainer.training_step), at ~10 % step time (its TRL help text).
    """
    if cfg.device != "cuda":
        return []
    base, base_need = reserve(cfg, peak_allocated, shares=shares), need(cfg, peak_allocated, shares=shares)
    out = []
    for variant, text in SETTINGS.items():
        r, n = reserve(cfg, peak_allocated, variant, shares), need(cfg, peak_allocated, variant, shares)
        caveat = ""
        if variant == "expandable_segments" and cfg.use_vllm and cfg.vllm_mode == "colocate":
            caveat = "not inside vLLM's colocated memory pool (pytorch#147851): applies to the trainer's tensors only"
        if variant == "torch_empty_cache_steps_1":
            caveat = "about 10% slower steps (TRL's help for torch_empty_cache_steps)"
        if variant == "max_split_size_mb_128":
            caveat = "saves only near the limit (lets the allocator free oversize cached blocks); costs reserve otherwise"
        out.append(SettingSaving(text, base_need.bytes - n.bytes, base.bytes - r.bytes, n.source, caveat))
    return out


@dataclass(frozen=True)
class MeasuredGap:
    """What measured-gpu rows of a setting no traced stream covers showed above the estimate: measured over
    estimated, lowest and highest, at torch's reserved peak and at NVML's process peak (what nvidia-smi shows)."""

    rows: int
    what: str
    where: str
    reserved: tuple[float, float]
    nvidia_smi: tuple[float, float]


# DeepSpeed ZeRO: no DeepSpeed step runs under the CPU tracer, so the reserve above its tensors is the fallback's,
# fitted on streams without DeepSpeed's buckets and fp64 gradient norms. The rows: results/raw/zero-offload.jsonl
# (DeepSpeed 0.19.8, torch 2.11); tests/accuracy/test_measured_zero_offload.py recomputes these ratios from them.
DEEPSPEED_MEASURED = MeasuredGap(
    rows=2,
    what="ZeRO-Offload rows (Qwen2.5-1.5B full fine-tune, ZeRO-2 and ZeRO-3)",
    where="results/raw/zero-offload.jsonl",
    reserved=(1.26, 1.52),
    nvidia_smi=(1.28, 1.44),
)
DEEPSPEED_NOTE_PREFIX = "DeepSpeed reserve"


def deepspeed_note(cfg: RunConfig) -> str | None:
    """The note a ZeRO run's answer carries: its reserve is not traced, and how far above the estimate the
    measured rows were (measured-gpu). None for other runs."""
    if cfg.sharding not in ("zero2", "zero3"):
        return None
    m = DEEPSPEED_MEASURED
    return (
        f"{DEEPSPEED_NOTE_PREFIX}: not traced (no DeepSpeed step runs on CPU); on the {m.rows} measured "
        f"{m.what} nvidia-smi showed {m.nvidia_smi[0]:.2f}-{m.nvidia_smi[1]:.2f} x the estimate's figure and "
        f"torch reserved {m.reserved[0]:.2f}-{m.reserved[1]:.2f} x, the allocated peak within the band "
        "(measured-gpu); the smallest card under ZeRO is not measured"
    )
