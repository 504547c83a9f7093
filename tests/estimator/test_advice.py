"""Advice and reverse solve against a toy estimator whose bytes are easy to compute by hand."""

from __future__ import annotations

import pytest

from estimator.model.architecture import from_config
from estimator.plan.advice import advise
from estimator.plan.solve import solve, with_generations
from estimator.settings.config import RunConfig
from estimator.step.estimate import Estimate

P = 1_000_000  # toy parameter count
ARCH = from_config(
    {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 128,
    }
)


@pytest.fixture(autouse=True)
def _no_band(monkeypatch):
    """These tests price toy estimates by hand; the error band's share is tested in tests/accuracy/test_validation_band.py."""
    from estimator.step import band

    monkeypatch.setattr(band, "margin", lambda cfg=None, model_type=None: 0.0)


def toy(cfg: RunConfig, arch) -> Estimate:
    """weights P×4 (fp32) / P×2 (bf16) / P/2 (4-bit); trainable P or P/100 (LoRA, fp32); AdamW 2 states,
    8-bit AdamW 2 B/param; activations bs×L×100 (×10 without checkpointing); KV gen_seqs×L×100;
    ZeRO-3 and FSDP divide weights, grads and state by the GPU count, ZeRO-2 grads and state; DDP (several GPUs,
    no sharding) holds the grads once more."""
    w = P // 2 if cfg.load_in_4bit else P * (4 if cfg.dtype == "float32" else 2)
    trainable = P // 100 if cfg.use_peft else P
    tb = 4 if (cfg.use_peft or cfg.dtype == "float32") else 2
    opt = trainable * (2 if "8bit" in cfg.optim else 2 * tb)
    grads = trainable * tb
    buckets = grads if cfg.num_gpus > 1 and cfg.sharding == "none" else 0  # DDP's copy of the gradients
    n = cfg.num_gpus if cfg.sharding in ("zero3", "fsdp") else 1
    w, opt, grads = w // n, opt // n, grads // n
    if cfg.sharding == "zero2":
        opt, grads = opt // cfg.num_gpus, grads // cfg.num_gpus
    seq = cfg.sequence_length
    act = cfg.per_device_train_batch_size * seq * (100 if cfg.gradient_checkpointing else 1000)
    kv = cfg.generation_sequences * seq * 100
    phases = {
        "generate": {"weights": w, "optimizer_state": opt, "kv_cache": kv},
        "train": {"weights": w, "optimizer_state": opt, "gradients": grads, "activations": act},
    }
    if buckets:
        for comps in phases.values():
            comps["ddp_gradient_buckets"] = buckets
    return Estimate(cfg, arch, phases, cuda_context_bytes=0, allocator_overhead_bytes=0)


BASE = RunConfig(model="toy")  # fp32 full fine-tune, bs 8, gens 8, 256 + 512 tokens, GC on
QLORA = BASE.with_(use_peft=True, load_in_4bit=True)


def test_toy_baseline():
    # train: 4M weights + 8M AdamW + 4M grads + 8×768×100 activations
    assert toy(BASE, ARCH).peak_device_bytes == 16_614_400


def test_singles_ranked_by_bytes_saved():
    adv = advise(BASE, ARCH, toy, budget_bytes=None)
    saved = {o.changes[0].key: o.saved_bytes for o in adv.singles}
    assert saved["qlora"] == 16_614_400 - (500_000 + 80_000 + 40_000 + 614_400)
    assert saved["lora"] == 16_614_400 - (4_000_000 + 80_000 + 40_000 + 614_400)
    assert saved["bf16"] == 8_000_000  # 2M weights + 4M state + 2M grads saved
    assert saved["adam8"] == 6_000_000  # 8M -> 2M state
    assert "gc" not in saved  # already on
    assert [o.saved_bytes for o in adv.singles] == sorted((o.saved_bytes for o in adv.singles), reverse=True)
    assert adv.plan is None


def test_plan_prefers_cheapest_single_that_fits():
    # 5 MB: LoRA (4.73 MB), QLoRA (1.23 MB) and 4 GPUs with ZeRO-3 (16M/4 + 0.61M = 4.61 MB) fit;
    # more GPUs changes the training least (cost 3 < LoRA 4 < QLoRA 5).
    adv = advise(BASE, ARCH, toy, budget_bytes=5_000_000)
    assert [c.key for c in adv.plan.changes] == ["gpus"]
    assert adv.plan.config.num_gpus == 4 and adv.plan.config.sharding == "zero3"
    assert adv.plan.peak_device_bytes == 4_614_400


