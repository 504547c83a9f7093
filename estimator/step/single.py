"""The phases of one GRPO step on one GPU (or one ZeRO rank), from the terms (TRL 1.16, notes §4).

`generate` (no grad, grads None, optimizer state resident from step 2) → `score` (no-grad reference /
old-policy passes, only when they run) → `train` (forward + backward of one micro-batch; its peak is the largest
of a few instants) → `optimizer` (step with gradients resident). Each function returns the phase's own
components; `estimator/step/phases.py` adds what is resident through the step.
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.step.offload import moved as offload_moved
from estimator.terms import activations as act
from estimator.terms import deepspeed_buffers as ds
from estimator.terms import generation as gen
from estimator.terms import logprob_head as head
from estimator.terms import moe_lora, release, vllm, weights
from estimator.terms import optimizer as opt
from estimator.terms.phase_names import GENERATE, OPTIMIZER, SCORE, TRAIN
from estimator.terms.sharding import ddp_gradient_buckets, gathered_weights, shard, zero3_fetched_weights
from estimator.units import nbytes


def resident(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Memory held through the whole step: weights, reference copy, adapters, optimizer state, DDP's gradient
    buckets, vLLM's reservation."""
    held = {
        "weights": weights.policy_weights(cfg, arch),
        "reference_weights": weights.reference_weights(cfg, arch),
        "lora_adapters": weights.lora_adapters(cfg, arch),
        "optimizer_state": opt.optimizer_state(cfg, arch),
        "master_weights": opt.master_weights(cfg, arch),
    }
    held = {k: shard(cfg, k, v) for k, v in held.items()}
    held["ddp_gradient_buckets"] = ddp_gradient_buckets(cfg, opt.gradients(cfg, arch))
    # DeepSpeed's own: ZeRO-3's gradient partitions (the phases then count no sharded .grad) and reduce buckets
    held["gradients"] = ds.grad_partitions(cfg, arch)
    held["zero_reduce_buckets"] = ds.reduce_buckets(cfg, arch) if ds.reduce_buckets_resident(cfg) else 0
    # vLLM colocate: its whole budget, or what stays while it sleeps (terms/vllm.py)
    held["vllm"] = vllm.colocate_sleeping(cfg) if cfg.vllm_sleeps else vllm.colocate_footprint(cfg)
    return held


