"""Each memory term on hand-computed cases (numbers worked out by hand from the formulas' sources)."""

import pytest

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate
from estimator.terms import activations as act
from estimator.terms import generation as gen
from estimator.terms import logprob_head as head
from estimator.terms import optimizer as opt
from estimator.terms import weights as w
from estimator.terms.sharding import shard

P_7B = 7_615_616_512
Q7 = resolve_model("7B")


def test_qwen25_7b_weights_by_dtype():
    cfg = RunConfig(model="7B")
    assert Q7.total_params == P_7B
    assert w.policy_weights(cfg, Q7) == 4 * P_7B  # TRL default: float32
    assert w.policy_weights(cfg.with_(dtype="bfloat16"), Q7) == 2 * P_7B


def test_reference_model_only_with_beta_and_no_peft():
    cfg = RunConfig(model="7B", dtype="bfloat16")
    assert w.reference_weights(cfg, Q7) == 0  # beta = 0 is TRL's default
    assert w.reference_weights(cfg.with_(beta=0.04), Q7) == 2 * P_7B
    assert w.reference_weights(cfg.with_(beta=0.04, use_peft=True), Q7) == 0  # adapters disabled instead


def test_lora_params_default_targets_and_all_linear():
    cfg = RunConfig(model="7B", use_peft=True, lora_r=16)
    # q: 16·(3584+3584) = 114,688; v: 16·(3584+512) = 65,536; × 28 layers
    assert w.lora_params(cfg, Q7) == 28 * (114_688 + 65_536) == 5_046_272
    all_lin = cfg.with_(lora_target_modules=("all-linear",))
    per_layer = 2 * 114_688 + 2 * 65_536 + 3 * 16 * (3584 + 18944)
    assert w.lora_params(all_lin, Q7) == 28 * per_layer == 40_370_176
    assert w.lora_adapters(all_lin, Q7) == 4 * 40_370_176  # fp32 adapters (PEFT autocast_adapter_dtype)
    assert w.lora_adapters(all_lin.with_(load_in_4bit=True), Q7) == 2 * 40_370_176  # bf16 with QLoRA


def test_nf4_linear_bytes():
    q_proj = next(lin for lin in Q7.layer_linears if lin.name == "q_proj")
    numel = 3584 * 3584
    assert w.nf4_linear_bytes(q_proj, nested=False) == numel // 2 + (numel // 64) * 4 == 7_225_344
    nested = numel // 2 + numel // 64 + -(-(numel // 64) // 256) * 4
    assert w.nf4_linear_bytes(q_proj, nested=True) == nested


def test_qlora_base_keeps_embeddings_and_head_in_load_dtype():
    cfg = RunConfig(model="7B", use_peft=True, load_in_4bit=True, dtype="bfloat16")
    # Qwen2.5-7B (H 3584, I 18944, 4 KV heads × 128 = 512, 28 layers, vocab 152064, untied), by hand:
    # decoder linears per layer: q, o 3584² + k, v 3584·512 + gate, up, down 3584·18944 = 233,046,016; × 28 =
    # 6,525,288,448 numel, all multiples of 64 -> NF4 numel/2 + fp32 absmax numel/64·4 = 0.5625 B/numel =
    # 3,670,474,752 B. Everything else stays bf16: embed + lm_head 2 · 152064·3584 = 1,089,994,752, q/k/v biases
    # 28 · 4608 = 129,024, norms 28 · 2 · 3584 + 3584 = 204,288 -> 1,090,328,064 params = 2,180,656,128 B.
    # the hand count of the dense rest matches the catalog's total
    assert P_7B - 6_525_288_448 == 1_090_328_064
    assert w.policy_weights(cfg, Q7) == 3_670_474_752 + 2_180_656_128 == 5_851_130_880


def test_gradients_and_adamw_state():
    cfg = RunConfig(model="7B", dtype="bfloat16")
    assert opt.gradients(cfg, Q7) == 2 * P_7B
    assert opt.optimizer_state(cfg, Q7) == 2 * 2 * P_7B  # exp_avg + exp_avg_sq in the param dtype
    assert opt.optimizer_state(cfg.with_(dtype="float32"), Q7) == 2 * 4 * P_7B
    assert opt.optimizer_temporaries(cfg, Q7) == 0
    assert opt.optimizer_temporaries(cfg.with_(optim="adamw_torch"), Q7) == 2 * P_7B
    assert opt.optimizer_state(cfg.with_(optim="sgd"), Q7) == 0


