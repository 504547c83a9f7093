"""The checks TRL 1.16 / transformers / PEFT make on a GRPO configuration, as one-line errors."""

from __future__ import annotations

from estimator.architecture import Arch
from estimator.config import RunConfig, check_value, schema
from estimator.trl_versions import profile


class InvalidConfig(ValueError):
    """A configuration TRL (or transformers / PEFT) would reject."""


def lora_module_names(arch: Arch) -> set[str]:
    """Names of the nn.Linear modules LoRA can target in one decoder layer."""
    return {lin.name.rsplit(".", 1)[-1] for lin in arch.layer_linears if lin.is_nn_linear}


def check_values(cfg: RunConfig) -> None:
    """Every setting's type, bounds and choices, from its schema entry (`estimator.config.Setting`)."""
    for f in schema():
        value = getattr(cfg, f.name)
        problem = check_value(f, value)
        if problem:
            raise InvalidConfig(f"{f.flag} {value!r}: {problem}")


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


def check_combination(cfg: RunConfig, arch: Arch | None) -> None:
    """Options that only make sense together (PEFT, 4-bit, vLLM, sharding, LoRA targets)."""
    try:
        profile(cfg.trl_version)  # a modelled TRL release
    except ValueError as e:
        raise InvalidConfig(str(e)) from None
    if cfg.load_in_4bit and not cfg.use_peft:
        raise InvalidConfig(
            "--load-in-4bit needs --use-peft: transformers refuses to fine-tune a purely quantized model"
        )
    if cfg.device == "cpu" and cfg.use_vllm:  # bitsandbytes 4-bit runs on CPU (the sweep measures it)
        raise InvalidConfig("--device cpu cannot run --use-vllm (vLLM needs CUDA); drop --use-vllm")
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
