"""vLLM as vLLM accounts for itself: its budget, its own weights, the KV pool, start-up checks and sleep.

Modelled: vLLM 0.22-0.31 (V1 engine), the range TRL 1.16 accepts (`trl/import_utils.py`: 0.22.0-0.31.0), each
source read at v0.22.0 and v0.31.0; where a release in that range changed a rule, the rule below is the stricter
one, named as such. Sources, all in github.com/vllm-project/vllm:

- `vllm/v1/worker/utils.py` `request_memory`: requested = ceil(total × gpu_memory_utilization), total being
  `cudaMemGetInfo`'s total; start-up raises "Free memory on device ... is less than desired GPU memory
  utilization" when free < requested. `gpu_worker.py` `init_device` takes that snapshot after
  `init_worker_distributed_environment`, so at tensor-parallel size > 1 the NCCL communicators and custom
  all-reduce buffers it sets up are already taken from `free` and sit outside `requested`.
- `vllm/v1/worker/gpu_worker.py` `determine_available_memory`: KV = requested − weights − torch peak increase
  of `profile_run` − non-torch increase − CUDA-graph estimate (charged to the budget since v0.21,
  `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`; from v0.27 the same sum is taken from the free memory consumed,
  `utils/mem_utils.py`). So vLLM's footprint is `requested`, whatever the parts, plus the communicators above.
- `vllm/v1/core/kv_cache_utils.py` `_check_enough_kv_cache_memory`: start-up fails when KV <= 0 ("No available
  memory for the cache blocks") or KV < one `max_model_len` request ("To serve at least one request..."). From
  v0.29 the KV it checks is less the null block `BlockPool` holds back (one block); that rule is used here
  for every release (one block too strict before v0.29).
- `vllm/v1/kv_cache_interface.py` `AttentionSpec.page_size_bytes`: 2 × block_size × kv_heads × head_dim ×
  dtype bytes per layer; block_size 16 (`config/cache.py`); KV heads are split over tensor-parallel ranks.
- `vllm/engine/arg_utils.py` `get_batch_defaults`: `trl vllm-serve` runs `vllm serve` (TRL
  `scripts/vllm_serve.py` `build_command`), whose profile run uses the server's defaults, by card size.
- `vllm/v1/worker/gpu_worker.py` `sleep`: level 1 copies the "weights" pool to pinned host RAM and discards
  the KV cache; level 2 discards both. CUDA graphs and NCCL buffers live outside the pool and stay. (v0.32
  adds a "runtime" pool copied to the host at both levels: outside TRL 1.16's range, not modelled.)

TRL 1.16 colocate (`trl/generation/vllm_generation.py:347-366`): `LLM(model=name_or_path, ...,
max_model_len=vllm_max_model_length, max_num_seqs=bs × tp × steps_per_generation, max_num_batched_tokens=4096)`,
its own copy of the weights in the checkpoint's dtype, and `sleep(level=2)` when `vllm_enable_sleep_mode`.
Prefix caching (on by default) reuses KV blocks; it never reserves memory of its own, so it is not a term.

Not verified on v0.29+: the V2 model runner (default from v0.29) profiles with its own dummy sampler, and the
CUDA-graph figure below was logged with a 512-batch graph cap (1024 on SM100 from v0.28); both feed only the
KV pool and the start-up check, never the footprint. The NCCL group `trl vllm-serve` opens for weight transfer
is set up after start-up, outside vLLM's accounting: the layout adds it and the packed chunks on each server GPU
(`plan/layout.py` `server_weight_sync`, `overhead.server_weight_sync_nccl`).
"""

from __future__ import annotations

import math

from estimator.model.architecture import Arch
from estimator.terms.quantized import arch_quant_spec, packed_base_weights
from estimator.units import GIB

VERSION = "vLLM 0.22-0.31 (V1 engine)"
BLOCK_SIZE = 16  # CacheConfig default block size (vllm/config/cache.py)
TRL_MAX_NUM_BATCHED_TOKENS = 4096  # TRL 1.16 passes this to LLM(...) in colocate mode
TRL_SERVE_UTILIZATION = 0.9  # `trl vllm-serve --gpu_memory_utilization` default
# Published, not derived (each figure's upstream issue or log is named beside it):
CUDA_GRAPH_BYTES = int(
    0.65 * GIB
)  # largest single-GPU pool logged by vLLM (gemma-3-4b, B200, vLLM PR #21489)
TP_NON_TORCH_BYTES = int(
    1.79 * GIB
)  # NCCL + custom all-reduce per rank at TP > 1: 3.58 − 1.79 GiB (PR #10511)
SLEEP_RESIDUE_BYTES = int(1.14e9)  # measured after level-1 sleep (RTX 3090, vLLM 0.13); graphs + NCCL stay
# vllm/distributed/weight_transfer/packed_tensor.py (0.22-0.31): DEFAULT_PACKED_BUFFER_SIZE_BYTES, _NUM_BUFFERS
PACKED_BUFFER_BYTES = 1024 * 1024 * 1024
PACKED_NUM_BUFFERS = 2


