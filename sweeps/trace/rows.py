"""The one builder of traced rows: one config (one GPU, or rank 0 of N FSDP2 ranks) traced under FakeTensorMode
into a result row (results/SCHEMA.md): ok with the observed peaks, error with the message, or skipped with
the reason. Rows hold what was traced, never an estimate (sweeps/report/accuracy.py recomputes it)."""

from __future__ import annotations

import contextlib
import logging
import traceback
import warnings

from estimator.settings.config import RunConfig
from estimator.settings.versions import default_transformers
from sweeps import records

DECODE_K = 2
STEPS = 2
NEED_RESOLUTION = 8 * 2**20  # the simulated need to 8 MiB, finer than the measured min-card search's 1.5 %


def variant(
    cfg: RunConfig,
    k: int = DECODE_K,
    steps: int = STEPS,
    max_micro: int | None = None,
    num_layers: int | None = None,
    layout: dict | None = None,
) -> dict:
    """Run settings that are not estimator fields (part of the row key); `layout`: rank 0 of a
    sweeps.trace.distributed.Layout."""
    v = {"decode": "fast-forward", "k": k} if k < cfg.max_completion_length else {"decode": "full"}
    v.update({"head": "fused-gpu", "steps": steps, "tensors": "fake"})
    if max_micro is not None:
        v["max_micro"] = max_micro
    if num_layers is not None:
        v["layers"] = num_layers
    if layout is not None:
        from sweeps.trace.distributed import Layout

        v.update(Layout(**layout).variant())
    return v


def traced_config(cfg: RunConfig) -> RunConfig:
    """`cfg` as its row records it: modelled at the installed transformers, which the trace runs."""
    return cfg.with_(transformers_version=default_transformers())


def key(cfg: RunConfig, var: dict) -> str:
    """The key of the row that tracing `cfg` under run variant `var` writes (what a rerun finds done)."""
    return records.make_key(traced_config(cfg).to_dict(), var)


def _device(cfg: RunConfig) -> dict:
    rounding = 512 if cfg.device == "cuda" else 1
    return {
        "type": f"fake-{cfg.device}",
        "name": None,
        "total_bytes": None,
        "allocator_rounding_bytes": rounding,
    }


def header(cfg: RunConfig, sweep: str, var: dict, seed: int | None = None, **status) -> dict:
    """A traced row's identity and environment: key, config, variant, versions, device, commit (and the
    seed of a seeded random grid)."""
    row = records.base_row(
        key=records.make_key(cfg.to_dict(), var),
        source="traced",
        sweep=sweep,
        config=cfg.to_dict(),
        variant=var,
        **status,
    )
    if seed is not None:
        row["seed"] = seed
    row["versions"] = records.environment_info("cpu")["versions"]
    row["device"], row["git_commit"] = _device(cfg), records.git_commit()
    return row


QUIET_LOGGERS = ("transformers", "trl", "peft", "accelerate", "datasets")


