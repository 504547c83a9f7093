"""Rank 0 of an N-rank FSDP2 GRPO step, traced on one CPU: a fake process group under FakeTensorMode.

How (the approach of torchtitan's `scripts/estimate/estimation.py` and torch's `distributed/_tools`):

* `torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=N)`: every collective
  returns at once without moving data, so one process plays rank 0 of N. The device mesh is built before
  FakeTensorMode is entered (`init_device_mesh` reads its rank tensor with `.tolist()`).
* The policy is wrapped by accelerate 1.15's own `fsdp2_prepare_model` (what `accelerate launch` with
  `fsdp_version: 2` runs under TRL), given a stand-in accelerator that carries the plugin and the mesh:
  trainable parameters upcast to fp32 (mixed precision != "no"), `fully_shard` on every
  `_no_split_modules` block, the tail group (final norm, embeddings, lm_head) with `reshard_after_forward=False`,
  then the root; `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)` from
  `FullyShardedDataParallelPlugin.set_mixed_precision("bf16")`.
* Strategies (accelerate's names): FULL_SHARD = `reshard_after_forward=True`, SHARD_GRAD_OP =
  `reshard_after_forward=False` (parameters stay gathered from forward to backward); `cpu_offload` =
  `CPUOffloadPolicy(pin_memory=True)` (sharded parameters, gradients and optimizer state on the host).
* Generation: TRL 1.16 `unwrap_model_for_generation` returns the FSDP2 module itself and
  `DistributedBackend.summon_full_params` is a no-op for FSDP2 (`trl.distributed.DistributedBackend.summon_full_params`), so generate runs
  through FSDP2's per-layer hooks: each decode step all-gathers each block. There is no whole-model gather.
* FSDP2 frees and re-allocates unsharded parameters by resizing their storages in place (`alloc_storage` /
  `free_storage`, `_fsdp_param.py`), which no dispatch mode sees: `track_fsdp_storage` reports those resizes to
  the probe. `ShardedStorageMode` counts a DTensor by its local shard (the wrapper has no storage of its own).

DeepSpeed ZeRO-2/3 cannot be traced this way (tried with deepspeed 0.19.8, DS_BUILD_OPS=0, in a throwaway target
dir): with no CUDA device DeepSpeed selects its CPU accelerator, whose communication layer JIT-compiles a C++
shared-memory op at `deepspeed.initialize` (`deepspeed.comm.torch.TorchBackend.__init__` -> `build_shm_op`), so the traced code
would not be the CUDA code path being estimated; and ZeRO's step reads data-dependent scalars that FakeTensorMode
refuses (`overflow_gpu[0].item()` in both ZeRO optimizers' overflow checks; the grad-norm `.item()` in
`DeepSpeedZeroOptimizer.complete_grad_norm_calculation_for_cpu_offload` / `get_grad_norm_direct`). FSDP2's FULL_SHARD and SHARD_GRAD_OP are traced as the ZeRO-3 / ZeRO-2 analogues.

What the trace holds is rank 0's live tensor bytes, phase by phase: its shards, the all-gather outputs of the
blocks in flight (FSDP2 keeps the previous block's all-gather result alive until the next copy-out in forward,
`FSDPParamGroup.wait_for_unshard`), the reduce-scatter input and output (`foreach_reduce`), the activations of
its own micro-batch. NCCL's own buffers are not tensors and are not here (see `estimator/terms/overhead.py`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from estimator.settings.config import RunConfig
from sweeps.probes.tensors import LiveStorageMode
from sweeps.trace import step as single

STRATEGIES = {
    "FULL_SHARD": True,
    "SHARD_GRAD_OP": False,
}  # accelerate fsdp_sharding_strategy -> reshard_after_forward
UNSHARDED_LABEL = "fsdp_unsharded_param"


@dataclass(frozen=True)
class Layout:
    """How the run is spread: ranks, FSDP strategy, CPU offload (the row's variant records it)."""

    world_size: int
    strategy: str = "FULL_SHARD"
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"world_size must be >= 2, got {self.world_size}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r}; accepted: {', '.join(STRATEGIES)}")

    def variant(self) -> dict:
        return {
            "distributed": "fsdp2",
            "world_size": self.world_size,
            "fsdp_sharding_strategy": self.strategy,
            "fsdp_offload_params": self.cpu_offload,
            "rank": 0,
        }


def _local(t):
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


class ShardedStorageMode(LiveStorageMode):
    """LiveStorageMode that counts a DTensor as its local shard (the wrapper's own storage is not memory)."""

    def _track(self, t, op, relabel=False):
        super()._track(_local(t), op, relabel)