def generate_phase(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """KV cache at full length + the larger of the prefill transient and the decode-step transient."""
    if cfg.use_vllm:
        woken = vllm.colocate_footprint(cfg) - vllm.colocate_sleeping(cfg) if cfg.vllm_sleeps else 0
        largest = max(arch.embedding_params, arch.lm_head_params) * nbytes(cfg.dtype)
        sync = vllm.weight_sync_gather(cfg, weights.policy_weights(cfg, arch), largest)
        out = {"vllm": woken, "gathered_weights": sync}
        push = vllm.server_weight_push(cfg, arch, weights.policy_weights(cfg, arch), nbytes(cfg.dtype))
        if push:
            out["vllm_weight_push"] = push
        return out
    if not cfg.generation_use_cache:
        return _generate_without_cache(cfg, arch)
    # The prefill's layers run before the head is first cast: autocast's cache then holds the layers' casts
    # only (it is cleared when each forward's autocast region exits, torch.autocast.__exit__)
    g, p = cfg.generation_sequences, cfg.max_prompt_length
    tables = gen.rotary_tables(cfg, arch, g, p)
    prefill = {
        "kv_cache": gen.kv_cache(cfg, arch, p, prefill=True),
        "activations": act.nograd_forward_peak(cfg, arch, g, p, rotary=False) + tables,
        "autocast_weight_cache": act.autocast_weight_cache(cfg, arch, include_lm_head=False),
    }
    # the last layer's rotary runs before its K/V enter the cache (act.nograd_rotary_per_token)
    prefill_rotary = {
        "kv_cache": gen.kv_cache(cfg, arch, p, prefill=True, layers=arch.num_layers - 1),
        "activations": act.nograd_rotary_peak(cfg, arch, g, p) + tables,
        "autocast_weight_cache": act.autocast_weight_cache(cfg, arch, include_lm_head=False),
    }
    # the last step's layers: the full cache, one tensor doubled by the cache's `cat` or the attention's copies
    # (the larger; the `cat` finishes before attention runs), the layers' casts
    decode_layers = {
        "kv_cache": gen.kv_cache(cfg, arch)
        + max(gen.kv_concat_transient(cfg, arch), gen.decode_attention_copies(cfg, arch)),
        "activations": moe_lora.merged_weights(cfg, arch) + moe_lora.factor_copies(cfg, arch),
        "autocast_weight_cache": act.autocast_weight_cache(cfg, arch, include_lm_head=False),
    }
    # the last step's head, after the layers: the full cache, the head's casts, the step's logits
    decode_head = {
        "kv_cache": gen.kv_cache(cfg, arch),
        "generation_logits": gen.generation_logits(cfg, arch),
        "autocast_weight_cache": act.autocast_weight_cache(cfg, arch, include_lm_head=True)
        + act.fp32_head_cast_in_generation(cfg, arch),
    }
    out = dict(max(prefill, prefill_rotary, decode_layers, decode_head, key=lambda d: sum(d.values())))
    out["gradients"] = _phase_gradients(cfg, opt.gradients_during_generation(cfg, arch))
    gathered = _generation_gather(cfg, arch)
    if gathered:
        out["gathered_weights"] = gathered
    return out


def _generate_without_cache(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Generation without a KV cache (`generation_use_cache` false): transformers 5.24 `_sample` runs every step
    over the whole sequence so far with `use_cache=False` and `logits_to_keep=1`
    (https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/generation/utils.py#L3230-L3236),
    so the largest step is a prefill of P + C - 1 positions that keeps no cache: its layers' no-grad peak (or
    rotary's), or at the head the last hidden states with the step's logits, whichever is larger. Beside it, the
    previous step's logits, scores and probabilities (`_sample`'s locals until the next sampling) and the token
    ids (`gen.generation_token_ids`)."""
    g, length = cfg.generation_sequences, cfg.sequence_length - 1
    tables = gen.rotary_tables(cfg, arch, g, length)
    layers = {"activations": act.nograd_forward_peak(cfg, arch, g, length, rotary=False) + tables}
    rotary = {"activations": act.nograd_rotary_peak(cfg, arch, g, length) + tables}
    at_head = {"activations": act.hidden_states(cfg, arch, g * length) + gen.generation_logits(cfg, arch)}
    head = at_head["activations"] >= max(layers["activations"], rotary["activations"])
    out = dict(at_head if head else max(layers, rotary, key=lambda d: d["activations"]))
    out["activations"] += gen.generation_token_ids(cfg, length)
    out["generation_logits"] = gen.generation_logits(cfg, arch)
    out["autocast_weight_cache"] = act.autocast_weight_cache(cfg, arch, include_lm_head=head) + (
        act.fp32_head_cast_in_generation(cfg, arch) if head else 0
    )
    out["gradients"] = _phase_gradients(cfg, opt.gradients_during_generation(cfg, arch))
    gathered = _generation_gather(cfg, arch)
    if gathered:
        out["gathered_weights"] = gathered
    return out


def _phase_gradients(cfg: RunConfig, full: int) -> int:
    """A phase's `.grad` bytes, sharded as the run shards them; under ZeRO-3 (optimizer on the GPU) none: the
    gradient partitions are resident (`ds.grad_partitions`)."""
    return 0 if ds.grad_partitions_resident(cfg) else shard(cfg, "gradients", full)


def _generation_gather(cfg: RunConfig, arch: Arch) -> int:
    """ZeRO-3 gathers the whole policy for generate (`gathered_weights`), or with ds3_gather_for_generation off
    fetches module by module as each token's forward runs (`zero3_fetched_weights`)."""
    full = weights.policy_weights(cfg, arch)
    if cfg.ds3_gather_for_generation:
        return gathered_weights(cfg, full)
    return zero3_fetched_weights(cfg, arch, "decode", full)


def score_phase(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """One no-grad chunk of per_device_train_batch_size sequences through the backbone and the head (buffers only if no pass runs)."""
    if not (cfg.runs_reference_pass or cfg.runs_old_logprob_pass):
        return {"rollout_buffers": gen.rollout_buffers(cfg)}  # rewards and advantages only: nothing sizeable
    b, seq = cfg.per_device_train_batch_size, cfg.sequence_length
    common = {
        "autocast_weight_cache": act.autocast_weight_cache(cfg, arch, include_lm_head=False),
        "rollout_buffers": gen.rollout_buffers(cfg),
        "gradients": _phase_gradients(cfg, opt.gradients_during_generation(cfg, arch)),
    }
    fetched = zero3_fetched_weights(cfg, arch, "forward", weights.policy_weights(cfg, arch))
    if fetched:
        common["gathered_weights"] = fetched
    # the backbone's largest layer and the head run one after the other: the phase peak is the larger instant
    layers = {"activations": act.nograd_forward_peak(cfg, arch, b, seq)}
    at_head = {
        "activations": act.hidden_states(cfg, arch, b * seq),  # last_hidden_state
        "logprob_head": head.nograd_head(cfg, arch, b),
    }
    larger = max(layers, at_head, key=lambda d: sum(d.values()))
    return common | larger


def layer_backward(cfg: RunConfig, arch: Arch, tokens: int, seq: int, grad_flow: int) -> int:
    """The largest transient of one decoder layer's backward, beyond what the step keeps: MLP / LoRA / wrapped
    experts, eager attention beside the residual gradients `grad_flow`, Gemma's post-feedforward norm, a 4-bit
    layer's dequantized weights."""
    # A layer's backward runs its MLP first, then attention: the MLP / LoRA / wrapped-expert transients live
    # beside the one incoming residual gradient; eager attention's, net of what the MLP block released (its saved
    # tensors, and the merged expert stacks and factor copies a wrapped MoE block kept), beside it and the partial sum
    # Gemma's post-feedforward norm runs its backward before the MLP's: the MLP's instant no longer holds what
    # that norm saved, and the norm's own fp32 backward is an instant of its own (at its pow, the normalized value
    # a trainable weight saved is already released)
    mlp_bwd = (
        tokens * act.layer_backward_transient_per_token(cfg, arch)
        + act.hidden_states(cfg, arch, tokens)
        + moe_lora.backward_transient(cfg, arch)
        - tokens * act.gemma_post_norm_saved_per_token(cfg, arch)
    )
    norm_bwd = 0
    if act.gemma_post_norm_saved_per_token(cfg, arch):
        norm_bwd = tokens * act.gemma_post_norm_backward_per_token(cfg, arch) + act.hidden_states(
            cfg, arch, tokens
        )
    eager_bwd = max(
        0,
        tokens * act.eager_backward_transient_per_token(cfg, arch, seq) - moe_lora.saved_per_layer(cfg, arch),
    )
    # a bnb 4-bit layer's dequantized weights are live at instants of their own; a GPTQ/AWQ one's beside any
    layer_bwd = max(
        mlp_bwd, eager_bwd + grad_flow, norm_bwd, act.bnb_4bit_backward_instant(cfg, arch, tokens)
    )
    if not cfg.load_in_4bit:
        layer_bwd += act.dequantized_weight_transient(cfg, arch)
    return layer_bwd


def layer_forward(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """The largest transient of one decoder layer's forward (a 4-bit layer's dequantized weights included)."""
    return max(
        tokens * act.layer_forward_transient_per_token(cfg, arch),
        act.bnb_4bit_forward_transient(cfg, arch, tokens),
    )


FORWARD_INSTANTS = ("head_forward", "last_layer_forward")  # train instants before any backward


def train_instants(cfg: RunConfig, arch: Arch, tensors: str = opt.REAL) -> dict[str, dict[str, int]]:
    """Candidate peak instants of forward + backward; the phase peak is the largest. `tensors`: what counts them,
    the device (real tensors) or a Python dispatch mode (`opt.tied_gradients_at_meeting`)."""
    b, seq = cfg.per_device_train_batch_size, cfg.sequence_length
    tokens = b * seq
    grads = shard(cfg, "gradients", opt.gradients(cfg, arch))
    # without input gradients (PEFT, no GC) the first layer keeps less
    saved = act.saved_activations(cfg, arch, b, seq) - tokens * act.first_layer_unsaved_per_token(cfg, arch)
    norm_saved = tokens * act.rmsnorm_saved_per_token(cfg, arch)
    buffers = gen.rollout_buffers(cfg)
    fwd_head, saved_head, bwd_head = head.train_head(cfg, arch, b)
    cast_cache = act.autocast_weight_cache(cfg, arch, include_lm_head=False)
    after_head = shard(cfg, "gradients", opt.gradients_after_head(cfg, arch))
    instants = {
        "head_forward": {
            "activations": saved + norm_saved,
            "autocast_weight_cache": cast_cache,
            "logprob_head": fwd_head,
        },
        "head_backward": {"activations": saved + norm_saved, "logprob_head": saved_head + bwd_head},
        # the final norm's backward at its pow, before any layer's backward
        "final_norm_backward": {
            "activations": saved + tokens * act.final_norm_backward_per_token(cfg, arch),
            "gradients": after_head,
        },
    }
    if not cfg.gradient_checkpointing:  # autograd keeps the casts it saved until each layer's backward
        cast_cache = act.autocast_weight_cache(cfg, arch, include_lm_head=False, saved_for_backward=True)
        instants["head_forward"]["autocast_weight_cache"] = cast_cache
        instants["head_backward"]["autocast_weight_cache"] = cast_cache
        instants["final_norm_backward"]["autocast_weight_cache"] = cast_cache
    grad_flow = act.residual_gradients(cfg, arch, tokens)
    layer_bwd = layer_backward(cfg, arch, tokens, seq, grad_flow)
    layer_fwd = layer_forward(cfg, arch, tokens)
    if cfg.gradient_checkpointing:
        recompute = act.recompute_layer(cfg, arch, b, seq)
        instants["last_layer_backward"] = {
            "activations": saved + recompute + layer_bwd,
            "gradients": after_head,
        }
        # the top layer's recomputed forward at its largest instant (act.layer_forward_transient_per_token), with
        # the incoming gradient live
        instants["last_layer_recompute"] = {
            "activations": saved
            + recompute
            + layer_fwd
            + act.hidden_states(cfg, arch, tokens)
            + act.bnb_4bit_recompute_gradient(cfg, arch, tokens)
            + act.recompute_waiting_gradients(cfg, arch, tokens),
            "gradients": after_head,
        }
        instants["first_layer_backward"] = {
            "activations": act.hidden_states(cfg, arch, tokens) + recompute + layer_bwd,
            "gradients": shard(cfg, "gradients", opt.gradients_before_first_layer(cfg, arch)),
        }
    else:
        # the final norm's backward ran before the top layer's: what it saved is already released
        instants["last_layer_backward"] = {
            "activations": saved + layer_bwd,
            "gradients": after_head,
            "autocast_weight_cache": cast_cache,
        }
        # the top layer's forward at its largest instant, every layer's saved tensors held
        instants["last_layer_forward"] = {
            "activations": saved + layer_fwd,
            "autocast_weight_cache": cast_cache,
        }
    # the tied head's gradient meets the embedding's: in place on real tensors with TRL's fused head
    tied = opt.tied_gradients_at_meeting(cfg, arch, tensors)
    instants["backward_end"] = {"activations": grad_flow, "gradients": grads + shard(cfg, "gradients", tied)}
    fetched = zero3_fetched_weights(cfg, arch, "train", weights.policy_weights(cfg, arch))
    for name, comps in instants.items():
        comps["rollout_buffers"] = buffers
        if (
            fetched
        ):  # the most ZeRO-3 holds gathered at once in forward + backward, at every instant (errs high)
            comps["gathered_weights"] = fetched
        # GA > 1: every .grad resident from micro-step 2
        later = opt.micro_step_gradients(cfg, arch, name, tensors)
        if later is not None:
            comps["gradients"] = shard(cfg, "gradients", later)
        if ds.grad_partitions_resident(
            cfg
        ):  # ZeRO-3: partitions resident, one module's full gradient in backward
            comps["gradients"] = 0 if name in FORWARD_INSTANTS else ds.full_module_gradient(cfg, arch)
        if name not in ds.instants_before_first_gradient(cfg, arch, FORWARD_INSTANTS):
            # ZeRO-2's bucket from the first gradient on; an offloaded gradient's copies
            if not ds.reduce_buckets_resident(cfg):
                comps["zero_reduce_buckets"] = ds.reduce_buckets(cfg, arch)
            transient = ds.offload_backward_transient(cfg, arch)
            if transient:
                comps["offload_gradient_copies"] = transient
    epilogue = ds.offload_epilogue(cfg, arch)
    if epilogue:  # the backward's end: the last gradient leaves for the host after the activations are gone
        instants["offload_epilogue"] = {**epilogue, "rollout_buffers": buffers}
    return release.train_instants(cfg, arch, instants, saved + norm_saved)


def train_phase(cfg: RunConfig, arch: Arch, tensors: str = opt.REAL) -> tuple[dict[str, int], str]:
    """The largest training instant and its name, counted on the GPU: without what CPU offload moves to the host
    (`estimator/step/offload.py`), so an offloaded run's peak is the instant that peaks on its GPU."""
    instants, gone = train_instants(cfg, arch, tensors), offload_moved(cfg)
    name = max(instants, key=lambda k: sum(v for c, v in instants[k].items() if c not in gone))
    return instants[name], name


def optimizer_phase(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Full gradients + the optimizer's step temporaries (under ZeRO, + the flattened fp32 gradient copies)."""
    return {
        "gradients": _phase_gradients(cfg, opt.gradients(cfg, arch)),
        "optimizer_temporaries": shard(cfg, "optimizer_temporaries", opt.optimizer_temporaries(cfg, arch))
        + ds.optimizer_step_copies(cfg, arch),
        "rollout_buffers": gen.rollout_buffers(cfg),
    }


@dataclass(frozen=True)
class StepParts:
    """One step's memory before merging: what stays resident, each phase's own components, the train peak's name."""

    resident: dict[str, int]
    phases: dict[str, dict[str, int]]
    train_instant: str


def parts(cfg: RunConfig, arch: Arch, tensors: str = opt.REAL) -> StepParts:
    """The single-GPU step's parts, with older TRL releases' phase differences applied (terms/release.py)."""
    own = {GENERATE: generate_phase(cfg, arch), SCORE: score_phase(cfg, arch)}
    own[TRAIN], instant = train_phase(cfg, arch, tensors)
    own[OPTIMIZER] = optimizer_phase(cfg, arch)
    return StepParts(resident(cfg, arch), release.phases(cfg, arch, own), instant)