def test_bnb_8bit_state_keeps_embedding_32bit():
    cfg = RunConfig(model="0.5B", dtype="bfloat16", optim="adamw_bnb_8bit")
    arch = resolve_model("0.5B")
    state = opt.optimizer_state(cfg, arch)
    emb = arch.embedding_params
    assert state > 2 * emb * 4  # embedding alone keeps two fp32 states
    rest = arch.total_params - emb
    # the rest is ~2 bytes/param (uint8 × 2) plus absmax (8/256 per param)
    assert state - 2 * emb * 4 == pytest.approx(2 * rest * (1 + 4 / 256), rel=0.01)


def test_kv_cache_takes_the_residual_dtype():
    # notes §1.3: Qwen2.5-7B, B_gen = 8, P + C = 1280, bf16 weights → 0.55 GiB
    cfg = RunConfig(
        model="7B", per_device_train_batch_size=8, max_prompt_length=256, max_completion_length=1024
    )
    assert gen.kv_cache(cfg.with_(dtype="bfloat16"), Q7) == 2 * 28 * 8 * 512 * 1280 * 2 == 587_202_560
    # fp32 weights: rotary promotes K to fp32 and, in transformers 5.23, DynamicCache's first cat promotes V,
    # even under autocast
    assert gen.kv_cache(cfg.with_(transformers_version="5.23"), Q7) == 2 * 587_202_560
    # 5.24 keeps V in v_proj's dtype: bf16 under autocast, fp32 K beside bf16 V
    assert gen.kv_cache(cfg.with_(transformers_version="5.24"), Q7) == 28 * 8 * 512 * 1280 * (4 + 2)
    assert gen.kv_cache(cfg.with_(transformers_version="5.24", bf16=False), Q7) == 2 * 587_202_560


def test_generation_batch_geometry():
    cfg = RunConfig(per_device_train_batch_size=4, gradient_accumulation_steps=4)
    assert cfg.resolved_steps_per_generation == 4
    assert cfg.generation_sequences == 16
    assert not cfg.runs_old_logprob_pass  # GA % (spg × iterations) == 0
    assert cfg.with_(num_iterations=2).runs_old_logprob_pass
    assert cfg.with_(steps_per_generation=8).runs_old_logprob_pass  # 4 % 8 != 0
    assert not cfg.with_(steps_per_generation=2).runs_old_logprob_pass  # 4 % 2 == 0


def test_fused_head_tiles_and_weight_gradient():
    cfg = RunConfig(model="7B", dtype="bfloat16", per_device_train_batch_size=8, max_completion_length=1024)
    n = 8 * 1024
    assert head.scored_tokens(cfg, 8) == n
    assert head.scored_tokens(cfg.with_(device="cpu"), 8) == 8 * (256 + 1024 - 1)
    assert head.tile_bytes(cfg, Q7, n) == 4096 * 32768 * 2
    full = head.head_backward(cfg, Q7, 8, lm_head_trainable=True)
    frozen = head.head_backward(cfg, Q7, 8, lm_head_trainable=False)
    assert full - frozen == 152064 * 3584 * (4 + 2)  # fp32 grad_weight + its bf16 cast


def test_checkpoint_inputs_scale_with_layers_tokens_and_residual_dtype():
    cfg = RunConfig(model="7B", dtype="float32")
    assert act.checkpoint_inputs(cfg, Q7, 1000) == 28 * 1000 * 3584 * 4
    assert act.checkpoint_inputs(cfg.with_(dtype="bfloat16"), Q7, 1000) == 28 * 1000 * 3584 * 2


def test_sharding_divides_states_not_activations():
    cfg = RunConfig(num_gpus=4, sharding="zero3")
    assert shard(cfg, "weights", 1000) == 250
    assert shard(cfg, "activations", 1000) == 1000
    assert shard(cfg.with_(sharding="zero2"), "weights", 1000) == 1000
    assert shard(cfg.with_(sharding="zero2"), "optimizer_state", 1000) == 250


