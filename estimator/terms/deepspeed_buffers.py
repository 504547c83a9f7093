"""DeepSpeed ZeRO's own buffers on each GPU, beside the partitions `sharding.py` divides (DeepSpeed 0.19.8,
`runtime/zero/stage3.py`, `stage_1_and_2.py`, `config.py`; SOURCES.md has the permalinks).

- Reduce buckets: with `contiguous_gradients` (the default) gradients are copied into a flat bucket of
  `reduce_bucket_size` elements (DeepSpeed's default 5e8; HF fills a JSON's "auto" with hidden_size^2) in the
  communication dtype (the model's 16-bit dtype under bf16) before they are reduce-scattered. ZeRO-3 allocates one
  per dtype when the optimizer is set up (`stage3.py` "IPG") and keeps it. ZeRO-2 allocates one at the first
  gradient of every backward, two with `overlap_comm` (off by default below stage 3, `config.py`
  `overlap_comm_valid`; `setup_buckets`), and frees them at the backward's end
  (`independent_gradient_partition_epilogue` -> `_release_ipg_buffers`): they live in backward only.
- ZeRO-3's gradient partitions: `grad_partitions_flat_buffer`, one slot per parameter partition in the gradient
  accumulation dtype, allocated with the optimizer and never freed (`zero_grad` only drops `.grad`), on the GPU
  unless the optimizer is offloaded. Meanwhile a module's full gradient exists in backward until it is copied
  into a bucket: at most the largest trainable module's.
- The optimizer step: each sub-group (at most `sub_group_size`, 1e9 elements) of this rank's gradient partition is
  flattened into a 16-bit copy and converted to fp32 (`_prepare_fp32_grad_for_sub_group`; ZeRO-2's `step`: the
  same flatten and `.to(fp32)`), so for a moment both copies are live beside the fp32 master and Adam state.
- Optimizer offload: each gradient, as it leaves for the host, is first measured in fp64
  (`get_norm_dtype`): ZeRO-2's `set_norm_for_param_grad_in_gpu` converts the parameter's slice of this rank's
  partition whole (8 bytes an element); ZeRO-3's `partition_grads` first copies the gradient partition back to the
  GPU (`grad_buffer.to(device)`, 16-bit) and `_constant_buffered_norm2` converts it in pieces of at most 2.5e8
  elements. The largest such transient comes with the largest trainable parameter: the input embedding's
  gradient is the backward's last, reduced at its end when the activations are gone (with the bucket, and under
  ZeRO-3 the module's full gradient); every other parameter's is reduced while backward runs.
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.terms import optimizer as opt
from estimator.units import nbytes

DEFAULT_REDUCE_BUCKET = 500_000_000  # DeepSpeed's zero_optimization.reduce_bucket_size (elements)
SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed's zero_optimization.sub_group_size (elements)
NORM_PIECE = 250_000_000  # stage3.py `_constant_buffered_norm2(buffer_size=250000000)` (elements)


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


def reduce_buckets_resident(cfg: RunConfig) -> bool:
    """ZeRO-3 keeps its bucket all step; ZeRO-2's lives in backward only (module docstring)."""
    return cfg.sharding == "zero3"


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


def instants_before_first_gradient(cfg: RunConfig, arch: Arch, forward: tuple[str, ...]) -> tuple[str, ...]:
    """The train instants before any parameter's gradient reaches DeepSpeed's hooks (`setup_buckets` runs at the
    first): forward's, and the head's backward unless the head is a trainable tensor of its own (an untied
    head in a full fine-tune), since a tied head's gradient completes with the embedding's, at the end."""
    untied_head = not cfg.use_peft and not arch.tie_word_embeddings
    return forward if untied_head else (*forward, "head_backward")


def _offloading(cfg: RunConfig) -> bool:
    return _zero(cfg) and cfg.offload_optimizer


def offload_gradient_numels(cfg: RunConfig, arch: Arch) -> tuple[int, int]:
    """(largest trainable parameter reduced while backward runs, the one reduced at its end), in elements: a full
    fine-tune's input embedding is the last (tied or not), the rest during backward; PEFT: the largest adapter
    tensor for both (its order is not modelled, so the larger case counts)."""
    if cfg.use_peft:
        largest = opt.largest_trainable(cfg, arch)
        return largest, largest
    during = [lin.in_features * lin.out_features for lin in arch.layer_linears]
    if not arch.tie_word_embeddings:
        during.append(arch.lm_head_params)
    return max(during, default=0), arch.embedding_params


def offload_norm_transient(cfg: RunConfig, arch: Arch, numel: int) -> int:
    """Bytes one gradient takes on the GPU as it is measured and sent to the host (module docstring): ZeRO-2 the
    fp64 copy of this rank's slice; ZeRO-3 the 16-bit copy of its partition and one fp64 piece of it. With
    gradient accumulation ZeRO-2 also brings the host's running sum back to the GPU (`async_accumulate_grad_in_cpu_
    via_gpu`): + the parameter in 16-bit. 0 without optimizer offload."""
    if not _offloading(cfg) or not numel:
        return 0
    part = min(numel, _partition(cfg, arch))
    if cfg.sharding == "zero3":
        return part * _grad_bytes(cfg) + min(part, NORM_PIECE) * 8
    accumulate = numel * _grad_bytes(cfg) if cfg.gradient_accumulation_steps > 1 else 0
    return part * 8 + accumulate


def offload_backward_transient(cfg: RunConfig, arch: Arch) -> int:
    """The norm transient of the largest gradient reduced while backward runs, on top of its instants."""
    return offload_norm_transient(cfg, arch, offload_gradient_numels(cfg, arch)[0])


def offload_epilogue(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """The backward's end under optimizer offload, activations released: ZeRO-2's bucket still allocated, the last
    gradient's norm transient, and under ZeRO-3 that module's full 16-bit gradient (its bucket is resident); {}
    without optimizer offload."""
    if not _offloading(cfg):
        return {}
    last = offload_gradient_numels(cfg, arch)[1]
    copies = offload_norm_transient(cfg, arch, last)
    if cfg.sharding == "zero3":
        copies += last * _grad_bytes(cfg)
    out = {"offload_gradient_copies": copies}
    if not reduce_buckets_resident(cfg):
        out["zero_reduce_buckets"] = reduce_buckets(cfg, arch)
    return out
