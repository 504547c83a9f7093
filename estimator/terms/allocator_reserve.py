"""The allocator's reserve (max_memory_reserved - max_memory_allocated) for a config, and what settings save.

Where the config's allocation stream was traced and simulated (`sweeps.trace.streams` -> the table
`estimator/data/allocator_streams.json`), the reserve is that simulation's. Otherwise it comes from a small
model fitted over those simulations (`fit` in the same table, written by `python -m sweeps.trace.streams
--table`); the fit's error against the simulations is stored next to it and printed by `make accuracy`-style
`python -m sweeps.trace.streams --report`. Stdlib only: the estimator never replays a stream at run time (a
7B stream takes ~0.3 s; the table holds the results).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
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
    d = cfg.to_dict() if isinstance(cfg, RunConfig) else dict(cfg)
    if _release_free(cfg if isinstance(cfg, RunConfig) else RunConfig.from_dict(d)):
        d.pop("transformers_version", None)
    for f in IGNORED_FIELDS:
        d.pop(f, None)
    if (
        d.get("trl_version") == NEWEST_TRL
    ):  # streams recorded before trl_version existed are the newest release's
        d.pop("trl_version")
    return tuple(sorted((k, json.dumps(v)) for k, v in d.items()))


def simulated(cfg: RunConfig, variant: str = "default") -> dict | None:
    """The simulation of this exact config's traced stream under `variant`, if one was recorded."""
    key = _match_key(cfg)
    for s in _table()["streams"]:
        if _match_key(s["config"]) == key:
            return s["variants"].get(variant)
    return None


def features(cfg: RunConfig, peak_allocated: int) -> dict[str, float]:
    """What the fitted model sees: checkpointing, PEFT, 4-bit, and 1 / allocated peak in GiB (a fixed-bytes part
    of the reserve: the fraction falls as the peak grows, as the simulations show from 0.5B to 7B)."""
    return {
        "gradient_checkpointing": float(cfg.gradient_checkpointing),
        "peft": float(cfg.use_peft),
        "4bit": float(cfg.load_in_4bit),
        "inv_peak_gib": 2**30 / max(peak_allocated, 2**30),
    }


def fitted_fraction(cfg: RunConfig, peak_allocated: int, variant: str = "default") -> float:
    """Reserve / allocated peak from the model fitted over the simulated streams (constants in the table), raised
    by the fit's worst leave-one-out under-prediction so that none of the held-out streams is predicted low.
    `variant` may be "need:<variant>": the fit of (smallest passing limit - peak allocated) / peak allocated.

    Fitted: intercept + coefficients of `features` are least squares over the traced streams' simulated
    fractions (`sweeps.trace.streams --table`), one set per allocator variant; `margin` (the worst LOO
    under-prediction, in fraction of the allocated peak) is added: the fallback errs high by up to
    `loo_max_abs + margin` (see results/streams/REPORT.txt for the current figures).
    """
    fit = _table()["fit"].get(variant)
    if not fit:
        return 0.07  # no table: AgileRL arena's measured slack (the estimator's former flat fraction)
    return fitted_from(fit, cfg, peak_allocated)


def fitted_from(fit: dict, cfg: RunConfig, peak_allocated: int) -> float:
    """One fitted model's fraction at `cfg`: intercept + coefficients · `features`, + its LOO margin, at least 0."""
    f = features(cfg, peak_allocated)
    central = fit["intercept"] + sum(fit["coef"][k] * f[k] for k in fit["coef"])
    margin = max(0.0, -min(fit["loo_errors"]))
    return max(0.0, central + margin)


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


def reserve(cfg: RunConfig, peak_allocated: int, variant: str = "default") -> Reserve:
    """The reserve for `cfg` at `peak_allocated` (max_memory_reserved - max_memory_allocated on a card with
    room): simulated where its stream exists, else fitted."""
    return _extra(cfg, peak_allocated, variant, need=False)


def need(cfg: RunConfig, peak_allocated: int, variant: str = "default") -> Reserve:
    """What the card must hold beyond `peak_allocated` for the run not to OOM: the smallest allocator limit at
    which the simulated stream passes (the allocator frees its cache and retries before failing), minus the
    allocated peak. At most `reserve`; the fit verdict should use this one."""
    return _extra(cfg, peak_allocated, variant, need=True)


def _extra(cfg: RunConfig, peak_allocated: int, variant: str, need: bool) -> Reserve:
    sim = simulated(cfg, variant)
    if sim is not None:
        extra = sim["min_limit"] - sim["peak_allocated"] if need else sim["fragmentation"]
        frac = extra / sim["peak_allocated"]
        return Reserve(int(frac * peak_allocated), frac, f"simulated (traced stream {sim['stream']})")
    key = "need:" + variant if need else variant
    frac = fitted_fraction(cfg, peak_allocated, key)
    fit = _table()["fit"].get(key, {})
    n, loo = fit.get("n", 0), fit.get("loo_max_abs", 0.0)
    note = (
        f"fitted over {n} simulated streams (+ worst LOO under-prediction; LOO max error {100 * loo:.1f} pts)"
    )
    return Reserve(int(frac * peak_allocated), frac, note)


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


def setting_savings(cfg: RunConfig, peak_allocated: int) -> list[SettingSaving]:
    """For each fragmentation setting, the reserve it saves against the default allocator at this config.

    `expandable_segments` cannot apply inside vLLM's own memory pool (CuMemAllocator) in colocate mode
    (pytorch#147851; NeMo-RL #2319, #2471; vLLM >= 0.20.1 turns it off around its pool): the saving shown is
    the trainer's. `torch_empty_cache_steps` empties the cache after the loss of every step where
    global_step % N == 0 (transformers Trainer.training_step), at ~10 % step time (its TRL help text).
    """
    if cfg.device != "cuda":
        return []
    base, base_need = reserve(cfg, peak_allocated), need(cfg, peak_allocated)
    out = []
    for variant, text in SETTINGS.items():
        r, n = reserve(cfg, peak_allocated, variant), need(cfg, peak_allocated, variant)
        caveat = ""
        if variant == "expandable_segments" and cfg.use_vllm and cfg.vllm_mode == "colocate":
            caveat = "not inside vLLM's colocated memory pool (pytorch#147851): applies to the trainer's tensors only"
        if variant == "torch_empty_cache_steps_1":
            caveat = "about 10% slower steps (TRL's help for torch_empty_cache_steps)"
        if variant == "max_split_size_mb_128":
            caveat = "saves only near the limit (lets the allocator free oversize cached blocks); costs reserve otherwise"
        out.append(SettingSaving(text, base_need.bytes - n.bytes, base.bytes - r.bytes, n.source, caveat))
    return out
