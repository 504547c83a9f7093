"""The phases of one GRPO step on rank 0 of N FSDP2 ranks (accelerate fsdp_version 2, FULL_SHARD or SHARD_GRAD_OP).

Held to rank-0 traces (`results/traced/tuned/multigpu.jsonl`, `sweeps/trace/distributed.py`). What differs from one GPU:

* resident: fp32 parameter shards (accelerate upcasts trainable parameters under mixed precision) and fp32 AdamW
  shards, Σ ceil(dim0/N)·rest elements (`sharding.fsdp_sharded_params`);
* compute runs on bf16 all-gathered parameters (MixedPrecisionPolicy.param_dtype): activations, the KV cache and
  the log-prob head are the single-GPU terms of a bf16 model (no autocast weight cache);
* the tail group (final norm + lm_head, + the tied embedding) stays gathered from the first forward of the step
  to its post-backward (`sharding.fsdp_tail_unsharded`);
* a forward holds the current group's all-gather output and unsharded parameters, and FSDP2 keeps the previous
  group's all-gather output alive until the next copy-out (`FSDPParamGroup.wait_for_unshard`); backward holds the
  current layer's unsharded parameters and gradients, the prefetched next layer's all-gather and the previous
  layer's reduce-scatter input (`FSDPCommContext.reduce_scatter_state`);
* gradients leave backward as fp32 shards (reduce-scatter in bf16, then cast to the shard's dtype);
* LoRA: the frozen base is sharded in its load dtype (only parameters that require grad are upcast), the adapters
  and their AdamW state are fp32 shards, and no [V, H] head or embedding gradient exists.
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.step import single
from estimator.step.single import StepParts
from estimator.terms import generation as gen
from estimator.terms import optimizer as opt
from estimator.terms import sharding as sh
from estimator.terms import weights
from estimator.units import nbytes


def compute_config(cfg: RunConfig) -> RunConfig:
    """The config the activation / head / KV terms see: a bf16 model on one GPU (the gathered parameters' dtype)."""
    dtype = "bfloat16" if cfg.bf16 else cfg.dtype
    return cfg.with_(dtype=dtype, sharding="none")


def _shard_fraction(cfg: RunConfig, arch: Arch) -> float:
    return sh.fsdp_shard_numel(arch, cfg.num_gpus) / arch.total_params


def _lora_shard(cfg: RunConfig, arch: Arch) -> int:
    """Rank 0's elements of the LoRA adapters: ceil(adapters / N) (their rank-r dims are small; padding ignored)."""
    return -(-weights.lora_params(cfg, arch) // cfg.num_gpus)


def resident(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """fp32 parameter shards + the optimizer's state for them (AdamW: 2 fp32 per element). LoRA: the frozen base
    stays in its load dtype (accelerate upcasts only parameters that require grad), adapters fp32."""
    if cfg.use_peft:
        lora = _lora_shard(cfg, arch)
        return {
            "weights": sh.fsdp_shard_numel(arch, cfg.num_gpus) * nbytes(cfg.dtype),
            "lora_adapters": lora * sh.fsdp_shard_dtype_bytes(cfg),
            "optimizer_state": 2 * 4 * lora,
        }
    full32 = cfg.with_(dtype="float32" if sh.fsdp_shard_dtype_bytes(cfg) == 4 else cfg.dtype, sharding="none")
    return {
        "weights": sh.fsdp_sharded_params(cfg, arch),
        "optimizer_state": int(opt.optimizer_state(full32, arch) * _shard_fraction(cfg, arch)),
    }


def gradient_shards(cfg: RunConfig, arch: Arch, numel: int) -> int:
    """Reduce-scattered gradients of `numel` parameters as rank 0's fp32 shards."""
    return -(-numel // cfg.num_gpus) * sh.fsdp_shard_dtype_bytes(cfg)


def forward_gathers(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Gather instants in a forward: the first group's (tied: a layer; untied: the embedding) all-gather output and
    unsharded parameters beside the tail's unsharded parameters and the all-gather output FSDP2 still holds."""
    tail, layer = sh.fsdp_tail_unsharded(cfg, arch), sh.fsdp_layer_unsharded(cfg, arch)
    if arch.tie_word_embeddings:  # the tail (with the embedding) is the first group gathered
        return {"start": 2 * tail + 2 * layer, "steady": tail + 2 * layer}
    # untied: the embedding group's all-gather output and parameters open the forward; after the first forward
    # the embedding and the tail stay gathered and one V·H all-gather output is still held (traced, 7B/14B)
    emb = arch.embedding_params * sh.fsdp_gather_bytes(cfg)
    return {"start": 2 * emb, "steady": emb + 2 * tail}


def _backward_end(cfg: RunConfig, arch: Arch, trainable: int, tail: int, tail_in_bwd: int) -> dict[str, int]:
    """What rank 0 holds as backward ends, beside the last activations: the embedding's backward, or none (LoRA)."""
    emb = arch.embedding_params * sh.fsdp_gather_bytes(cfg)
    layer = sh.fsdp_layer_unsharded(cfg, arch)
    if cfg.use_peft:  # the frozen embedding has no backward: backward ends at the first layer
        ends = {"gathered_weights": tail_in_bwd, "gradients": gradient_shards(cfg, arch, trainable)}
    elif arch.tie_word_embeddings:
        # the embedding's backward inside the still-gathered tail: the head's bf16 [V, H] gradient, the embedding's,
        # and their sum, beside every layer's fp32 shard and the last layer's held reduce-scatter input
        ends = {
            "gathered_weights": tail,
            "gradients": gradient_shards(cfg, arch, arch.num_layers * arch.layer_params),
            "gradient_buffers": 3 * emb + layer,
        }
    else:
        # the embedding's own group: its bf16 gradient, reduce-scatter input and output, one V·H all-gather output
        # still held, beside every other shard
        ends = {
            "gathered_weights": emb,
            "gradients": gradient_shards(cfg, arch, arch.total_params),
            "gradient_buffers": 2 * emb + -(-emb // cfg.num_gpus),
        }
    return ends


def _train(cfg: RunConfig, arch: Arch, every: int | None) -> tuple[dict[str, int], str]:
    """The largest training instant on rank 0 and its name: the single-GPU instants' activations beside the
    groups gathered and the gradient shards held at that instant (`every`: all groups, under SHARD_GRAD_OP)."""
    c = compute_config(cfg)
    tail, layer = sh.fsdp_tail_unsharded(cfg, arch), sh.fsdp_layer_unsharded(cfg, arch)
    instants = single.train_instants(c, arch)
    peft = cfg.use_peft  # only the adapters have gradients: no [V, H] head or embedding gradient, no big RS
    trainable = weights.lora_params(cfg, arch) if peft else arch.total_params
    grads_layers_done = gradient_shards(
        cfg, arch, trainable if peft else (arch.num_layers - 1) * arch.layer_params
    )
    tied_grad = opt.tied_gradient_buffer(c, arch)  # the tied [V, H] grad waits unsharded for the embedding's
    untied_head = not arch.tie_word_embeddings and not peft
    head_grad_shard = gradient_shards(cfg, arch, arch.lm_head_params) if untied_head else 0
    # this layer's params + grads, the prefetched all-gather, the held RS input (LoRA: params + prefetch)
    backward_gathers = (2 if peft else 4) * layer
    # the tail stays gathered through backward when it holds the tied embedding, or when it has no gradient (LoRA:
    # FSDP2 reshards a group without gradients only at the end of backward); an untied full FT reshards it early
    tail_in_bwd = tail if arch.tie_word_embeddings or peft else 0
    fsdp_instants = {
        "head_forward": {**instants["head_forward"], "gathered_weights": tail + layer},
        "head_backward": {**instants["head_backward"], "gathered_weights": tail + layer},
    }
    if "first_layer_backward" in instants:
        fsdp_instants["last_layer_backward"] = {
            "activations": instants["last_layer_backward"]["activations"],
            "gathered_weights": tail_in_bwd + backward_gathers,
            "gradient_buffers": tied_grad if arch.tie_word_embeddings else 0,
            "gradients": head_grad_shard,
        }
        # untied: the group prefetched during the first layer's backward is the embedding (its V·H all-gather)
        prefetched_emb = (
            0 if arch.tie_word_embeddings else arch.embedding_params * sh.fsdp_gather_bytes(cfg) - layer
        )
        fsdp_instants["first_layer_backward"] = {
            "activations": instants["first_layer_backward"]["activations"],
            "gathered_weights": tail_in_bwd + backward_gathers + prefetched_emb,
            "gradient_buffers": tied_grad,
            "gradients": grads_layers_done + head_grad_shard,
        }
    else:
        fsdp_instants["last_layer_backward"] = {
            "activations": instants["last_layer_backward"]["activations"],
            "gathered_weights": tail_in_bwd + backward_gathers,
            "gradient_buffers": tied_grad if arch.tie_word_embeddings else 0,
            "gradients": head_grad_shard,
        }
    if every is not None:  # forward left every group gathered; each layer reshards after its reduce-scatter
        for name in ("head_forward", "head_backward"):
            fsdp_instants[name]["gathered_weights"] = every
        fsdp_instants["last_layer_backward"]["gathered_weights"] = every + 2 * layer  # + grads, held RS input
    ends = _backward_end(cfg, arch, trainable, tail, tail_in_bwd)
    fsdp_instants["backward_end"] = {"activations": instants["backward_end"]["activations"], **ends}
    for comps in fsdp_instants.values():
        comps["rollout_buffers"] = gen.rollout_buffers(cfg)
    name = max(fsdp_instants, key=lambda k: sum(fsdp_instants[k].values()))
    return fsdp_instants[name], name


def rank0_parts(cfg: RunConfig, arch: Arch) -> StepParts:
    """Rank 0's resident shards, each phase's own components and the train peak's name, from the single-GPU
    terms on the bf16 compute model."""
    c = compute_config(cfg)
    held = resident(cfg, arch)
    tail, layer = sh.fsdp_tail_unsharded(cfg, arch), sh.fsdp_layer_unsharded(cfg, arch)
    fwd = forward_gathers(cfg, arch)
    out: dict[str, dict[str, int]] = {}

    sgo = cfg.fsdp_sharding_strategy == "SHARD_GRAD_OP"
    if sgo:  # nothing is resharded after forward: after the first forward every group stays gathered
        every = sh.fsdp_all_unsharded(cfg, arch)
        held_flat = (
            layer if arch.tie_word_embeddings else max(layer, tail)
        )  # the last group's all-gather output
        fwd = {"start": every + held_flat, "steady": every + held_flat}
    g = dict(single.generate_phase(c, arch))
    g.pop("gathered_weights", None)
    gen_start = {"gathered_weights": fwd["start"]}
    gen_steady = {**g, "gathered_weights": fwd["steady"]}
    out["generate"] = max(gen_start, gen_steady, key=lambda d: sum(d.values()))

    if cfg.runs_reference_pass or cfg.runs_old_logprob_pass:
        s = dict(single.score_phase(c, arch))
        s["gathered_weights"] = fwd["steady"]
    else:
        s = {"rollout_buffers": gen.rollout_buffers(cfg), "gathered_weights": every if sgo else tail}
    out["score"] = s

    out["train"], name = _train(cfg, arch, every if sgo else None)
    trainable = weights.lora_params(cfg, arch) if cfg.use_peft else arch.total_params
    out["optimizer"] = {
        "gradients": gradient_shards(cfg, arch, trainable),
        "optimizer_temporaries": int(
            opt.optimizer_temporaries(c.with_(dtype="float32"), arch) * _shard_fraction(cfg, arch)
        ),
        "rollout_buffers": gen.rollout_buffers(cfg),
    }
    return StepParts(held, out, name)
