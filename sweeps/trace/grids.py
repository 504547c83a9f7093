"""Every traced grid, as data: its jobs, where its rows go (under results/traced/), and which accuracy set they
count in. `python -m sweeps.trace grid NAME` traces one (sweeps/trace/gridrun.py); sweeps/report/ reads the
sets from here.

- tuned: products over models x methods x generations x GC x dtype plus spot checks, the grids the estimator
  was refined on (`in-sample`); `multigpu` is rank 0 of 2/4/8 FSDP2 ranks of the same shape.
- random: seeded draws over every axis (sweeps/trace/random_grid.py); `validation` holds the seeds whose
  rows were read while terms were fixed, `heldout` the seed never used to change a term. Each row records its
  seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

from estimator.settings.config import RunConfig

REPO = Path(__file__).resolve().parents[2]
TRACED = REPO / "results" / "traced"
SPLITS = ("in-sample", "validation", "held-out")

PROMPT, COMPLETION = 256, 512
METHODS = {
    "full": {},
    "lora": {"use_peft": True},
    "qlora": {"use_peft": True, "load_in_4bit": True},
}


@dataclass(frozen=True)
class Job:
    """One config of a grid and how it is traced: its seed (random grids), rank-0 layout (multi-GPU), the
    micro-batch cap and depth (random grids)."""

    config: RunConfig
    seed: int | None = None
    layout: dict | None = None
    max_micro: int | None = None
    num_layers: int | None = None

    def variant(self) -> dict:
        from sweeps.trace.rows import variant

        return variant(self.config, max_micro=self.max_micro, num_layers=self.num_layers, layout=self.layout)

    @property
    def key(self) -> str:
        """The key of the row this job writes (sweeps.trace.rows.key)."""
        from sweeps.trace.rows import key

        return key(self.config, self.variant())

    def to_dict(self) -> dict:
        return {
            "config": self.config.to_dict(),
            "seed": self.seed,
            "layout": self.layout,
            "max_micro": self.max_micro,
            "num_layers": self.num_layers,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Job:
        return cls(**{**d, "config": RunConfig.from_dict(d["config"])})


def config(model: str, num_generations: int = 8, gc: bool = True, dtype: str = "bfloat16", **kw) -> RunConfig:
    """A tuned grid's config: one prompt per step (batch = generations), 256 + 512 tokens."""
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


@dataclass(frozen=True)
class Product:
    """A product over models x methods x num_generations x GC x dtype, plus spot checks."""

    models: tuple[str, ...]
    methods: tuple[str, ...] = ("full", "lora", "qlora")
    generations: tuple[int, ...] = (4, 8, 16)
    gradient_checkpointing: tuple[bool, ...] = (True, False)
    dtypes: tuple[str, ...] = ("bfloat16", "float32")
    spot: tuple[dict, ...] = field(default_factory=tuple)

    def configs(self) -> list[RunConfig]:
        out = [
            config(model=model, num_generations=gens, gc=gc, dtype=dtype, **METHODS[method])
            for model, method, gens, gc, dtype in product(
                self.models, self.methods, self.generations, self.gradient_checkpointing, self.dtypes
            )
        ]
        for s in self.spot:
            s = dict(s)
            method = s.pop("method", "full")
            out.append(config(**{**METHODS[method], **s}))
        return out

    def jobs(self) -> list[Job]:
        return [Job(c) for c in self.configs()]


