"""The phases of one steady-state GRPO step: each phase's own components (single GPU or FSDP rank 0) merged once
with what is resident through the step, then CPU offload applied; the notes that say what was modelled."""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings import versions
from estimator.settings.config import RunConfig
from estimator.step import fsdp, single
from estimator.step import offload as offload_phases
from estimator.terms import allocator_reserve
from estimator.terms.optimizer import REAL
from estimator.terms.sharding import deepspeed_dtype_config, is_fsdp

Phases = dict[str, dict[str, int]]  # phase -> component -> bytes (zero components dropped)


def merge(resident: dict[str, int], own: Phases) -> Phases:
    """Each phase's own components added to what is resident through the step; zero components dropped."""
    phases: Phases = {}
    for phase, comps in own.items():
        merged = dict(resident)
        for k, v in comps.items():
            merged[k] = merged.get(k, 0) + v
        phases[phase] = {k: v for k, v in merged.items() if v}
    return phases


def build_phases(cfg: RunConfig, arch: Arch, tensors: str = REAL) -> tuple[Phases, list[str], RunConfig]:
    """Per-phase component bytes (resident + phase-specific), notes, and the config the terms saw. `tensors`:
    what counts the tensors, the device (real tensors) or a Python dispatch mode (traces, the measured-cpu probe).

    The config the terms see differs from the one given under ZeRO (DeepSpeed's bf16 cast); `estimate()` builds
    the frozen Estimate from these.
    """
    given = cfg
    cfg = deepspeed_dtype_config(cfg)
    notes: list[str] = []
    if is_fsdp(given):  # rank 0 of N FSDP2 ranks: estimator/step/fsdp.py, from the single-GPU terms
        part = fsdp.rank0_parts(given, arch)
        notes.append(
            f"rank 0 of {given.num_gpus} FSDP2 ranks ({given.fsdp_sharding_strategy}): accelerate upcasts trainable "
            "parameters to fp32 under mixed precision, so shards, gradients and AdamW state are fp32; "
            "held to traced rank-0 steps (results/traced/tuned/multigpu.jsonl)"
        )
    else:
        part = single.parts(cfg, arch, tensors)
    phases = merge(part.resident, part.phases)
    instant = part.train_instant
    notes.append(f"train peak instant: {instant}")
    notes.append(
        f"modelled TRL release: {cfg.trl_version} (semantics of TRL {cfg.release.label}); with "
        + versions.modelled_beside_trl(cfg.transformers_version, cfg.use_vllm)
    )
    if cfg.release.batch_unit == "prompts":
        notes.append(
            f"TRL {cfg.trl_version} counts per_device_train_batch_size in prompts: "
            f"{cfg.per_device_train_batch_size} completions per micro-batch (prompts x num_generations)"
        )
    if given.offload_optimizer or given.offload_param or given.host_ram_gib:  # estimator/step/offload.py
        phases, offload_notes = offload_phases.apply(given, arch, phases)
        notes += offload_notes
        notes.append(offload_phases.host_ram_line(given, arch))
    if cfg.dtype == "float32" and not cfg.load_in_4bit:
        notes.append(
            "weights load in float32 (TRL's default for a model given by name); "
            "model_init_kwargs={'dtype': 'bfloat16'} halves weights, gradients and AdamW state"
        )
    if given.sharding == "fsdp" and given.num_gpus > 1 and not is_fsdp(given):
        notes.append("FSDP with QLoRA: states divided by --gpus, gathers not modelled (not traced)")
    if cfg is not given:
        notes.append(
            "DeepSpeed casts the model to bf16 under ZeRO; fp32 master weights and AdamW state are sharded"
        )
    ds_reserve = allocator_reserve.deepspeed_note(given)
    if ds_reserve:
        notes.append(ds_reserve)
    return phases, notes, cfg
