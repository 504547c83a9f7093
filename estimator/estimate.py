"""The estimate of one GRPO step: bytes per component per phase, the peak, and the overheads on top.

`estimate(cfg)` is the one entry point. It sums the terms in `estimator/terms/` phase by phase
(`estimator/phases.py`) and takes the maximum over phases. Every number it returns is `estimated`.
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.architecture import Arch
from estimator.config import RunConfig
from estimator.units import gib

SOURCE = "estimated"


@dataclass(frozen=True)
class Estimate:
    """Predicted memory of one steady-state GRPO step (step ≥ 2, optimizer state resident)."""

    config: RunConfig
    arch: Arch
    phases: dict[str, dict[str, int]]  # phase -> component -> bytes (tensor bytes, "torch allocated")
    cuda_context_bytes: int  # CUDA context + kernels + cuBLAS workspace: outside torch's allocator
    allocator_overhead_bytes: int  # caching-allocator reserve beyond allocated, at the peak
    notes: tuple[str, ...] = ()
    trainable_params: int = 0

    @property
    def phase_totals(self) -> dict[str, int]:
        return {p: sum(c.values()) for p, c in self.phases.items()}

    @property
    def peak_phase(self) -> str:
        totals = self.phase_totals
        return max(totals, key=lambda p: totals[p])

    @property
    def peak_allocated_bytes(self) -> int:
        """max over phases of Σ components: what torch.cuda.max_memory_allocated would report."""
        return max(self.phase_totals.values())

    @property
    def peak_reserved_bytes(self) -> int:
        """peak allocated + caching-allocator overhead: torch.cuda.max_memory_reserved."""
        return self.peak_allocated_bytes + self.allocator_overhead_bytes

    @property
    def peak_device_bytes(self) -> int:
        """peak reserved + CUDA context: what nvidia-smi shows for the process."""
        return self.peak_reserved_bytes + self.cuda_context_bytes

    @property
    def components(self) -> list[str]:
        seen: dict[str, None] = {}
        for comps in self.phases.values():
            for c in comps:
                seen.setdefault(c, None)
        return list(seen)

    def to_dict(self) -> dict:
        """JSON-ready breakdown; every number is labelled `estimated`."""
        return {
            "source": SOURCE,
            "model": {
                "name": self.arch.name,
                "params": self.arch.total_params,
                "trainable_params": self.trainable_params,
            },
            "config": self.config.to_dict(),
            "phases": {p: dict(c) for p, c in self.phases.items()},
            "phase_totals": self.phase_totals,
            "peak_phase": self.peak_phase,
            "peak_allocated_bytes": self.peak_allocated_bytes,
            "allocator_overhead_bytes": self.allocator_overhead_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "peak_device_bytes": self.peak_device_bytes,
            "peak_device_gib": round(gib(self.peak_device_bytes), 3),
            "notes": list(self.notes),
        }


def estimate(cfg: RunConfig, arch: Arch | None = None) -> Estimate:
    """Estimate one GRPO step of `cfg` (the model is resolved from `cfg.model` unless `arch` is given)."""
    from estimator.catalog import resolve_model
    from estimator.phases import build_phases
    from estimator.terms import overhead, weights

    if arch is None:
        arch = resolve_model(cfg.model)
    phases, notes, effective = build_phases(cfg, arch)
    peak_allocated = max(sum(c.values()) for c in phases.values())
    return Estimate(
        config=cfg,
        arch=arch,
        phases=phases,
        cuda_context_bytes=overhead.cuda_context(effective),
        allocator_overhead_bytes=overhead.allocator_overhead(effective, peak_allocated),
        notes=tuple(notes),
        trainable_params=weights.trainable_params(effective, arch),
    )
