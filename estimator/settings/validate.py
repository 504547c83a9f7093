"""The checks TRL 1.16 / transformers / PEFT make on a GRPO configuration, as one-line errors."""

from __future__ import annotations

from collections.abc import Iterable

from estimator.model.architecture import Arch
from estimator.model.quantized import quant_spec
from estimator.settings.compat import check_library_support
from estimator.settings.config import InvalidConfig, RunConfig, check_value, flag, schema
from estimator.settings.role_spec import MAX_ROLES, RoleSpecError, group_size_conflict, parse_role
from estimator.settings.trl_versions import profile
from estimator.text import listed, printable, shown


def lora_module_names(arch: Arch) -> set[str]:
    """Names of the nn.Linear modules LoRA can target in one decoder layer."""
    return {lin.name.rsplit(".", 1)[-1] for lin in arch.layer_linears if lin.is_nn_linear}


def check_values(cfg: RunConfig) -> None:
    """Every setting's type, bounds and choices, from its schema entry (`estimator.settings.config.Setting`)."""
    for f in schema():
        value = getattr(cfg, f.name)
        problem = check_value(f, value)
        if problem:  # a list of names as typed, each quoted: --reward-model '0.5B' ''
            said = " ".join(shown(v, 40) for v in value[:6]) if isinstance(value, tuple) else shown(value)
            detail = f"{said}: {problem}"
            raise InvalidConfig(f"{f.flag} {detail}", f.name, detail)
    try:  # a release this estimator models (MAJOR.MINOR within the release table)
        profile(cfg.trl_version)
    except ValueError as e:
        raise InvalidConfig(str(e).splitlines()[0]) from None


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


def check_roles(cfg: RunConfig) -> None:
    """Every reward / reference / value model reads as MODEL[@own[=GROUP][:N]] (estimator/settings/role_spec.py),
    at most MAX_ROLES of them, and roles sharing a GPU group agree on its size."""
    named = [("reward_models", "reward", s) for s in cfg.reward_models or ()]
    named += [("reference_models", "reference", s) for s in cfg.reference_models or ()]
    named += [("value_model", "value", cfg.value_model)] if cfg.value_model is not None else []
    if len(named) > MAX_ROLES:
        raise InvalidConfig(
            f"{len(named)} models beside the policy ({flag('reward_models')}, {flag('reference_models')}, "
            f"{flag('value_model')} together): at most {MAX_ROLES}"
        )
    roles = []
    for name, kind, spec in named:
        try:
            roles.append(parse_role(kind, spec))
        except RoleSpecError as e:
            raise InvalidConfig(f"{flag(name)} {e}") from None
    conflict = group_size_conflict(roles)
    if conflict:
        group, a, b = conflict
        flag_of = {kind: flag(name) for name, kind, _ in named}
        raise InvalidConfig(
            f"GPU group {shown(group, 40)} is given two sizes: {a.gpus} ({flag_of[a.kind]} {shown(a.model, 40)}) "
            f"and {b.gpus} ({flag_of[b.kind]} {shown(b.model, 40)}); roles sharing a group share its GPUs: "
            "give one :N (or leave it out)"
        )


