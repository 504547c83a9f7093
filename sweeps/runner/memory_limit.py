"""A run under a torch memory limit: the child's `memory_limit_bytes` spec key, applied before the model is built.

The limit is `torch.cuda.set_per_process_memory_fraction(fraction, 0)`. In torch's `CUDACachingAllocator`
(`DeviceCachingAllocator::setMemoryFraction`) the cap is `fraction × totalGlobalMem` bytes of the allocator's
*reserved* total (every segment it holds, cached or in use); an allocation that would pass it first frees the
cached blocks and retries (`release_cached_blocks`), then raises `torch.OutOfMemoryError`. cuBLAS / cuBLASLt
workspaces are allocated through the allocator, so they count; the CUDA context and lazily loaded kernels do not.
A fraction of 1.0 or more sets no cap at all, so a limit at or above the card is not applied.

`simulated_need_bytes` is a test double for CPU tests: the child raises a CUDA-style OOM when its limit is below
that figure, and passes otherwise, without any GPU.
"""

from __future__ import annotations

SPEC_KEY = "memory_limit_bytes"
SIMULATED_KEY = "simulated_need_bytes"  # test double: the reserved bytes a simulated run needs


def spec_value(spec: dict, key: str) -> int | None:
    """The integer at `spec[key]` (None when absent or null); ValueError naming the key for anything else."""
    value = spec.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key}={value!r}: accepted values are null or an integer number of bytes >= 1")
    return value


def simulated_fails(limit: int | None, need: int | None) -> bool:
    """The test double's outcome: a run that needs `need` reserved bytes fails under a `limit` below it."""
    return limit is not None and need is not None and limit < need


def fraction_for(limit: int, total: int) -> float:
    """The fraction whose `fraction × total` the allocator truncates to exactly `limit` (half a byte above it, so
    the float product never lands one byte short of a limit the reserved total can reach exactly)."""
    return (limit + 0.5) / total


def apply(spec: dict, device: str) -> dict:
    """Apply the spec's limit on CUDA device 0 (before anything is allocated) and say what was done; raise the
    test double's OOM when the spec simulates one. The returned dict goes into the result as `memory_limit`."""
    limit = spec_value(spec, SPEC_KEY)
    need = spec_value(spec, SIMULATED_KEY)
    seen: dict = {"limit_bytes": limit, "applied": False, "fraction": None, "device_total_bytes": None}
    if need is not None:
        seen["simulated_need_bytes"] = need
    if limit is not None and device == "cuda":
        import torch

        if torch.cuda.is_available():
            total = int(torch.cuda.get_device_properties(0).total_memory)
            seen["device_total_bytes"] = total
            if limit < total:
                seen["fraction"] = fraction_for(limit, total)
                torch.cuda.set_per_process_memory_fraction(seen["fraction"], 0)
                seen["applied"] = True
    if simulated_fails(limit, need):
        import torch

        raise torch.OutOfMemoryError(
            f"CUDA out of memory (simulated: {SIMULATED_KEY}={need} above {SPEC_KEY}={limit})"
        )
    return seen


def peaks_at_failure(device: str) -> dict:
    """torch's peak counters when a run failed: since the last phase boundary (the torch_cuda probe resets them at
    each), so a lower bound of the run's peaks. Empty off CUDA."""
    if device != "cuda":
        return {}
    try:
        import torch

        if not torch.cuda.is_available():
            return {}
        return {
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(0)),
            "peak_allocated_bytes": int(torch.cuda.max_memory_allocated(0)),
            "peaks_since": "last phase boundary",
        }
    except Exception:  # a broken context after the failure: the outcome stands without the counters
        return {}
