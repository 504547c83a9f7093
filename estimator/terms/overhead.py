"""Memory outside torch's tensors: the CUDA context and the caching allocator's reserve.

Both constants are FITTED, not derived from a code path: they are published measurements (AgileRL arena's
constants, fitted on its own A100/H100/L4 runs) until GPU rows of our own replace them (`make fit-overheads`).
CUDA context ~0.5-1.3 GiB depending on GPU and driver (AgileRL arena: A100 1268 MiB, L4 694 MiB, H100
~1000 MiB; notes §4: "~0.5-1 GiB"); allocator slack 5.4-7 % of the peak (AgileRL arena's measured 7 %).
Sources: estimator/terms/SOURCES.md (Published sources) and NOTES.md.
"""

from __future__ import annotations

from estimator.config import RunConfig
from estimator.units import MIB

CUDA_CONTEXT_BYTES = 1000 * MIB  # fitted: H100, AgileRL arena's estimate from its driver reservation
ALLOCATOR_FRACTION = 0.07  # fitted: (reserved − allocated) / allocated at the peak, AgileRL arena


def cuda_context(cfg: RunConfig) -> int:
    """CUDA context + kernels + cuBLAS workspace per process: a fitted (published, measured) constant on GPU, 0 on CPU."""
    return CUDA_CONTEXT_BYTES if cfg.device == "cuda" else 0


def allocator_overhead(cfg: RunConfig, peak_allocated: int) -> int:
    """Caching-allocator reserve beyond allocated: a fitted (published) fraction × peak allocated on GPU, 0 on CPU."""
    return int(ALLOCATOR_FRACTION * peak_allocated) if cfg.device == "cuda" else 0
