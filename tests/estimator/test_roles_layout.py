"""Reward, reference and value models and their placement (terms/roles.py, layout.py), hand-computed."""

from estimator.model.catalog import resolve_model
from estimator.plan.layout import Role, VllmSettings, plan
from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate
from estimator.terms import roles as rt
from estimator.units import GIB

Q15 = resolve_model("1.5B")  # tied embeddings, H = 1536, V = 151936, 28 layers
P15 = 1_543_714_304
A100_80 = 81920 * 2**20
LORA_7B_VLLM = dict(model="7B", dtype="bfloat16", use_peft=True, use_vllm=True)  # Qwen2.5-7B LoRA, bf16 load
SMALL_BATCH = dict(per_device_train_batch_size=2, num_generations=2)


def test_reward_model_is_backbone_plus_scalar_head():
    assert Q15.total_params == P15 and Q15.lm_head_params == 0  # tied: nothing to drop
    assert rt.scalar_head_params(Q15) == P15 + 1536
    q7 = resolve_model("7B")  # untied: its [V, H] lm_head goes, a [1, H] score head comes
    assert rt.scalar_head_params(q7) == 7_615_616_512 - 152_064 * 3584 + 3584
    cfg = RunConfig(model="1.5B", dtype="bfloat16")
    assert rt.reward_weights(cfg, Q15) == 2 * (P15 + 1536)


def test_reward_scores_the_whole_generation_batch_at_once():
    cfg = RunConfig(
        model="1.5B",
        dtype="bfloat16",
        bf16=True,
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_prompt_length=100,
        max_completion_length=100,
    )
    # G = 4 × 2 = 8 sequences of 200 tokens = 1600 tokens, bf16 residual (r = a = 2). At the MLP's act·up: the
    # layer's input, the post-attention sum and inputs_embeds (the model's forward keeps it referenced through its
    # layer loop), 3·2·1536; the post-attention norm's bf16 output, 2·1536; act, up and their product, 3·2·8960;
    # then the final hidden states 1600 × 1536 × 2
    assert (
        rt.reward_forward_peak(cfg, Q15) == 1600 * (3 * 2 * 1536 + 2 * 1536 + 3 * 2 * 8960) + 1600 * 1536 * 2
    )


def test_critic_states_full_fine_tune_bf16_adamw():
    cfg = RunConfig(model="1.5B", dtype="bfloat16", use_peft=True)  # the critic ignores the policy's PEFT
    n = P15 + 1536
    states = rt.critic_states(cfg, Q15)
    assert states["weights"] == 2 * n and states["gradients"] == 2 * n
    assert states["optimizer_state"] == 2 * 2 * n  # fused AdamW keeps m, v in the parameter dtype
    assert states["master_weights"] == 0


