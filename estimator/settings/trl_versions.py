"""Which TRL release is being modelled: a table of version ranges and what each changes about GRPO's memory.

GRPO landed in TRL 0.14 (PR #2565). Every minor release from 0.14 to the newest modelled (NEWEST) maps to exactly
one `TrlProfile` row below; a row holds, as data, everything in that range that sets memory: the defaults, what
`per_device_train_batch_size` counts, when a reference model exists, the log-prob head and its temporaries, how
generation is batched, when the old-policy pass runs, and vLLM's modes. Each row's `changes` cites the TRL pull
request that made its first release differ from the previous row, or, where no PR number was found, the release's
own source file and line (read from the wheel: `pip download --no-deps trl==X.Y.Z`, then
`trl/trainer/grpo_config.py` / `grpo_trainer.py` / `utils.py`).

Pure data and pure functions, stdlib only: `profile("0.14")` is the row for a release; `parse_version` and
`installed_version` find which one to model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from estimator.settings import version_text

Version = tuple[int, int]

BATCH_UNITS = ("prompts", "completions")
# rowwise: full [B, C+1, V] logits, then log_softmax row by row, every row's output kept for backward (0.14);
# selective: full logits, then TRL's selective_log_softmax (per-row logsumexp in fp32/fp64, per-row
#   log_softmax in 16-bit) (PR #2799);
# chunked: TRL 1.15's fused LM head (hidden states × lm_head in 4096 × 32768 tiles, no [B, C, V] logits).
LOGPROB_PATHS = ("rowwise", "selective", "chunked")
# micro_batch: each micro-batch generates and scores its own completions (gradients of the earlier micro-batches
#   of the step are resident); accumulated: one generation for the gradient_accumulation_steps micro-batches of a
#   step (PR #3283); steps_per_generation: generation_batch_size / steps_per_generation decide it (PR #3388).
GENERATION_UNITS = ("micro_batch", "accumulated", "steps_per_generation")
# never; num_iterations: when num_iterations > 1; iterations_or_spg: + steps_per_generation > GA (PR #3493);
# ga_modulo: when GA % (steps_per_generation × num_iterations) != 0; ga_modulo_or_vllm_is: + vLLM importance
# sampling correction.
OLD_PASS_RULES = ("never", "num_iterations", "iterations_or_spg", "ga_modulo", "ga_modulo_or_vllm_is")
# where vLLM runs: another GPU picked by `vllm_device` (0.14-0.15), `trl vllm-serve` (server), or inside the
# training process on the same GPU (colocate, PR #3394).
VLLM_MODES = ("separate_device", "server", "colocate")


@dataclass(frozen=True)
class Defaults:
    """GRPOConfig / TrainingArguments / model-loading defaults of one range (None: the setting does not exist)."""

    beta: float
    bf16: bool
    gradient_checkpointing: bool
    dtype: str  # dtype a model given by name loads in: "float32" or "auto" (the checkpoint's own dtype)
    num_generations: int
    max_completion_length: int
    max_prompt_length: int | None  # None: no prompt cap (the field is deprecated or gone)
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    vllm_gpu_memory_utilization: float | None  # None: set on the vLLM server, not in GRPOConfig
    vllm_mode: str
    # TrainingArguments' optim as the release's users ran it: transformers defaults to adamw_torch_fused only
    # with torch >= 2.8 (transformers PR #37358, training_args.py `default_optim`), else adamw_torch (foreach)
    optim: str


@dataclass(frozen=True)
class TrlProfile:
    """GRPO's memory semantics for TRL releases first..last (minor versions, inclusive)."""

    first: Version
    last: Version
    defaults: Defaults
    batch_unit: str  # what per_device_train_batch_size counts
    truncates_prompts: bool  # prompts cut (left) to max_prompt_length
    reference_needs_beta: bool  # False: the reference model and its pass exist whatever beta is (0.14)
    reference_pass_in_train: (
        bool  # reference log-probs computed inside compute_loss, policy graph alive (0.14)
    )
    logprob_path: str
    temperature_copy: bool  # `logits / temperature` makes a second [B, C, V] tensor
    entropy_pass: bool  # no-grad row-by-row entropy of the training logits
    entropy_chunk: int  # entropy's chunk: 0 = one sequence's [C, V] (0.20-0.22), else that many token rows
    generation_unit: str
    has_num_iterations: bool
    has_steps_per_generation: bool
    old_pass_rule: str
    vllm_modes: tuple[str, ...]
    has_vllm_importance_sampling: bool
    # transformers' sdpa path repeats K/V to every head (repeat_kv) before the kernel, so autograd saves the
    # expanded K/V, and makes the query contiguous, so the output's transpose is one more saved copy: true of the transformers releases these TRL releases accept at their minimum and that
    # sweep-legacy pins (4.48.3, 4.52.4: integrations/sdpa_attention.py L30-31); 4.56.2 calls the kernel with
    # enable_gqa when no mask is passed (use_gqa_in_sdpa), as the 1.16 estimate assumes.
    sdpa_repeats_kv: bool
    # where vLLM's CUDA graphs sit in the vLLM releases these TRL releases accept (terms/vllm.py VLLM_GRAPHS):
    # "outside" gpu_memory_utilization (vLLM before 0.21), "budget" (charged to it, 0.21 on), or "either"
    vllm_graphs: str
    changes: tuple[str, ...] = field(default=())  # what differs from the previous row, each with its source

    @property
    def label(self) -> str:
        """`0.14` or `0.20-0.21`: the releases this row covers."""
        return version_text.span(self.first, self.last)

    def covers(self, version: Version) -> bool:
        return self.first <= version <= self.last


