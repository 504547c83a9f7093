"""grpo-vram's estimator: how much GPU memory a TRL GRPO run needs, before you rent the GPU.

    from estimator import estimate
    r = estimate(model="Qwen/Qwen2.5-7B-Instruct", use_peft=True, dtype="bfloat16")
    print(r)                  # the answer `vram-estimate` prints
    r.need_gib, r.fits("RTX 4090"), r.gpus_that_fit()

Exports (each loaded on first use, so `import estimator` stays light):
- `estimate(config=None, *, gpu=None, **settings) -> Result` (estimator/interface/api.py)
- `Result`: `need_gib`, `fits(gpu)`, `fit(gpu)`, `gpus_that_fit()`, `components`, `to_dict()`, `text()`
- `RunConfig`: the run's settings, TRL's names and defaults (estimator/settings/config.py)
- `GPUS`: the cards the fits list checks; `find_gpu(name)`: any card `--gpu` accepts (estimator/hardware/gpus.py)
- `InvalidInput`: what `estimate` raises for input the command refuses (a ValueError)

`estimator.estimate` is the function; the module behind it is `estimator.step.estimate` (the `Estimate`
breakdown).
"""

from __future__ import annotations

__all__ = ["GPUS", "InvalidInput", "Result", "RunConfig", "estimate", "find_gpu"]

_LAZY = {
    "Result": ("estimator.interface.api", "Result"),
    "InvalidInput": ("estimator.interface.api", "InvalidInput"),
    "RunConfig": ("estimator.settings.config", "RunConfig"),
    "GPUS": ("estimator.hardware.gpus", "GPUS"),
}


def estimate(config=None, /, **kwargs):
    """Estimate the GPU memory of one GRPO step, as `vram-estimate` does; see `estimator.interface.api.estimate`."""
    from estimator.interface.api import estimate as _estimate

    return _estimate(config, **kwargs)


def find_gpu(name: str):
    """The card `--gpu NAME` checks (`"H100"`, `"4090"`, `"24GB"`); InvalidInput naming the close names if none."""
    from estimator.hardware import gpus
    from estimator.interface.api import InvalidInput

    try:
        return gpus.resolve(name)[0]
    except gpus.UnknownGPU as e:
        raise InvalidInput(str(e)) from None


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'estimator' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
