"""Multi-GPU sharding: DeepSpeed ZeRO-2/3 and FSDP full-shard divide model states across GPUs.

Rajbhandari et al. 2020 (ZeRO), Fig. 1: with mixed precision every parameter costs 2 (bf16 weights) + 2
(bf16 grads) + K = 12 (fp32 master, m, v) bytes. ZeRO-2 shards gradients and optimizer state
(2Ψ + (2 + K)Ψ/N); ZeRO-3 also shards the parameters ((2 + 2 + K)Ψ/N). DeepSpeed casts the module to bf16
when `bf16=True`, so TRL's fp32 default load does not apply under ZeRO. FSDP FULL_SHARD shards weights,
gradients and optimizer state in the parameter dtype. Activations are never sharded: each rank runs its own
micro-batch.

Line references (`GT:N-M`, `CK:N`, ...) are upstream files at pinned versions: estimator/terms/SOURCES.md.
"""

from __future__ import annotations

from estimator.config import RunConfig

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
    """ZeRO-3 / FSDP gather the full policy for generate (ds3_gather_for_generation=True, MU:141-150): full − own shard."""
    if cfg.sharding in ("zero3", "fsdp") and cfg.num_gpus > 1:
        return full_weights - shard(cfg, "weights", full_weights)
    return 0
