"""Memory outside torch's tensors, per GPU: the CUDA context, cuBLAS workspaces, NCCL, and the allocator's reserve.

Itemized as small pure functions; every figure names its upstream source (a PR, an issue or a torch source
file) where it is used, and the legend in estimator/terms/SOURCES.md (Published sources) links them. What sits
where:

* outside torch's caching allocator (in nvidia-smi, not in `memory_reserved`): the CUDA context with lazily
  loaded kernel modules, and NCCL's buffers per communicator;
* inside it (in `memory_reserved`): the cuBLAS and cuBLASLt workspaces (allocated through the caching allocator,
  `at::cuda::getNewWorkspace` / `getCUDABlasLtWorkspace`), and the allocator's reserve beyond the allocated peak,
  which comes from replaying the run's allocation stream through `estimator.hardware.allocator` (`allocator_overhead`).

`cuda_context(cfg)` and `allocator_overhead(cfg, peak)` keep the signatures `phases.py` calls; `non_tensor_items`
gives the itemized view for the report.
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.settings.config import RunConfig
from estimator.terms import allocator_reserve as allocator_term
from estimator.units import MIB

# ---- CUDA context (unsloth-zoo PR #1053, pytorch PR #86509) ---------------------------------------------------------------------------------
CONTEXT_LAZY_BYTES = 426 * MIB  # bare context, torch 2.10+cu130, RTX 6000 Ada: unsloth-zoo PR #1053
# PyTorch PR #86509: context 666,632,192 B with eager module loading vs 287,047,680 B lazy (torch 1.13). Eager
# loads every kernel module, so the difference bounds what a run's lazily loaded modules can add.
LAZY_MODULES_BYTES = 666_632_192 - 287_047_680  # 379,584,512 B ≈ 362 MiB

# ---- cuBLAS / cuBLASLt workspaces (torch aten/src/ATen/cuda/CublasHandlePool.cpp, pytorch PR #120925) ------------------
CUBLAS_WORKSPACE_SM90 = 4096 * 8 * 1024  # parseChosenWorkspaceSize: "32MiB for Hopper and Blackwell"
CUBLAS_WORKSPACE_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8  # ":4096:2:16:8 default" = 8,519,680 B

# ---- NCCL (NVIDIA/nccl#964, #986) ------------------------------------------------------------------------------------------
NCCL_2_RANKS = 544 * MIB  # nccl#964: 4xA100 NVLink, one 4 MB all-reduce per group: 544 MB for 2-rank groups
NCCL_LARGER = 688 * MIB  # nccl#964: 688 MB for larger groups (MB read as MiB: errs high by 4.9 %)
# NVIDIA/nccl PR #2366 (NCCL 2.28, CUDA 13.0, one RTX 3090): a single-rank communicator's initialization memory with
# runtime connect, NCCL's default (996 MiB without it)
NCCL_1_RANK = 484 * MIB


def cuda_context_bytes(lazy_loading: bool = True) -> int:
    """CUDA context per process and GPU: 426 MiB bare (unsloth-zoo PR #1053, torch 2.10+cu130) plus the kernel
    modules a GRPO step loads lazily, bounded by PyTorch PR #86509's eager - lazy difference (362 MiB).

    Without lazy loading (CUDA < 11.7, or CUDA_MODULE_LOADING=EAGER) every module loads at start: 426 MiB plus the
    same 362 MiB, so both give 788 MiB; the bound is what makes them equal. An upper estimate: ptrblck quotes
    "around 400MB" for the bare context with lazy loading (pytorch#109888).
    """
    return CONTEXT_LAZY_BYTES + LAZY_MODULES_BYTES


H100_SM = (9, 0)  # the card the non-tensor items are counted for unless one is named


def cublas_workspace_bytes(sm: tuple[int, int] = (9, 0)) -> int:
    """cuBLAS workspace per (handle, stream), allocated through the caching allocator (counts in reserved):
    32 MiB on Hopper and Blackwell (sm major 9, 10, 12: pytorch PR #175344; a release before it gives Blackwell
    8,519,680 B, which this errs above), else :4096:2:16:8 = 8,519,680 B (torch CublasHandlePool.cpp
    `parseChosenWorkspaceSize`, default without CUBLAS_WORKSPACE_CONFIG). Where cuBLASLt shares this workspace
    (pytorch PRs #168175, #173002) the two are still counted apart: at most one workspace too high. Default sm:
    H100, the project's reference GPU."""
    return CUBLAS_WORKSPACE_SM90 if sm[0] in (9, 10, 12) else CUBLAS_WORKSPACE_DEFAULT


def cublaslt_workspace_bytes(sm: tuple[int, int] = (9, 0), total_bytes: int | None = None) -> int:
    """cuBLASLt workspace (through the caching allocator): 32 MiB on Hopper and newer, 4 MiB on Ampere with
    >= 24 GB, 1 MiB otherwise (PyTorch PR #120925, citing the cuBLAS docs; CUBLASLT_WORKSPACE_SIZE overrides)."""
    if sm >= (9, 0):
        return 32 * MIB
    if sm[0] == 8 and total_bytes is not None and total_bytes >= 24 * 10**9:
        return 4 * MIB
    return 1 * MIB


def _single_rank_deepspeed(cfg: RunConfig) -> bool:
    """DeepSpeed on one GPU: `deepspeed.init_distributed` brings up torch.distributed with NCCL all the same, and
    ZeRO's reductions run their collectives over that one-rank group."""
    return cfg.num_gpus == 1 and cfg.sharding in ("zero2", "zero3")


def nccl_communicators(cfg: RunConfig) -> int:
    """Communicators a rank holds: the data-parallel / ZeRO / FSDP group when num_gpus > 1 (a one-rank group under
    DeepSpeed on one GPU), plus the weight-sync group to a vLLM server (`vllm_mode="server"`; not TRL 0.14-0.15's
    in-process vLLM device, which loads weights without NCCL). Colocated vLLM with TP 1 adds none."""
    n = 1 if cfg.num_gpus > 1 or _single_rank_deepspeed(cfg) else 0
    if cfg.use_vllm and cfg.vllm_mode == "server" and cfg.release.vllm_modes != ("separate_device",):
        n += 1
    return n


def nccl_bytes(cfg: RunConfig) -> int:
    """NCCL buffers per GPU: 544 MiB per communicator for 2 ranks, 688 MiB for larger groups (nccl#964, 4xA100
    NVLink; NVLS or many channels use more, nccl#986), 484 MiB for DeepSpeed's one-rank group on one GPU (nccl PR
    #2366). 0 on one GPU without DeepSpeed or a vLLM server."""
    if cfg.device != "cuda":
        return 0
    per = NCCL_2_RANKS if cfg.num_gpus <= 2 else NCCL_LARGER
    if _single_rank_deepspeed(cfg):  # the one-rank group, then a vLLM server's group as before
        return NCCL_1_RANK + (nccl_communicators(cfg) - 1) * per
    return nccl_communicators(cfg) * per


def server_weight_sync_nccl(server_gpus: int) -> int:
    """NCCL buffers on each vLLM server GPU for the weight-sync communicator: the server's ranks plus the trainer's
    client (TRL 1.16 `VLLMClient.init_communicator`: world_size = the server's + 1), sized as `nccl_bytes` sizes a
    group of that many ranks."""
    return NCCL_2_RANKS if server_gpus + 1 <= 2 else NCCL_LARGER


@dataclass(frozen=True)
class NonTensorItem:
    """One item of memory that is not a tensor the run allocates, with where it is counted and its source."""

    name: str
    bytes: int
    in_reserved: bool  # True: allocated through torch's caching allocator (part of memory_reserved)
    source: str


def workspace_bytes(sm: tuple[int, int], total_bytes: int | None = None) -> int:
    """The cuBLAS + cuBLASLt workspaces of one process on a card of compute capability `sm`."""
    return cublas_workspace_bytes(sm) + cublaslt_workspace_bytes(sm, total_bytes)


def non_tensor_items(
    cfg: RunConfig, sm: tuple[int, int] = (9, 0), total_bytes: int | None = None
) -> list[NonTensorItem]:
    """The per-GPU items outside the traced tensors, for the report (all 0 on CPU)."""
    if cfg.device != "cuda":
        return []
    items = [
        NonTensorItem("CUDA context (lazy loading)", CONTEXT_LAZY_BYTES, False, "unsloth-zoo PR #1053"),
        NonTensorItem("lazily loaded kernel modules (bound)", LAZY_MODULES_BYTES, False, "pytorch PR #86509"),
        NonTensorItem("cuBLAS workspace", cublas_workspace_bytes(sm), True, "torch CublasHandlePool.cpp"),
        NonTensorItem(
            "cuBLASLt workspace", cublaslt_workspace_bytes(sm, total_bytes), True, "pytorch PR #120925"
        ),
    ]
    if nccl_communicators(cfg):
        source = (
            "nccl PR #2366" if _single_rank_deepspeed(cfg) and nccl_communicators(cfg) == 1 else "nccl#964"
        )
        items.append(NonTensorItem(f"NCCL x{nccl_communicators(cfg)}", nccl_bytes(cfg), False, source))
    return items


def cuda_context(cfg: RunConfig) -> int:
    """Everything outside the caching allocator on one GPU: context + lazily loaded modules + cuBLAS/cuBLASLt
    workspaces (counted here until the reserve includes them) + NCCL. 0 on CPU.

    On an H100 with one GPU: 426 + 362 + 32 + 32 = 852 MiB.
    """
    return sum(i.bytes for i in non_tensor_items(cfg))


def allocator_overhead(
    cfg: RunConfig, peak_allocated: int, shares: allocator_term.Shares = allocator_term.UNKNOWN
) -> int:
    """The caching allocator's reserve beyond the allocated peak (max_memory_reserved - max_memory_allocated):
    from the simulated allocation stream of this config where one was traced, else from the model fitted over
    the simulated streams (`estimator.terms.allocator_reserve`), under the allocator settings the config carries
    (`pytorch_cuda_alloc_conf`, `torch_empty_cache_steps`); `shares` as in `allocator_term.reserve`. 0 on CPU."""
    if cfg.device != "cuda":
        return 0

    return allocator_term.reserve(cfg, peak_allocated, allocator_term.config_variant(cfg), shares).bytes
