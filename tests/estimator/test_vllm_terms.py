"""vLLM's own accounting (terms/vllm.py), each pinned by hand-computed bytes."""

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.terms import vllm
from estimator.units import GIB, MIB

Q7 = resolve_model("7B")  # 28 layers, 4 KV heads of 128
L8 = resolve_model("meta-llama/Llama-3.1-8B-Instruct")


def test_requested_is_a_share_of_total_and_start_up_needs_it_free():
    total = 40960 * MIB  # A100 40GB
    assert vllm.requested_memory(total, 0.2) == 8192 * MIB
    assert vllm.starts(8192 * MIB, total, 0.2)
    assert not vllm.starts(8192 * MIB - 1, total, 0.2)
    assert vllm.largest_startable_utilization(30 * GIB, 40 * GIB) == 0.75
    assert vllm.largest_startable_utilization(30 * GIB + 399 * MIB, 40 * GIB) == 0.75  # 30.39/40 = 0.7597


def test_kv_bytes_per_token_split_over_tensor_parallel_ranks():
    assert vllm.kv_bytes_per_token(Q7) == 2 * 28 * 4 * 128 * 2 == 57_344
    assert vllm.kv_bytes_per_token(Q7, tp=2) == 28_672
    assert vllm.kv_bytes_per_token(Q7, tp=8) == 2 * 28 * 1 * 128 * 2  # 4 heads over 8 ranks: one each


def test_one_sequence_rounds_up_to_16_token_blocks_plus_the_null_block():
    # 2500 tokens: 157 blocks of 16, and the null block BlockPool holds back (vLLM 0.29+ checks without it)
    assert vllm.one_sequence_kv(Q7, 2500) == (157 + 1) * 16 * 57_344 == 144_965_632
    # Qwen2.5-7B's default max_model_len: 2048 blocks + 1 = 1.75 GiB + 0.875 MiB
    assert vllm.one_sequence_kv(Q7, 32768) == (32768 + 16) * 57_344


def test_server_batch_defaults_follow_vllm_serve_by_card_size():
    # vllm/engine/arg_utils.py get_batch_defaults, OPENAI_API_SERVER: < 70 GiB, 70-160 GiB, >= 160 GiB (0.28+)
    assert vllm.server_batch_defaults(int(14.58 * GIB)) == (2048, 256)  # T4
    assert vllm.server_batch_defaults(int(79.2 * GIB)) == (8192, 1024)  # H100 80GB
    assert vllm.server_batch_defaults(int(178.4 * GIB)) == (16384, 1024)  # B200


def test_kv_pool_and_tokens():
    assert vllm.kv_pool(10, 3, 2, 1, 1) == 3
    assert vllm.kv_pool(5, 3, 2, 1, 1) == -2
    block = 16 * 57_344
    assert vllm.kv_tokens(10 * block + 5, Q7) == 160
    assert vllm.kv_tokens(-1, Q7) == 0


def test_profile_activation_peak_llama3_8b():
    # T = 8192: (3·14336 + 4·4096 + 4096 + 2·1024) × 2 B = 131,072 B per token -> 1 GiB;
    # sampler: 2 × 4 B × 256 × 128,256 = 262,668,288
    got = vllm.profile_activation_peak(L8, 8192, 256)
    assert got == 8192 * 131_072 + 262_668_288 == 1_336_410_112  # 1.24 GiB; vLLM logged 1.26 (PR #10511)


