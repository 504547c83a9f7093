"""Build a GRPOTrainer the way a TRL user does: model path, model_init_kwargs, LoraConfig, GRPOConfig, reward."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from estimator.settings.config import RunConfig
from sweeps.runner import data, deepspeed_config, tiny

# Run settings that are not estimator fields (the run's `variant`), with their defaults.
VARIANT_DEFAULTS = {
    "steps": 2,
    "prompts": "synthetic",  # synthetic = prompts of exactly max_prompt_length tokens; or gsm8k
    "force_length": True,  # suppress EOS until max_completion_length, so every completion has that length
    "num_prompts": 64,
    "learning_rate": 1e-5,
    "lora_alpha": 32,
    "seed": 0,
    "weights": "pretrained",  # pretrained = the hub checkpoint; random = catalog config.json, random weights, no hub
}
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def correctness_reward(completions, answer=None, **kwargs) -> list[float]:
    """1 when the last number in a completion equals the GSM8K answer; else the fraction of distinct tokens."""
    answers = answer or [""] * len(completions)
    out = []
    for text, ans in zip(completions, answers, strict=False):
        text = text if isinstance(text, str) else " ".join(m.get("content", "") for m in text)
        if ans:
            nums = NUMBER.findall(text)
            out.append(1.0 if nums and nums[-1] == ans else 0.0)
        else:
            toks = text.split()
            out.append(len(set(toks)) / max(1, len(toks)))
    return out


@dataclass
class Built:
    """A ready trainer plus what the row needs to know about how it was built."""

    trainer: object
    model_path: str
    tokenizer: object
    hf_config: dict | None = None
    info: dict = field(default_factory=dict)


def prepare_model(
    cfg: RunConfig, workdir: Path, seed: int, weights: str = "pretrained"
) -> tuple[str, dict | None]:
    """(model path or hub id, config.json dict for in-code models): in-code models are save_pretrained first.

    Tiny models always have random weights; `weights="random"` builds a catalog model at full size with random
    weights and saves it (tiny.save_random), so TRL loads it from that path with the run's model_init_kwargs.
    """
    if tiny.is_tiny(cfg.model):
        path = workdir / "model"
        tiny.save_tiny(cfg.model, str(path), seed=seed)
        return str(path), tiny.hf_config(cfg.model)
    if weights == "random":
        return str(tiny.save_random(cfg.model, seed=seed, device=cfg.device)), tiny.catalog_config(cfg.model)
    if weights != "pretrained":
        raise ValueError(f"run.weights={weights!r}: accepted values are {', '.join(tiny.WEIGHTS)}")
    return cfg.model, None


def model_init_kwargs(cfg: RunConfig) -> dict:
    """model_init_kwargs honouring RunConfig.dtype, attention, and 4-bit loading for QLoRA."""
    import torch
    from transformers import BitsAndBytesConfig

    kwargs: dict = {"dtype": cfg.dtype, "attn_implementation": cfg.attn_implementation}
    if cfg.load_in_4bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=cfg.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=cfg.use_bnb_nested_quant,
            bnb_4bit_compute_dtype=getattr(torch, cfg.dtype),
        )
    return kwargs


def peft_config(cfg: RunConfig, variant: dict):
    """LoraConfig for use_peft runs (target modules None = PEFT's default for the model type)."""
    if not cfg.use_peft:
        return None
    from peft import LoraConfig

    targets = list(cfg.lora_target_modules) if cfg.lora_target_modules else None
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=variant["lora_alpha"],
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )


# What `build` applies beyond GRPOConfig's own settings (`grpo_config_values`): the model and its load
# (model_init_kwargs, BitsAndBytesConfig, LoraConfig), the prompts, and what only the estimator reads
# (gpu_memory_gib; trl_version and transformers_version, checked against the installed releases by
# `release_problem`), ZeRO sharding with its offload (`deepspeed_config`), and generation's cache (through
# generation_kwargs, `grpo_args`). Roles, vLLM server and sleep-level knobs, FSDP and allocator settings are not.
APPLIED_BEYOND_GRPO_CONFIG = frozenset({
    "model", "device", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_target_modules", "lora_dropout",
    "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "max_prompt_length", "bf16", "logprob_head",
    "num_gpus", "sharding", "offload_optimizer", "offload_param", "gpu_memory_gib", "trl_version",
    "transformers_version", "generation_use_cache",
})  # fmt: skip


def applied_settings() -> frozenset[str]:
    """Every run setting one runner process applies; any other must stay at its default."""
    return APPLIED_BEYOND_GRPO_CONFIG | set(grpo_config_values(RunConfig()))


def grpo_config_values(cfg: RunConfig) -> dict:
    """Every run setting TRL's GRPOConfig takes under its own name, from the schema (`estimator.settings.config`: group
    GRPOConfig, not ours) and present in the installed GRPOConfig; a setting added to the schema reaches TRL here
    with no further edit. (ms-swift / OpenRLHF keys such as vllm_sleep_level are not GRPOConfig's: skipped.)"""
    from dataclasses import fields as dataclass_fields

    from trl import GRPOConfig

    from estimator.settings.config import schema

    known = {f.name for f in dataclass_fields(GRPOConfig)}
    return {
        f.name: getattr(cfg, f.name)
        for f in schema()
        if f.meta.group == "GRPOConfig" and not f.meta.ours and f.name in known and f.name != "bf16"
    }


