"""Multi-GPU sharding: DeepSpeed ZeRO-2/3 and FSDP full-shard divide model states across GPUs.

Rajbhandari et al. 2020 (ZeRO), Fig. 1: with mixed precision every parameter costs 2 (bf16 weights) + 2
(bf16 grads) + K = 12 (fp32 master, m, v) bytes. ZeRO-2 shards gradients and optimizer state
(2Ψ + (2 + K)Ψ/N); ZeRO-3 also shards the parameters ((2 + 2 + K)Ψ/N). DeepSpeed casts the module to bf16
when `bf16=True`, so TRL's fp32 default load does not apply under ZeRO. FSDP (accelerate's FSDP2) is assembled
in `estimator/step/fsdp.py` from the FSDP2 terms below and held to rank-0 traces: accelerate upcasts trainable
parameters to fp32 under mixed precision, so the shards are fp32 whatever the load dtype. Activations are never
sharded: each rank runs its own micro-batch.

Line references (`GT:N-M`, `CK:N`, ...) are upstream files at pinned versions: estimator/terms/SOURCES.md.
"""

from __future__ import annotations

import functools

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig

SHARDED = {
    "zero2": {"gradients", "optimizer_state", "master_weights", "optimizer_temporaries"},
    "zero3": {
        "weights",
        "reference_weights",
        "gradients",
        "optimizer_state",
        "master_weights",
        "optimizer_temporaries",
    },
    "fsdp": {"weights", "reference_weights", "gradients", "optimizer_state", "optimizer_temporaries"},
}


def is_deepspeed(cfg: RunConfig) -> bool:
    """ZeRO-2/3 over more than one GPU."""
    return cfg.sharding in ("zero2", "zero3")


def is_ddp(cfg: RunConfig) -> bool:
    """Several GPUs without sharding: accelerate wraps the policy in torch's DistributedDataParallel."""
    return cfg.num_gpus > 1 and cfg.sharding == "none"


def ddp_gradient_buckets(cfg: RunConfig, gradient_bytes: int) -> int:
    """DDP's flat gradient buckets, held from the wrap on through every phase: one more copy of the trainable
    parameters' gradients (`gradient_bytes`, each in its parameter's dtype), 0 without DDP.

    torch 2.13 `Reducer::initialize_buckets` (torch/csrc/distributed/c10d/reducer.cpp) allocates each bucket's
    `gradients` as one flat tensor over its parameters (`at::empty({offset}, options)`, the parameters' dtype);
    unless `gradient_as_bucket_view`, each `.grad` stays a tensor of its own that is copied into the bucket for
    the all-reduce and back. accelerate 1.15 leaves it off (`DistributedDataParallelKwargs.gradient_as_bucket_view
    = False`, https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/utils/dataclasses.py#L188),
    and TRL and transformers' Trainer pass no other. Measured on CPU (2 gloo ranks, tiny-2M full fine-tune in
    fp32): every phase's peak +8,008,192 bytes = 2,002,048 trainable parameters x 4.
    """
    return gradient_bytes if is_ddp(cfg) else 0


def deepspeed_dtype_config(cfg: RunConfig) -> RunConfig:
    """Under DeepSpeed with bf16 the model is cast to bf16 (fp32 master weights and AdamW state live in the optimizer)."""
    if is_deepspeed(cfg) and cfg.bf16 and not cfg.load_in_4bit:
        return cfg.with_(dtype="bfloat16")
    return cfg


