"""Seeded random RunConfigs over every axis the estimator accepts (the `validation` and `heldout` grids of
sweeps/trace/grids.py, which name the seeds).

`random_configs(seed, n)` draws `n` configurations with `random.Random(seed)`: the same seed gives the same
configs on every machine and Python version (only `Random.random/choice/randrange` are used). Axes: every
catalog family, dtype, full / LoRA / QLoRA, rank, targets, dropout, GC, batch != generations, GA,
steps_per_generation, num_iterations, beta, prompt 32-4096, completion 32-8192, every optimizer, attention
implementation, cast_lm_head_to_fp32, chunked / full log-prob head.

A drawn config the libraries refuse becomes what a user would have to pass (`_as_accepted`); one this machine
cannot trace keeps its reason (`skip_reason`), written as a `status: "skipped"` row.
"""

from __future__ import annotations

import math
import random

from estimator.model.catalog import resolve_model
from estimator.settings.config import OPTIMIZERS, RunConfig

# Depth cap: at ~0.3 of a core a full-depth trace takes 1-4 minutes, so a random grid traces each model at full
# width, vocabulary, batch and lengths with its first DEPTH decoder layers (at least one period of the family's
# layer kinds: 6 for gemma-3, whose every 6th layer is global), and the estimator is held to that same config.json.
DEPTH = 4
MAX_MICRO = (
    2  # score chunks / training micro-batches per step (step.run's time cap: same peak as all of them)
)


def layers_for(cfg: RunConfig) -> int:
    """Decoder layers a random grid traces for `cfg` (recorded in the row's variant and model.config)."""
    return max(DEPTH, resolve_model(cfg.model).family.layer_period)


# every catalog model, grouped by family (families are drawn uniformly, then a size within the family)
FAMILIES: dict[str, tuple[str, ...]] = {
    "qwen2.5": ("0.5B", "1.5B", "3B", "7B", "14B", "32B"),
    "qwen3": ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B", "Qwen/Qwen3-14B"),
    "qwen3-moe": ("Qwen/Qwen3-30B-A3B",),
    "llama3": (
        "meta-llama/Llama-3.2-1B-Instruct",
        "meta-llama/Llama-3.2-3B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
    ),
    "gemma2": ("google/gemma-2-2b-it",),
    "gemma3": ("google/gemma-3-1b-it",),
    "phi3": ("microsoft/Phi-3-mini-4k-instruct",),
    "smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct"),
    "deepseek-r1-distill": ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",),
}
# the 72B / 70B / 32B (Qwen3) models trace too, but 64-80 layers cost minutes each on 2 shared cores
ATTENTION_ONLY = {
    "phi3": ("qkv_proj", "o_proj"),
}
DEFAULT_ATTENTION_ONLY = ("q_proj", "k_proj", "v_proj", "o_proj")


def _log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    """An integer drawn log-uniformly in [lo, hi]."""
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def draw(rng: random.Random) -> RunConfig:
    """One random configuration a user could pass (after the library-refusal fix-ups in the module docstring)."""
    family = rng.choice(sorted(FAMILIES))
    model = rng.choice(FAMILIES[family])
    record = resolve_model(model).family  # estimator/model/families.py: what PEFT and transformers accept
    method = rng.choice(("full", "lora", "qlora"))
    peft = method != "full"
    targets: tuple[str, ...] | None = None
    if peft:
        kind = rng.choice(("default", "attention", "all-linear"))
        if kind == "default" and record.peft_default_targets is None:  # peft has no default for the family
            kind = rng.choice(("attention", "all-linear"))
        if kind == "attention":
            targets = ATTENTION_ONLY.get(family, DEFAULT_ATTENTION_ONLY)
        elif kind == "all-linear":
            targets = ("all-linear",)
    gens = rng.choice((2, 4, 8, 16))
    batch = rng.choice((1, 2, 4, 8, 16))
    ga = rng.randrange(1, 9)
    # steps_per_generation: TRL's default (= GA) or a multiple of it, with bs × spg a multiple of gens
    spg = ga * rng.choice((1, 1, 2))
    while (batch * spg) % gens:
        spg += ga
    attn = rng.choice(("sdpa",) * 4 + ("eager",) * 3 + ("flash_attention_2",))
    if attn == "sdpa" and record.sdpa_refused:  # transformers refuses sdpa for the family
        attn = "eager"
    dtype = rng.choice(("bfloat16", "bfloat16", "float32", "float16"))
    cfg = RunConfig(
        model=model,
        dtype=dtype,
        bf16=dtype != "float16",  # fp16 weights run without bf16 autocast (a user sets fp16, not bf16)
        attn_implementation=attn,
        use_peft=peft,
        load_in_4bit=method == "qlora",
        lora_r=rng.choice((8, 16, 32, 64, 128)),
        lora_target_modules=targets,
        lora_dropout=rng.choice((0.0, 0.05, 0.05, 0.1)),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=ga,
        num_generations=gens,
        steps_per_generation=None if spg == ga else spg,
        max_prompt_length=_log_uniform_int(rng, 32, 4096),
        max_completion_length=_log_uniform_int(rng, 32, 8192),
        num_iterations=rng.choice((1, 1, 2, 3)),
        beta=rng.choice((0.0, 0.0, 0.04)),
        gradient_checkpointing=rng.random() < 0.5,
        optim=rng.choice(OPTIMIZERS),
        cast_lm_head_to_fp32=rng.random() < 0.25,
        logprob_head="full" if rng.random() < 0.1 else "chunked",
    )
    return _as_accepted(cfg)


def _as_accepted(cfg: RunConfig) -> RunConfig:
    """What a user passes once TRL / PEFT refuse the drawn config (estimator.settings.compat); no further random draws."""
    from estimator.model.catalog import resolve_model

    arch = resolve_model(cfg.model)
    if cfg.use_peft and arch.is_moe and cfg.lora_dropout != 0 and cfg.lora_target_modules == ("all-linear",):
        cfg = cfg.with_(lora_dropout=0.0)
    if cfg.use_peft and cfg.cast_lm_head_to_fp32 and arch.tie_word_embeddings:
        cfg = cfg.with_(cast_lm_head_to_fp32=False)
    return cfg


def random_configs(seed: int, n: int) -> list[RunConfig]:
    """`n` configurations drawn with `random.Random(seed)` (deterministic)."""
    rng = random.Random(seed)
    return [draw(rng) for _ in range(n)]


def skip_reason(cfg: RunConfig) -> str | None:
    """Why this machine cannot trace `cfg` (the row is recorded as skipped with this reason), or None."""
    if cfg.logprob_head == "full":
        return "logprob_head=full is TRL < 1.x's path; the tracer runs TRL 1.16, whose GRPOTrainer always uses the fused head"
    if cfg.attn_implementation == "flash_attention_2":
        return "flash_attention_2 needs the flash-attn package and a CUDA device; neither exists on the trace machine"
    if cfg.model in FAMILIES["qwen3-moe"] and cfg.dtype != "bfloat16":
        return (
            "the trace machine's torch.grouped_mm (CPU) takes bf16 experts only; this MoE config loads them in "
            + cfg.dtype
        )
    return None
