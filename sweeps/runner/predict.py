"""The estimator's prediction for a run's config (in-code tiny models are sized from their config.json dict)."""

from __future__ import annotations

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms.optimizer import DISPATCH, REAL

# rows whose tensors a Python dispatch mode counted: the FakeTensor traces and the measured-cpu probe
DISPATCH_SOURCES = ("traced", "measured-cpu")


def arch_for(cfg: RunConfig, hf_config: dict | None = None):
    """Arch from the stored config.json dict (tiny models), else the estimator's own model resolution."""
    if hf_config:
        return from_config(hf_config, name=cfg.model)
    from sweeps.runner import tiny

    if tiny.is_tiny(cfg.model):
        return from_config(tiny.hf_config(cfg.model), name=cfg.model)
    return None


def tensors_of(row: dict) -> str:
    """What counted a row's tensors, as `estimate(tensors=...)` takes it: a Python dispatch mode for traced and
    measured-cpu rows (autograd sums gradients out of place there), the device's own counters otherwise."""
    return DISPATCH if row.get("source") in DISPATCH_SOURCES else REAL


def config_of(row: dict) -> dict:
    """A row's run settings, with one a row may record only in its DeepSpeed config: a config without
    `zero_reduce_bucket_size` whose DeepSpeed config says reduce_bucket_size "auto" ran with HF's fill (None)."""
    config = dict(row["config"])
    zero = ((row.get("variant") or {}).get("deepspeed") or {}).get("zero_optimization") or {}
    if "zero_reduce_bucket_size" not in config and zero.get("reduce_bucket_size") == "auto":
        config["zero_reduce_bucket_size"] = None
    return config


def predict(
    config: dict, hf_config: dict | None = None, tensors: str = REAL
) -> tuple[dict | None, str | None]:
    """(Estimate.to_dict(), None), or (None, one-line error) when the estimator cannot size this run. `tensors`:
    what counts them (`tensors_of` a row)."""
    try:
        from estimator.step.estimate import estimate

        cfg = RunConfig.from_dict(config)  # rows carrying trl_version are modelled with that release
        return estimate(cfg, arch_for(cfg, hf_config), tensors).to_dict(), None
    except Exception as exc:  # estimator incomplete or config rejected: keep the measurement anyway
        msg = (str(exc).strip().splitlines() or [""])[0]
        return None, f"{type(exc).__name__}: {msg}"[:300]