def grpo_args(cfg: RunConfig, variant: dict, output_dir: Path):
    """GRPOConfig with the run's settings (TRL defaults elsewhere)."""
    from trl import GRPOConfig

    ds = deepspeed_config.ds_config(cfg)
    kwargs = dict(
        output_dir=str(output_dir),
        # DeepSpeed on CPU (a rehearsal) runs through its CPU accelerator: accelerate takes the DeepSpeed path
        # only without use_cpu
        use_cpu=cfg.device == "cpu" and ds is None,
        bf16=cfg.bf16,
        report_to="none",
        max_steps=variant["steps"],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        learning_rate=variant["learning_rate"],
        seed=variant["seed"],
        **grpo_config_values(cfg),
        model_init_kwargs=model_init_kwargs(cfg),
    )
    if cfg.bf16 is False:
        kwargs["fp16"] = False
    if ds is not None:
        kwargs["deepspeed"] = ds
    generation_kwargs = {}
    if variant["force_length"]:
        # EOS is masked until the last token (a random model emits EOS at random); vLLM's SamplingParams name it
        # min_tokens, transformers' generate min_new_tokens
        key = "min_tokens" if cfg.use_vllm else "min_new_tokens"
        generation_kwargs[key] = cfg.max_completion_length
    if not cfg.use_vllm:
        # said, not left to the checkpoint: a generation config with "use_cache": false (a random-weight
        # checkpoint saved from a config.json that says so writes one) would otherwise decode without a cache
        generation_kwargs["use_cache"] = cfg.generation_use_cache
    kwargs["generation_kwargs"] = generation_kwargs
    return GRPOConfig(**kwargs)


def release_problem(cfg: RunConfig) -> str | None:
    """Why this environment cannot run `cfg.trl_version` / `cfg.transformers_version` (it runs the installed
    releases only), or None."""
    from estimator.settings.trl_versions import fmt, installed_version
    from estimator.settings.versions import default_transformers

    here = installed_version()
    if here is not None and cfg.trl_version != fmt(here):
        return (
            f"trl_version={cfg.trl_version}: this environment runs TRL {fmt(here)}; "
            "older releases run in their own environments through `make sweep-legacy`"
        )
    if cfg.transformers_version != default_transformers():
        return (
            f"transformers_version={cfg.transformers_version}: this environment runs transformers "
            f"{default_transformers()}; install that release to measure another"
        )
    return None


def build(cfg: RunConfig, variant: dict, workdir: Path, after_context=None) -> Built:
    """Model on disk, tokenizer, prompts, reward, GRPOConfig -> GRPOTrainer (the user's path).

    `after_context()`, if given, runs once the bare CUDA context is measured and before the model is made
    (the `history` probe starts recording there)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    variant = {**VARIANT_DEFAULTS, **variant}
    problem = release_problem(cfg)
    if problem:
        raise ValueError(problem)
    workdir = Path(workdir)
    info: dict = {}
    if cfg.device == "cuda":
        # the bare CUDA context, before anything (random init, model load) touches the GPU
        from sweeps.probes.torch_cuda import context_baseline

        info["cuda_context"] = context_baseline()
    if after_context is not None:
        after_context()
    model_path, hf_config = prepare_model(cfg, workdir, variant["seed"], variant["weights"])
    if hf_config is not None:  # AutoTokenizer would map model_type qwen2 to Qwen2Tokenizer
        tokenizer = tiny.build_tokenizer(hf_config["vocab_size"])
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts_needed = cfg.global_generation_batch // cfg.num_generations * variant["steps"]
    rows = data.prompt_rows(
        variant["prompts"],
        tokenizer,
        cfg.max_prompt_length,
        max(variant["num_prompts"], prompts_needed),
        variant["seed"],
    )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=correctness_reward,
        args=grpo_args(cfg, variant, workdir / "out"),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config(cfg, variant),
    )
    return Built(trainer=trainer, model_path=model_path, tokenizer=tokenizer, hf_config=hf_config, info=info)


def count_params(model) -> tuple[int, int]:
    """(base parameters, trainable parameters); 4-bit packed weights count their unpacked elements, ZeRO-3
    partitioned ones their full size."""
    total = trainable = 0
    for name, p in model.named_parameters():
        qs = getattr(p, "quant_state", None)
        n = 1
        if qs is not None and getattr(qs, "shape", None) is not None:
            for s in qs.shape:
                n *= int(s)
        elif hasattr(
            p, "ds_numel"
        ):  # ZeRO-3 partitions in place: the local tensor is empty, ds_numel the whole
            n = int(p.ds_numel)
        else:
            n = p.numel()
        if p.requires_grad:
            trainable += n
        if "lora_" not in name:
            total += n
    return total, trainable
