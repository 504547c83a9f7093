"""Multi-GPU sharding: DeepSpeed ZeRO-2/3 and FSDP full-shard divide model states across GPUs.

Rajbhandari et al. 2020 (ZeRO), Fig. 1: ZeRO-2 shards gradients and optimizer state (2Ψ + (2 + K)Ψ/N);
ZeRO-3 also shards the parameters ((2 + 2 + K)Ψ/N). FSDP FULL_SHARD shards like ZeRO-3. Activations are
never sharded: each rank runs its own micro-batch.
"""

from __future__ import annotations

from estimator.config import RunConfig


def shard(cfg: RunConfig, component: str, nbytes: int) -> int:
    """bytes / N for the states this sharding scheme partitions, unchanged otherwise."""
    n = cfg.num_gpus
    if n <= 1 or cfg.sharding == "none":
        return nbytes
    sharded = {
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
    }[cfg.sharding]
    return -(-nbytes // n) if component in sharded else nbytes


def gathered_weights(cfg: RunConfig, full_weights: int) -> int:
    """ZeRO-3 gathers the full policy for generate (ds3_gather_for_generation=True, MU:141-150): full − own shard."""
    if cfg.sharding in ("zero3", "fsdp") and cfg.num_gpus > 1:
        return full_weights - shard(cfg, "weights", full_weights)
    return 0
