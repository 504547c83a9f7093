"""Assemble the terms into the phases of one steady-state GRPO step and take the peak.

A TRL 1.16 step (notes §4): `generate` (no grad, grads None, optimizer state resident from step 2) →
`score` (no-grad reference / old-policy passes, only when they run) → `train` (forward + backward of one
micro-batch; its peak is the largest of a few instants) → `optimizer` (step with gradients resident).
"""

from __future__ import annotations

from estimator.architecture import Arch
from estimator.config import RunConfig
from estimator.estimate import Estimate
from estimator.terms import activations as act
from estimator.terms import generation as gen
from estimator.terms import logprob_head as head
from estimator.terms import optimizer as opt
from estimator.terms import overhead, weights
from estimator.terms.sharding import deepspeed_dtype_config, gathered_weights, shard


def resident(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Memory held through the whole step: weights, reference copy, adapters, optimizer state, vLLM's reservation."""
    held = {
        "weights": weights.policy_weights(cfg, arch),
        "reference_weights": weights.reference_weights(cfg, arch),
        "lora_adapters": weights.lora_adapters(cfg, arch),
        "optimizer_state": opt.optimizer_state(cfg, arch),
        "master_weights": opt.master_weights(cfg, arch),
    }
    held = {k: shard(cfg, k, v) for k, v in held.items()}
    if not cfg.vllm_enable_sleep_mode:
        held["vllm"] = gen.vllm_reservation(cfg)
    return held


def generate_phase(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """KV cache at full length + the larger of the prefill transient and the decode-step transient."""
    if cfg.use_vllm:
        woken = gen.vllm_reservation(cfg) if cfg.vllm_enable_sleep_mode else 0
        return {"vllm": woken}
    prefill = {
        "kv_cache": gen.kv_cache(cfg, arch, cfg.max_prompt_length),
        "activations": act.nograd_forward_peak(cfg, arch, cfg.generation_sequences, cfg.max_prompt_length),
    }
    decode = {  # the last step: full cache, one layer's K/V briefly held twice, the step's logits
        "kv_cache": gen.kv_cache(cfg, arch) + gen.kv_concat_transient(cfg, arch),
        "generation_logits": gen.generation_logits(cfg, arch),
    }
    out = dict(max(prefill, decode, key=lambda d: sum(d.values())))
    out["gradients"] = shard(cfg, "gradients", opt.gradients_during_generation(cfg, arch))
    gathered = gathered_weights(cfg, weights.policy_weights(cfg, arch))
    out["autocast_weight_cache"] = act.autocast_weight_cache(cfg, arch, include_lm_head=True)
    if gathered:
        out["gathered_weights"] = gathered
    return out


def score_phase(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """One no-grad chunk of per_device_train_batch_size sequences through the backbone and the head (buffers only if no pass runs)."""
    if not (cfg.runs_reference_pass or cfg.runs_old_logprob_pass):
        return {"rollout_buffers": gen.rollout_buffers(cfg)}  # rewards and advantages only: nothing sizeable
    b, seq = cfg.per_device_train_batch_size, cfg.sequence_length
    common = {
        "autocast_weight_cache": act.autocast_weight_cache(cfg, arch, include_lm_head=False),
        "rollout_buffers": gen.rollout_buffers(cfg),
        "gradients": shard(cfg, "gradients", opt.gradients_during_generation(cfg, arch)),
    }
    # the backbone's largest layer and the head run one after the other: the phase peak is the larger instant
    layers = {"activations": act.nograd_forward_peak(cfg, arch, b, seq)}
    at_head = {
        "activations": act.hidden_states(cfg, arch, b * seq),  # last_hidden_state
        "logprob_head": head.head_forward(cfg, arch, b),
    }
    larger = max(layers, at_head, key=lambda d: sum(d.values()))
    return common | larger


def train_instants(cfg: RunConfig, arch: Arch) -> dict[str, dict[str, int]]:
    """Candidate peak instants of forward + backward; the phase peak is the largest."""
    b, seq = cfg.per_device_train_batch_size, cfg.sequence_length
    tokens = b * seq
    grads = shard(cfg, "gradients", opt.gradients(cfg, arch))
    saved = act.saved_activations(cfg, arch, b, seq)
    norm_saved = tokens * act.rmsnorm_saved_per_token(cfg, arch)
    buffers = gen.rollout_buffers(cfg)
    if cfg.logprob_head == "full":
        fwd_head = bwd_head = head.full_logits(cfg, arch, b)
        saved_head = 0
    else:
        fwd_head = head.head_forward(cfg, arch, b)
        saved_head = head.head_saved(cfg, arch, b)
        bwd_head = head.head_backward(cfg, arch, b, lm_head_trainable=not cfg.use_peft)
    cast_cache = act.autocast_weight_cache(cfg, arch, include_lm_head=False)
    instants = {
        "head_forward": {
            "activations": saved + norm_saved,
            "autocast_weight_cache": cast_cache,
            "logprob_head": fwd_head,
        },
        "head_backward": {"activations": saved + norm_saved, "logprob_head": saved_head + bwd_head},
    }
    if not cfg.gradient_checkpointing:  # autograd keeps the casts it saved until each layer's backward
        cast_cache = act.autocast_weight_cache(cfg, arch, include_lm_head=False, saved_for_backward=True)
        instants["head_forward"]["autocast_weight_cache"] = cast_cache
        instants["head_backward"]["autocast_weight_cache"] = cast_cache
    grad_flow = act.residual_gradients(cfg, arch, tokens)
    layer_bwd = (
        tokens * act.layer_backward_transient_per_token(cfg, arch)
        + tokens * act.eager_backward_transient_per_token(cfg, arch, seq)
        + grad_flow
        + act.dequantized_weight_transient(cfg, arch)
    )
    after_head = shard(cfg, "gradients", opt.gradients_after_head(cfg, arch))
    if cfg.gradient_checkpointing:
        recompute = act.recompute_layer(cfg, arch, b, seq)
        instants["last_layer_backward"] = {
            "activations": saved + recompute + layer_bwd,
            "gradients": after_head,
        }
        instants["first_layer_backward"] = {
            "activations": act.hidden_states(cfg, arch, tokens) + recompute + layer_bwd,
            "gradients": shard(cfg, "gradients", opt.gradients_before_first_layer(cfg, arch)),
        }
    else:
        instants["last_layer_backward"] = {
            "activations": saved + norm_saved + layer_bwd,
            "gradients": after_head,
            "autocast_weight_cache": cast_cache,
        }
    # the tied buffer and the embedding's own [V, H] gradient meet before they are summed into .grad
    tied = 2 * opt.tied_gradient_buffer(cfg, arch)
    instants["backward_end"] = {"activations": grad_flow, "gradients": grads + shard(cfg, "gradients", tied)}
    for name, comps in instants.items():
        comps["rollout_buffers"] = buffers
        later = opt.micro_step_gradients(cfg, arch, name)  # GA > 1: every .grad resident from micro-step 2
        if later is not None:
            comps["gradients"] = shard(cfg, "gradients", later)
    return instants


def train_phase(cfg: RunConfig, arch: Arch) -> tuple[dict[str, int], str]:
    """The largest training instant and its name."""
    instants = train_instants(cfg, arch)
    name = max(instants, key=lambda k: sum(instants[k].values()))
    return instants[name], name


def optimizer_phase(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Full gradients + the optimizer's step temporaries."""
    return {
        "gradients": shard(cfg, "gradients", opt.gradients(cfg, arch)),
        "optimizer_temporaries": shard(cfg, "optimizer_temporaries", opt.optimizer_temporaries(cfg, arch)),
        "rollout_buffers": gen.rollout_buffers(cfg),
    }


def build_phases(cfg: RunConfig, arch: Arch) -> Estimate:
    """Per-phase component bytes (resident + phase-specific), overheads on top of the peak."""
    given = cfg
    cfg = deepspeed_dtype_config(cfg)
    held = resident(cfg, arch)
    phases: dict[str, dict[str, int]] = {}
    notes: list[str] = []
    specific = {"generate": generate_phase(cfg, arch), "score": score_phase(cfg, arch)}
    train, instant = train_phase(cfg, arch)
    specific["train"] = train
    specific["optimizer"] = optimizer_phase(cfg, arch)
    for phase, comps in specific.items():
        if comps is None:
            continue
        merged = dict(held)
        for k, v in comps.items():
            merged[k] = merged.get(k, 0) + v
        phases[phase] = {k: v for k, v in merged.items() if v}
    notes.append(f"train peak instant: {instant}")
    if cfg.dtype == "float32" and not cfg.load_in_4bit:
        notes.append(
            "weights load in float32 (TRL's default for a model given by name); "
            "model_init_kwargs={'dtype': 'bfloat16'} halves weights, gradients and AdamW state"
        )
    if cfg is not given:
        notes.append(
            "DeepSpeed casts the model to bf16 under ZeRO; fp32 master weights and AdamW state are sharded"
        )
    est = Estimate(
        config=given,
        arch=arch,
        phases=phases,
        cuda_context_bytes=overhead.cuda_context(cfg),
        allocator_overhead_bytes=0,
        notes=notes,
        trainable_params=weights.trainable_params(cfg, arch),
    )
    est.allocator_overhead_bytes = overhead.allocator_overhead(cfg, est.peak_allocated_bytes)
    return est
