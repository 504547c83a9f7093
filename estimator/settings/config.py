"""What one GRPO run is: the settings that set its memory, with TRL 1.16's names and defaults, in one schema.

Every field of `RunConfig` carries its metadata (`Setting`: help, group, choices, bounds, the key TRL /
transformers / accelerate use for it, CLI aliases, the grpo-vram version that introduced it). Everything that
reads run settings derives from this one list: `vram-estimate`'s and the tracer's flags (`estimator/interface/flags.py`),
the validator (`estimator/settings/validate.py`), the GRPOConfig YAML reader (`estimator/interface/configfile.py`) and the sweep's
Hydra schema (`sweeps/runner/schema.py`). Adding a setting is one `setting(...)` line here.

Defaults are TRL's (`trl/trainer/grpo_config.py`, `trl/trainer/model_config.py`, transformers
`TrainingArguments`); fields TRL does not have are marked `ours=True`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from estimator.hardware.allocator import AllocatorSettings, _conf_items, torch_grammar_problem
from estimator.settings.trl_versions import MODELLED, profile
from estimator.settings.versions import (
    MODELLED_TRANSFORMERS,
    NEWEST_TRANSFORMERS,
    RECORDS_TRANSFORMERS,
    transformers_profile,
)
from estimator.text import printable, shown

DTYPES = ("float32", "bfloat16", "float16")
ATTN_IMPLEMENTATIONS = ("sdpa", "flash_attention_2", "eager")
OPTIMIZERS = (
    "adamw_torch_fused",
    "adamw_torch",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "sgd",
)
VLLM_MODES = ("colocate", "server")
SLEEP_LEVELS = (
    0,
    1,
    2,
)  # vLLM LLM.sleep(level): 1 offloads weights to host RAM, 2 discards them; 0 = never sleeps
# TRL 1.15+'s fused chunked head, the classic [B, C, V] logits path, and older releases' materialized-logits
# heads: 0.14's row-wise log_softmax and 0.15-1.14's selective_log_softmax (estimator/settings/trl_versions.py)
LOGPROB_HEADS = ("chunked", "full", "rowwise", "selective")
NEWEST_TRL = MODELLED[-1]  # the newest TRL release modelled (estimator/settings/trl_versions.py)
DEVICES = ("cuda", "cpu")  # cpu = TRL's `use_cpu=True` path
SHARDINGS = ("none", "zero2", "zero3", "fsdp")  # DeepSpeed ZeRO-2/3 or FSDP over `num_gpus`
FSDP_STRATEGIES = (
    "FULL_SHARD",
    "SHARD_GRAD_OP",
)  # accelerate fsdp_sharding_strategy (FSDP2: reshard_after_forward)
MAX_COUNT = 1 << 20  # upper bound of batch-like counts: beyond it no GPU holds one sequence's state
MAX_TOKENS = 1 << 22  # upper bound of token lengths (4M): far past every catalog model's context


class InvalidConfig(ValueError):
    """A configuration TRL (or transformers / PEFT) would reject. For one bad value, `setting` is the field and
    `detail` the message after the setting's name, so the caller names it as the user gave it (flag or file key)."""

    def __init__(self, message: str, setting: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        self.detail = detail


@dataclass(frozen=True)
class Setting:
    """Metadata of one run setting: everything a parser, validator or file reader needs to know about it."""

    help: str
    group: str = "GRPOConfig"  # CLI help group: model, GRPOConfig, hardware
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None  # inclusive
    maximum: float | None = None  # inclusive
    above: float | None = None  # exclusive lower bound (e.g. utilization > 0)
    below: float | None = None  # exclusive upper bound
    trl: str | None = None  # the key in TRL's GRPOConfig / ModelConfig when it differs from the field name
    file_keys: tuple[str, ...] = ()  # further keys a config file may use for it (e.g. torch_dtype)
    aliases: tuple[str, ...] = ()  # further CLI flags (the primary is derived from the name or `flag`)
    flag: str | None = None  # the primary CLI flag when it is not --field-name
    metavar: str | None = None
    ours: bool = False  # not a TRL option: the estimator's own
    since: str = "0.1.0"  # grpo-vram version that introduced it
    check: Callable[[Any], str | None] | None = None  # a further check of a well-typed value: why it is bad
    # what a record without this key means, where records made before the setting existed ran with a value other
    # than its default (None: the default); `to_dict` leaves the key out at that value, `from_dict` fills it in
    absent: Any = None


def setting(default: Any, help: str, **meta: Any) -> Any:
    """A RunConfig field with its metadata (`Setting`)."""
    return field(default=default, metadata={"setting": Setting(help=help, **meta)})


@dataclass(frozen=True)
class RunConfig:
    """One GRPO training configuration; every field has TRL 1.16's default unless marked ours."""

    model: str = setting(
        "7B",
        "size (0.5B 1.5B 3B 7B 14B 32B 72B = Qwen2.5-Instruct), catalog name or HF id (e.g. qwen3-8b, "
        "meta-llama/Llama-3.1-8B-Instruct), a config.json (or its folder), or an HF id in the local HF cache",
        group="model",
        trl="model_name_or_path",
        metavar="MODEL",
        ours=True,
    )
    # ModelConfig
    dtype: str = setting(
        "float32",
        "weight dtype the model loads in (auto = the checkpoint's); TRL loads a model given by name in "
        "float32 unless model_init_kwargs sets a dtype",
        group="model",
        choices=DTYPES,
        trl="model_init_kwargs.dtype",
        file_keys=("torch_dtype",),
    )
    attn_implementation: str = setting(
        "sdpa", "attention kernel transformers uses", group="model", choices=ATTN_IMPLEMENTATIONS
    )
    use_peft: bool = setting(False, "LoRA adapters via PEFT", group="model", aliases=("--lora",))
    lora_r: int = setting(16, "LoRA rank", group="model", minimum=1, maximum=65536, metavar="N")
    lora_target_modules: tuple[str, ...] | None = setting(
        None,
        "module names (space or comma separated) or all-linear (default: PEFT's default for the model type)",
        group="model",
        metavar="MODULE",
    )
    lora_dropout: float = setting(
        0.05,
        "LoRA dropout (TRL ModelConfig's default; PEFT's own is 0.0)",
        metavar="X",
        group="model",
        minimum=0.0,
        below=1.0,
    )
    load_in_4bit: bool = setting(False, "bitsandbytes 4-bit base (QLoRA with --use-peft)", group="model")
    bnb_4bit_quant_type: str = setting("nf4", "4-bit quant type", group="model", choices=("nf4", "fp4"))
    use_bnb_nested_quant: bool = setting(
        False, "nested (double) quantization of the 4-bit scales", group="model"
    )
    # GRPOConfig / TrainingArguments
    per_device_train_batch_size: int = setting(
        8, "completions per device per micro-step", minimum=1, maximum=MAX_COUNT, metavar="N"
    )
    gradient_accumulation_steps: int = setting(
        1, "micro-steps per optimizer step", minimum=1, maximum=MAX_COUNT, metavar="N"
    )
    num_generations: int = setting(
        8,
        "completions per prompt (GRPO needs at least 2)",
        minimum=2,
        maximum=MAX_COUNT,
        aliases=("--gens",),
        metavar="N",
    )
    max_completion_length: int = setting(512, "completion tokens", minimum=1, maximum=MAX_TOKENS, metavar="N")
    max_prompt_length: int = setting(
        256,
        "the prompt length you expect: TRL 1.16 has no such option and never truncates prompts",
        minimum=0,
        maximum=MAX_TOKENS,
        metavar="N",
        ours=True,
    )
    steps_per_generation: int | None = setting(
        None,
        "micro-steps one generation batch serves (default: gradient_accumulation_steps)",
        minimum=1,
        maximum=MAX_COUNT,
        metavar="N",
    )
    generation_batch_size: int | None = setting(
        None,
        "sequences per generation (default: per_device_train_batch_size x GPUs x steps)",
        minimum=1,
        maximum=MAX_COUNT,
        metavar="N",
    )
    num_iterations: int = setting(
        1, "optimization passes per generation batch (mu)", minimum=1, maximum=MAX_COUNT, metavar="N"
    )
    beta: float = setting(
        0.0,
        "KL weight; > 0 adds a reference model (or a pass with adapters disabled)",
        minimum=0.0,
        maximum=1e6,
        metavar="X",
    )
    gradient_checkpointing: bool = setting(True, "recompute activations in backward")
    bf16: bool = setting(True, "bf16 autocast mixed precision (not a weight cast)")
    optim: str = setting("adamw_torch_fused", "optimizer", choices=OPTIMIZERS)
    cast_lm_head_to_fp32: bool = setting(False, "run the LM head in float32")
    ds3_gather_for_generation: bool = setting(
        True,
        "ZeRO-3: gather the whole policy for generate (false: each module is fetched as it runs; not with vLLM)",
        since="0.2.0",
    )
    generation_use_cache: bool = setting(
        True,
        "generate keeps a KV cache (transformers' use_cache; false where the checkpoint's generation config says "
        "use_cache false, or it has none and config.json says so, and generation_kwargs do not set it: every "
        "token then re-runs the whole sequence)",
        trl="generation_kwargs.use_cache",
        since="0.2.0",
    )
    use_vllm: bool = setting(False, "generate with vLLM")
    vllm_mode: str = setting(
        "colocate", "vLLM beside training on the same GPU, or a separate server", choices=VLLM_MODES
    )
    vllm_gpu_memory_utilization: float = setting(
        0.3, "share of the GPU's total memory vLLM reserves", above=0.0, maximum=1.0, metavar="X"
    )
    vllm_enable_sleep_mode: bool = setting(False, "vLLM releases its memory while training runs")
    vllm_importance_sampling_correction: bool = setting(
        True, "TRL's importance-sampling correction (adds an old-policy pass)"
    )
    vllm_max_model_length: int | None = setting(
        None,
        "longest request vLLM admits; its start-up check needs one such request's KV cache "
        "(ms-swift vllm_max_model_len; default: the model's max_position_embeddings)",
        minimum=1,
        maximum=MAX_TOKENS,
        file_keys=("vllm_max_model_len",),
        metavar="N",
        since="0.2.0",
    )
    vllm_tensor_parallel_size: int = setting(
        1,
        "GPUs one vLLM engine spans (tensor parallel)",
        minimum=1,
        maximum=65536,
        metavar="N",
        since="0.2.0",
    )
    vllm_sleep_level: int | None = setting(
        None,
        "level a colocated vLLM sleeps at: 1 parks its weights in host RAM, 2 drops them, 0 never sleeps "
        "(ms-swift sleep_level; default: 2 with --vllm-enable-sleep-mode, as TRL 1.16, else no sleep)",
        choices=SLEEP_LEVELS,
        file_keys=("sleep_level",),
        since="0.2.0",
    )
    vllm_share_base: bool = setting(
        False,
        "vLLM loads only the LoRA weights and shares the trainer's base (Unsloth fast_inference)",
        ours=True,
        since="0.2.0",
    )
    vllm_starts_first: bool = setting(
        False,
        "colocate: vLLM reserves its share before the models load (OpenRLHF / Open-Reasoner-Zero order)",
        ours=True,
        since="0.2.0",
    )
    vllm_server_gpus: int = setting(
        1,
        "server mode: GPUs running trl vllm-serve (data parallel x tensor parallel)",
        minimum=1,
        maximum=65536,
        metavar="N",
        ours=True,
        since="0.2.0",
    )
    vllm_server_utilization: float = setting(
        0.9,
        "server mode: trl vllm-serve --gpu_memory_utilization",
        above=0.0,
        maximum=1.0,
        metavar="X",
        ours=True,
        since="0.2.0",
    )
    # other models beside the policy: MODEL, MODEL@policy, MODEL@own[=GROUP][:N] (estimator/settings/role_spec.py)
    reward_models: tuple[str, ...] | None = setting(
        None,
        "reward model(s) scoring every completion (sequence classification), as MODEL[@own[=GROUP][:N]]: "
        "@own puts it on N GPUs of its own, =GROUP shares them with other roles (default: the policy's GPUs); repeatable",
        group="model",
        flag="--reward-model",
        aliases=("--reward-models",),
        file_keys=("reward_model", "reward_model_name_or_path"),
        metavar="ROLE",
        since="0.2.0",
    )
    reference_models: tuple[str, ...] | None = setting(
        None,
        "separate frozen copies of a policy (an OpenRLHF reference, a sampler's old policy), as "
        "MODEL[@own[=GROUP][:N]]; TRL's own reference is --beta",
        group="model",
        flag="--reference-model",
        aliases=("--reference-models",),
        file_keys=("ref_model",),
        metavar="ROLE",
        since="0.2.0",
    )
    value_model: str | None = setting(
        None,
        "a PPO value model (critic) trained beside the policy, as MODEL[@own[=GROUP][:N]]",
        group="model",
        metavar="ROLE",
        since="0.2.0",
    )
    torch_empty_cache_steps: int | None = setting(
        None,
        "empty the CUDA cache every N steps (transformers TrainingArguments; TRL suggests it to save memory "
        "at the cost of slower steps (about a tenth, TRL says); default: never)",
        minimum=1,
        maximum=MAX_COUNT,
        metavar="N",
        since="0.2.0",
    )
    pytorch_cuda_alloc_conf: str = setting(
        "",
        "the PYTORCH_CUDA_ALLOC_CONF string, e.g. expandable_segments:True or max_split_size_mb:128 "
        "(expandable segments cannot apply inside vLLM's memory pool in colocate mode; default: unset)",
        group="hardware",
        flag="--alloc-conf",
        aliases=("--pytorch-cuda-alloc-conf",),
        metavar="CONF",
        ours=True,
        since="0.2.0",
        check=lambda v: alloc_conf_problem(v),
    )
    # ours
    trl_version: str = setting(
        NEWEST_TRL,
        "TRL release whose GRPO semantics to model, MAJOR.MINOR from 0.14 (defaults, what "
        "per_device_train_batch_size counts (prompts in 0.14), reference model, log-prob head, generation; "
        "default: the installed TRL when modelled, else the newest)",
        group="hardware",
        choices=MODELLED,
        metavar="X.Y",
        ours=True,
        since="0.1.0",
    )
    transformers_version: str = setting(
        NEWEST_TRANSFORMERS,
        "transformers release whose code paths to model, MAJOR.MINOR (the KV cache's dtypes; "
        "default: the installed transformers when modelled, else the newest)",
        group="hardware",
        choices=MODELLED_TRANSFORMERS,
        metavar="X.Y",
        ours=True,
        since="0.2.0",
        absent=RECORDS_TRANSFORMERS,
    )
    logprob_head: str = setting(
        "chunked",
        "TRL's fused chunked log-prob head or full [B, C, V] logits",
        group="hardware",
        choices=LOGPROB_HEADS,
        ours=True,
    )
    device: str = setting(
        "cuda",
        "what the run executes on (cpu = TRL's use_cpu=True)",
        group="hardware",
        choices=DEVICES,
        ours=True,
    )
    gpu_memory_gib: float | None = setting(
        None,
        "total memory of the GPU in GiB (vLLM colocate sizes its pool from it; default 80)",
        group="hardware",
        minimum=1.0,  # the generic card's range (estimator/hardware/gpus.py GENERIC_MIN_GB..GENERIC_MAX_GB)
        maximum=4096.0,
        metavar="GIB",
        ours=True,
    )
    num_gpus: int = setting(
        1,
        "number of GPUs (processes)",
        group="hardware",
        flag="--gpus",
        aliases=("--num-gpus",),
        minimum=1,
        maximum=65536,
        metavar="N",
        ours=True,
    )
    sharding: str = setting(
        "none",
        "DeepSpeed ZeRO-2/3 or FSDP over --gpus (shortcuts: --zero 2|3, --fsdp)",
        group="hardware",
        choices=SHARDINGS,
        ours=True,
    )
    fsdp_sharding_strategy: str = setting(
        "FULL_SHARD",
        "FSDP: FULL_SHARD reshards each layer after forward, SHARD_GRAD_OP keeps it gathered until backward "
        "(accelerate fsdp_config.fsdp_sharding_strategy; FSDP2 fsdp_reshard_after_forward true/false)",
        group="hardware",
        choices=FSDP_STRATEGIES,
        file_keys=("fsdp_sharding_strategy",),
        since="0.2.0",
    )
    offload_optimizer: bool = setting(
        False,
        "optimizer state, fp32 master weights and gradients on the host (DeepSpeed "
        "zero_optimization.offload_optimizer.device: cpu; accelerate deepspeed_config.offload_optimizer_device)",
        group="hardware",
        since="0.2.0",
    )
    offload_param: bool = setting(
        False,
        "parameters on the host too (DeepSpeed ZeRO-3 zero_optimization.offload_param.device: cpu; FSDP "
        "fsdp_offload_params / CPUOffloadPolicy, which also moves gradients and optimizer state)",
        group="hardware",
        since="0.2.0",
    )
    zero_reduce_bucket_size: int | None = setting(
        500_000_000,
        "DeepSpeed ZeRO's reduce bucket in elements (zero_optimization.reduce_bucket_size: DeepSpeed's default "
        '5e8 where no DeepSpeed JSON gives it; a JSON\'s "auto" is hidden_size^2)',
        group="hardware",
        minimum=1,
        maximum=10**12,
        metavar="N",
        ours=True,
        since="0.2.0",
    )
    zero_overlap_comm: bool | None = setting(
        None,
        "DeepSpeed ZeRO's zero_optimization.overlap_comm (default: DeepSpeed's, on at stage 3 only); at ZeRO-2 it "
        "doubles the reduce bucket",
        group="hardware",
        ours=True,
        since="0.2.0",
    )
    host_ram_gib: float | None = setting(
        None,
        "host RAM per node in GiB: checks what offload and loading need there",
        group="hardware",
        flag="--host-ram",
        above=0.0,
        maximum=1e7,
        metavar="GIB",
        ours=True,
        since="0.2.0",
    )

    # ---- derived geometry (TRL 1.16 GRPOConfig.__post_init__, grpo_config.py:1096-1116) ----
    @property
    def release(self):
        """The TRL release row this config models (estimator/settings/trl_versions.py TrlProfile)."""
        return profile(self.trl_version)

    @property
    def transformers(self):
        """The transformers release row this config models (estimator/settings/versions.py TransformersProfile)."""
        return transformers_profile(self.transformers_version)

    @property
    def resolved_steps_per_generation(self) -> int:
        """steps_per_generation = given, or generation_batch_size / (bs × procs), or gradient_accumulation_steps.

        TRL ≤0.16 generates per micro-batch (1); 0.17 once per accumulation cycle (GA); 0.18+ as above.
        """
        unit = self.release.generation_unit
        if unit == "micro_batch":
            return 1
        if unit == "accumulated":
            return self.gradient_accumulation_steps
        if self.steps_per_generation is not None:
            return self.steps_per_generation
        if self.generation_batch_size is not None:
            return self.generation_batch_size // (self.per_device_train_batch_size * self.num_gpus)
        return self.gradient_accumulation_steps

    @property
    def generation_sequences(self) -> int:
        """Sequences one device generates at once: per_device_train_batch_size × steps_per_generation."""
        return self.per_device_train_batch_size * self.resolved_steps_per_generation

    @property
    def global_generation_batch(self) -> int:
        """generation_batch_size = per_device_train_batch_size × num_processes × steps_per_generation."""
        return self.generation_sequences * self.num_gpus

    @property
    def sequence_length(self) -> int:
        """Padded length of every micro-batch: prompt + completion (TRL pads to the generation-batch maximum)."""
        return self.max_prompt_length + self.max_completion_length

    @property
    def has_reference_model(self) -> bool:
        """A separate reference copy exists only with beta != 0 and no PEFT (grpo_trainer.py:982-1003); TRL ≤0.15 makes one whatever beta."""
        if not self.release.reference_needs_beta:
            return not self.use_peft
        return self.beta != 0.0 and not self.use_peft

    @property
    def runs_reference_pass(self) -> bool:
        """The no-grad reference log-prob pass runs whenever beta != 0 (on the ref model or adapters disabled); always in TRL ≤0.15."""
        return self.beta != 0.0 or not self.release.reference_needs_beta

    @property
    def runs_old_logprob_pass(self) -> bool:
        """Old-policy pass: GA % (steps_per_generation × num_iterations) != 0, or vLLM IS correction (GT:2634-2657).

        Older releases' rules (trl_versions.OLD_PASS_RULES): never (≤0.15), num_iterations > 1 (0.16-0.18),
        + steps_per_generation > GA (0.19), the GA rule without vLLM's correction (0.20-0.22).
        """
        rule = old_pass(self)
        if rule is not None:
            return rule
        if self.use_vllm and self.vllm_importance_sampling_correction:
            return True
        return (
            self.gradient_accumulation_steps % (self.resolved_steps_per_generation * self.num_iterations) != 0
        )

    @property
    def vllm_sleeps(self) -> bool:
        """A colocated vLLM sleeps between generations: TRL's vllm_enable_sleep_mode or an ms-swift level 1-2."""
        return self.vllm_enable_sleep_mode or bool(self.vllm_sleep_level)

    @property
    def resolved_vllm_sleep_level(self) -> int:
        """The level vLLM sleeps at: the given one, else TRL 1.16's 2 (vllm_generation.py:366); 0 = never."""
        if not self.vllm_sleeps:
            return 0
        return self.vllm_sleep_level or 2

    def with_(self, **changes) -> RunConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """Field values; a setting added after 0.1.0 appears only when it differs from its default, so a run
        that does not use it keeps the key (`sweeps.records.make_key`) it had before the setting existed."""
        # every field is a bool, number, string, None or tuple of strings: a shallow copy is `asdict`'s result
        d = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata["setting"].since != "0.1.0" and value == _absent(f):
                continue
            d[f.name] = list(value) if isinstance(value, (tuple, list)) else value
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """Build from a dict of field values (unknown keys are an error: use `field_names()` to filter)."""
        d = dict(d)
        for f in fields(cls):
            if f.name not in d and f.metadata["setting"].absent is not None:
                d[f.name] = f.metadata["setting"].absent
        for name in ("lora_target_modules", "reward_models", "reference_models"):
            if d.get(name) is not None:
                v = d[name]
                d[name] = (v,) if isinstance(v, str) else tuple(v)
        return cls(**d)

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(RunConfig))