def test_ddp_holds_one_more_copy_of_the_trainable_gradients_in_every_phase():
    # Qwen2.5-1.5B: 1,543,714,304 parameters (estimator/catalog/SOURCES.md), fp32 by TRL's default load
    one = estimate(RunConfig(model="Qwen/Qwen2.5-1.5B-Instruct"))
    two = estimate(RunConfig(model="Qwen/Qwen2.5-1.5B-Instruct", num_gpus=2))
    for phase, comps in two.phases.items():
        assert sum(comps.values()) - sum(one.phases[phase].values()) == 1_543_714_304 * 4
    assert two.peak_allocated_bytes - one.peak_allocated_bytes == 1_543_714_304 * 4
    # sharded runs reduce-scatter their gradients: no DDP buckets
    zero2 = estimate(RunConfig(model="Qwen/Qwen2.5-1.5B-Instruct", num_gpus=2, sharding="zero2"))
    assert all("ddp_gradient_buckets" not in comps for comps in zero2.phases.values())


def test_device_overheads_are_the_published_constants_on_cuda_and_zero_on_cpu():
    # (that the allocated peak is the traced peak phase's total is checked against every traced row in
    # test_estimator_vs_traces.py)
    e = estimate(RunConfig(model="1.5B", dtype="bfloat16"))
    # 426 MiB bare context (unsloth-zoo PR #1053) + 666,632,192 - 287,047,680 B lazily loaded modules (pytorch PR
    # #86509) + 32 MiB cuBLAS + 32 MiB cuBLASLt workspaces on sm 9.0 = 446,693,376 + 379,584,512 + 67,108,864 B
    assert e.cuda_context_bytes == 893_386_752
    # the reserve comes from the caching-allocator simulation (estimator/hardware/allocator.py): over the 13 traced streams
    # it is 1.1-15.5 % of the allocated peak, and the fitted model for configs without a stream errs high by up to
    # 6.6 points (results/streams/REPORT.txt), so any estimate outside 1.1-22.1 % is wrong
    assert 0.011 <= e.allocator_overhead_bytes / e.peak_allocated_bytes <= 0.221
    cpu = estimate(RunConfig(model="1.5B", dtype="bfloat16", device="cpu"))
    assert cpu.cuda_context_bytes == 0 and cpu.allocator_overhead_bytes == 0
    assert cpu.peak_device_bytes == cpu.peak_allocated_bytes


def test_full_finetune_peak_exceeds_states_and_lora_is_smaller():
    cfg = RunConfig(model="7B", dtype="bfloat16")
    full = estimate(cfg)
    states = 2 * P_7B + 2 * P_7B + 4 * P_7B  # weights + grads + AdamW
    assert full.peak_allocated_bytes > states
    lora = estimate(cfg.with_(use_peft=True))
    # bf16 base + fp32 adapters (5,046,272 params, see above) with fp32 grads and two AdamW states: 16 B each
    assert lora.peak_allocated_bytes > 2 * P_7B + 16 * 5_046_272
    # the same config traced at real size (results/traced/tuned/default.jsonl): 18,376,651,264 B
    assert lora.peak_allocated_bytes == pytest.approx(18_376_651_264, rel=0.05)
    # beta = 0, GA = 1: TRL skips every no-grad pass, so scoring holds only resident memory and buffers
    assert set(full.phases["score"]) <= {"weights", "optimizer_state", "rollout_buffers"}
    assert "activations" in estimate(cfg.with_(beta=0.04)).phases["score"]


def test_more_generations_more_memory():
    a = estimate(RunConfig(model="1.5B", num_generations=4, per_device_train_batch_size=4))
    b = estimate(RunConfig(model="1.5B", num_generations=16, per_device_train_batch_size=16))
    assert b.peak_allocated_bytes > a.peak_allocated_bytes


def test_generation_without_a_cache_is_one_long_forward_and_no_cache():
    """Qwen2.5-0.5B, bf16 load, 8 sequences, P 256, C 256: without a cache the largest generation step is a
    no-grad forward over P + C - 1 = 511 positions that keeps no KV cache. By hand: the MLP instant holds
    act, up and their product [8·511, 4864] bf16, 3 × 39,763,968 = 119,291,904 B, beside the residuals
    (3 × [4088, 896] bf16 = 21,975,552), the norm output (7,325,184) and rotary's cos/sin [8, 511, 64] bf16
    (1,046,528)."""
    from estimator.step import single

    arch = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    cfg = RunConfig(
        model="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16", use_peft=True, per_device_train_batch_size=8,
        num_generations=8, max_prompt_length=256, max_completion_length=256, generation_use_cache=False,
    )  # fmt: skip
    phase = single.generate_phase(cfg, arch)
    assert "kv_cache" not in phase
    tokens = 8 * 511
    layer = 3 * tokens * 4864 * 2 + 3 * tokens * 896 * 2 + tokens * 896 * 2 + 2 * 8 * 511 * 64 * 2
    ids = (3 * 511 + 2 * 256) * 8 * 8
    assert phase["activations"] == layer + ids
    assert "kv_cache" in single.generate_phase(cfg.with_(generation_use_cache=True), arch)