def requested_memory(total_bytes: int, utilization: float) -> int:
    """ceil(total × gpu_memory_utilization): vLLM's whole budget (weights + activations + graphs + KV)."""
    return math.ceil(total_bytes * utilization)


def starts(free_at_start: int, total_bytes: int, utilization: float) -> bool:
    """vLLM starts only if the free memory it sees at start-up covers its request (utils.py request_memory)."""
    return free_at_start >= requested_memory(total_bytes, utilization)


def largest_startable_utilization(free_at_start: int, total_bytes: int) -> float:
    """floor(free / total, 2 decimals): the largest gpu_memory_utilization start-up accepts."""
    return math.floor(100 * free_at_start / total_bytes) / 100


def checkpoint_weight_bytes(arch: Arch, tp: int = 1, dtype_bytes: int = 2) -> int:
    """vLLM's own copy per rank: the packed GPTQ/AWQ base or P × dtype bytes (dtype 'auto' = the checkpoint's
    16-bit dtype), split over `tp` ranks (ceil)."""
    spec = arch_quant_spec(arch)
    total = packed_base_weights(arch, spec, dtype_bytes) if spec else arch.total_params * dtype_bytes
    return -(-total // tp)


def lora_buffer_bytes(
    arch: Arch, max_lora_rank: int, target_in_out: list[tuple[int, int]], tp: int = 1
) -> int:
    """vLLM's static LoRA slots when it serves adapters only (base shared): layers × Σ r × (in + out) × 2 bytes,
    for max_loras = 1 (vllm/lora: buffers sized max_loras × max_lora_rank per target), split over `tp`."""
    per_layer = sum(max_lora_rank * (i + o) for i, o in target_in_out)
    return -(-(arch.num_layers * per_layer * 2) // tp)


def kv_bytes_per_token(arch: Arch, tp: int = 1, dtype_bytes: int = 2) -> int:
    """2 (K, V) × layers × ceil(kv_heads / tp) × head_dim × dtype bytes, per rank."""
    return 2 * arch.num_layers * -(-arch.num_kv_heads // tp) * arch.head_dim * dtype_bytes


def one_sequence_kv(arch: Arch, max_model_len: int, tp: int = 1, dtype_bytes: int = 2) -> int:
    """KV the start-up check needs for one max_model_len request: its whole 16-token blocks (`needed_memory`)
    plus the null block the pool holds back (checked from v0.29; one block too strict before)."""
    blocks = -(-max_model_len // BLOCK_SIZE) + 1
    return blocks * BLOCK_SIZE * kv_bytes_per_token(arch, tp, dtype_bytes)


def server_batch_defaults(total_bytes: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of `vllm serve` on a card of `total_bytes` (arg_utils
    `get_batch_defaults`, OPENAI_API_SERVER): 16384 / 1024 from 160 GiB (v0.28+; 8192 before), 8192 / 1024
    from 70 GiB (2048 / 256 on an A100 80GB, which this errs above), 2048 / 256 below."""
    if total_bytes >= 160 * GIB:
        return 16384, 1024
    if total_bytes >= 70 * GIB:
        return 8192, 1024
    return 2048, 256


def profile_activation_peak(
    arch: Arch, num_tokens: int, max_num_seqs: int, tp: int = 1, dtype_bytes: int = 2
) -> int:
    """profile_run's torch peak above the weights: one layer of a `num_tokens` dummy batch, T × (3·I/tp +
    4·H + (q + 2·kv)/tp) × bytes (gate_up output, activation, residual and norm copies, qkv), plus the dummy
    sampler's fp32 logits and probs over max_num_seqs rows, 2 × 4 × S × V. Shapes-based, estimated; for
    Llama-3-8B at 8192 tokens and 256 sequences it gives 1.26 GiB, vLLM logged 1.26 GiB (PR #10511)."""
    per_token = 3 * arch.intermediate_size // tp + 4 * arch.hidden_size + (arch.q_dim + 2 * arch.kv_dim) // tp
    return num_tokens * per_token * dtype_bytes + 2 * 4 * max_num_seqs * arch.vocab_size


def non_torch_bytes(tp: int) -> int:
    """NCCL + custom all-reduce buffers per rank: none at TP 1 (the trainer's context is counted once). Set up
    before vLLM's snapshot, so outside `requested` (`footprint`); also charged inside the KV pool, where a
    lazily grown part would land (stricter start-up check, footprint at most this much too high)."""
    return TP_NON_TORCH_BYTES if tp > 1 else 0


# Where vLLM's CUDA graphs sit, by the TRL release's vLLM range (TrlProfile.vllm_graphs): before v0.21
# `determine_available_memory` leaves them out and captures them after the KV cache is allocated, so they come on
# top of `requested`; from v0.21 they are charged inside it (module docstring). "either": a range across v0.21,
# counted both ways (a footprint with them on top, a KV pool with them charged).
VLLM_GRAPHS = ("outside", "budget", "either")


def graphs_charged(cfg) -> int:
    """CUDA-graph bytes the KV pool is charged for under cfg's TRL release (0 where vLLM predates v0.21)."""
    return CUDA_GRAPH_BYTES if cfg.release.vllm_graphs in ("budget", "either") else 0


def graphs_on_top(cfg) -> int:
    """CUDA-graph bytes a vLLM rank holds beyond `requested` under cfg's TRL release (vLLM before v0.21)."""
    return CUDA_GRAPH_BYTES if cfg.release.vllm_graphs in ("outside", "either") else 0


def footprint(requested: int, tp: int = 1, graphs: int = 0) -> int:
    """What one vLLM rank holds on its GPU while awake: its request plus the TP communicators set up before it,
    plus the CUDA `graphs` captured outside the request (`graphs_on_top`)."""
    return requested + non_torch_bytes(tp) + graphs


def kv_pool(requested: int, weights: int, activation_peak: int, non_torch: int, cuda_graphs: int) -> int:
    """determine_available_memory: requested − weights − activation peak − non-torch − CUDA graphs (may be <= 0)."""
    return requested - weights - activation_peak - non_torch - cuda_graphs


def kv_tokens(kv_bytes: int, arch: Arch, tp: int = 1, dtype_bytes: int = 2) -> int:
    """Tokens the pool holds, in whole blocks (kv_cache_utils get_num_blocks)."""
    if kv_bytes <= 0:
        return 0
    per_block = BLOCK_SIZE * kv_bytes_per_token(arch, tp, dtype_bytes)
    return kv_bytes // per_block * BLOCK_SIZE


def sleep_residue(level: int, tp: int = 1) -> int:
    """What stays on the GPU while vLLM sleeps: nothing asleep-able at level 0; at levels 1 and 2 the CUDA graphs
    and NCCL buffers (a published measurement, plus the TP communicators)."""
    if level == 0:
        return 0
    return SLEEP_RESIDUE_BYTES + non_torch_bytes(tp)


def sleep_host_bytes(level: int, weights: int) -> int:
    """Pinned host RAM a sleeping vLLM holds: its weights at level 1, nothing at level 2."""
    return weights if level == 1 else 0


DEFAULT_GPU_GIB = 80.0


def colocate_footprint(cfg) -> int:
    """vLLM colocate's bytes on each training GPU: `requested` of the card (cfg.gpu_memory_gib, 80 GiB if not
    given) plus its TP communicators (`footprint`); 0 in server mode or without vLLM."""
    if not cfg.use_vllm or cfg.vllm_mode != "colocate":
        return 0
    total = int((cfg.gpu_memory_gib or DEFAULT_GPU_GIB) * GIB)
    return footprint(
        requested_memory(total, cfg.vllm_gpu_memory_utilization),
        cfg.vllm_tensor_parallel_size,
        graphs_on_top(cfg),
    )


def colocate_sleeping(cfg) -> int:
    """vLLM colocate's bytes while it sleeps between generations (TRL 1.16 uses level 2), 0 otherwise."""
    if not cfg.use_vllm or cfg.vllm_mode != "colocate" or not cfg.vllm_sleeps:
        return 0
    return sleep_residue(cfg.resolved_vllm_sleep_level, cfg.vllm_tensor_parallel_size)


def sent_tensor_bytes(arch: Arch, sent_bytes: int, dtype_bytes: int) -> list[int]:
    """The tensors a weight push streams, in `named_parameters` order: the embedding, each layer's linears and
    norms, the final norm, an untied head. Embedding, norms and head at `dtype_bytes`; the linears share what is
    left of `sent_bytes` (the policy's weights: a 4-bit or packed base sends its packed linears)."""
    norms = arch.num_layers * arch.layer_norm_params + arch.final_norm_params
    other = (arch.embedding_params + arch.lm_head_params + norms) * dtype_bytes
    linear_params = arch.num_layers * sum(lin.params for lin in arch.layer_linears)
    per_param = max(0, sent_bytes - other) / linear_params if linear_params else 0.0
    layer = [int(lin.params * per_param) for lin in arch.layer_linears] + [
        arch.layer_norm_params * dtype_bytes
    ]
    out = [
        arch.embedding_params * dtype_bytes,
        *layer * arch.num_layers,
        arch.final_norm_params * dtype_bytes,
    ]
    if arch.lm_head_params:
        out.append(arch.lm_head_params * dtype_bytes)
    return out


def packed_chunks(tensor_bytes: list[int]) -> list[int]:
    """`pack_tensors`: each chunk takes tensors in order until its bytes pass PACKED_BUFFER_BYTES."""
    chunks, size = [], 0
    for b in tensor_bytes:
        size += b
        if size > PACKED_BUFFER_BYTES:
            chunks.append(size)
            size = 0
    if size:
        chunks.append(size)
    return chunks


def packed_broadcast_bytes(tensor_bytes: list[int]) -> int:
    """Packed chunks alive at once while weights stream to a vLLM server (`packed_nccl_broadcast_producer` on the
    trainer, `_consumer` on the server, PACKED_NUM_BUFFERS = 2 in flight): the largest two consecutive chunks."""
    chunks = packed_chunks(tensor_bytes)
    return max((sum(chunks[i : i + PACKED_NUM_BUFFERS]) for i in range(len(chunks))), default=0)


def in_process_device(cfg) -> bool:
    """TRL 0.14-0.15 run vLLM inside the trainer's process on a GPU of its own (`vllm_device`, modelled as a
    server's GPU) and load the weights into it in place (`_move_model_to_vllm`: `model.load_weights(
    state_dict.items())`, each parameter copied into vLLM's own): no packed chunks, no weight-sync NCCL group."""
    return cfg.use_vllm and cfg.release.vllm_modes == ("separate_device",)


def server_weight_push(cfg, arch: Arch, sent_bytes: int, dtype_bytes: int) -> int:
    """Bytes the trainer's main process holds while it pushes weights to a `trl vllm-serve` server (TRL 1.16
    `VLLMClient.update_named_params` -> `packed_nccl_broadcast_producer`): the packed chunks, which are new
    (`packed_broadcast_bytes`). Unsharded, the tensors it packs are views of the parameters. Sharded over several
    GPUs they are gathered one at a time (`_iter_named_params`: FSDP's full tensors, ZeRO-3's gathered data) and
    the pack's list keeps a chunk's worth alive until it is packed: one more chunk (ZeRO-3 with PEFT gathers the
    whole model first, `weight_sync_gather`). 0 without a vLLM server."""
    if not cfg.use_vllm or cfg.vllm_mode != "server" or in_process_device(cfg):
        return 0
    tensors = sent_tensor_bytes(arch, sent_bytes, dtype_bytes)
    in_flight = packed_broadcast_bytes(tensors)
    gathered_one_by_one = cfg.sharding in ("zero3", "fsdp") and cfg.num_gpus > 1
    if gathered_one_by_one and not (cfg.sharding == "zero3" and cfg.use_peft):
        return in_flight + max(packed_chunks(tensors), default=0)
    return in_flight


def weight_sync_gather(cfg, full_weights: int, largest_param: int) -> int:
    """Bytes ZeRO-3 gathers on each rank to push weights to vLLM (TRL 1.16 `vllm_generation.py:435-475`
    `_iter_named_params`): with PEFT the whole model at once to merge the adapters (full − own shard); without,
    one parameter at a time (the largest, less its shard). 0 without vLLM, ZeRO-3 or more than one GPU."""
    if not cfg.use_vllm or cfg.sharding != "zero3" or cfg.num_gpus <= 1:
        return 0
    n = cfg.num_gpus
    if cfg.use_peft:
        return full_weights - -(-full_weights // n)
    return largest_param - -(-largest_param // n)
