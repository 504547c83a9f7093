"""The traced grids: which RunConfigs `grpo-vram-trace --grid NAME` traces (data, not code paths)."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

from estimator.settings.config import RunConfig

PROMPT, COMPLETION = 256, 512
METHODS = {
    "full": {},
    "lora": {"use_peft": True},
    "qlora": {"use_peft": True, "load_in_4bit": True},
}


@dataclass(frozen=True)
class Grid:
    """A product over models × methods × num_generations × GC × dtype, plus spot checks."""

    models: tuple[str, ...]
    methods: tuple[str, ...] = ("full", "lora", "qlora")
    generations: tuple[int, ...] = (4, 8, 16)
    gradient_checkpointing: tuple[bool, ...] = (True, False)
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    spot: tuple[dict, ...] = field(default_factory=tuple)

    def configs(self) -> list[RunConfig]:
        """Every config, per_device_train_batch_size = num_generations (one prompt per step, as TRL requires)."""
        out = []
        for model, method, gens, gc, dtype in product(
            self.models, self.methods, self.generations, self.gradient_checkpointing, self.dtypes
        ):
            out.append(_config(model=model, num_generations=gens, gc=gc, dtype=dtype, **METHODS[method]))
        for s in self.spot:
            s = dict(s)
            method = s.pop("method", "full")
            out.append(_config(**{**METHODS[method], **s}))
        return out


def _config(
    model: str, num_generations: int = 8, gc: bool = True, dtype: str = "bfloat16", **kw
) -> RunConfig:
    return RunConfig(
        model=model,
        dtype=dtype,
        num_generations=num_generations,
        per_device_train_batch_size=num_generations,
        gradient_checkpointing=gc,
        max_prompt_length=PROMPT,
        max_completion_length=COMPLETION,
        **kw,
    )


_SPOT = (
    {"model": "meta-llama/Llama-3.2-1B-Instruct", "method": "full"},
    {"model": "meta-llama/Llama-3.2-1B-Instruct", "method": "lora"},
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "method": "full"},
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "method": "lora"},
    {"model": "meta-llama/Llama-3.1-8B-Instruct", "method": "qlora"},
    # PEFT has no default LoRA targets for qwen3_moe (TRL raises the same): attention projections only
    {
        "model": "Qwen/Qwen3-30B-A3B",
        "method": "lora",
        "lora_target_modules": ("q_proj", "k_proj", "v_proj", "o_proj"),
    },
    {
        "model": "Qwen/Qwen3-30B-A3B",
        "method": "qlora",
        "lora_target_modules": ("q_proj", "k_proj", "v_proj", "o_proj"),
    },
    # the non-default knobs: beta > 0 (reference pass), other optimizers, fp32 load default
    {"model": "1.5B", "method": "full", "beta": 0.04},
    {"model": "1.5B", "method": "lora", "beta": 0.04},
    {"model": "1.5B", "method": "full", "optim": "adamw_torch"},
    {"model": "1.5B", "method": "full", "optim": "adamw_bnb_8bit"},
    {"model": "1.5B", "method": "lora", "optim": "adamw_bnb_8bit"},
    {"model": "7B", "method": "full", "beta": 0.04},
    {"model": "7B", "method": "full", "dtype": "float32", "optim": "adamw_bnb_8bit"},
)

GRIDS: dict[str, Grid] = {
    "default": Grid(models=("0.5B", "1.5B", "3B", "7B", "14B"), spot=_SPOT),
    # every size at the default shape first (what a time-boxed run can cover), then the spot checks
    "core": Grid(
        models=("1.5B", "3B", "7B", "14B"),
        generations=(8,),
        gradient_checkpointing=(True,),
        spot=_SPOT
        + ({"model": "7B", "method": "full", "gc": False}, {"model": "7B", "method": "lora", "gc": False}),
    ),
    # the published headline's 8-bit AdamW columns (bf16 weights, 8 generations), with and without checkpointing
    "headline": Grid(
        models=(),
        spot=tuple(
            {"model": m, "method": "full", "optim": "adamw_bnb_8bit", "gc": gc}
            for m in ("0.5B", "1.5B", "3B", "7B", "14B")
            for gc in (False, True)
        ),
    ),
    "smoke": Grid(
        models=(),
        spot=(
            {"model": "0.5B", "method": "full"},
            {"model": "0.5B", "method": "lora", "beta": 0.04},
            {"model": "0.5B", "method": "qlora", "gc": False},
        ),
    ),
}


def grid_configs(name: str) -> list[RunConfig]:
    """The configs of the named grid."""
    if name not in GRIDS:
        raise KeyError(f"unknown grid {name!r}; known: {', '.join(GRIDS)}")
    return GRIDS[name].configs()