def test_a_ddp_run_is_sharded_on_the_gpus_it_has_before_more_are_added():
    ddp = BASE.with_(num_gpus=4)  # 4M weights + 8M AdamW + 4M grads + 4M DDP buckets + 614,400 activations
    assert toy(ddp, ARCH).peak_device_bytes == 20_614_400
    # 5 MB: FSDP over the same 4 GPUs (16M / 4 + 614,400) fits at cost 2, before 8 GPUs with ZeRO-3 (cost 3)
    adv = advise(ddp, ARCH, toy, budget_bytes=5_000_000)
    assert [c.label for c in adv.plan.changes] == ["--fsdp"]
    assert (adv.plan.config.num_gpus, adv.plan.config.sharding) == (4, "fsdp")
    assert adv.plan.peak_device_bytes == 4_614_400
    # one GPU, or a run already sharded: nothing to shard on the same GPUs
    for cfg in (BASE, ddp.with_(sharding="zero2")):
        assert "shard" not in {o.changes[0].key for o in advise(cfg, ARCH, toy, budget_bytes=None).singles}


def test_plan_pairs_when_no_single_fits():
    # 1 MB: no single change fits (QLoRA alone is 1,234,400); QLoRA + 2 GPUs ZeRO-3 is
    # 250,000 + 40,000 + 20,000 + 614,400 = 924,400.
    adv = advise(BASE, ARCH, toy, budget_bytes=1_000_000)
    assert not any(o.fits for o in adv.singles)
    assert {c.key for c in adv.plan.changes} == {"qlora", "gpus"}
    assert adv.plan.config.num_gpus == 2
    assert adv.plan.peak_device_bytes == 924_400
    assert adv.plan.saved_bytes == 16_614_400 - 924_400


def test_solve_completion_length():
    # QLoRA train peak = 620,000 + 8×(256 + L)×100 <= 1,000,000  ->  L <= 219
    sol = solve(QLORA, ARCH, "max_completion_length", 1_000_000, toy)
    assert sol.value == 219
    assert sol.peak_device_bytes == 1_000_000


def test_solve_batch_size_respects_divisibility():
    # 620,000 + bs×76,800 <= 2,000,000 -> bs <= 17; gens 8 needs bs a multiple of 8 -> 16
    sol = solve(QLORA, ARCH, "per_device_train_batch_size", 2_000_000, toy)
    assert sol.value == 16


def test_solve_generations_grows_generation_batch():
    # gens 16 with bs 8 needs gradient_accumulation_steps 2 (16 sequences): generate = 580,000 + 16×76,800
    # = 1,808,800 fits 2 MB; gens 24 needs 24 sequences (2,423,200) and every larger group needs more.
    sol = solve(QLORA, ARCH, "num_generations", 2_000_000, toy)
    assert sol.value == 16
    assert sol.config.gradient_accumulation_steps == 2
    assert sol.peak_device_bytes == 1_808_800


def test_with_generations_keeps_trl_divisibility():
    c = with_generations(QLORA.with_(per_device_train_batch_size=6), 4)
    assert c.gradient_accumulation_steps == 2  # 6×1 is not a multiple of 4; 6×2 = 12 is
    c = with_generations(QLORA.with_(generation_batch_size=16), 12)
    assert c.generation_batch_size == 24  # lcm(8, 12)
    assert with_generations(QLORA, 1) is None


def test_nothing_fits():
    sol = solve(QLORA, ARCH, "max_completion_length", 100_000, toy)
    assert sol.value is None and sol.config is None


def toy_gather(cfg: RunConfig, arch) -> Estimate:
    """`toy`, except ZeRO-3 also gathers every other rank's weights for generation: on few GPUs it costs more."""
    est = toy(cfg, arch)
    if cfg.sharding == "zero3":
        est.phases["generate"]["gathered_weights"] = 40_000_000
    return est


def test_advice_never_lists_a_change_that_adds_memory():
    # ZeRO-3 here adds a 40 MB gather to a 16.6 MB run: the old advice listed it as "saves -23 MB"
    adv = advise(BASE, ARCH, toy_gather, budget_bytes=None)
    assert "gpus" not in {o.changes[0].key for o in adv.singles}
    assert all(o.saved_bytes > 0 for o in adv.singles)


