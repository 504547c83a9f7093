"""CPU offload applied to the per-phase GPU components, and the host RAM a run needs (its own line).

The terms and their sources are in `estimator/terms/offload.py`. On the GPU, offload removes the states that move
to the host and adds the buffers that carry them: DeepSpeed's per-parameter gradient staging buffer, FSDP2's
host-to-device copy of one group's shard before its all-gather. Not traced: on a CPU device mesh FSDP2's host
copies are no-ops (see `sweeps/trace/distributed.py`), so these GPU terms are estimated from the code paths only.
"""

from __future__ import annotations

import math

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.terms import offload as off
from estimator.terms import sharding as sh
from estimator.terms.weights import trainable_params


def settings(cfg: RunConfig) -> off.Offload:
    return off.Offload(optimizer=cfg.offload_optimizer, param=cfg.offload_param)


def _largest_param(arch: Arch) -> int:
    return max([arch.embedding_params] + [lin.params for lin in arch.layer_linears])


def moved(cfg: RunConfig) -> set[str]:
    """The GPU components CPU offload takes to the host (empty without offload)."""
    o = settings(cfg)
    if not (o.optimizer or o.param):
        return set()
    if cfg.sharding == "fsdp":
        return off.fsdp_gpu_moved()
    return off.ds_gpu_moved(3 if cfg.sharding == "zero3" else 2, o)


def apply(cfg: RunConfig, arch: Arch, phases: dict[str, dict[str, int]]) -> tuple[dict, list[str]]:
    """The GPU components with the offloaded states removed and the staging buffers added; notes."""
    o = settings(cfg)
    if not (o.optimizer or o.param):
        return phases, []
    if cfg.sharding == "fsdp":
        moved = off.fsdp_gpu_moved()
        layer_shard = sh.chunk_rows(arch.layer_params, cfg.num_gpus)
        staging = off.fsdp_h2d_shard_copy(layer_shard, sh.fsdp_shard_dtype_bytes(cfg))
        note = "FSDP CPUOffloadPolicy: parameter, gradient and optimizer shards on the host (estimated, not traced)"
    else:
        stage = 3 if cfg.sharding == "zero3" else 2
        moved = off.ds_gpu_moved(stage, o)
        # stage_1_and_2.py's GPU staging buffer; stage3.py has none (its gradients go through the bucket)
        staging = off.ds_grad_staging(_largest_param(arch)) if o.optimizer and stage < 3 else 0
        note = "ZeRO-Offload: " + ", ".join(sorted(moved)) + " on the host (estimated, not traced)"
    out = {}
    for phase, comps in phases.items():
        kept = {k: v for k, v in comps.items() if k not in moved}
        if staging:
            kept["offload_staging"] = staging
        out[phase] = kept
    return out, [note]


def _param_partitions(arch: Arch, n: int) -> tuple[int, ...]:
    """Bytes of each sizeable parameter's 16-bit partition on one of `n` ranks: the embedding, an untied head and
    every decoder linear (norms and biases are a few KiB each)."""
    numels = [arch.embedding_params] + ([] if arch.tie_word_embeddings else [arch.lm_head_params])
    for lin in arch.layer_linears:
        numels += [lin.count * lin.in_features * lin.out_features] * arch.num_layers
    return tuple(2 * off.partition(x, n) for x in numels)


def host_ram(cfg: RunConfig, arch: Arch) -> dict[str, int]:
    """Host bytes of the node in training (per rank × ranks) and while loading, each process's own memory included
    (measured, `off.PROCESS_TRAINING_BYTES` / `PROCESS_BEFORE_LOAD_BYTES`): {'training', 'loading', 'pinned'
    (with offload)}."""
    o = settings(cfg)
    n = cfg.num_gpus
    load_bytes = 4 if cfg.dtype == "float32" else 2
    process = off.PROCESS_TRAINING_BYTES * n
    # ZeRO-3: accelerate's zero3_init_flag (on by default for stage 3) partitions while loading
    loading = (
        off.model_load_host(arch.total_params, load_bytes, n, efficient_loading=cfg.sharding == "zero3")
        + off.PROCESS_BEFORE_LOAD_BYTES * n
    )
    if not (o.optimizer or o.param):
        return {"training": process, "loading": loading}
    if cfg.sharding == "fsdp":
        per_rank = off.fsdp_host_per_rank(sh.fsdp_shard_numel(arch, n), sh.fsdp_shard_dtype_bytes(cfg))
    else:
        stage = 3 if cfg.sharding == "zero3" else 2
        t = trainable_params(cfg, arch)
        per_rank = off.ds_host_blocks(
            off.ds_host_per_rank(t, arch.total_params, n, stage, o, _largest_param(arch)),
            o,
            stage,
            _param_partitions(arch, n),
        )
    unpinned = ("optimizer_state", "master_weights") if cfg.sharding == "zero3" else ("optimizer_state",)
    return {
        "training": off.host_ram_node(per_rank, n) + process,
        "loading": loading,
        "pinned": off.pinned_bytes(per_rank, o, unpinned) * n,
    }


def host_ram_short_bytes(cfg: RunConfig, arch: Arch) -> int:
    """How many bytes the node's host RAM (--host-ram) is short of what the run needs there, in training or while
    loading, whichever is more (the figures `host_ram_line` prints); 0 when it holds them or no --host-ram is given."""
    if not cfg.host_ram_gib:
        return 0
    ram = host_ram(cfg, arch)
    return max(0, math.ceil(max(ram["training"], ram["loading"]) - cfg.host_ram_gib * off.GIB))


def host_ram_line(cfg: RunConfig, arch: Arch) -> str | None:
    """`host RAM: X GiB in training, Y GiB while loading (estimated)`, and the --host-ram check when given."""
    ram = host_ram(cfg, arch)
    if not (cfg.offload_optimizer or cfg.offload_param or cfg.host_ram_gib):
        return None
    need = max(ram["training"], ram["loading"])
    # pinned memory that prints as 0.0 GiB is left out
    pinned = f"{ram['pinned'] / off.GIB:.1f} GiB pinned, " if ram.get("pinned", 0) >= 0.05 * off.GIB else ""
    line = (
        f"host RAM (node): {ram['training'] / off.GIB:.1f} GiB in training ({pinned}"
        f"{off.PROCESS_TRAINING_BYTES / off.GIB:.1f} GiB for each process itself, measured-gpu), "
        f"{ram['loading'] / off.GIB:.1f} GiB while {cfg.num_gpus} process(es) load the model (estimated)"
    )
    if cfg.host_ram_gib:
        problem = off.check_host_ram(need, cfg.host_ram_gib)
        line += f"; {problem}" if problem else f"; fits in --host-ram {cfg.host_ram_gib:g} GiB"
    return line