def old_pass(cfg: RunConfig) -> bool | None:
    """Whether the old-policy pass runs under a pre-0.23 release's rule; None where TRL 1.16's rule applies."""
    rule = cfg.release.old_pass_rule
    spg, ga, it = cfg.resolved_steps_per_generation, cfg.gradient_accumulation_steps, cfg.num_iterations
    if rule == "never":
        return False
    if rule == "num_iterations":
        return it > 1
    if rule == "iterations_or_spg":
        return it > 1 or spg > ga
    if rule == "ga_modulo":
        return ga % (spg * it) != 0
    return None


def _absent(f) -> Any:
    """The value a record without field `f`'s key means (`Setting.absent`, else the default)."""
    absent = f.metadata["setting"].absent
    return f.default if absent is None else absent


@dataclass(frozen=True)
class Field:
    """One run setting as the parsers see it: name, default, value kind and metadata."""

    name: str
    default: Any
    kind: str  # bool | int | float | str | strs (a tuple of strings)
    nullable: bool
    meta: Setting

    @property
    def flag(self) -> str:
        """The primary CLI flag: `--field-name` unless the metadata names another."""
        return self.meta.flag or "--" + self.name.replace("_", "-")

    @property
    def file_keys(self) -> tuple[str, ...]:
        """Keys a TRL config file may use for this setting (its TRL name first)."""
        return tuple(dict.fromkeys((self.meta.trl or self.name, self.name, *self.meta.file_keys)))