fmt = version_text.fmt


_D014 = Defaults(
    beta=0.04,
    bf16=False,
    gradient_checkpointing=False,
    dtype="float32",
    num_generations=8,
    max_completion_length=256,
    max_prompt_length=512,
    per_device_train_batch_size=1,
    gradient_accumulation_steps=8,
    vllm_gpu_memory_utilization=0.9,
    vllm_mode="separate_device",
    optim="adamw_torch",
)

_P014 = TrlProfile(
    first=(0, 14),
    last=(0, 14),
    defaults=_D014,
    batch_unit="prompts",
    truncates_prompts=True,
    reference_needs_beta=False,
    reference_pass_in_train=True,
    logprob_path="rowwise",
    temperature_copy=False,
    entropy_pass=False,
    entropy_chunk=0,
    generation_unit="micro_batch",
    has_num_iterations=False,
    has_steps_per_generation=False,
    old_pass_rule="never",
    vllm_modes=("separate_device",),
    has_vllm_importance_sampling=False,
    sdpa_repeats_kv=True,
    vllm_graphs="outside",
    changes=(
        "GRPO lands (PR #2565): batch = prompts × num_generations completions, per_device_train_batch_size=1, "
        "gradient_accumulation_steps=8 (grpo_config.py L159-171); beta=0.04; a reference copy whenever PEFT is "
        "off, whatever beta (create_reference_model, grpo_trainer.py L200-209); generation and the reference "
        "pass inside compute_loss after the policy forward (grpo_trainer.py L370-451); full [B, C+1, V] logits "
        "and a row-by-row log_softmax (grpo_trainer.py L430-441); model given by name loads with dtype None = "
        "float32 under transformers 4.x (grpo_trainer.py L173-175); vLLM on another GPU at 0.9 utilization; "
        "TrainingArguments' optim adamw_torch (foreach), transformers' default before torch 2.8 "
        "(training_args.py `default_optim`); vLLM of its time, before 0.21: CUDA graphs beyond "
        "gpu_memory_utilization (gpu_worker.py determine_available_memory; TRL 0.14-0.23 set only a minimum vLLM, "
        "0.24-0.29 pin 0.10.2-0.12.0 in trl/import_utils.py)",
    ),
)


def _next(prev: TrlProfile, first: Version, last: Version, changes: tuple[str, ...], **kw) -> TrlProfile:
    """A row that is `prev` with some semantics or defaults changed."""
    d = kw.pop("defaults", {})
    return TrlProfile(
        **{
            **{f: getattr(prev, f) for f in prev.__dataclass_fields__},
            "first": first,
            "last": last,
            "defaults": Defaults(**{**prev.defaults.__dict__, **d}),
            "changes": changes,
            **kw,
        }
    )


