"""CPU offload: what leaves the GPU, what the host must hold instead (DeepSpeed ZeRO-Offload, FSDP2 CPUOffloadPolicy).

Sources, at the versions read:
* DeepSpeed 0.19.8 `deepspeed/runtime/zero/stage_1_and_2.py` (ZeRO-1/2, `offload_optimizer.device: cpu`):
  `DeepSpeedZeroOptimizer.__init__` clones the fp32 master partition to the host and pins it when `pin_memory`
  (`weights_partition`), beside a 16-bit host copy of it (`param_buffer_of_bit16_for_cpu_offload_groups`);
  `initialize_optimizer_states` gives it an fp32 host gradient partition, pinned; `DeepSpeedCPUAdam` keeps exp_avg / exp_avg_sq in fp32 beside the partition on the host; gradients
  leave the GPU per parameter through `temp_grad_buffer_for_gpu_offload` and its pinned host twin
  `temp_grad_buffer_for_cpu_offload`, each `largest_param_numel` elements of the 16-bit dtype.
* DeepSpeed 0.19.8 `stage3.py` / `partition_parameters.py` (ZeRO-3): with `offload_optimizer` the fp32 master
  partition is a plain host copy (`_create_fp32_partitions`: `.to(cpu, fp32).clone()`, not pinned), its fp32
  gradient one pinned buffer per sub-group of at most `sub_group_size` elements (`initialize_optimizer_states`),
  and the 16-bit gradient partitions one pinned flat buffer (`grad_partitions_flat_buffer`); with `offload_param`
  each parameter's 16-bit partition is pinned on its own when it is partitioned (`Init._partition_param`), then
  copied into one pinned flat buffer per parameter group (`_create_param_groups_fp16_flat_cpu_memory`).
* torch 2.13 FSDP2 `CPUOffloadPolicy(pin_memory=True)` (`FSDPParam._init_sharded_param` pins the
  padded shard, `foreach_reduce` copies each reduced gradient shard to the host): the sharded parameters (fp32 under accelerate's mixed precision) and the reduce-scattered gradient
  shards live on the host, pinned; the optimizer steps on the host parameters, so its state is on the host.
* Loading (transformers `from_pretrained` without `cpu_ram_efficient_loading` / `zero3_init_flag`): every process
  of a node holds the whole model in host memory before it is sharded, in the load dtype.
* The process itself (`PROCESS_BEFORE_LOAD_BYTES`, `PROCESS_TRAINING_BYTES`): measured, not read from code.

Every function is bytes for ONE rank unless it says node; `n` is the number of data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30

# Each training process's own host memory beside the model states (measured-gpu: the host probe's RSS of GRPO runs
# on one H200, torch 2.11+cu130, transformers 5.24, TRL 1.16, DeepSpeed 0.19.8; results/raw/mincard.jsonl and
# results/raw/zero-offload.jsonl, held to them by tests/accuracy/test_measured_host.py). Before loading (Python,
# torch, transformers and TRL imported, the CUDA context up): 1.03-1.05 GiB on 6 runs. While training, with no state
# on the host (the CUDA libraries' host side, tokenizer, data, Python's heap): 2.34-3.46 GiB on 4 runs of 0.5B-4B;
# the two ZeRO-Offload runs held 2.5 and 3.0 GiB beyond the states the estimate counts. The largest of each.
PROCESS_BEFORE_LOAD_BYTES = 1076 * 2**20  # 1.05 GiB
PROCESS_TRAINING_BYTES = 3541 * 2**20  # 3.46 GiB


@dataclass(frozen=True)
class Offload:
    """Which model states live on the host (DeepSpeed offload_optimizer / offload_param, FSDP fsdp_offload_params)."""

    optimizer: bool = False
    param: bool = False
    pin_memory: bool = True


def partition(numel: int, n: int) -> int:
    """Elements of one rank's partition: ceil(numel / n)."""
    return -(-numel // n)


# ---- DeepSpeed ZeRO-Offload ----------------------------------------------------------------------------------


def ds_host_master_weights(trainable: int, n: int) -> int:
    """fp32 master partition on the host: 4 · ceil(T / n) (`weights_partition`)."""
    return 4 * partition(trainable, n)


def ds_host_gradients(trainable: int, n: int) -> int:
    """fp32 gradient partition on the host: 4 · ceil(T / n) (`initialize_optimizer_states`)."""
    return 4 * partition(trainable, n)


def ds_host_optimizer_state(trainable: int, n: int) -> int:
    """DeepSpeedCPUAdam's exp_avg and exp_avg_sq in fp32: 8 · ceil(T / n)."""
    return 8 * partition(trainable, n)


def ds_host_bit16_partition(trainable: int, n: int, stage: int) -> int:
    """ZeRO-1/2 keep a 16-bit host copy of the partition to copy back from: 2 · ceil(T / n) (`param_buffer_of_bit16_for_cpu_offload_groups`); ZeRO-3: 0."""
    return 2 * partition(trainable, n) if stage in (1, 2) else 0


def ds_host_params(params: int, n: int) -> int:
    """ZeRO-3 offload_param: the 16-bit parameter partition on the host, 2 · ceil(P / n) (`Init._partition_param`)."""
    return 2 * partition(params, n)


def ds_grad_staging(largest_param_numel: int) -> int:
    """One 16-bit staging buffer of the largest parameter, on the GPU and again pinned on the host (`temp_grad_buffer_for_gpu_offload` / `_for_cpu_offload`): 2 · numel."""
    return 2 * largest_param_numel


SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's zero_optimization.sub_group_size (elements)


def sub_groups(numel: int, size: int = SUB_GROUP_SIZE) -> list[int]:
    """ZeRO-3's optimizer sub-groups of a partition of `numel` elements (`_create_fp16_sub_groups` closes one at
    `size` elements; the parameter that crosses it stays in it, which this split ignores)."""
    return [size] * (numel // size) + ([numel % size] if numel % size else [])


def ds_host_per_rank(
    trainable: int, params: int, n: int, stage: int, off: Offload, largest: int
) -> dict[str, int]:
    """Host bytes one DeepSpeed rank holds under `off` (empty when nothing is offloaded)."""
    out: dict[str, int] = {}
    if off.optimizer:
        out["master_weights"] = ds_host_master_weights(trainable, n)
        out["optimizer_state"] = ds_host_optimizer_state(trainable, n)
        out["gradients"] = ds_host_gradients(trainable, n)
        out["bit16_partition"] = ds_host_bit16_partition(trainable, n, stage)
        if stage == 3:  # grad_partitions_flat_buffer: the 16-bit gradient partitions
            out["bit16_gradients"] = 2 * partition(trainable, n)
        if stage in (1, 2):  # stage_1_and_2.py's pinned twin of the GPU staging buffer
            out["grad_staging"] = ds_grad_staging(largest)
    if off.param and stage == 3:
        out["weights"] = ds_host_params(params, n)
    return out


def ds_gpu_moved(stage: int, off: Offload) -> set[str]:
    """GPU components that move to the host: optimizer offload takes master weights, optimizer state and the
    fp32 gradient partition (the 16-bit weights stay); ZeRO-3 param offload also takes the weight partition."""
    moved = set()
    if off.optimizer:
        moved |= {"master_weights", "optimizer_state", "optimizer_temporaries", "gradients"}
    if off.param and stage == 3:
        moved |= {"weights", "reference_weights"}
    return moved


# ---- FSDP2 CPUOffloadPolicy -------------------------------------------------------------------------------------


def fsdp_host_per_rank(shard_numel: int, shard_bytes: int, adam_states: int = 2) -> dict[str, int]:
    """Host bytes of one FSDP2 rank with CPUOffloadPolicy: parameter and gradient shards (pinned) and the optimizer's
    state for them, `adam_states` fp32 tensors per element (AdamW: 2)."""
    return {
        "weights": shard_numel * shard_bytes,
        "gradients": shard_numel * shard_bytes,
        "optimizer_state": adam_states * shard_numel * 4,
    }


def fsdp_gpu_moved() -> set[str]:
    """CPUOffloadPolicy moves every sharded state to the host; only gathered parameters, gradients before their
    reduce-scatter, and activations stay on the GPU."""
    return {"weights", "optimizer_state", "optimizer_temporaries", "gradients", "master_weights"}


def fsdp_h2d_shard_copy(group_shard_numel: int, shard_bytes: int) -> int:
    """Before each all-gather the group's host shard is copied to the GPU (`.to(device)`), then cast: one group's
    shard in its dtype, transient."""
    return group_shard_numel * shard_bytes


# ---- host RAM ---------------------------------------------------------------------------------------------------


def model_load_host(params: int, load_bytes: int, ranks_per_node: int, efficient_loading: bool) -> int:
    """Node host bytes while loading: every process holds the whole model (P · bytes · ranks), or only rank 0 with
    `fsdp_cpu_ram_efficient_loading` / `zero3_init_flag`."""
    return params * load_bytes * (1 if efficient_loading else ranks_per_node)


def pinned_block(nbytes: int) -> int:
    """What one pinned tensor of `nbytes` takes: torch's CachingHostAllocator rounds every page-locked allocation up
    to a power of two (`c10::llvm::PowerOf2Ceil` in ATen/core/CachingHostAllocator.h, torch 2.11-2.13, below its
    default unlimited `pinned_max_round_threshold`), and the block is pinned whole: a 6.2 GB fp32 partition takes
    8 GiB."""
    return 1 << (nbytes - 1).bit_length() if nbytes > 0 else 0


def ds_host_blocks(
    per_rank: dict[str, int], off: Offload, stage: int = 2, param_partitions: tuple[int, ...] = ()
) -> dict[str, int]:
    """One DeepSpeed rank's host bytes as allocated: each pinned buffer (`pin_memory`) in its power-of-two block
    (`pinned_block`). Not pinned: AdamW's state, and under ZeRO-3 the fp32 master copy. ZeRO-3 pins the fp32
    gradient per sub-group, and with parameter offload each parameter's partition (`param_partitions`, bytes) on its
    own before the flat copy; torch's host allocator keeps those blocks cached, so they stay in the process."""
    if not off.pin_memory:
        return dict(per_rank)
    unpinned = ("optimizer_state", "master_weights") if stage == 3 else ("optimizer_state",)
    out = {}
    for k, v in per_rank.items():
        if k in unpinned:
            out[k] = v
        elif k == "gradients" and stage == 3:
            out[k] = sum(pinned_block(4 * g) for g in sub_groups(v // 4))
        else:
            out[k] = pinned_block(v)
    if stage == 3 and off.param and param_partitions:
        out["weight_partitions"] = sum(pinned_block(b) for b in param_partitions)
    return out


def host_ram_node(per_rank: dict[str, int], ranks_per_node: int) -> int:
    """Node host bytes in training: Σ per-rank host bytes × ranks on the node."""
    return sum(per_rank.values()) * ranks_per_node


def pinned_bytes(
    per_rank: dict[str, int], off: Offload, unpinned: tuple[str, ...] = ("optimizer_state",)
) -> int:
    """Page-locked bytes of one rank (cannot be swapped; `ulimit -l` and containers cap them): all but `unpinned`
    (ZeRO-3 leaves its fp32 master copy unpinned too: `ds_host_blocks`)."""
    if not off.pin_memory:
        return 0
    return sum(v for k, v in per_rank.items() if k not in unpinned)


def check_host_ram(need_bytes: int, have_gib: float) -> str | None:
    """None when `need_bytes` fits in `have_gib` GiB of host RAM, else one line saying by how much it does not."""
    have = have_gib * GIB
    if need_bytes <= have:
        return None
    return (
        f"host RAM: needs {need_bytes / GIB:.1f} GiB (estimated), --host-ram is {have_gib:g} GiB: "
        f"{(need_bytes - have) / GIB:.1f} GiB short"
    )