def test_uncached_generation_keeps_three_mlp_segments_per_2_mib_size():
    """Qwen2.5-0.5B (I 4864), 8 sequences, bf16, P 256, C 16: each step's [8, L, 4864] bf16 tensor is 77,824 B a
    position, 19.0 MiB at L = 256 and 20.1 MiB at L = 271. Rounded up to 2 MiB, L = 256 ... 269 take 20 MiB
    segments and L = 270, 271 take 22 MiB: three tensors at each size, 3 × (20 + 22) MiB."""
    from estimator.step.estimate import estimate
    from estimator.terms import generation as gen

    arch = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    cfg = RunConfig(
        model="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16", use_peft=True, per_device_train_batch_size=8,
        num_generations=8, max_prompt_length=256, max_completion_length=16, generation_use_cache=False,
    )  # fmt: skip
    assert gen.uncached_mlp_segments(cfg, arch) == 3 * (20 + 22) * 2**20
    assert gen.uncached_generation_segments(cfg.with_(generation_use_cache=True), arch) == 0
    # under 10 MiB the requests share 20 MiB segments
    assert gen.uncached_mlp_segments(cfg.with_(max_prompt_length=64), arch) == 0
    assert gen.uncached_generation_segments(cfg, arch) == 3 * (20 + 22) * 2**20  # sdpa: no scores
    # on the estimate: the reserve holds them above what generation keeps; the card's need does not move
    long = cfg.with_(max_prompt_length=1024, max_completion_length=256)
    cached, uncached = estimate(long.with_(generation_use_cache=True)), estimate(long)
    assert uncached.peak_reserved_bytes > cached.peak_reserved_bytes
    assert uncached.need_bytes == cached.need_bytes


@pytest.mark.parametrize(
    "g, p, c", [(8, 256, 16), (8, 1024, 256), (80, 740, 284), (160, 300, 50), (1, 4000, 3000)]
)
def test_uncached_mlp_segments_is_every_distinct_rounded_size(g, p, c):
    """The count by its definition, token by token through the allocator's own rounding: three segments of each
    distinct size `get_allocation_size` gives the [G, L, I] request, from the first step's length to the last,
    sizes under 10 MiB left out (the estimate sums the sizes in closed form)."""
    from estimator.hardware.allocator import AllocatorSettings, allocation_size, round_size
    from estimator.terms import generation as gen

    arch = resolve_model("Qwen/Qwen3-4B")
    cfg = RunConfig(
        model="Qwen/Qwen3-4B", dtype="bfloat16", use_peft=True, per_device_train_batch_size=g, num_generations=g,
        max_prompt_length=p, max_completion_length=c, generation_use_cache=False,
    )  # fmt: skip
    s = AllocatorSettings()
    per = cfg.generation_sequences * 9728 * 2
    sizes = {allocation_size(round_size(per * n, s), s) for n in range(p, p + c) if per * n >= 10 * 2**20}
    assert gen.uncached_mlp_segments(cfg, arch) == 3 * sum(sizes)


def test_uncached_eager_scores_strand_two_fp32_segments_a_step():
    """Qwen2.5-0.5B (14 heads), 8 sequences, bf16 autocast, eager, P 256, C 2: the fp32 scores [8, 14, L, L] are
    448·L² B, 28 MiB at L = 256 and 29,589,952 B at 257, a 30 MiB segment; softmax's fp32 copy and output are two
    of each. The MLP's three [8, L, 4864] bf16 (19.0 and 19.1 MiB) take 20 MiB segments: the scores' sum is larger."""
    from estimator.terms import generation as gen

    arch = resolve_model("Qwen/Qwen2.5-0.5B-Instruct")
    cfg = RunConfig(
        model="Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16", use_peft=True, per_device_train_batch_size=8,
        num_generations=8, max_prompt_length=256, max_completion_length=2, generation_use_cache=False,
        attn_implementation="eager",
    )  # fmt: skip
    assert gen.uncached_score_segments(cfg, arch) == 2 * (28 + 30) * 2**20
    assert gen.uncached_mlp_segments(cfg, arch) == 3 * 20 * 2**20
    assert gen.uncached_generation_segments(cfg, arch) == 2 * (28 + 30) * 2**20
    assert gen.uncached_score_segments(cfg.with_(attn_implementation="sdpa"), arch) == 0
    fp16 = cfg.with_(dtype="float16", bf16=False)  # CUDA's half_to_float softmax copies nothing: one a step
    assert gen.uncached_score_segments(fp16, arch) == (28 + 30) * 2**20