_P015 = _next(
    _P014,
    (0, 15),
    (0, 15),
    (
        "per_device_train_batch_size counts completions (PR #2776); TrainingArguments' defaults 8 and 1 return",
        "selective_log_softmax replaces the row-wise log_softmax (PR #2799)",
        "generation and scoring move to _prepare_inputs, per micro-batch (grpo_trainer.py L520, 0.15.2)",
    ),
    defaults={"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1},
    batch_unit="completions",
    reference_pass_in_train=False,
    logprob_path="selective",
)
_P016 = _next(
    _P015,
    (0, 16),
    (0, 16),
    (
        "num_iterations (PR #2899): old-policy log-prob pass when num_iterations > 1",
        "the reference model and its pass exist only when beta != 0 (PR #2806; grpo_trainer.py L316, 0.16.1)",
        "logits / temperature copies the [B, C, V] logits (grpo_trainer.py _get_per_token_logps, 0.16.1)",
        "vLLM runs as `trl vllm-serve`; vllm_gpu_memory_utilization moves to the server (grpo_config.py L338)",
    ),
    defaults={"vllm_gpu_memory_utilization": None, "vllm_mode": "server"},
    temperature_copy=True,
    reference_needs_beta=True,
    has_num_iterations=True,
    old_pass_rule="num_iterations",
    vllm_modes=("server",),
)
_P017 = _next(
    _P016,
    (0, 17),
    (0, 17),
    (
        "one generation per gradient_accumulation_steps micro-batches, scored in chunks of per_device_train_batch_size (PR #3283)",
    ),
    generation_unit="accumulated",
)
_P018 = _next(
    _P017,
    (0, 18),
    (0, 18),
    (
        "steps_per_generation / generation_batch_size decouple generation from accumulation (PR #3388)",
        "vLLM colocate mode (PR #3394); vllm_gpu_memory_utilization returns with default 0.3",
    ),
    defaults={"vllm_gpu_memory_utilization": 0.3},
    generation_unit="steps_per_generation",
    has_steps_per_generation=True,
    vllm_modes=("server", "colocate"),
)
_P019 = _next(
    _P018,
    (0, 19),
    (0, 19),
    (
        "beta defaults to 0.0: no reference model (grpo_config.py, 0.19.1)",
        "bf16=True by default (PR #3515)",
        "old-policy pass also when steps_per_generation > gradient_accumulation_steps (PR #3493)",
    ),
    defaults={"beta": 0.0, "bf16": True},
    old_pass_rule="iterations_or_spg",
)
_P020 = _next(
    _P019,
    (0, 20),
    (0, 21),
    (
        "old-policy pass when GA % (steps_per_generation × num_iterations) != 0 (grpo_trainer.py, 0.20.0)",
        "no-grad row-by-row entropy of the training logits (entropy_from_logits, utils.py, 0.20.0)",
        "requires transformers>=4.53.2 (METADATA): modelled as sdpa with native GQA, no repeat_kv copies "
        "(transformers integrations/sdpa_attention.py use_gqa_in_sdpa, present in 4.56.2)",
    ),
    old_pass_rule="ga_modulo",
    entropy_pass=True,
    sdpa_repeats_kv=False,
)
_P022 = _next(
    _P020,
    (0, 22),
    (0, 22),
    (
        "gradient_checkpointing=True by default (grpo_config.py, 0.22.2)",
        "optim adamw_torch_fused: the first release after torch 2.8 (August 2025), under which transformers "
        "defaults to it (transformers PR #37358; an older torch keeps adamw_torch, which vram-estimate notes)",
    ),
    defaults={"gradient_checkpointing": True, "optim": "adamw_torch_fused"},
)
_P023 = _next(
    _P022,
    (0, 23),
    (0, 25),
    (
        "vllm_importance_sampling_correction=True: the old-policy pass runs with vLLM (grpo_config.py, 0.23.1)",
        "entropy_from_logits flattens the logits and works on 128 token rows at a time (utils.py L1480, 0.23.1)",
    ),
    entropy_chunk=128,
    old_pass_rule="ga_modulo_or_vllm_is",
    has_vllm_importance_sampling=True,
)
_P026 = _next(
    _P023,
    (0, 26),
    (0, 26),
    (
        "max_prompt_length deprecated, default None: prompts are not truncated (grpo_config.py L292-301, 0.26.2)",
        "a model given by name loads with dtype='auto' (create_model_from_path, utils.py L2007, 0.26.2)",
    ),
    defaults={"max_prompt_length": None, "dtype": "auto"},
    truncates_prompts=False,
)
_P027 = _next(
    _P026,
    (0, 27),
    (0, 29),
    (
        "a model given by name loads in float32 (create_model_from_path, utils.py L1154, 0.27.2); "
        "max_prompt_length removed in 0.28",
    ),
    defaults={"dtype": "float32"},
)
_P100 = _next(
    _P027,
    (1, 0),
    (1, 9),
    (
        "vllm_mode defaults to colocate (grpo_config.py L503, 1.0.0)",
        "vLLM 0.10.2-0.17.1 accepted (trl/import_utils.py, 1.0.0; up to 0.25.1 by 1.9.0), across vLLM 0.21, from which "
        "its CUDA graphs are charged to gpu_memory_utilization: both placements are counted, each where stricter",
        "temperature applied in place, logits.div_ (grpo_trainer.py L1068, 1.0.0): no second [B, C, V] tensor",
    ),
    defaults={"vllm_mode": "colocate"},
    temperature_copy=False,
    vllm_graphs="either",
)
_P110 = _next(
    _P100,
    (1, 10),
    (1, 13),
    (
        "max_completion_length defaults to 512 (grpo_config.py, 1.10.0)",
        "logits = logits / temperature copies the logits again (grpo_trainer.py L1532, 1.10.0)",
    ),
    defaults={"max_completion_length": 512},
    temperature_copy=True,
)
_P114 = _next(
    _P110,
    (1, 14),
    (1, 14),
    (
        "selective_log_softmax_and_entropy scales by temperature inside the kernel and computes the entropy in "
        "the same pass (trl/kernels/logprob_entropy.py; grpo_trainer.py L1580-1595, 1.14.2)",
    ),
    temperature_copy=False,
    entropy_pass=False,
)
_P115 = _next(
    _P110,
    (1, 15),
    (1, 15),
    (
        "fused chunked LM head: log-probs from hidden states in 4096 × 32768 tiles, no [B, C, V] logits "
        "(add_fused_lm_head, trl/kernels/chunked_logprob.py, 1.15.0)",
    ),
    logprob_path="chunked",
    temperature_copy=False,
    entropy_pass=False,
)
_P116 = _next(
    _P115,
    (1, 16),
    (1, 16),
    ("vLLM 0.22-0.31 accepted (trl/import_utils.py, 1.16.0): CUDA graphs charged to gpu_memory_utilization",),
    vllm_graphs="budget",
)

TABLE: tuple[TrlProfile, ...] = (
    _P014, _P015, _P016, _P017, _P018, _P019, _P020, _P022, _P023, _P026, _P027, _P100, _P110, _P114, _P115,
    _P116,
)  # fmt: skip
OLDEST: Version = TABLE[0].first
NEWEST: Version = TABLE[-1].last
MODELLED: tuple[str, ...] = tuple(
    f"{row.first[0]}.{m}" for row in TABLE for m in range(row.first[1], row.last[1] + 1)
)  # every minor release covered, "0.14" ... "1.16"


def accepted_range() -> str:
    return f"{fmt(OLDEST)} to {fmt(NEWEST)}"


def parse_version(text: str) -> Version:
    """`0.14`, `0.14.0`, `v1.16.2`, `0.19.0.dev0` -> (major, minor); ValueError naming the accepted form."""
    try:
        return version_text.parse_version(text)
    except ValueError:
        raise ValueError(
            f"--trl-version {str(text)[:40]!r}: expected MAJOR.MINOR, e.g. 0.14 (modelled: {accepted_range()})"
        ) from None


@lru_cache(maxsize=256)
def profile(version: str | Version) -> TrlProfile:
    """The row modelling one TRL release; ValueError naming the modelled range for any other. Cached: an
    answer that prices hundreds of configs asks for the same release thousands of times."""
    v = parse_version(version) if isinstance(version, str) else version
    for row in TABLE:
        if row.covers(v):
            return row
    raise ValueError(
        f"--trl-version {fmt(v)}: not a modelled TRL release; accepted {accepted_range()} (GRPO landed in 0.14)"
    )


def installed_version() -> Version | None:
    """The installed TRL's (major, minor) from its package metadata (trl is not imported), None if absent."""
    from importlib import metadata

    try:
        return parse_version(metadata.version("trl"))
    except (metadata.PackageNotFoundError, ValueError):
        return None


def default_version() -> Version:
    """The installed TRL when the table covers it, else the newest modelled release."""
    v = installed_version()
    return v if v is not None and OLDEST <= v <= NEWEST else NEWEST
