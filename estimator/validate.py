"""The checks TRL 1.16 / transformers / PEFT make on a GRPO configuration, as one-line errors."""

from __future__ import annotations

from estimator.architecture import Arch
from estimator.config import (
    ATTN_IMPLEMENTATIONS,
    DEVICES,
    DTYPES,
    LOGPROB_HEADS,
    OPTIMIZERS,
    SHARDINGS,
    VLLM_MODES,
    RunConfig,
)

POSITIVE_INTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "max_completion_length",
    "num_iterations",
    "num_gpus",
    "lora_r",
)
OPTIONAL_POSITIVE_INTS = ("steps_per_generation", "generation_batch_size")
CHOICES = {
    "dtype": DTYPES,
    "attn_implementation": ATTN_IMPLEMENTATIONS,
    "optim": OPTIMIZERS,
    "vllm_mode": VLLM_MODES,
    "logprob_head": LOGPROB_HEADS,
    "device": DEVICES,
    "sharding": SHARDINGS,
}


class InvalidConfig(ValueError):
    """A configuration TRL (or transformers / PEFT) would reject."""


def flag(name: str) -> str:
    """The CLI flag of a RunConfig field."""
    return {"num_gpus": "--gpus"}.get(name, "--" + name.replace("_", "-"))


def lora_module_names(arch: Arch) -> set[str]:
    """Names of the nn.Linear modules LoRA can target in one decoder layer."""
    return {lin.name.rsplit(".", 1)[-1] for lin in arch.layer_linears if lin.is_nn_linear}


def check_values(cfg: RunConfig) -> None:
    """Types, ranges and choices of single values."""
    for name in POSITIVE_INTS + OPTIONAL_POSITIVE_INTS:
        v = getattr(cfg, name)
        if v is None and name in OPTIONAL_POSITIVE_INTS:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise InvalidConfig(f"{flag(name)} must be a positive integer, got {v!r}")
    if not isinstance(cfg.max_prompt_length, int) or cfg.max_prompt_length < 0:
        raise InvalidConfig(f"--max-prompt-length must be an integer >= 0, got {cfg.max_prompt_length!r}")
    for name, choices in CHOICES.items():
        if getattr(cfg, name) not in choices:
            raise InvalidConfig(
                f"unknown {flag(name)} {getattr(cfg, name)!r}; accepted: {', '.join(choices)}"
            )
    if not 0.0 < cfg.vllm_gpu_memory_utilization <= 1.0:
        raise InvalidConfig(
            f"--vllm-gpu-memory-utilization must be in (0, 1], got {cfg.vllm_gpu_memory_utilization}"
        )
    if cfg.beta < 0:
        raise InvalidConfig(f"--beta must be >= 0, got {cfg.beta}")


def check_geometry(cfg: RunConfig) -> None:
    """GRPOConfig.__post_init__ (grpo_config.py): generation batch resolution and divisibility."""
    bs, procs = cfg.per_device_train_batch_size, cfg.num_gpus
    if cfg.generation_batch_size is not None and cfg.steps_per_generation is not None:
        raise InvalidConfig(
            "'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time"
        )
    if cfg.generation_batch_size is not None and cfg.generation_batch_size % (bs * procs) != 0:
        raise InvalidConfig(
            f"generation_batch_size ({cfg.generation_batch_size}) must be divisible by the global batch size "
            f"({bs * procs} = per_device_train_batch_size {bs} x {procs} processes)"
        )
    gbs = cfg.global_generation_batch
    if gbs % cfg.num_generations != 0:
        raise InvalidConfig(
            f"generation_batch_size ({gbs} = per_device_train_batch_size {bs} x {procs} processes x "
            f"steps_per_generation {cfg.resolved_steps_per_generation}) must be divisible by num_generations "
            f"({cfg.num_generations})"
        )
    if cfg.num_generations < 2:
        raise InvalidConfig(
            f"GRPO requires at least 2 generations per prompt (--num-generations), got {cfg.num_generations}"
        )


def check_combination(cfg: RunConfig, arch: Arch | None) -> None:
    """Options that only make sense together (PEFT, 4-bit, vLLM, sharding, LoRA targets)."""
    if cfg.load_in_4bit and not cfg.use_peft:
        raise InvalidConfig(
            "--load-in-4bit needs --use-peft: transformers refuses to fine-tune a purely quantized model"
        )
    if cfg.device == "cpu" and (cfg.use_vllm or cfg.load_in_4bit):
        raise InvalidConfig("--device cpu cannot run --use-vllm or --load-in-4bit (both need CUDA)")
    if cfg.device == "cpu" and (cfg.num_gpus != 1 or cfg.sharding != "none"):
        raise InvalidConfig("--device cpu is a single process: drop --gpus / --zero / --fsdp")
    targets = cfg.lora_target_modules
    if cfg.use_peft and targets and arch is not None:
        if "lm_head" in targets:
            raise InvalidConfig(
                "TRL 1.16 rejects a LoRA on lm_head (its fused log-prob head reads lm_head.weight)"
            )
        if tuple(targets) != ("all-linear",):
            known = lora_module_names(arch)
            missing = [t for t in targets if t not in known]
            if missing:
                raise InvalidConfig(
                    f"--lora-target-modules {', '.join(missing)} not found in {arch.name}; "
                    f"accepted: all-linear or {', '.join(sorted(known))}"
                )


def validate(cfg: RunConfig, arch: Arch | None = None) -> None:
    """Raise InvalidConfig (one line) for anything TRL, transformers or PEFT would refuse."""
    check_values(cfg)
    check_geometry(cfg)
    check_combination(cfg, arch)
    from estimator.compat import check_library_support  # compat imports InvalidConfig from here

    check_library_support(cfg, arch)