def check_combination(cfg: RunConfig, arch: Arch | None) -> None:
    """Options that only make sense together (PEFT, 4-bit, GPTQ/AWQ, vLLM, sharding, LoRA targets, roles)."""
    if (
        cfg.use_vllm and cfg.vllm_mode == "colocate" and cfg.num_gpus % cfg.vllm_tensor_parallel_size != 0
    ):  # trl/generation/vllm_generation.py L314-318 (TRL 1.16)
        raise InvalidConfig(
            f"--vllm-tensor-parallel-size {cfg.vllm_tensor_parallel_size} must divide --gpus {cfg.num_gpus} in "
            "colocate mode (TRL raises 'tensor_parallel_size must divide world size evenly')"
        )
    tp = cfg.vllm_tensor_parallel_size
    if cfg.use_vllm and cfg.vllm_mode == "server" and cfg.vllm_server_gpus % tp != 0:
        # trl vllm-serve runs data_parallel_size x tensor_parallel_size GPUs: a whole number of TP groups
        raise InvalidConfig(
            f"--vllm-server-gpus {cfg.vllm_server_gpus} is not a multiple of --vllm-tensor-parallel-size {tp}: "
            "trl vllm-serve runs data parallel x tensor parallel GPUs; accepted: server GPUs = k x "
            f"{tp} (e.g. {tp * max(1, cfg.vllm_server_gpus // tp)})"
        )
    heads = arch.num_heads if arch is not None else None
    if cfg.use_vllm and heads and heads % tp != 0:
        # vLLM ModelConfig.verify_with_parallel_config: "Total number of attention heads (H) must be divisible by
        # tensor parallel size (TP)"
        fitting = [d for d in range(1, min(heads, 64) + 1) if heads % d == 0]
        raise InvalidConfig(
            f"--vllm-tensor-parallel-size {tp}: {printable(arch.name, 80)} has {heads} attention heads and vLLM "
            f"needs them divisible by the tensor parallel size; accepted: {', '.join(map(str, fitting))}"
        )
    if cfg.load_in_4bit and not cfg.use_peft:
        raise InvalidConfig(
            "--load-in-4bit needs --use-peft: transformers refuses to fine-tune a purely quantized model"
        )
    if arch is not None and not cfg.use_peft:
        spec = quant_spec((arch.extra or {}).get("config", {}))
        if spec is not None:
            raise InvalidConfig(
                f"{arch.name} is a {spec.method.upper()} {spec.bits}-bit checkpoint: its packed weights cannot be "
                "trained; pass --use-peft (LoRA adapters on the quantized base)"
            )
    n = cfg.vllm_max_model_length
    # vLLM v1 InputProcessor._validate_model_input: a prompt of max_model_len tokens or more, asked for one more
    # token, raises "The decoder prompt ... is longer than the maximum model length"
    if cfg.use_vllm and n is not None and cfg.max_prompt_length >= n:
        raise InvalidConfig(
            f"--vllm-max-model-length {n} leaves no room after a {cfg.max_prompt_length}-token prompt: vLLM refuses "
            f"a prompt of max_model_len tokens or more; give at least {cfg.sequence_length} "
            "(prompt + completion)"
        )
    if cfg.vllm_enable_sleep_mode and cfg.vllm_sleep_level == 0:
        raise InvalidConfig(
            "--vllm-enable-sleep-mode with --vllm-sleep-level 0 (never sleeps): drop one, or give level 1 or 2"
        )
    check_roles(cfg)
    if cfg.device == "cpu" and cfg.use_vllm:  # bitsandbytes 4-bit runs on CPU (the sweep measures it)
        raise InvalidConfig("--device cpu cannot run --use-vllm (vLLM needs CUDA); drop --use-vllm")
    if cfg.device == "cpu" and cfg.sharding != "none":  # --gpus N on CPU: N DDP processes over gloo
        raise InvalidConfig(
            "--device cpu shards nothing (its processes run DDP over gloo): drop --zero / --fsdp"
        )
    problem = offload_problem(cfg)
    if problem:
        raise InvalidConfig(problem)
    targets = cfg.lora_target_modules
    if cfg.use_peft and targets and arch is not None:
        if "lm_head" in targets:
            raise InvalidConfig(
                "TRL 1.16 rejects a LoRA on lm_head (its fused log-prob head reads lm_head.weight)"
            )
        if "all-linear" in targets and len(targets) > 1:  # PEFT takes the string "all-linear", not in a list
            others = [t for t in targets if t != "all-linear"]
            raise InvalidConfig(
                f"--lora-target-modules all-linear cannot be combined with module names ({listed(others, 4)}); "
                "accepted: all-linear alone, or names alone"
            )
        if tuple(targets) != ("all-linear",):
            known = lora_module_names(arch)
            missing = [t for t in targets if t not in known]
            if missing:
                comma = any(t.endswith(",") for t in missing)
                hint = (
                    ' (a name ends in a comma: in `"q_proj", "v_proj"` the shell keeps the comma, and PEFT '
                    "matches no module by that name)"
                    if comma
                    else ""
                )
                raise InvalidConfig(
                    f"--lora-target-modules {listed(missing, 4)} not found in {printable(arch.name, 80)}{hint}; "
                    f"accepted: all-linear or {', '.join(sorted(known))}"
                )


def offload_problem(cfg: RunConfig) -> str | None:
    """One line when the offload flags do not fit the sharding (as DeepSpeed / accelerate refuse them), else None."""
    if not (cfg.offload_optimizer or cfg.offload_param):
        return None
    if cfg.sharding == "none":
        return "--offload-optimizer / --offload-param need DeepSpeed ZeRO or FSDP: add --zero 2|3 or --fsdp"
    if cfg.sharding == "fsdp" and cfg.offload_optimizer and not cfg.offload_param:
        return "FSDP offloads parameters, gradients and optimizer state together: use --offload-param with --fsdp"
    if cfg.sharding == "zero2" and cfg.offload_param:
        return "--offload-param needs ZeRO-3 (DeepSpeed offloads parameters only at stage 3); use --zero 3"
    return None


def validate(cfg: RunConfig, arch: Arch | None = None) -> None:
    """Raise InvalidConfig (one line) for anything TRL, transformers or PEFT would refuse."""
    check_values(cfg)
    check_geometry(cfg)
    check_combination(cfg, arch)
    check_library_support(cfg, arch)


