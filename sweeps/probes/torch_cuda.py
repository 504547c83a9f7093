"""torch.cuda probe: max_memory_allocated / max_memory_reserved, reset at each phase boundary."""

from __future__ import annotations

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
        }