def test_layout_counts_gpus_and_shards_roles_under_zero3():
    cfg = RunConfig(
        model="1.5B",
        dtype="bfloat16",
        num_gpus=4,
        sharding="zero3",
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=256,
        gpu_memory_gib=80.0,
    )
    est = estimate(cfg)
    roles = [Role("reference", "1.5B"), Role("reward", "1.5B", placement="own", gpus=1)]
    lay = plan(est, roles, VllmSettings(), resolve_model, A100_80)
    assert lay.total_gpus == 5
    training, reward = lay.groups
    ref = training.roles[1]
    assert ref.resident == -(-2 * P15 // 4)  # ZeRO-3 partitions the reference over the 4 training GPUs
    assert reward.roles[0].resident == 2 * (P15 + 1536)  # on its own GPU: whole
    assert training.peak_device_bytes > est.peak_device_bytes  # the reference sits beside the policy


def test_colocate_fails_at_start_up_when_one_request_does_not_fit():
    cfg = RunConfig(
        **LORA_7B_VLLM,
        **SMALL_BATCH,
        vllm_gpu_memory_utilization=0.2,
        max_prompt_length=512,
        max_completion_length=1024,
        gpu_memory_gib=40.0,
    )
    q7 = resolve_model("7B")
    est = estimate(cfg, q7)
    total = 40 * GIB
    default = plan(est, [], VllmSettings(), resolve_model, total)
    # request 8 GiB − bf16 weights 14.2 GiB < 0: no KV at all
    # vLLM's arithmetic leaves less than nothing: the pool is reported as 0 and the failure says why
    assert default.vllm.kv_cache == 0 and default.vllm.failure_kind == "no_kv_room"
    assert "no memory left for the KV cache" in default.vllm.failure
    assert default.vllm.requested == 8 * GIB


def test_colocate_start_up_needs_its_request_free():
    cfg = RunConfig(
        model="1.5B",
        dtype="float32",
        use_vllm=True,
        vllm_gpu_memory_utilization=0.9,
        **SMALL_BATCH,
        gpu_memory_gib=80.0,
    )
    lay = plan(estimate(cfg), [], VllmSettings(max_model_length=1024), resolve_model, 80 * GIB)
    # fp32 policy 5.75 GiB + context ~1 GiB leave ~73 GiB free, the request is 72 GiB: starts; at 0.95 it does not
    assert lay.vllm.failure_kind in (None, "training_step")
    lay2 = plan(
        estimate(cfg.with_(vllm_gpu_memory_utilization=0.95)),
        [],
        VllmSettings(max_model_length=1024),
        resolve_model,
        80 * GIB,
    )
    assert lay2.vllm.failure_kind == "request_not_free"
    assert lay2.vllm.failure.startswith("vLLM start-up: it asks 0.95")


def test_start_up_failure_from_the_trainer_load_names_loading_less_and_that_works():
    from estimator.plan.fixes import layout_fixes

    # Qwen2.5-7B in fp32 takes 7.62e9 x 4 B = 28.4 GiB before vLLM starts; 0.3 of a 40 GiB card does not fit
    # beside it. Loaded in bf16 it takes half, and vLLM's start-up check passes.
    cfg = RunConfig(model="7B", dtype="float32", use_vllm=True, gpu_memory_gib=40.0)
    settings = VllmSettings(max_model_length=cfg.sequence_length)
    lay = plan(estimate(cfg), [], settings, resolve_model, 40 * GIB)
    assert lay.vllm.failure_kind == "request_not_free" and lay.vllm.failure.startswith(
        "vLLM start-up: it asks 0.3"
    )
    loaded = 40 * GIB - lay.vllm.free_at_start
    assert 7.6e9 * 4 < loaded < 7.7e9 * 4 + 2 * GIB
    hint = [f for f in layout_fixes(lay, cfg) if f.startswith("load less into the trainer")]
    assert len(hint) == 1 and f"{loaded / GIB:.2f} GiB" in hint[0]
    assert "dtype: bfloat16" in hint[0] and "--qlora" in hint[0] and "--zero 3" not in hint[0]  # one GPU
    bf16 = cfg.with_(dtype="bfloat16")
    after = plan(estimate(bf16), [], settings, resolve_model, 40 * GIB).vllm
    assert after.failure_kind != "request_not_free"
    # loaded beyond the card (32B in fp32, 4 GPUs without sharding): no negative free memory, the load named
    big = RunConfig(model="32B", dtype="float32", use_vllm=True, num_gpus=4, gpu_memory_gib=40.0)
    lay = plan(estimate(big), [], VllmSettings(max_model_length=big.sequence_length), resolve_model, 40 * GIB)
    assert "already take" in lay.vllm.failure and "-" not in lay.vllm.failure.split("GiB, ")[-1]
    assert "--zero 3" in [f for f in layout_fixes(lay, big) if f.startswith("load less")][0]
    # ZeRO-3 alone, or a 4-bit base alone, takes the trainer's load below what vLLM's share needs free
    for way in ({"sharding": "zero3"}, {"use_peft": True, "load_in_4bit": True}):
        c = big.with_(**way)
        v = plan(
            estimate(c), [], VllmSettings(max_model_length=c.sequence_length), resolve_model, 40 * GIB
        ).vllm
        assert v.failure_kind != "request_not_free", way


def test_server_mode_reports_the_vllm_cards_with_tensor_parallelism():
    cfg = RunConfig(**LORA_7B_VLLM, **SMALL_BATCH, vllm_mode="server", gpu_memory_gib=80.0)
    settings = VllmSettings(
        tensor_parallel_size=2, server_gpus=2, server_utilization=0.9, max_model_length=4096
    )
    lay = plan(estimate(cfg), [], settings, resolve_model, A100_80)
    assert lay.total_gpus == 3  # 1 training + 2 vLLM
    assert lay.vllm.mode == "server" and lay.vllm.failure is None
    assert lay.vllm.weights == -(-2 * 7_615_616_512 // 2)  # each TP rank holds half the bf16 weights
    assert lay.vllm.requested == -(-A100_80 * 9 // 10)
    assert lay.vllm.non_torch == int(1.79 * GIB)  # TP communicators (PR #10511)


def test_sleep_level_1_parks_weights_in_host_ram():
    cfg = RunConfig(
        model="1.5B",
        dtype="bfloat16",
        use_vllm=True,
        vllm_enable_sleep_mode=True,
        **SMALL_BATCH,
        gpu_memory_gib=80.0,
    )
    lay1 = plan(estimate(cfg), [], VllmSettings(sleep_level=1, max_model_length=1024), resolve_model, A100_80)
    assert lay1.vllm.sleep_residue == 1_140_000_000
    assert lay1.vllm.host_bytes == 2 * P15  # the bf16 checkpoint vLLM loaded
    lay2 = plan(estimate(cfg), [], VllmSettings(sleep_level=2, max_model_length=1024), resolve_model, A100_80)
    assert lay2.vllm.host_bytes == 0


def test_role_moves_when_training_gpus_do_not_fit():
    from estimator.plan.fixes import role_moves

    cfg = RunConfig(model="7B", dtype="bfloat16", **SMALL_BATCH, gpu_memory_gib=40.0)
    roles = [Role("reference", "7B"), Role("reward", "1.5B")]
    lay = plan(estimate(cfg), roles, VllmSettings(), resolve_model, 40 * GIB)
    assert not lay.fits
    moves = role_moves(lay)
    assert moves[0].startswith("move reference 7B") and "14.19 GiB" in moves[0]  # 2 × 7.62 B params
    assert moves[1].startswith("move reward 1.5B")


def test_the_share_the_layout_offers_holds_vllms_own_weights():
    from estimator.plan.fixes import layout_fixes

    # 7B LoRA in bf16, vLLM colocate 0.5 on an A100 40GB with 2,048-token completions: the step leaves vLLM room
    # for about 0.31 of the card, but vLLM's own bf16 copy is 7.62e9 × 2 B = 14.19 GiB, more than 0.35 of the
    # 39.59 GiB it takes its share of: no share both starts and leaves the step room, and none is offered
    cfg = RunConfig(
        **LORA_7B_VLLM, vllm_gpu_memory_utilization=0.5, max_completion_length=2048, gpu_memory_gib=40.0
    )
    total = 40536 * 2**20
    lay = plan(estimate(cfg), [], VllmSettings.of(cfg), resolve_model, total, lambda c, a: estimate(c, a))
    v = lay.vllm
    assert 7_615_616_512 * 2 > 0.35 * total and v.smallest_utilization > 0.35
    assert v.largest_safe_utilization is None
    fixes = layout_fixes(lay, cfg)
    assert not any(f.startswith("lower vllm_gpu_memory_utilization") for f in fixes)
    assert any(f"from {v.smallest_utilization}" in f and "server mode" in f for f in fixes)
    # a shorter completion leaves the step room for a share that holds the weights: that share is offered
    short = cfg.with_(max_completion_length=256, vllm_max_model_length=1024)
    lay = plan(estimate(short), [], VllmSettings.of(short), resolve_model, total, lambda c, a: estimate(c, a))
    v = lay.vllm
    assert v.largest_safe_utilization is not None and v.largest_safe_utilization >= v.smallest_utilization
    at = short.with_(vllm_gpu_memory_utilization=v.largest_safe_utilization)
    assert plan(estimate(at), [], VllmSettings.of(at), resolve_model, total).vllm.failure is None