INERT_WITHOUT = {  # settings that change nothing unless another one is on: (the switch, how to turn it on)
    "lora_r": ("use_peft", "--lora"),
    "lora_target_modules": ("use_peft", "--lora"),
    "lora_dropout": ("use_peft", "--lora"),
    "bnb_4bit_quant_type": ("load_in_4bit", "--load-in-4bit (or --qlora)"),
    "use_bnb_nested_quant": ("load_in_4bit", "--load-in-4bit (or --qlora)"),
    "vllm_mode": ("use_vllm", "--use-vllm"),
    "vllm_gpu_memory_utilization": ("use_vllm", "--use-vllm"),
    "vllm_enable_sleep_mode": ("use_vllm", "--use-vllm"),
    "vllm_importance_sampling_correction": ("use_vllm", "--use-vllm"),
}


def notes(cfg: RunConfig, arch: Arch | None, given: Iterable[str] = ()) -> list[str]:
    """One-line notes for a valid config that may not be what the user meant: settings `given` that have no
    effect here, sharding over one GPU, and prompt + completion past the model's context. Never an error:
    TRL accepts all of these."""
    out = []
    for name in sorted(set(given) & set(INERT_WITHOUT)):
        switch, how = INERT_WITHOUT[name]
        if not getattr(cfg, switch):
            out.append(f"{flag(name)} has no effect without {how} (ignored)")
    if "fsdp_sharding_strategy" in given and cfg.sharding != "fsdp":
        out.append(f"{flag('fsdp_sharding_strategy')} has no effect without FSDP (--fsdp) (ignored)")
    if cfg.use_vllm and cfg.vllm_mode == "server" and cfg.release.vllm_modes != ("separate_device",):
        for name in sorted({"vllm_gpu_memory_utilization", "vllm_enable_sleep_mode"} & set(given)):
            out.append(
                f"{flag(name)} applies to colocate mode; a vLLM server takes its share from "
                "--vllm-server-utilization (trl vllm-serve --gpu_memory_utilization) (ignored)"
            )
    if "ds3_gather_for_generation" in given and not cfg.ds3_gather_for_generation:
        if cfg.sharding != "zero3":
            out.append(f"{flag('ds3_gather_for_generation')} false has no effect without ZeRO-3 (--zero 3)")
        elif cfg.use_vllm:
            out.append(
                f"{flag('ds3_gather_for_generation')} false: TRL says it is not compatible with vLLM generation; "
                "vLLM generates from its own copy, so the estimate is the same"
            )
    if cfg.sharding != "none" and cfg.num_gpus == 1:
        out.append(
            f"--sharding {cfg.sharding} over one GPU shards nothing; give --gpus N for N processes "
            "(estimated as one process holding everything)"
        )
    ctx = (
        ((arch.extra or {}).get("config") or {}).get("max_position_embeddings") if arch is not None else None
    )
    n = cfg.vllm_max_model_length
    if cfg.use_vllm and n is not None and cfg.sequence_length > n:
        out.append(
            f"prompt + completion = {cfg.sequence_length} tokens is past --vllm-max-model-length {n}: vLLM stops "
            f"each completion at {n} tokens in all; the estimate sizes all {cfg.sequence_length} (errs high)"
        )
    if not cfg.use_vllm:
        out += _generation_cache_notes(cfg, arch)
    if isinstance(ctx, int) and cfg.sequence_length > ctx:
        out.append(
            f"prompt + completion = {cfg.sequence_length} tokens is past {arch.name}'s context "
            f"(max_position_embeddings {ctx}): transformers generates past it on positions the model never "
            f"trained on, vLLM stops at its max_model_len; the estimate sizes all {cfg.sequence_length} tokens"
        )
    return out


def _generation_cache_notes(cfg: RunConfig, arch: Arch | None) -> list[str]:
    """Generation without a KV cache, asked for, or possibly the checkpoint's own default (transformers' generate
    follows the checkpoint's generation config: tests/ground_truth/test_generation_without_cache.py)."""
    if not cfg.generation_use_cache:
        return [
            f"generation without a KV cache: each of the {cfg.max_completion_length} tokens re-runs the whole "
            "sequence so far, far slower, and the allocator keeps the segments each longer step outgrows (the "
            "reserved and nvidia-smi lines count them for a card with room, where --detail's reserve source says "
            "so; a smaller card fills and frees them as it needs to; the card's need barely moves)"
        ]
    from estimator.model.catalog import catalog_id

    extra = (arch.extra or {}) if arch is not None else {}
    resolved = extra.get("generation_use_cache")  # catalog.generation_use_cache, where it could be told
    if resolved is False:
        return [
            "this checkpoint's generation config says use_cache: false, so transformers generates without a KV "
            "cache, re-running the whole sequence each token (estimate that with --no-generation-use-cache); "
            "generation_kwargs: {use_cache: true} keeps the cache"
        ]
    said = (extra.get("config") or {}).get("use_cache")
    if resolved is None and said is False and catalog_id(cfg.model) is None:
        return [
            "the model's config.json says use_cache: false; where its generation_config.json says so too, or "
            "it has none, transformers generates without a KV cache (estimate that with --no-generation-use-cache); "
            "generation_kwargs: {use_cache: true} keeps the cache"
        ]
    return []
