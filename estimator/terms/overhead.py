"""Memory outside torch's tensors: the CUDA context and the caching allocator's reserve.

Constants are published measurements until GPU rows of our own replace them (`make fit-overheads`):
CUDA context ~0.5-1.3 GiB depending on GPU and driver (AgileRL arena: A100 1268 MiB, L4 694 MiB, H100
~1000 MiB; notes §4: "~0.5-1 GiB"); allocator slack 5.4-7 % of the peak (AgileRL arena's measured 7 %).
"""

from __future__ import annotations

from estimator.config import RunConfig
from estimator.units import MIB

CUDA_CONTEXT_BYTES = 1000 * MIB  # H100, AgileRL arena's estimate from its driver reservation
ALLOCATOR_FRACTION = 0.07  # reserved − allocated at the peak, as a fraction of allocated (AgileRL arena)


def cuda_context(cfg: RunConfig) -> int:
    """CUDA context + kernels + cuBLAS workspace per process: a measured constant on GPU, 0 on CPU."""
    return CUDA_CONTEXT_BYTES if cfg.device == "cuda" else 0


def allocator_overhead(cfg: RunConfig, peak_allocated: int) -> int:
    """Caching-allocator reserve beyond allocated: fraction × peak allocated on GPU, 0 on CPU."""
    return int(ALLOCATOR_FRACTION * peak_allocated) if cfg.device == "cuda" else 0