@dataclass(frozen=True)
class MultiGpu:
    """Rank 0 of N FSDP2 ranks: FULL_SHARD over models x ranks, SHARD_GRAD_OP and LoRA spot checks, then the
    layouts the tracer records as skipped with its reason (DeepSpeed ZeRO, QLoRA under FSDP, CPU offload)."""

    models: tuple[str, ...]
    ranks: tuple[int, ...]
    strategy_spots: tuple[tuple[str, int], ...]
    lora_spots: tuple[tuple[str, int], ...]

    def jobs(self) -> list[Job]:
        bf16 = {"dtype": "bfloat16"}
        out = [
            Job(config(model=m, **bf16).with_(num_gpus=n, sharding="fsdp"), layout={"world_size": n})
            for n in self.ranks
            for m in self.models
        ]
        for m, n in self.strategy_spots:
            cfg = config(model=m, **bf16).with_(
                num_gpus=n, sharding="fsdp", fsdp_sharding_strategy="SHARD_GRAD_OP"
            )
            out.append(Job(cfg, layout={"world_size": n, "strategy": "SHARD_GRAD_OP"}))
        for m, n in self.lora_spots:  # frozen bf16 base shards, fp32 adapters
            cfg = config(model=m, use_peft=True, **bf16).with_(num_gpus=n, sharding="fsdp")
            out.append(Job(cfg, layout={"world_size": n}))
        for extra, lay in (
            ({"sharding": "zero2"}, {}),
            ({"sharding": "zero3"}, {}),
            ({"sharding": "fsdp", "use_peft": True, "load_in_4bit": True}, {}),
            ({"sharding": "fsdp", "offload_param": True}, {"cpu_offload": True}),
        ):
            cfg = config(model="7B", **bf16).with_(num_gpus=4, **extra)
            out.append(Job(cfg, layout={"world_size": 4, **lay}))
        return out


@dataclass(frozen=True)
class Seeded:
    """`n` configs drawn per seed (sweeps/trace/random_grid.py), traced at a capped depth and micro-batch count."""

    seeds: tuple[tuple[int, int], ...]  # (seed, n)

    def jobs(self) -> list[Job]:
        from sweeps.trace import random_grid

        return [
            Job(c, seed=seed, max_micro=random_grid.MAX_MICRO, num_layers=random_grid.layers_for(c))
            for seed, n in self.seeds
            for c in random_grid.random_configs(seed, n)
        ]


@dataclass(frozen=True)
class Listed:
    """Configs written out one by one for one model, each traced at its first `num_layers` decoder layers."""

    model: str
    configs: tuple[dict, ...]
    num_layers: int
    max_micro: int = 2

    def jobs(self) -> list[Job]:
        return [
            Job(RunConfig(model=self.model, **c), max_micro=self.max_micro, num_layers=self.num_layers)
            for c in self.configs
        ]


_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
# OLMo-2 configs unlike the tuned olmo2 rows (other lengths, batches, LoRA ranks, 4-bit, the reference pass, 8-bit
# AdamW, several iterations), traced once and never used to change a term
_OLMO2_HELDOUT = (
    {
        "use_peft": True,
        "lora_r": 32,
        "lora_target_modules": ("all-linear",),
        "dtype": "bfloat16",
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "max_prompt_length": 512,
        "max_completion_length": 1024,
    },
    {
        "use_peft": True,
        "load_in_4bit": True,
        "lora_target_modules": _ATTENTION,
        "dtype": "bfloat16",
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "max_prompt_length": 256,
        "max_completion_length": 768,
    },
    {
        "dtype": "bfloat16",
        "beta": 0.04,
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "max_prompt_length": 256,
        "max_completion_length": 512,
    },
    {
        "use_peft": True,
        "lora_target_modules": ("all-linear",),
        "dtype": "float32",
        "num_generations": 16,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "max_prompt_length": 128,
        "max_completion_length": 384,
        "gradient_checkpointing": False,
        "attn_implementation": "eager",
    },
    {
        "dtype": "bfloat16",
        "optim": "adamw_bnb_8bit",
        "num_generations": 8,
        "per_device_train_batch_size": 8,
        "max_prompt_length": 384,
        "max_completion_length": 640,
    },
    {
        "use_peft": True,
        "lora_target_modules": ("q_proj", "v_proj"),
        "dtype": "bfloat16",
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "num_iterations": 2,
        "max_prompt_length": 256,
        "max_completion_length": 256,
        "gradient_checkpointing": False,
    },
)


