"""The estimate of one GRPO step: bytes per component per phase, the peak, and the overheads on top.

`estimate(cfg)` is the one entry point. It sums the terms in `estimator/terms/` phase by phase
(`estimator/step/phases.py`) and takes the maximum over phases. Every number it returns is `estimated`.
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.model.architecture import Arch
from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step import band
from estimator.step.phases import build_phases
from estimator.terms import allocator_reserve as allocator_term
from estimator.terms import generation as gen
from estimator.terms import overhead, weights
from estimator.terms.optimizer import REAL, TENSORS
from estimator.terms.overhead import NonTensorItem
from estimator.terms.phase_names import GENERATE
from estimator.units import gib

SOURCE = "estimated"


@dataclass(frozen=True)
class Estimate:
    """Predicted memory of one steady-state GRPO step (step ≥ 2, optimizer state resident)."""

    config: RunConfig
    arch: Arch
    phases: dict[str, dict[str, int]]  # phase -> component -> bytes (tensor bytes, "torch allocated")
    cuda_context_bytes: int  # every non-tensor item: CUDA context, modules, cuBLAS workspaces, NCCL
    allocator_overhead_bytes: int  # caching-allocator reserve beyond allocated, at the peak
    notes: tuple[str, ...] = ()
    trainable_params: int = 0
    # the layers (`allocator_layers`): where the reserve came from, the non-tensor items and what the card must hold
    reserve_source: str = SOURCE  # "simulated" (this config's traced stream), "fitted", or "estimated" (none)
    reserve_basis: str = ""  # which stream / fit
    allocator_variant: str = "default"  # the simulated allocator settings (allocator_term.VARIANTS)
    non_tensor: tuple[NonTensorItem, ...] = ()  # itemized; their sum is cuda_context_bytes where given
    need_extra_bytes: int | None = (
        None  # smallest passing allocator limit - allocated peak (release-and-retry)
    )
    need_margin_bytes: int = 0  # of need_extra_bytes, what the fitted models' safety margins add

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
    def in_reserved_bytes(self) -> int:
        """Non-tensor items allocated through the caching allocator (cuBLAS / cuBLASLt workspaces)."""
        return sum(i.bytes for i in self.non_tensor if i.in_reserved)

    @property
    def outside_allocator_bytes(self) -> int:
        """Non-tensor memory outside torch's allocator (CUDA context, lazily loaded modules, NCCL)."""
        return self.cuda_context_bytes - self.in_reserved_bytes

    @property
    def peak_reserved_bytes(self) -> int:
        """peak allocated + the allocator's reserve beyond it + the workspaces allocated through it:
        torch.cuda.max_memory_reserved."""
        return self.peak_allocated_bytes + self.allocator_overhead_bytes + self.in_reserved_bytes

    @property
    def peak_device_bytes(self) -> int:
        """peak reserved + the items outside the allocator: what nvidia-smi shows for the process."""
        return self.peak_reserved_bytes + self.outside_allocator_bytes

    @property
    def band_bytes(self) -> int:
        """The validated error band of this config's regime on the estimated tensor peak (estimator/step/band.py):
        margin × (peak allocated − vLLM's fixed share). Fits are decided with it added (`fit_bytes`)."""
        fixed = self.phases[self.peak_phase].get("vllm", 0)
        return int(band.margin(self.config, self.arch.model_type) * max(0, self.peak_allocated_bytes - fixed))

    @property
    def fit_bytes(self) -> int:
        """What a fit verdict compares with the GPU: what the card must hold + the error band (safe side)."""
        return self.need_bytes + self.band_bytes

    def fit_bytes_on(self, sm: tuple[int, int], total_bytes: int) -> int:
        """`fit_bytes` on a card of compute capability `sm` with `total_bytes`: the estimate counts an H100's
        cuBLAS / cuBLASLt workspaces (`non_tensor_items`' default). A card before Hopper gets its own, which
        torch's `parseChosenWorkspaceSize` makes smaller (52 to 59 MiB less on Ampere and Ada); Hopper, newer
        cards whose defaults this estimator has not read, and an unknown card (sm (0, 0)) keep the H100's."""
        if self.config.device != "cuda" or sm == (0, 0) or sm >= overhead.H100_SM:
            return self.fit_bytes
        return (
            self.fit_bytes
            + overhead.workspace_bytes(sm, total_bytes)
            - overhead.workspace_bytes(overhead.H100_SM)
        )

    @property
    def need_bytes(self) -> int:
        """What the card must hold for the step not to OOM: the allocated peak + the smallest allocator reserve the
        simulated stream passes with (the allocator frees its cache and retries before it fails) + every
        non-tensor item. At most `peak_device_bytes`; the nvidia-smi peak where no `need` was computed."""
        if self.need_extra_bytes is None:
            return self.peak_device_bytes
        return self.peak_allocated_bytes + self.need_extra_bytes + self.cuda_context_bytes

    def layers(self) -> dict:
        """Allocated -> reserved -> nvidia-smi peak, each layer with its bytes and where the number came from."""

        def item(i: NonTensorItem) -> dict:
            return {"name": i.name, "bytes": i.bytes, "source": SOURCE, "basis": i.source}

        return {
            "allocated": {
                "bytes": self.peak_allocated_bytes,
                "source": SOURCE,
                "what": "tensor bytes at the peak",
            },
            "fragmentation": {
                "bytes": self.allocator_overhead_bytes,
                "source": self.reserve_source,
                "basis": self.reserve_basis,
                "allocator_settings": self.allocator_variant,
                "what": "the caching allocator's reserve beyond the allocated peak",
            },
            "in_reserved": [item(i) for i in self.non_tensor if i.in_reserved],
            "reserved": {"bytes": self.peak_reserved_bytes, "source": SOURCE},
            "outside_allocator": [item(i) for i in self.non_tensor if not i.in_reserved],
            "nvidia_smi_peak": {"bytes": self.peak_device_bytes, "source": SOURCE},
            "need": {
                "bytes": self.need_bytes,
                "allocator_extra_bytes": self.need_extra_bytes,
                "allocator_margin_bytes": self.need_margin_bytes,
                "source": self.reserve_source,
                "what": "what the card must hold: smallest allocator limit the step passes (release-and-retry) "
                "+ every non-tensor item",
            },
        }

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
            "need_bytes": self.need_bytes,
            "band_bytes": self.band_bytes,  # the regime's validated error band on the tensor peak (band.py)
            "fit_bytes": self.fit_bytes,  # need + band: what the fit verdicts compare with a GPU
            "layers": self.layers(),
            "notes": list(self.notes),
        }