@contextlib.contextmanager
def quiet_libraries():
    """Silence library deprecation warnings and info/warning logs that a trace triggers but a user cannot act on
    (TRL calling transformers' deprecated gradient_checkpointing names, model_init_kwargs ignored for a model
    built in code); errors still show. Restores the warning filters and logger levels on exit."""
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning, UserWarning):
            warnings.simplefilter("ignore", category)
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def make_row(
    cfg: RunConfig,
    sweep: str,
    k: int = DECODE_K,
    max_micro: int | None = None,
    num_layers: int | None = None,
    layout: dict | None = None,
    seed: int | None = None,
    need: bool = False,
) -> dict:
    """Trace `cfg` and build its row: ok, error (the trace raised) or skipped (the tracer cannot run it).

    `need`: also replay the stream through the allocator simulation for the smallest limit it runs under
    (`simulated_need`, in `observed.need`; a few seconds more).

    A config of several GPUs is traced as rank 0 of `layout` (default: its GPU count and FSDP strategy).
    `num_layers`: a depth-reduced trace; the row's `model.config` holds the traced config.json, which the
    estimator is evaluated on (sweeps.runner.predict). The row models the installed transformers, which the
    trace runs."""
    cfg = traced_config(cfg)
    if (
        need and not cfg.generation_use_cache
    ):  # each step a little longer than the last: the replay needs them all
        k = max(k, cfg.max_completion_length)
    if layout is None and cfg.num_gpus > 1:
        layout = {"world_size": cfg.num_gpus, "strategy": cfg.fsdp_sharding_strategy}
    row = header(cfg, sweep, variant(cfg, k, max_micro=max_micro, num_layers=num_layers, layout=layout), seed)
    hf = None
    if num_layers is not None:
        from sweeps.trace.fake_model import truncated_config_dict

        hf = truncated_config_dict(cfg.model, num_layers)
    try:
        if layout is not None:
            from sweeps.trace import distributed

            try:
                res = distributed.run(cfg, distributed.Layout(**layout), STEPS, k)
            except NotImplementedError as e:  # DeepSpeed, QLoRA under FSDP, ...: recorded with the reason
                row.update(status="skipped", error=str(e))
                return row
        else:
            from sweeps.trace import step

            with quiet_libraries():
                res = step.run(
                    cfg, fake=True, steps=STEPS, decode_k=k, max_micro=max_micro, num_layers=num_layers
                )
        row = with_result(row, cfg, res, hf)
        if need:
            row["observed"]["need"] = simulated_need(cfg, res.events)
    except Exception as e:  # one failing config must not stop a grid
        return with_error(row, e)
    return row


def replay_inputs(cfg: RunConfig, events: list, arch=None) -> tuple[list, object]:
    """The traced stream as the run's allocator sees it, and that allocator's settings: the tied gradients summed
    in place as real tensors sum them (`tied_sums.as_real`), the run's `torch_empty_cache_steps` applied, and its
    `pytorch_cuda_alloc_conf`. `arch`: the traced model where it is not the catalog's (a stored config.json)."""
    from estimator.hardware.allocator import AllocatorSettings, with_empty_cache_steps
    from estimator.model.catalog import resolve_model
    from sweeps.trace.tied_sums import as_real

    events = as_real(events, cfg, arch or resolve_model(cfg.model))
    if cfg.torch_empty_cache_steps:
        events = with_empty_cache_steps(events, cfg.torch_empty_cache_steps)
    return events, AllocatorSettings.from_conf(cfg.pytorch_cuda_alloc_conf or "")


def simulated_need(cfg: RunConfig, events: list, arch=None) -> dict:
    """The smallest allocator limit the traced stream runs under (traced, simulated): replayed at the run's own
    allocator settings with the tied gradients summed in place (`replay_inputs`). Under a limit torch's allocator
    frees its cache and retries before it fails, so this is what the card must give torch, below the peak reserved
    on a roomy card (results/MINCARD.md sets it beside the smallest limit measured on a GPU)."""
    from estimator.hardware.allocator import min_device_limit

    events, settings = replay_inputs(cfg, events, arch)
    limit, res = min_device_limit(events, settings, resolution=NEED_RESOLUTION)
    return {
        "source": "traced, simulated",
        "min_limit_bytes": limit,
        "peak_allocated_bytes": res.peak_allocated,
    }


def with_error(row: dict, e: Exception) -> dict:
    """`row` as an error row: the exception's first line and the traceback's tail."""
    row["status"] = "error"
    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
    row["traceback"] = traceback.format_exc()[-4000:]
    return row


def with_result(row: dict, cfg: RunConfig, res, hf: dict | None = None) -> dict:
    """`row` with a trace's observed peaks (source `traced`), the model's sizes and the step times (and the
    traced config.json `hf` of a depth-reduced trace, which the estimator is evaluated on)."""
    obs = res.observed
    row["model"] = {"name": cfg.model, "params": res.params, "trainable_params": res.trainable_params}
    if hf is not None:
        row["model"]["config"] = hf
    row["observed"] = {
        "source": "traced",
        "peak_bytes": obs["peak_bytes"],
        "peak_bytes_unrounded": obs["peak_bytes_unrounded"],
        "peak_phase": obs["peak_phase"],
        "phases": obs["phases"],
        "probes": {"tensors": obs},
    }
    row["step_seconds"], row["setup_seconds"] = res.step_seconds, res.setup_seconds
    return row