def _kind(annotation: str) -> tuple[str, bool]:
    """('int', True) for 'int | None': the value kind and whether None is allowed."""
    base = annotation.replace(" | None", "").strip()
    kind = {"bool": "bool", "int": "int", "float": "float", "str": "str", "tuple[str, ...]": "strs"}[base]
    return kind, "None" in annotation


def schema() -> tuple[Field, ...]:
    """Every run setting with its metadata, in declaration order."""
    out = []
    for f in fields(RunConfig):
        kind, nullable = _kind(str(f.type))
        default = f.default if f.default is not MISSING else None
        out.append(Field(f.name, default, kind, nullable, f.metadata["setting"]))
    return tuple(out)


def schema_field(name: str) -> Field:
    """The schema entry of one setting (KeyError for an unknown name)."""
    return {f.name: f for f in schema()}[name]


def flag(name: str) -> str:
    """The CLI flag of a RunConfig field."""
    return schema_field(name).flag


def _num(x: float) -> str:
    """1048576.0 -> '1048576', 0.5 -> '0.5'."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def describe_bounds(f: Field) -> str:
    """'an integer >= 1', 'a number in (0, 1]', 'one of: a, b' — what the setting accepts, in words."""
    m = f.meta
    if m.choices:
        return "one of: " + ", ".join(map(str, m.choices))
    what = {
        "int": "an integer",
        "float": "a number",
        "bool": "true or false",
        "str": "a string",
        "strs": "one or more names, none empty",
    }[f.kind]
    lo = (
        f">= {_num(m.minimum)}"
        if m.minimum is not None
        else (f"> {_num(m.above)}" if m.above is not None else "")
    )
    hi = (
        f"<= {_num(m.maximum)}"
        if m.maximum is not None
        else (f"< {_num(m.below)}" if m.below is not None else "")
    )
    bounds = " and ".join(b for b in (lo, hi) if b)
    return f"{what} {bounds}".strip()


def check_value(f: Field, value: Any) -> str | None:
    """Why `value` is not acceptable for setting `f` (one phrase), or None when it is."""
    if value is None:
        return None if f.nullable else "a value is required"
    m = f.meta
    if f.kind == "bool":
        ok = isinstance(value, bool)
    elif f.kind == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif f.kind == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif f.kind == "str":
        ok = isinstance(value, str)
    else:
        ok = (
            isinstance(value, tuple)
            and len(value) > 0
            and all(isinstance(v, str) and v.strip() for v in value)
        )
    if not ok and f.kind == "float" and isinstance(value, float) and math.isnan(value):
        return f"must be {describe_bounds(f)}"
    if not ok and f.kind == "float" and isinstance(value, float) and not math.isfinite(value):
        return f"not a finite number (a value past 1.8e308 reads as inf); accepted: {describe_bounds(f)}"
    if not ok:
        return f"must be {describe_bounds(f)}"
    if m.choices is not None and value not in m.choices:
        return f"accepted: {', '.join(map(str, m.choices))}"
    if m.check is not None and (problem := m.check(value)):
        return problem
    if f.kind in ("int", "float"):
        low = (m.minimum is not None and value < m.minimum) or (m.above is not None and value <= m.above)
        high = (m.maximum is not None and value > m.maximum) or (m.below is not None and value >= m.below)
        if low or high:
            return f"must be {describe_bounds(f)}"
    return None


ALLOC_CONF_BOOLS = ("expandable_segments",)


def alloc_conf_problem(conf: str) -> str | None:
    """Why a PYTORCH_CUDA_ALLOC_CONF string is not one the allocator simulator models (one phrase naming the bad
    part and what is accepted), or None. Parsed item by item with `AllocatorSettings.from_conf`; torch's own
    parser (c10/cuda/CUDAAllocatorConfig.cpp) wants exactly True or False for expandable_segments."""
    accepted = (
        "key:value,... of max_split_size_mb (>= 20), max_non_split_rounding_mb (>= 20), "
        "roundup_power2_divisions (a power of 2, or [MiB:N,...,>:N]), expandable_segments (True/False), "
        "large_segment_size_mb (> 10)"
    )
    problem = torch_grammar_problem(conf)
    if problem:  # the part named is the user's text: escaped and cut like every echoed value
        return f"{printable(problem, 90)}; accepted: {accepted}"
    for key, val in _conf_items(conf):
        item = f"{key}:{val}" if val else key
        at = f"{shown(item, 40)}: " if item != conf.replace(" ", "") else ""
        if key in ALLOC_CONF_BOOLS and val not in ("True", "False"):
            return f"{at}expandable_segments takes True or False; accepted: {accepted}"
        try:
            AllocatorSettings.from_conf(item)
        except (ValueError, IndexError) as e:
            why = str(e) if "int()" not in str(e) else "not a number"
            return f"{at}{why}; accepted: {accepted}"
    return None