def test_no_degenerate_completion_length():
    # QLoRA (1,234,400) does not fit 700,000; the length that would (L <= 44) is below the floor 64: not proposed
    adv = advise(QLORA, ARCH, toy, budget_bytes=700_000)
    assert "len" not in {o.changes[0].key for o in adv.singles}
    adv = advise(QLORA, ARCH, toy, budget_bytes=1_000_000)  # L <= 219 fits and is above 512 // 8 = 64
    lens = [o.config.max_completion_length for o in adv.singles if o.changes[0].key == "len"]
    assert lens == [219]


def toy_vllm(cfg: RunConfig, arch) -> Estimate:
    """`toy` on an 80 MB card with vLLM colocate holding util × 80 MB in every phase."""
    est = toy(cfg, arch)
    for comps in est.phases.values():
        colocate = cfg.use_vllm and cfg.vllm_mode == "colocate"
        comps["vllm"] = int(cfg.vllm_gpu_memory_utilization * 80_000_000) if colocate else 0
    return est


def test_advice_lowers_vllm_share_to_the_largest_that_fits():
    cfg = QLORA.with_(use_vllm=True, vllm_gpu_memory_utilization=0.3)  # 1,234,400 + 24,000,000
    adv = advise(cfg, ARCH, toy_vllm, budget_bytes=10_000_000)
    share = next(o for o in adv.singles if o.changes[0].key == "vllm_share")
    # 1,234,400 + u × 80 MB <= 10 MB  ->  u <= 0.1095  ->  0.10
    assert share.config.vllm_gpu_memory_utilization == 0.10
    assert share.saved_bytes == 16_000_000 and share.fits
    assert "KV cache" in share.tradeoff
    server = next(o for o in adv.singles if o.changes[0].key == "vllm_server")
    assert server.saved_bytes == 24_000_000


def test_solve_vllm_share():
    cfg = QLORA.with_(use_vllm=True, vllm_gpu_memory_utilization=0.3)
    sol = solve(cfg, ARCH, "vllm_gpu_memory_utilization", 10_000_000, toy_vllm)
    assert sol.value == 0.10


def test_with_vllm_failing_at_start_up_a_change_fits_only_if_vllm_then_starts():
    # a start-up check that passes only with max_model_len at most prompt + completion (768): that change saves
    # no bytes, yet it is the whole plan when the step already fits
    cfg = QLORA.with_(use_vllm=True, vllm_gpu_memory_utilization=0.1, vllm_max_model_length=4096)

    def starts(c: RunConfig, arch) -> bool:
        return (c.vllm_max_model_length or 10**9) <= c.sequence_length

    adv = advise(cfg, ARCH, toy_vllm, budget_bytes=10_000_000, starts=starts)  # 1,234,400 + 8,000,000 fits
    assert adv.baseline_starts is False and adv.baseline_fails
    length = next(o for o in adv.singles if o.changes[0].key == "vllm_len")
    assert length.saved_bytes == 0 and length.starts and length.fits
    assert length.config.vllm_max_model_length == 768
    assert [c.key for c in adv.plan.changes] == ["vllm_len"]
    # a change that saves bytes and leaves vLLM failing is listed, marked as not fitting
    assert all(o.fits is False for o in adv.singles if o.starts is False)
    # without the start check the step fits: no plan is asked for
    assert advise(cfg, ARCH, toy_vllm, budget_bytes=10_000_000).plan is None


def test_the_plan_takes_the_change_that_lets_vllm_start_over_a_cheaper_one_that_only_saves_bytes():
    # 4 MB fp32 weights + 8M + 4M + 614,400 + 0.05 × 80 MB: bf16 (cost 1) makes the step fit 14 MB, but vLLM starts
    # only with a 4-bit base (its weights then fit its share): QLoRA is the plan
    cfg = BASE.with_(use_vllm=True, vllm_gpu_memory_utilization=0.05)
    adv = advise(cfg, ARCH, toy_vllm, budget_bytes=14_000_000, starts=lambda c, arch: c.load_in_4bit)
    bf16 = next(o for o in adv.singles if o.changes[0].key == "bf16")
    assert bf16.need_bytes == 12_614_400 and bf16.fits is False and bf16.starts is False
    assert [c.key for c in adv.plan.changes] == ["qlora"] and adv.plan.fits and adv.plan.starts