def test_weights_split_over_tp_and_sleep_residue():
    assert vllm.checkpoint_weight_bytes(Q7) == 2 * Q7.total_params
    assert vllm.checkpoint_weight_bytes(Q7, tp=4) == -(-2 * Q7.total_params // 4)
    assert vllm.sleep_residue(0) == 0
    assert vllm.sleep_residue(2) == 1_140_000_000
    assert vllm.sleep_residue(1, tp=2) == 1_140_000_000 + int(1.79 * GIB)
    assert vllm.sleep_host_bytes(1, 100) == 100 and vllm.sleep_host_bytes(2, 100) == 0


def test_colocate_footprint_and_sleeping():
    cfg = RunConfig(use_vllm=True, gpu_memory_gib=40.0, vllm_gpu_memory_utilization=0.25)
    assert vllm.colocate_footprint(cfg) == 10 * GIB
    assert vllm.colocate_sleeping(cfg) == 0
    assert vllm.colocate_sleeping(cfg.with_(vllm_enable_sleep_mode=True)) == 1_140_000_000
    assert vllm.colocate_footprint(cfg.with_(vllm_mode="server")) == 0
    # at TP 2 the NCCL communicators and custom all-reduce buffers are set up before vLLM's snapshot: beyond it
    assert vllm.colocate_footprint(cfg.with_(vllm_tensor_parallel_size=2)) == 10 * GIB + int(1.79 * GIB)


def test_lora_buffers():
    # r = 16 on q (3584 -> 3584) and v (3584 -> 512): 16 × (7168 + 4096) × 28 layers × 2 B
    assert vllm.lora_buffer_bytes(Q7, 16, [(3584, 3584), (3584, 512)]) == 16 * 11264 * 28 * 2


def test_weight_sync_gather_under_zero3():
    cfg = RunConfig(use_vllm=True, num_gpus=4, sharding="zero3", use_peft=True)
    assert vllm.weight_sync_gather(cfg, 1000, 10) == 750  # PEFT: the whole model gathered to merge adapters
    assert vllm.weight_sync_gather(cfg.with_(use_peft=False), 1000, 10) == 7  # one parameter at a time
    assert vllm.weight_sync_gather(cfg.with_(sharding="zero2"), 1000, 10) == 0
    assert vllm.weight_sync_gather(cfg.with_(use_vllm=False), 1000, 10) == 0


def test_packed_chunks_pass_one_gib_and_two_are_in_flight():
    # pack_tensors closes a chunk once its bytes pass 1 GiB: [0.6 + 0.6], [0.3 + 2.0], [0.1]
    tensors = [int(0.6 * GIB), int(0.6 * GIB), int(0.3 * GIB), 2 * GIB, int(0.1 * GIB)]
    assert vllm.packed_chunks(tensors) == [2 * int(0.6 * GIB), int(0.3 * GIB) + 2 * GIB, int(0.1 * GIB)]
    # two chunks in flight: the largest neighbouring pair, [1.2] + [2.3]
    assert vllm.packed_broadcast_bytes(tensors) == 2 * int(0.6 * GIB) + int(0.3 * GIB) + 2 * GIB
    assert vllm.packed_broadcast_bytes([100]) == 100 and vllm.packed_broadcast_bytes([]) == 0


def test_sent_tensors_are_the_policy_weights_in_parameter_order():
    # Qwen2.5-7B in bf16: the embedding first (152,064 × 3,584 × 2 B), the untied head last, all of it sent
    sent = 2 * Q7.total_params
    tensors = vllm.sent_tensor_bytes(Q7, sent, 2)
    assert tensors[0] == tensors[-1] == 152_064 * 3_584 * 2
    assert sent - len(tensors) <= sum(tensors) <= sent  # the linears' share is cut to whole bytes


def test_the_trainer_holds_the_packed_push_only_with_a_vllm_server():
    cfg = RunConfig(model="0.5B", use_vllm=True, vllm_mode="server", dtype="float32")
    arch = resolve_model("0.5B")
    # Qwen2.5-0.5B ties its head: 1.84 GiB of fp32 weights make two chunks (the first passes 1 GiB), both in
    # flight at once, so the whole model is packed while it streams
    weights = 4 * arch.total_params
    assert vllm.server_weight_push(cfg, arch, weights, 4) == weights
    assert vllm.server_weight_push(cfg.with_(vllm_mode="colocate"), arch, weights, 4) == 0


def test_a_sharded_trainer_keeps_a_chunk_of_gathered_tensors_while_it_packs():
    # under FSDP (or ZeRO-3 without PEFT) each parameter is gathered whole, and pack_tensors' list keeps the gathered
    # tensors of the chunk it is filling: one chunk more than the two in flight
    arch = resolve_model("7B")
    sent = 2 * arch.total_params
    cfg = RunConfig(model="7B", use_vllm=True, vllm_mode="server", num_gpus=4, sharding="fsdp")
    chunks = vllm.packed_chunks(vllm.sent_tensor_bytes(arch, sent, 2))
    plain = vllm.server_weight_push(cfg.with_(num_gpus=1, sharding="none"), arch, sent, 2)
    assert vllm.server_weight_push(cfg, arch, sent, 2) == plain + max(chunks)
    # ZeRO-3 with PEFT gathers the whole model before packing (weight_sync_gather): views again
    assert vllm.server_weight_push(cfg.with_(sharding="zero3", use_peft=True), arch, sent, 2) == plain
