"""grpo-vram's estimator: how much GPU memory a TRL GRPO run needs, before you rent the GPU.

    from estimator import estimate
    r = estimate(model="Qwen/Qwen2.5-7B-Instruct", use_peft=True, dtype="bfloat16")
    print(r)                  # the answer `vram-estimate` prints
    r.need_gib, r.fits("RTX 4090"), r.gpus_that_fit()

Exports (each loaded on first use, so `import estimator` stays light):
- `estimate(config=None, *, gpu=None, **settings) -> Result` (estimator/api.py)
- `Result`: `need_gib`, `fits(gpu)`, `fit(gpu)`, `gpus_that_fit()`, `components`, `to_dict()`, `text()`
- `RunConfig`: the run's settings, TRL's names and defaults (estimator/config.py)
- `GPUS`: the cards the fits list checks; `find_gpu(name)`: any card `--gpu` accepts (estimator/gpus.py)
- `InvalidInput`: what `estimate` raises for input the command refuses (a ValueError)

`estimator.estimate` is the function. The module of the same name (the `Estimate` breakdown) stays importable
by its full name: `from estimator.estimate import Estimate`.
"""

from __future__ import annotations

import sys
import types

__all__ = ["GPUS", "InvalidInput", "Result", "RunConfig", "estimate", "find_gpu"]

_LAZY = {
    "Result": ("estimator.api", "Result"),
    "InvalidInput": ("estimator.api", "InvalidInput"),
    "RunConfig": ("estimator.config", "RunConfig"),
    "GPUS": ("estimator.gpus", "GPUS"),
}


def estimate(config=None, /, **kwargs):
    """Estimate the GPU memory of one GRPO step, as `vram-estimate` does; see `estimator.api.estimate`."""
    from estimator.api import estimate as _estimate

    return _estimate(config, **kwargs)


def find_gpu(name: str):
    """The card `--gpu NAME` checks (`"H100"`, `"4090"`, `"24GB"`); InvalidInput naming the close names if none."""
    from estimator import gpus
    from estimator.api import InvalidInput

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


class _Package(types.ModuleType):
    """Keeps `estimator.estimate` the function: importing the submodule `estimator/estimate.py` would otherwise
    rebind the package attribute to that module (the import system sets it on the parent package)."""

    def __setattr__(self, name: str, value) -> None:
        if name == "estimate" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