def shard(cfg: RunConfig, component: str, nbytes: int) -> int:
    """ceil(bytes / N) for the states this sharding scheme partitions, unchanged otherwise."""
    n = cfg.num_gpus
    if n <= 1 or cfg.sharding == "none":
        return nbytes
    return -(-nbytes // n) if component in SHARDED[cfg.sharding] else nbytes


def gathered_weights(cfg: RunConfig, full_weights: int) -> int:
    """ZeRO-3 gathers the full policy for generate (ds3_gather_for_generation=True, MU:141-150:
    `deepspeed.zero.GatheredParameters(model.parameters())`). DeepSpeed 0.19.8 `partition_parameters.py`: over
    several GPUs the all-gather writes every parameter into a new full-size buffer (`_all_gather_dtype`'s
    `flat_tensor`) while the rank's own partition (`ds_tensor`) stays allocated, so the GPU holds the full 16-bit
    weights beside its shard; on one GPU `NoGatherHandle` points the parameter at its partition moved to the GPU,
    no copy when the partition is already there, a full copy when offload_param keeps it on the host.
    (FSDP2 does not gather for generation: TRL's summon_full_params is a no-op for it, trl/distributed.py
    `DistributedBackend.summon_full_params`; estimator/step/fsdp.py. The FSDP branch below is the shard model of
    QLoRA under FSDP, which is not traced.)"""
    if cfg.sharding == "zero3" and (cfg.num_gpus > 1 or cfg.offload_param):
        return full_weights
    if cfg.sharding == "fsdp" and cfg.num_gpus > 1:
        return full_weights - shard(cfg, "weights", full_weights)
    return 0


# ---- ZeRO-3's parameter fetches (DeepSpeed 0.19.8 runtime/zero/partitioned_param_coordinator.py) -------------
# Under ZeRO-3 every submodule's parameters are all-gathered before it runs (`fetch_sub_module`) and released after
# (`release_sub_module`), except those `__params_to_release` keeps: parameters that recur among the next modules of
# the recorded trace before `stage3_max_reuse_distance` elements have been traversed (default 1e9,
# runtime/zero/config.py). Parameters below `stage3_param_persistence_threshold` (HF "auto": 10 x hidden) persist,
# gathered all run; the prefetcher gathers up to `stage3_prefetch_bucket_size` elements ahead (HF "auto":
# 0.9 x hidden^2, DeepSpeed's default 5e7). The first step records the trace and releases everything after use;
# from the second on the rules above hold, so the walk below models them (the larger case). Each gathered
# parameter is a new full-size buffer beside the rank's partition (`gathered_weights`).
ZERO3_MAX_REUSE_DISTANCE = 10**9  # DeepSpeed's default stage3_max_reuse_distance (elements)
ZERO3_PREFETCH_BUCKET = 5 * 10**7  # DeepSpeed's default stage3_prefetch_bucket_size (elements)


def fetches_parameters(cfg: RunConfig) -> bool:
    """ZeRO-3 gathers each module's parameters onto the GPU: over several GPUs, or on one with parameter offload
    (on one GPU without it the partition is the parameter: `NoGatherHandle`)."""
    return cfg.sharding == "zero3" and (cfg.num_gpus > 1 or cfg.offload_param)


HEAD = "@head"  # TRL's fused log-prob head gathers the head's weight itself (GatheredParameters), outside the hooks


def _modules(arch: Arch) -> tuple[list[tuple[str, int]], tuple[str, int], int]:
    """One forward's module order as ZeRO-3's hooks see it up to the last decoder layer, (module id, elements it
    gathers); the head as (id, elements), a tied head being the embedding's parameter; and the elements that
    persist (norms and biases, below the persistence threshold). Fused MoE experts are one module."""
    weight = [lin for lin in arch.layer_linears if lin.is_nn_linear]
    experts = sum(
        lin.count * lin.in_features * lin.out_features for lin in arch.layer_linears if not lin.is_nn_linear
    )
    order: list[tuple[str, int]] = [("embed", arch.embedding_params)]
    for layer in range(arch.num_layers):
        order += [(f"{layer}.{lin.name}", lin.count * lin.in_features * lin.out_features) for lin in weight]
        if experts:
            order.append((f"{layer}.experts", experts))
    head = ("embed", arch.embedding_params) if arch.tie_word_embeddings else ("head", arch.lm_head_params)
    biases = sum(lin.count * lin.out_features for lin in arch.layer_linears if lin.bias)
    persistent = arch.num_layers * (arch.layer_norm_params + biases) + arch.final_norm_params
    return order, head, persistent


def _pass_order(arch: Arch, kind: str, checkpointing: bool) -> list[tuple[str, int]]:
    """The module order of one phase. "decode": one generated token's forward, the head running as a module
    (every top-level forward starts a new trace, `_start_of_forward_hook` -> `reset_step`, so nothing is kept
    from one token to the next). "forward" (a no-grad scoring pass) and "train" (forward, then backward in
    reverse; with gradient checkpointing each layer's forward recomputed just before its backward): TRL's fused
    head reads the head's weight directly and gathers it with `GatheredParameters` (trl trainer/utils.py
    `maybe_gather_lm_head_ctx`), so the hooks never see it; HEAD marks where it is gathered, at the turnaround."""
    layers, head, _ = _modules(arch)
    if kind == "decode":
        return [*layers, head]
    marker = (HEAD, head[1])
    if kind == "forward":
        return [*layers, marker]
    if not checkpointing:
        return [*layers, marker, *layers[::-1]]
    per_layer = (len(layers) - 1) // max(arch.num_layers, 1)
    backward = [marker]
    for layer in reversed(range(arch.num_layers)):
        mods = layers[1 + layer * per_layer : 1 + (layer + 1) * per_layer]
        backward += mods + mods[::-1]
    return [*layers, *backward, layers[0]]


@functools.cache
def zero3_live_elements(
    arch: Arch, kind: str, checkpointing: bool, reuse: int = ZERO3_MAX_REUSE_DISTANCE
) -> int:
    """Most parameter elements gathered at once over a phase's module order: each module's are fetched when it
    runs and kept after it only if the module recurs before `reuse` elements of the order have been traversed
    (`__params_to_release`); at HEAD the fused head's weight is gathered beside them unless it is already."""
    order = _pass_order(arch, kind, checkpointing)
    head_id = "embed" if arch.tie_word_embeddings else "head"
    live: dict[str, int] = {}
    peak = 0
    for i, (module, n) in enumerate(order):
        if module == HEAD:
            peak = max(peak, sum(live.values()) + (0 if head_id in live else n))
            continue
        live[module] = n
        peak = max(peak, sum(live.values()))
        traversed = 0
        for later, m in order[i + 1 :]:
            if traversed >= reuse:
                break
            if later == module:
                break
            traversed += m if later != HEAD else 0
        else:
            del live[module]
            continue
        if traversed >= reuse:
            del live[module]
    return peak


def zero3_fetched_weights(cfg: RunConfig, arch: Arch, kind: str, full_weights: int) -> int:
    """Bytes of parameters ZeRO-3 holds gathered beside the partitions during a phase (`zero3_live_elements` +
    the persistent ones + one prefetch bucket), at the policy's bytes per parameter; 0 when it fetches nothing."""
    if not fetches_parameters(cfg):
        return 0
    _, _, persistent = _modules(arch)
    bucket = max(ZERO3_PREFETCH_BUCKET, int(0.9 * arch.hidden_size**2))
    live = zero3_live_elements(arch, kind, cfg.gradient_checkpointing) + persistent + bucket
    total = max(arch.total_params, 1)
    return min(full_weights, -(-full_weights * live // total))


# ---- FSDP2 as accelerate 1.15 applies it under TRL (traced: sweeps/trace/distributed.py) -----------------------
# accelerate `fsdp2_prepare_model` (accelerate/utils/fsdp_utils.py): trainable parameters upcast to fp32 when
# mixed_precision != "no"; `fully_shard` on every decoder layer (transformer_based_wrap); the untied input
# embedding gets its own group; final norm + lm_head (+ the tied embedding) form the tail group with
# reshard_after_forward=False; then the root. MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16).
# torch 2.13 FSDP2 (`_fully_shard/_fsdp_param.py`): each parameter is chunked on dim 0, rank 0 holds
# ceil(dim0 / N) rows, so padding falls on the last ranks; rank 0 holds the full chunk.


def is_fsdp(cfg: RunConfig) -> bool:
    """FSDP (accelerate fsdp_version 2) over more than one GPU, full fine-tune or LoRA: the traced cases. QLoRA
    under FSDP keeps the simple `shard` model (not traced: accelerate leaves uint8 4-bit weights unsharded)."""
    return cfg.sharding == "fsdp" and cfg.num_gpus > 1 and not cfg.load_in_4bit


def fsdp_shard_dtype_bytes(cfg: RunConfig) -> int:
    """Bytes per element of a sharded trainable parameter: fp32 under mixed precision (accelerate upcasts), else the load dtype."""
    return 4 if cfg.bf16 or cfg.dtype == "float32" else 2


def fsdp_gather_bytes(cfg: RunConfig) -> int:
    """Bytes per element of an all-gathered (unsharded) parameter: MixedPrecisionPolicy.param_dtype (bf16) or the shard's."""
    return 2 if cfg.bf16 else fsdp_shard_dtype_bytes(cfg)


def chunk_rows(rows: int, n: int) -> int:
    """Rows of rank 0's chunk of a dim-0 of `rows` over n ranks: ceil(rows / n) (torch.chunk, FSDPParam._init_sharded_param)."""
    return -(-rows // n)


def _layer_tensors(arch) -> list[tuple[int, int]]:
    """(dim0, numel / dim0) of every parameter of one decoder layer: linear weights, biases, norms."""
    out = []
    for lin in arch.layer_linears:
        out.append((lin.count * lin.out_features if lin.count > 1 else lin.out_features, lin.in_features))
        if lin.bias:
            out.append((lin.out_features * lin.count, 1))
    if arch.layer_norm_params:
        out.append((arch.layer_norm_params, 1))  # the layer's 1-D norms, taken as one for chunking
    return out


def fsdp_groups(arch) -> dict[str, tuple[int, list[tuple[int, int]]]]:
    """FSDP2 groups as accelerate makes them: name -> (count, parameter shapes as (dim0, rest))."""
    v, h = arch.vocab_size, arch.hidden_size
    tail = [(arch.final_norm_params, 1), (v, h)]  # final norm + lm_head (tied: the shared embedding)
    groups = {"layer": (arch.num_layers, _layer_tensors(arch)), "tail": (1, tail)}
    if not arch.tie_word_embeddings:
        groups["embedding"] = (1, [(v, h)])
    return groups


def fsdp_shard_numel(arch, n: int) -> int:
    """Elements rank 0 holds of every parameter: Σ ceil(dim0 / n) · rest over all groups."""
    return sum(
        count * sum(chunk_rows(d0, n) * rest for d0, rest in shapes)
        for count, shapes in fsdp_groups(arch).values()
    )


def fsdp_group_unsharded_numel(arch, name: str, n: int) -> int:
    """Elements of one group's all-gather output (= its unsharded parameters): n × rank 0's padded chunk."""
    _, shapes = fsdp_groups(arch)[name]
    return sum(n * chunk_rows(d0, n) * rest for d0, rest in shapes)


def fsdp_sharded_params(cfg: RunConfig, arch) -> int:
    """Rank 0's parameter shards: Σ ceil(dim0/N)·rest × (4 under mixed precision: accelerate upcasts to fp32)."""
    return fsdp_shard_numel(arch, cfg.num_gpus) * fsdp_shard_dtype_bytes(cfg)


def fsdp_tail_unsharded(cfg: RunConfig, arch) -> int:
    """The tail group (final norm + lm_head, tied embedding) is never resharded after forward: gathered in bf16 from
    the first forward of the step until its post-backward reshard (accelerate passes reshard_after_forward=False)."""
    return fsdp_group_unsharded_numel(arch, "tail", cfg.num_gpus) * fsdp_gather_bytes(cfg)


def fsdp_layer_unsharded(cfg: RunConfig, arch) -> int:
    """One decoder layer's all-gather output (or its unsharded parameters), in param_dtype."""
    return fsdp_group_unsharded_numel(arch, "layer", cfg.num_gpus) * fsdp_gather_bytes(cfg)


def fsdp_all_unsharded(cfg: RunConfig, arch) -> int:
    """Every group gathered at once (SHARD_GRAD_OP after a forward): Σ groups' all-gather outputs, in param_dtype."""
    n = cfg.num_gpus
    return sum(
        count * fsdp_group_unsharded_numel(arch, name, n) for name, (count, _) in fsdp_groups(arch).items()
    ) * fsdp_gather_bytes(cfg)