@contextmanager
def fake_process_group(world_size: int) -> Iterator[object]:
    """A fake N-rank process group with this process as rank 0; yields its 1-D device mesh (cpu)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
    finally:
        dist.destroy_process_group()


@contextmanager
def track_fsdp_storage(probe: LiveStorageMode) -> Iterator[None]:
    """Report FSDP2's in-place storage resizes (unshard / reshard) to `probe`; restored on exit."""
    import torch.distributed.fsdp._fully_shard._fsdp_param as fp
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as fpg

    orig_alloc, orig_free = fp.alloc_storage, fp.free_storage

    def alloc(tensor: torch.Tensor) -> None:
        orig_alloc(tensor)
        probe._track(tensor, UNSHARDED_LABEL, relabel=True)

    def free(tensor: torch.Tensor) -> None:
        orig_free(tensor)
        probe._track(tensor, UNSHARDED_LABEL)

    fp.alloc_storage, fp.free_storage, fpg.alloc_storage = alloc, free, alloc
    try:
        yield
    finally:
        fp.alloc_storage, fp.free_storage, fpg.alloc_storage = orig_alloc, orig_free, orig_alloc


def fsdp_plugin(layout: Layout, mixed_precision: str | None):
    """accelerate's FullyShardedDataParallelPlugin as `accelerate launch` builds it for fsdp_version 2."""
    from accelerate.utils import FullyShardedDataParallelPlugin
    from torch.distributed.fsdp import CPUOffloadPolicy

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        reshard_after_forward=STRATEGIES[layout.strategy],
        auto_wrap_policy="transformer_based_wrap",
        cpu_offload=CPUOffloadPolicy(pin_memory=True) if layout.cpu_offload else None,
        cpu_ram_efficient_loading=False,
        state_dict_type="SHARDED_STATE_DICT",
    )
    if mixed_precision:
        plugin.set_mixed_precision(
            mixed_precision
        )  # AcceleratorState does this (`AcceleratorState.__init__`)
    return plugin


def prepare_fsdp2(model: torch.nn.Module, mesh, layout: Layout, mixed_precision: str | None):
    """Wrap `model` in place with accelerate's `fsdp2_prepare_model` (the code accelerate runs), on `mesh`."""
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    accelerator = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=fsdp_plugin(layout, mixed_precision)),
        torch_device_mesh=mesh,
        parallelism_config=SimpleNamespace(fsdp_dim_names=("dp_shard",)),
        mixed_precision=mixed_precision or "no",
        is_main_process=True,
        device=torch.device("cpu"),
    )
    return fsdp2_prepare_model(accelerator, model)


def untraced_reason(cfg: RunConfig) -> str | None:
    """Why a config over several ranks cannot be traced here, or None (checked before a trace starts)."""
    if cfg.sharding != "fsdp":
        return (
            f"sharding {cfg.sharding!r} is not traced on CPU: only FSDP2 runs on a fake process group "
            "(DeepSpeed's CPU accelerator builds its own ops, and ZeRO's step reads .item())"
        )
    if cfg.load_in_4bit or cfg.beta != 0.0:
        return "the FSDP2 trace covers full fine-tuning and LoRA with beta = 0"
    if cfg.offload_param:
        # on a cpu mesh FSDP2's host<->device copies are no-ops, so the GPU side of offload cannot be observed
        return "CPU offload is not traceable on a cpu device mesh"
    return None


def run(cfg: RunConfig, layout: Layout, steps: int = 2, decode_k: int = 2) -> single.TraceResult:
    """Trace `steps` GRPO steps of `cfg` as rank 0 of `layout.world_size` FSDP2 ranks."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from sweeps.trace import fake_model, patches

    reason = untraced_reason(cfg)
    if reason is None and layout.cpu_offload:
        reason = "CPU offload is not traceable on a cpu device mesh"
    if reason is not None:
        raise NotImplementedError(reason)
    conf = fake_model.hf_config(cfg.model, cfg.attn_implementation)
    t0 = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(
            prefix="grpo-vram-trace-"
        ) as out_dir,  # the trainer's output_dir, removed
        single.offline_env(),
        patches.patched(),
        fake_process_group(layout.world_size) as mesh,
        FakeTensorMode(shape_env=ShapeEnv()),
    ):
        trainer, _ = single.build(cfg, conf, fake=True, out_dir=out_dir)
        policy = prepare_fsdp2(trainer.model, mesh, layout, "bf16" if cfg.bf16 else None)
        trainer.model = trainer.model_wrapped = policy
        trainer.optimizer = None
        opt = trainer.create_optimizer()  # transformers creates it after FSDP wraps the model
        if cfg.device == "cuda":
            single.use_cuda_optimizer_defaults(optimizer=opt)
        probe = ShardedStorageMode(round_to=single.CUDA_BLOCK if cfg.device == "cuda" else 1)
        probe.register(policy)
        setup = time.perf_counter() - t0
        with probe, track_fsdp_storage(probe):
            step_seconds = single.run_steps(cfg, trainer, opt, probe, steps, decode_k)
        observed = probe.result()
        for d in (observed["phases"], *observed["steps"].values(), observed["phase_at_peak"]):
            d.pop("(between steps)", None)
        observed["phase_at_peak_by_label"].pop("(between steps)", None)
        params = sum(p.numel() for p in policy.parameters())  # DTensor numel is the global size
        trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    return single.TraceResult(observed, step_seconds, setup, params, trainable)