def test_uncached_segments_are_counted_only_where_they_were_checked():
    """Dense models on the default allocator settings: the reserve holds the segments; an MoE model or other
    allocator settings keep the cached generation's reserve, and its basis says the segments are not counted."""
    from estimator.step.estimate import estimate

    shapes = dict(
        dtype="bfloat16", use_peft=True, per_device_train_batch_size=8, num_generations=8, max_prompt_length=1024,
        max_completion_length=256,
    )  # fmt: skip
    for cfg in (
        RunConfig(model="Qwen/Qwen3-30B-A3B", **shapes),
        RunConfig(
            model="Qwen/Qwen2.5-0.5B-Instruct", pytorch_cuda_alloc_conf="expandable_segments:True", **shapes
        ),
    ):
        cached, uncached = estimate(cfg), estimate(cfg.with_(generation_use_cache=False))
        assert uncached.allocator_overhead_bytes == cached.allocator_overhead_bytes
        assert "not counted" in uncached.reserve_basis
    dense = RunConfig(model="Qwen/Qwen2.5-0.5B-Instruct", **shapes)
    assert (
        estimate(dense.with_(generation_use_cache=False)).peak_reserved_bytes
        > estimate(dense).peak_reserved_bytes
    )


@pytest.mark.parametrize("g, p, c", [(1, 300, 6000), (8, 256, 4500), (80, 740, 284), (2, 8000, 50)])
def test_uncached_score_segments_is_every_distinct_rounded_size(g, p, c):
    """Eager scores [G, 32, L, L] fp32 of Qwen3-4B by definition, token by token through the allocator's own
    rounding: two segments of each distinct size of 10 MiB or more (the estimate: an arithmetic sum while the size
    grows by at most 2 MiB a token, then one size a token)."""
    from estimator.hardware.allocator import AllocatorSettings, allocation_size, round_size
    from estimator.terms import generation as gen

    arch = resolve_model("Qwen/Qwen3-4B")
    cfg = RunConfig(
        model="Qwen/Qwen3-4B", dtype="bfloat16", use_peft=True, per_device_train_batch_size=g, num_generations=g,
        max_prompt_length=p, max_completion_length=c, generation_use_cache=False, attn_implementation="eager",
    )  # fmt: skip
    s = AllocatorSettings()
    per = g * 32 * 4
    sizes = {
        allocation_size(round_size(per * n * n, s), s) for n in range(p, p + c) if per * n * n >= 10 * 2**20
    }
    assert gen.uncached_score_segments(cfg, arch) == 2 * sum(sizes)


def test_cuda_softmax_backward_temporary_worked_by_hand():
    """Qwen3-4B (32 query heads), eager, 16 sequences of 740 + 284 = 1024 tokens: CUDA's `softmax_backward_cuda_out`
    makes `tmp = grad * output`, fp32 like eager's `softmax(dtype=float32)` output, [16, 32, 1024, 1024] x 4 B =
    2 GiB beside the layer's backward peak; a CPU run has none."""
    kw = dict(
        model="Qwen/Qwen3-4B", use_peft=True, lora_r=16, attn_implementation="eager",
        per_device_train_batch_size=16, num_generations=16, max_prompt_length=740, max_completion_length=284,
        gradient_checkpointing=True, steps_per_generation=5,
    )  # fmt: skip
    cuda, cpu = RunConfig(**kw), RunConfig(device="cpu", **kw)
    arch = resolve_model(cuda.model)
    assert arch.num_heads == 32
    tmp = 16 * 32 * 1024 * 1024 * 4
    assert tmp == 2 * 2**30
    per_token = act.eager_backward_transient_per_token
    assert 16 * 1024 * (per_token(cuda, arch, 1024) - per_token(cpu, arch, 1024)) == tmp
    assert act.softmax_backward_cuda_tmp_bytes(cpu) == 0
