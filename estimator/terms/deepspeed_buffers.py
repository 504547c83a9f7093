"""DeepSpeed ZeRO's own buffers on each GPU, beside the partitions `sharding.py` divides (DeepSpeed 0.19.8,
`runtime/zero/stage3.py`, `stage_1_and_2.py`, `config.py`; SOURCES.md has the permalinks).

- Reduce buckets: with `contiguous_gradients` (the default) gradients are copied into a flat bucket of
  `reduce_bucket_size` elements (DeepSpeed's default 5e8; HF fills a JSON's "auto" with hidden_size^2) in the
  communication dtype (the model's 16-bit dtype under bf16) before they are reduce-scattered. ZeRO-3 allocates one
  per dtype when the optimizer is set up (`stage3.py` "IPG"), ZeRO-2 one at every backward's start, two with
  `overlap_comm` (off by default below stage 3, `config.py` `overlap_comm_valid`; `setup_buckets`); both stay
  allocated.
- ZeRO-3's gradient partitions: `grad_partitions_flat_buffer`, one slot per parameter partition in the gradient
  accumulation dtype, allocated with the optimizer and never freed (`zero_grad` only drops `.grad`), on the GPU
  unless the optimizer is offloaded. Meanwhile a module's full gradient exists in backward until it is copied
  into a bucket: at most the largest trainable module's.
- The optimizer step: each sub-group (at most `sub_group_size`, 1e9 elements) of this rank's gradient partition is
  flattened into a 16-bit copy and converted to fp32 (`_prepare_fp32_grad_for_sub_group`; ZeRO-2's `step`: the
  same flatten and `.to(fp32)`), so for a moment both copies are live beside the fp32 master and Adam state.
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.terms import optimizer as opt
from estimator.units import nbytes

DEFAULT_REDUCE_BUCKET = 500_000_000  # DeepSpeed's zero_optimization.reduce_bucket_size (elements)
SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's zero_optimization.sub_group_size (elements)


def _zero(cfg: RunConfig) -> bool:
    return cfg.sharding in ("zero2", "zero3")


def _grad_bytes(cfg: RunConfig) -> int:
    """Bytes per gradient element under DeepSpeed: the module's dtype (cast to bf16 under bf16), fp32 otherwise."""
    return 2 if cfg.bf16 else nbytes(opt.trainable_dtype(cfg))


def reduce_bucket_elements(cfg: RunConfig, arch: Arch) -> int:
    """reduce_bucket_size: the run's (`zero_reduce_bucket_size`), HF's "auto" fill (None) hidden_size^2."""
    n = cfg.zero_reduce_bucket_size
    return arch.hidden_size**2 if n is None else n


def reduce_buckets(cfg: RunConfig, arch: Arch) -> int:
    """The reduce buckets each rank keeps (module docstring); 0 without ZeRO."""
    if not _zero(cfg):
        return 0
    overlap = cfg.zero_overlap_comm if cfg.zero_overlap_comm is not None else cfg.sharding == "zero3"
    buffers = 2 if cfg.sharding == "zero2" and overlap else 1  # ZeRO-3 keeps one per dtype either way
    return buffers * reduce_bucket_elements(cfg, arch) * _grad_bytes(cfg)


def _partition(cfg: RunConfig, arch: Arch) -> int:
    """This rank's share of the trainable parameters (elements)."""
    return -(-opt.trainable_params(cfg, arch) // max(cfg.num_gpus, 1))


def grad_partitions_resident(cfg: RunConfig) -> bool:
    """ZeRO-3 with the optimizer on the GPU: its gradient partitions stand in for every `.grad` of the step."""
    return cfg.sharding == "zero3" and not cfg.offload_optimizer


def grad_partitions(cfg: RunConfig, arch: Arch) -> int:
    """ZeRO-3's flat gradient partition buffer on the GPU, held all step; 0 otherwise (or with optimizer offload,
    where it is pinned host memory)."""
    if not grad_partitions_resident(cfg):
        return 0
    return _partition(cfg, arch) * _grad_bytes(cfg)


def full_module_gradient(cfg: RunConfig, arch: Arch) -> int:
    """ZeRO-3 backward: the largest trainable module's full gradient before it reaches a bucket."""
    if cfg.sharding != "zero3":
        return 0
    return opt.largest_trainable(cfg, arch) * _grad_bytes(cfg)


def optimizer_step_copies(cfg: RunConfig, arch: Arch) -> int:
    """The optimizer step's flattened 16-bit gradient and its fp32 conversion for one sub-group, live together;
    0 without ZeRO or with the optimizer offloaded (the CPU step's buffers: terms/offload.py)."""
    if not _zero(cfg) or cfg.offload_optimizer:
        return 0
    return min(SUB_GROUP_SIZE, _partition(cfg, arch)) * (_grad_bytes(cfg) + 4)