@dataclass(frozen=True)
class Grid:
    """A named grid: its jobs, its rows' file under results/traced/, its accuracy set, and how it runs: each
    config in its own subprocess (a fresh FakeTensorMode, bounded memory; a time-out is an error row, retried),
    or `in_process` (one import of torch / transformers / TRL for the grid; a time-out is a skipped row)."""

    spec: Product | MultiGpu | Seeded | Listed
    out: str
    split: str = "in-sample"
    in_process: bool = False
    timeout: float = 900.0  # seconds per config

    @property
    def path(self) -> Path:
        return TRACED / self.out

    def jobs(self) -> list[Job]:
        return self.spec.jobs()


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
    "default": Grid(Product(models=("0.5B", "1.5B", "3B", "7B", "14B"), spot=_SPOT), "tuned/default.jsonl"),
    # every size at the default shape first (what a time-boxed run can cover), then the spot checks
    "core": Grid(
        Product(
            models=("1.5B", "3B", "7B", "14B"),
            generations=(8,),
            gradient_checkpointing=(True,),
            spot=_SPOT
            + (
                {"model": "7B", "method": "full", "gc": False},
                {"model": "7B", "method": "lora", "gc": False},
            ),
        ),
        "tuned/core.jsonl",
    ),
    # the published headline's 8-bit AdamW columns (bf16 weights, 8 generations), with and without checkpointing
    "headline": Grid(
        Product(
            models=(),
            spot=tuple(
                {"model": m, "method": "full", "optim": "adamw_bnb_8bit", "gc": gc}
                for m in ("0.5B", "1.5B", "3B", "7B", "14B")
                for gc in (False, True)
            ),
        ),
        "tuned/headline.jsonl",
    ),
    "smoke": Grid(
        Product(
            models=(),
            spot=(
                {"model": "0.5B", "method": "full"},
                {"model": "0.5B", "method": "lora", "beta": 0.04},
                {"model": "0.5B", "method": "qlora", "gc": False},
            ),
        ),
        "tuned/smoke.jsonl",
    ),
    # 4 ranks first (the benchmark's shape), then the ends
    "multigpu": Grid(
        MultiGpu(
            models=("0.5B", "1.5B", "3B", "7B", "14B"),
            ranks=(4, 2, 8),
            strategy_spots=(("1.5B", 4), ("7B", 4), ("7B", 8)),
            lora_spots=(("1.5B", 4), ("3B", 4), ("7B", 8)),
        ),
        "tuned/multigpu.jsonl",
    ),
    "validation": Grid(
        Seeded(
            seeds=(
                (20261122, 200),
                (7301, 60),
                (90417, 60),
                (52813, 60),
                (61129, 60),
                (40883, 60),
                (73519, 60),
                (28657, 60),
            )
        ),
        "random/validation.jsonl",
        split="validation",
        in_process=True,
        timeout=240.0,
    ),
    "heldout": Grid(
        Seeded(seeds=((46381, 60),)), "random/heldout.jsonl", split="held-out", in_process=True, timeout=240.0
    ),
    "olmo2-heldout": Grid(
        Listed("allenai/OLMo-2-1124-13B", _OLMO2_HELDOUT, num_layers=4),
        "heldout/olmo2.jsonl",
        split="held-out",
        in_process=True,
        timeout=240.0,
    ),
}


def split_of(sweep: str | None) -> str:
    """The accuracy set of a traced row, by its sweep (the grid that wrote it): in-sample unless a random grid's."""
    grid = GRIDS.get(str(sweep))
    return grid.split if grid is not None else "in-sample"


def grid_configs(name: str) -> list[RunConfig]:
    """The configs of the named grid."""
    if name not in GRIDS:
        raise KeyError(f"unknown grid {name!r}; known: {', '.join(GRIDS)}")
    return [j.config for j in GRIDS[name].jobs()]