def test_solve_vllm_share_only_where_vllm_starts():
    cfg = QLORA.with_(use_vllm=True, vllm_gpu_memory_utilization=0.3)

    def starts(c: RunConfig, arch) -> bool:  # holds one request from 0.12, free at start-up up to 0.20
        return 0.12 <= c.vllm_gpu_memory_utilization <= 0.20

    # the step fits up to 0.10 (test_solve_vllm_share), below where vLLM starts
    sol = solve(cfg, ARCH, "vllm_gpu_memory_utilization", 10_000_000, toy_vllm, starts)
    assert sol.value is None and "starts from 0.12 to 0.2" in sol.note
    # with a 20 MB card the step fits up to 0.234: the largest share that also starts is 0.20
    sol = solve(cfg, ARCH, "vllm_gpu_memory_utilization", 20_000_000, toy_vllm, starts)
    assert sol.value == 0.20
    # another knob cannot make a vLLM start that never does
    sol = solve(cfg, ARCH, "max_completion_length", 10_000_000, toy_vllm, lambda c, arch: False)
    assert sol.value is None and "vLLM does not start" in sol.note


def test_eager_attention_is_advised_sdpa_or_flash_attention_where_transformers_takes_it(monkeypatch):
    # with the real estimator: an eager Llama keeps a [batch, heads, T, T] score and its fp32 softmax per layer,
    # which sdpa never materialises; at 1,536 tokens that is most of the step, so on a 24 GiB budget the cheapest
    # plan (cost 1: the result unchanged) is that switch alone
    from estimator.model.catalog import resolve_model
    from estimator.step.estimate import estimate

    monkeypatch.undo()  # the real band
    cfg = RunConfig(
        model="meta-llama/Llama-3.2-1B-Instruct",
        use_peft=True,
        attn_implementation="eager",
        max_prompt_length=1024,
        per_device_train_batch_size=16,
        num_generations=16,
    )
    adv = advise(cfg, resolve_model(cfg.model), estimate, budget_bytes=24 * 2**30)
    sdpa = next(o for o in adv.singles if o.changes[0].key == "sdpa")
    assert sdpa.config == cfg.with_(attn_implementation="sdpa") and sdpa.saved_bytes > 8 * 2**30
    assert [c.key for c in adv.plan.changes] == ["sdpa"]
    assert "fa2" not in {o.changes[0].key for o in adv.singles}  # sdpa needs no extra package
    # Gemma 2 soft-caps its attention logits, which transformers' sdpa path refuses; flash-attn applies the cap
    gemma = cfg.with_(model="google/gemma-2-2b-it")
    singles = {o.changes[0].key: o for o in advise(gemma, resolve_model(gemma.model), estimate).singles}
    assert "sdpa" not in singles
    assert singles["fa2"].config == gemma.with_(attn_implementation="flash_attention_2")
    assert singles["fa2"].saved_bytes > 2**30
    # already on sdpa: nothing to switch
    plain = cfg.with_(attn_implementation="sdpa")
    assert "sdpa" not in {
        o.changes[0].key for o in advise(plain, resolve_model(plain.model), estimate).singles
    }


def test_a_kl_term_is_advised_away_where_it_loads_a_reference_model(monkeypatch):
    # TRL 1.16 loads a second copy of the policy for beta > 0 without PEFT (a bf16 Qwen2.5-7B: 7.6 B parameters,
    # 15.2 GB, ../shared/model_configs/SOURCES.md); beta 0 drops it. TRL 0.14 loads the reference whatever beta
    # is, so there it saves nothing and is not listed.
    from estimator.model.catalog import resolve_model
    from estimator.step.estimate import estimate

    monkeypatch.undo()
    cfg = RunConfig(model="Qwen/Qwen2.5-7B-Instruct", dtype="bfloat16", beta=0.04)
    arch = resolve_model(cfg.model)
    beta0 = next(o for o in advise(cfg, arch, estimate).singles if o.changes[0].key == "beta0")
    assert beta0.config == cfg.with_(beta=0.0) and beta0.saved_bytes >= 7.6e9 * 2
    old = cfg.with_(trl_version="0.14")
    assert "beta0" not in {o.changes[0].key for o in advise(old, arch, estimate).singles}
    assert "beta0" not in {o.changes[0].key for o in advise(cfg.with_(beta=0.0), arch, estimate).singles}
