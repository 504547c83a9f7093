"""torch.cuda probe: max_memory_allocated / max_memory_reserved, reset at each phase boundary; the bare context."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class TorchCudaProbe:
    """Per-phase and overall peaks of torch's caching allocator on one CUDA device."""

    device: int = 0
    phase: str = "other"
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    reserved_phases: dict[str, int] = field(default_factory=dict)
    reason: str | None = None

    @property
    def available(self) -> bool:
        import torch

        return torch.cuda.is_available()

    def _fold(self) -> None:
        """Close the current phase: fold its peaks in, then reset the counters for the next one."""
        import torch

        alloc = int(torch.cuda.max_memory_allocated(self.device))
        reserved = int(torch.cuda.max_memory_reserved(self.device))
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, alloc)
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, reserved)
        self.phases[self.phase] = max(self.phases.get(self.phase, 0), alloc)
        self.reserved_phases[self.phase] = max(self.reserved_phases.get(self.phase, 0), reserved)
        torch.cuda.reset_peak_memory_stats(self.device)

    def start(self) -> TorchCudaProbe:
        if self.available:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def set_phase(self, name: str) -> None:
        if self.available:
            self._fold()
        self.phase = name

    def stop(self) -> None:
        if self.available:
            self._fold()

    def result(self) -> dict:
        if not self.available:
            return {"available": False, "reason": self.reason or "torch.cuda is not available"}
        import torch

        return {
            "available": True,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "phases": dict(self.phases),
            "reserved_phases": dict(self.reserved_phases),
            "num_alloc_retries": int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0)),
            "mem_get_info_total_bytes": _total_bytes(self.device),
        }


def _total_bytes(device: int) -> int | None:
    """cudaMemGetInfo's total (what the driver lets this process see; below the card's label), or None."""
    import torch

    try:
        return int(torch.cuda.mem_get_info(device)[1])
    except (RuntimeError, AssertionError):  # no driver / torch built without CUDA (scripted tests)
        return None


def after_build(device: int = 0) -> dict:
    """The caching allocator once the model is loaded and the trainer built, before the first step: what is
    allocated, what is reserved (the difference is cached free blocks that loading left behind, which every
    later reserved and nvidia-smi figure of the run carries until the allocator needs them), and both peaks
    since the process began (loading's own)."""
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch.cuda is not available"}
    return {
        "available": True,
        "allocated_bytes": int(torch.cuda.memory_allocated(device)),
        "reserved_bytes": int(torch.cuda.memory_reserved(device)),
        "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
        "max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
    }


def context_baseline(device: int = 0) -> dict:
    """The bare CUDA context of this process, measured before a model touches the GPU.

    NVML's device 'used' is read before and after `torch.cuda.mem_get_info` creates the primary context (which
    `cudaMemGetInfo` does), then NVML's figure for this process. `context_bytes` is that process figure (else the
    device delta); torch has allocated nothing yet, so it is the context alone: the driver's per-process state
    and the kernels loaded so far (lazy loading adds cuBLAS/attention kernels later, which the fitted
    CUDA-context constant of `make fit-overheads` includes and this does not). Call once per process, first.
    """
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "reason": "torch.cuda is not available"}
    from sweeps.probes.nvml import open_cuda_device

    nv, reason = open_cuda_device(device)
    before = nv.used_bytes() if nv is not None else None
    free, total = torch.cuda.mem_get_info(device)
    torch.cuda.synchronize(device)
    after = nv.used_bytes() if nv is not None else None
    process = nv.process_bytes(os.getpid()) if nv is not None else None
    delta = after - before if nv is not None else None
    return {
        "available": True,
        "context_bytes": process if process is not None else delta,
        "process_bytes": process,
        "device_used_before_bytes": before,
        "device_used_after_bytes": after,
        "mem_get_info_free_bytes": int(free),
        "mem_get_info_total_bytes": int(total),
        "nvml_reason": reason,
        "torch_allocated_bytes": int(torch.cuda.memory_allocated(device)),
    }