def estimate(cfg: RunConfig, arch: Arch | None = None, tensors: str = REAL) -> Estimate:
    """Estimate one GRPO step of `cfg` (the model is resolved from `cfg.model` unless `arch` is given).

    `tensors` says what counts them: `"real"`, the device's own counters (what a user's GPU shows), or
    `"dispatch"`, a Python dispatch mode (the FakeTensor traces and the measured-cpu probe), under which autograd
    sums gradients out of place (`estimator.terms.optimizer.tied_gradients_at_meeting`): what the estimate is
    compared with on traced and measured-cpu rows."""
    if tensors not in TENSORS:
        raise ValueError(f"tensors={tensors!r}: accepted values are {', '.join(TENSORS)}")
    if arch is None:
        arch = resolve_model(cfg.model)
    phases, notes, effective = build_phases(cfg, arch, tensors)
    peak_allocated = max(sum(c.values()) for c in phases.values())
    items = tuple(overhead.non_tensor_items(effective))
    return Estimate(
        config=cfg,
        arch=arch,
        phases=phases,
        cuda_context_bytes=sum(i.bytes for i in items),
        notes=tuple(notes),
        trainable_params=weights.trainable_params(effective, arch),
        non_tensor=items,
        **with_uncached_generation(
            allocator_layers(effective, peak_allocated, allocator_term.shares_of(phases)),
            effective,
            arch,
            phases,
            peak_allocated,
        ),
    )


# a generate phase's components that come and go with each step's forward; the rest is held through it
GENERATION_WORKING = ("activations", "generation_logits", "autocast_weight_cache")


def with_uncached_generation(
    layers: dict, cfg: RunConfig, arch: Arch, phases: dict[str, dict[str, int]], peak_allocated: int
) -> dict:
    """The reserve when generation keeps no KV cache: the larger of the step's and what generation leaves
    reserved, the memory held through it + the segments it cuts and keeps cached
    (`gen.uncached_generation_segments`, estimated) + the step model's reserve (fitted), the other segments the step
    cuts. Counted for dense models on the default allocator settings, the shapes it was checked on; elsewhere the
    reserve's basis says it is not. The need is unchanged: under a limit the allocator frees cached segments before
    it fails."""
    if cfg.generation_use_cache or cfg.use_vllm or GENERATE not in phases:
        return layers
    if arch.is_moe or layers["allocator_variant"] != "default":
        why = "an MoE model" if arch.is_moe else "these allocator settings"
        return layers | {
            "reserve_basis": layers["reserve_basis"]
            + f"; generation without a KV cache: the segments it keeps cached are not counted for {why}"
        }
    segments = gen.uncached_generation_segments(cfg, arch)
    held = sum(v for k, v in phases[GENERATE].items() if k not in GENERATION_WORKING)
    beyond = held + segments + layers["allocator_overhead_bytes"] - peak_allocated
    if beyond <= layers["allocator_overhead_bytes"]:
        return layers
    return layers | {
        "allocator_overhead_bytes": beyond,
        "reserve_basis": layers["reserve_basis"]
        + "; generation without a KV cache: the segments it keeps cached (estimated) on top",
    }


def allocator_layers(
    cfg: RunConfig, peak_allocated: int, shares: allocator_term.Shares = allocator_term.UNKNOWN
) -> dict:
    """The Estimate fields the caching allocator sets at `peak_allocated`, under the allocator settings `cfg`
    carries: the reserve beyond the peak (max_memory_reserved - max_memory_allocated with room to spare) and the
    smallest extra the step passes with (`allocator_term.reserve` / `need`), and where they came from.
    `shares`: where the estimate's peak sits (`allocator_term.shares_of` its phases)."""
    if cfg.device != "cuda":
        return {"allocator_overhead_bytes": 0, "reserve_source": "none (cpu)", "need_extra_bytes": 0}
    variant = allocator_term.config_variant(cfg)
    r = allocator_term.reserve(cfg, peak_allocated, variant, shares)
    n = allocator_term.need(cfg, peak_allocated, variant, shares)
    return {
        "allocator_overhead_bytes": r.bytes,
        "reserve_source": r.source.split(" ", 1)[0],
        "reserve_basis": r.source,
        "allocator_variant": variant,
        "need_extra_bytes": n.bytes,
        "need_margin_bytes": n.margin_bytes,
    }
