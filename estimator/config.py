"""What one GRPO run is: the settings that set its memory, with TRL 1.16's names and defaults.

Field names follow TRL's `GRPOConfig` and `ModelConfig` where one exists (dashes in the CLI, underscores here);
the defaults are TRL's (`trl/trainer/grpo_config.py`, `trl/trainer/model_config.py`, transformers
`TrainingArguments`). Fields TRL does not have are marked "ours".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

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
LOGPROB_HEADS = (
    "chunked",
    "full",
)  # ours: TRL 1.16's fused chunked head, or the classic [B, C, V] logits path
DEVICES = ("cuda", "cpu")  # ours: what the run executes on (cpu = TRL's `use_cpu=True` path)
SHARDINGS = (
    "none",
    "zero2",
    "zero3",
    "fsdp",
    "fsdp_shard_grad_op",
)  # ours: DeepSpeed ZeRO-2/3, or FSDP2 FULL_SHARD / SHARD_GRAD_OP (accelerate's names) over `num_gpus`


@dataclass(frozen=True)
class RunConfig:
    """One GRPO training configuration; every field has TRL 1.16's default unless marked ours."""

    model: str = "7B"  # ours: shorthand size, catalog name, HF id, or a path to config.json
    # ModelConfig
    dtype: str = "float32"  # TRL loads a model given by name in float32 unless model_init_kwargs sets a dtype
    attn_implementation: str = "sdpa"
    use_peft: bool = False
    lora_r: int = 16
    lora_target_modules: tuple[str, ...] | None = None  # None = PEFT's default for the model type
    lora_dropout: float = 0.05  # TRL ModelConfig's default (PEFT's own LoraConfig default is 0.0)
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "nf4"
    use_bnb_nested_quant: bool = False
    # GRPOConfig / TrainingArguments
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_generations: int = 8
    max_completion_length: int = 512
    max_prompt_length: int = 256  # ours: TRL 1.16 has no such option and never truncates prompts
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None
    num_iterations: int = 1
    beta: float = 0.0
    gradient_checkpointing: bool = True
    bf16: bool = True  # autocast mixed precision, not a weight cast
    optim: str = "adamw_torch_fused"
    cast_lm_head_to_fp32: bool = False
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    vllm_gpu_memory_utilization: float = 0.3
    vllm_enable_sleep_mode: bool = False
    vllm_importance_sampling_correction: bool = True
    # ours
    logprob_head: str = "chunked"
    device: str = "cuda"
    gpu_memory_gib: float | None = None  # total memory of the GPU (needed by vLLM colocate); None = 80
    num_gpus: int = 1
    sharding: str = "none"

    # ---- derived geometry (TRL 1.16 GRPOConfig.__post_init__, grpo_config.py:1096-1116) ----
    @property
    def resolved_steps_per_generation(self) -> int:
        """steps_per_generation = given, or generation_batch_size / (bs × procs), or gradient_accumulation_steps."""
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
        """A separate reference copy exists only with beta != 0 and no PEFT (grpo_trainer.py:982-1003)."""
        return self.beta != 0.0 and not self.use_peft

    @property
    def runs_reference_pass(self) -> bool:
        """The no-grad reference log-prob pass runs whenever beta != 0 (on the ref model or adapters disabled)."""
        return self.beta != 0.0

    @property
    def runs_old_logprob_pass(self) -> bool:
        """Old-policy pass: GA % (steps_per_generation × num_iterations) != 0, or vLLM IS correction (GT:2634-2657)."""
        if self.use_vllm and self.vllm_importance_sampling_correction:
            return True
        return (
            self.gradient_accumulation_steps % (self.resolved_steps_per_generation * self.num_iterations) != 0
        )

    @property
    def quantized(self) -> bool:
        return self.load_in_4bit

    def with_(self, **changes) -> RunConfig:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["lora_target_modules"] is not None:
            d["lora_target_modules"] = list(d["lora_target_modules"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        """Build from a dict of field values (unknown keys are an error: use `field_names()` to filter)."""
        d = dict(d)
        if d.get("lora_target_modules") is not None:
            tm = d["lora_target_modules"]
            d["lora_target_modules"] = (tm,) if isinstance(tm, str) else tuple(tm)
        return cls(**d)

    @staticmethod
    def field_names() -> tuple[str, ...]:
        return tuple(f.name for f in fields(RunConfig))


DEFAULT = RunConfig()
