"""The single changes advice tries: each takes (cfg, fits) and returns the changed config(s), with what it costs.

Sizing changes pick the largest value that fits (given `fits`) and never go below a floor where the run would stop
being the run the user asked for; vLLM's changes keep vLLM's own start-up check in view (max_model_len, share).
`GENERATORS` is the order they are applied in, `CONFLICTS` the pairs never combined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from estimator.hardware import gpus
from estimator.model.architecture import Arch
from estimator.model.catalog import UnknownModel, resolve_model
from estimator.plan.layout import VllmSettings, max_model_len, server_share_range, smallest_utilization
from estimator.plan.solve import is_valid, largest_fitting
from estimator.settings.compat import check_library_support
from estimator.settings.config import InvalidConfig, RunConfig
from estimator.settings.role_spec import config_roles
from estimator.step.estimate import estimate
from estimator.terms import allocator_reserve as allocator_term
from estimator.terms.quantized import arch_quant_spec
from estimator.terms.sharding import fetches_parameters
from estimator.units import GIB

FitsFn = Callable[[RunConfig], bool]
MAX_EXTRA_GPUS = (2, 4, 8)


@dataclass(frozen=True)
class Change:
    """One edit of the run: a short key, what to do (in TRL terms), its cost rank and the resulting config."""

    key: str
    label: str
    # 0 = no effect at all, 1 = no effect on the result, higher = changes training more (breaks ties)
    cost: int
    config: RunConfig
    tradeoff: str = ""  # what the change costs: throughput, GPUs or quality


@dataclass(frozen=True, eq=False)
class Toggle:
    """A single change that either applies to a config or not, and then sets fixed values: called like the other
    changes, `(cfg, fits) -> [Change]` (empty when `when(cfg)` is false)."""

    key: str
    label: str | Callable[[RunConfig], str]
    cost: int
    when: Callable[[RunConfig], bool]
    edits: dict
    tradeoff: str

    def __call__(self, cfg: RunConfig, fits: FitsFn | None = None) -> list[Change]:
        if not self.when(cfg):
            return []
        label = self.label(cfg) if callable(self.label) else self.label
        return [Change(self.key, label, self.cost, cfg.with_(**self.edits), self.tradeoff)]


def _arch(cfg: RunConfig) -> Arch | None:
    """The run's model as the catalog (or its config.json) describes it; None where it cannot be read."""
    try:
        return resolve_model(cfg.model)
    except (UnknownModel, ValueError):
        return None


def _prequantized(cfg: RunConfig) -> bool:
    """The model is a GPTQ / AWQ checkpoint (already packed: bitsandbytes 4-bit does not apply to it)."""
    arch = _arch(cfg)
    return arch is not None and arch_quant_spec(arch) is not None


def _colocated_vllm(cfg: RunConfig) -> bool:
    return cfg.use_vllm and cfg.vllm_mode == "colocate"


load_bf16 = Toggle(
    "bf16",
    "load in bf16 (model_init_kwargs dtype: bfloat16)",
    1,
    lambda cfg: cfg.dtype == "float32" and not cfg.load_in_4bit,
    {"dtype": "bfloat16"},
    "bf16 weights and optimizer state instead of fp32 (bf16 autocast already computes in bf16)",
)
_grad_ckpt = Toggle(
    "gc",
    "--gradient-checkpointing",
    1,
    lambda cfg: not cfg.gradient_checkpointing,
    {"gradient_checkpointing": True},
    "each layer's forward runs twice: the training step is roughly a third slower",
)


def _takes(cfg: RunConfig, arch: Arch, attention: str) -> bool:
    """Whether the modelled transformers release runs `cfg`'s model under `attention`
    (`compat.check_library_support` holds the families' refusals)."""
    try:
        check_library_support(cfg.with_(attn_implementation=attention), arch)
    except InvalidConfig:
        return False
    return True


def _sdpa_accepted(cfg: RunConfig) -> bool:
    """Eager attention on a model that also runs under sdpa, which computes the same scores: not one whose class
    refuses sdpa (Gemma 2, for its logit soft-capping)."""
    arch = _arch(cfg)
    return cfg.attn_implementation == "eager" and arch is not None and _takes(cfg, arch, "sdpa")


_sdpa = Toggle(
    "sdpa",
    "--attn-implementation sdpa (model_init_kwargs attn_implementation: sdpa)",
    1,
    _sdpa_accepted,
    {"attn_implementation": "sdpa"},
    "the same attention in torch's fused kernel: no [batch, heads, T, T] scores and fp32 softmax per layer",
)
_no_reference = Toggle(
    "beta0",
    "--beta 0 (no KL term: TRL loads no reference model)",
    4,
    lambda cfg: cfg.beta > 0,
    {"beta": 0.0},
    "the objective loses its KL penalty to the reference model (TRL's default since 0.19, as in DAPO and "
    "Dr. GRPO)",
)


def _flash_attention_instead(cfg: RunConfig) -> bool:
    """Eager attention on a CUDA run whose model refuses sdpa (Gemma 2's soft-capping) but not flash-attn, whose
    kernel applies the soft-cap."""
    arch = _arch(cfg)
    if cfg.attn_implementation != "eager" or cfg.device != "cuda" or arch is None or _sdpa_accepted(cfg):
        return False
    return _takes(cfg, arch, "flash_attention_2")


# flash-attn 2 runs on compute capability 8.0 and newer (Ampere, Ada, Hopper): its README's requirements,
# https://github.com/Dao-AILab/flash-attention/blob/v2.8.3/README.md ("currently supports: Ampere, Ada, or Hopper GPUs")
FLASH_ATTENTION_MIN_SM = (8, 0)


def kernel_runs_on(sm: tuple[int, int] | None, cfg: RunConfig) -> Callable[[RunConfig, Arch], bool] | None:
    """The check that a change's attention kernel runs on a target card of compute capability `sm`: a change to
    flash_attention_2 does not fit a card older than Ampere. None where nothing is checked: no target, an unknown
    card ((0, 0)), a new enough one, or a run that chose flash_attention_2 itself (the user's own choice)."""
    if (
        sm is None
        or sm == (0, 0)
        or sm >= FLASH_ATTENTION_MIN_SM
        or cfg.attn_implementation == "flash_attention_2"
    ):
        return None
    return lambda c, arch: c.attn_implementation != "flash_attention_2"


_flash_attention = Toggle(
    "fa2",
    "--attn-implementation flash_attention_2 (model_init_kwargs attn_implementation: flash_attention_2)",
    1,
    _flash_attention_instead,
    {"attn_implementation": "flash_attention_2"},
    "the same attention, soft-cap included, in flash-attn's kernel: no [batch, heads, T, T] scores; needs the "
    "flash-attn package and an Ampere or newer GPU",
)
_adam8bit = Toggle(
    "adam8",
    "--optim adamw_bnb_8bit",
    2,
    lambda cfg: (
        cfg.device == "cuda" and cfg.optim in ("adamw_torch_fused", "adamw_torch", "paged_adamw_32bit")
    ),
    {"optim": "adamw_bnb_8bit"},
    "8-bit AdamW moments (block-wise quantized): usually no visible quality change",
)
_lora = Toggle(
    "lora",
    lambda cfg: f"--use-peft (LoRA r={cfg.lora_r})",
    4,
    lambda cfg: not cfg.use_peft,
    {"use_peft": True},
    "trains adapters only: fewer trainable parameters, may learn less than a full fine-tune",
)
qlora = Toggle(
    "qlora",
    "--qlora (LoRA on a 4-bit base)",
    5,
    lambda cfg: not cfg.load_in_4bit and cfg.device == "cuda" and not _prequantized(cfg),
    {"use_peft": True, "load_in_4bit": True},
    "4-bit NF4 base: slower (dequantized every matmul), a small quality loss",
)
_vllm_sleep = Toggle(
    "sleep",
    "--vllm-enable-sleep-mode",
    1,
    lambda cfg: _colocated_vllm(cfg) and not cfg.vllm_sleeps,
    {"vllm_enable_sleep_mode": True, "vllm_sleep_level": None},
    "vLLM frees its weights and KV cache while training (level 2): every step re-pushes the weights",
)
_offload_optimizer = Toggle(  # DeepSpeed ZeRO-Offload of the optimizer state
    "offload",
    "--offload-optimizer (DeepSpeed offload_optimizer: cpu)",
    3,
    lambda cfg: cfg.sharding in ("zero2", "zero3") and not cfg.offload_optimizer,
    {"offload_optimizer": True},
    "AdamW state and step on the CPU: slower optimizer steps, needs host RAM for the fp32 state",
)
_no_generation_gather = Toggle(  # ZeRO-3: generation fetches module by module instead of gathering the policy
    "no_gather",
    "--no-ds3-gather-for-generation (TRL ds3_gather_for_generation: false)",
    2,
    lambda cfg: fetches_parameters(cfg) and cfg.ds3_gather_for_generation and not cfg.use_vllm,
    {"ds3_gather_for_generation": False},
    "generation fetches each module's parameters for every token instead of gathering the policy once: much "
    "slower generation, nothing else changes",
)
_vllm_server = (
    Toggle(  # vLLM on a GPU of its own (`trl vllm-serve`): the training GPUs keep none of its share
        "vllm_server",
        "--vllm-mode server (vLLM on a GPU of its own: trl vllm-serve)",
        3,
        _colocated_vllm,
        {"vllm_mode": "server"},
        "needs one more GPU for vLLM; generation no longer waits on the training GPUs' memory",
    )
)


def _vllm_max_len(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """vllm_max_model_length cut to prompt + completion: vLLM's start-up check then needs one such request's KV
    instead of one of the model's whole context (saves no step memory; lets vLLM start in a smaller share)."""
    if not cfg.use_vllm or _max_model_len(cfg) <= cfg.sequence_length:
        return []
    n = cfg.sequence_length
    return [
        Change(
            "vllm_len",
            f"--vllm-max-model-length {n}",
            0,
            cfg.with_(vllm_max_model_length=n),
            f"vLLM refuses requests over {n} tokens (prompt + completion): the run sends none",
        )
    ]


def _vllm_share(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """vLLM's share moved to the largest that fits, never below the smallest whose KV cache holds one prompt +
    completion request (`vllm_floor`); raised to that floor when the share is below it. Where the share is below
    what one request of the current max_model_len needs, vllm_max_model_length is cut to prompt + completion too
    (vLLM's start-up check fails otherwise)."""
    if not _colocated_vllm(cfg):
        return []
    floor = vllm_floor(cfg)
    u = cfg.vllm_gpu_memory_utilization
    shares = [x / 100 for x in range(int(round(floor * 100)), int(round(u * 100)))]
    raise_ = not shares and u < floor
    if raise_:
        pick = floor
    elif not shares:
        return []
    else:
        pick = largest_fitting(shares, lambda x: fits(_with_share(cfg, x))) if fits else None
        pick = pick if pick is not None else shares[0]
    changed = _with_share(cfg, pick)
    flag = f"--vllm-gpu-memory-utilization {pick}"
    if changed.vllm_max_model_length != cfg.vllm_max_model_length:
        flag += f" --vllm-max-model-length {changed.vllm_max_model_length}"
    why = (
        f"vLLM's share raised to hold its weights and one {cfg.sequence_length}-token request: the step has "
        "less room"
        if raise_
        else f"a smaller KV cache (down to {floor} still holds one {cfg.sequence_length}-token request, with "
        "vllm_max_model_length set to it): fewer sequences at once, generation may run in waves"
    )
    return [Change("vllm_share", flag, 1, changed, why)]


def _vllm_server_share(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """A vLLM server that does not start on its own GPU: trl vllm-serve's share moved into the range where it does,
    from the smallest that holds its weights and one max_model_len request (the run's, or prompt + completion
    with max_model_len cut to it) up to the largest its card has free (`layout.server_share_range`). Its GPU is
    its own, so the share costs the training GPUs nothing."""
    if not (cfg.use_vllm and cfg.vllm_mode == "server"):
        return []
    arch = _arch(cfg)
    if arch is None:
        return []
    total, settings, u = _card_bytes(cfg), VllmSettings.of(cfg), cfg.vllm_server_utilization
    lo, hi = server_share_range(cfg, arch, settings, total)
    changed = cfg
    if lo is None or lo > hi:  # not with the run's max_model_len: with prompt + completion
        changed = cfg.with_(vllm_max_model_length=cfg.sequence_length)
        lo, hi = server_share_range(
            changed, arch, replace(settings, max_model_length=cfg.sequence_length), total
        )
        if lo is None or lo > hi:
            return []
    if lo <= u <= hi:
        return []
    pick = lo if u < lo else hi
    changed = changed.with_(vllm_server_utilization=pick)
    flag = f"--vllm-server-utilization {pick}"
    if changed.vllm_max_model_length != cfg.vllm_max_model_length:
        flag += f" --vllm-max-model-length {changed.vllm_max_model_length}"
    why = (
        f"the server's KV cache then holds one {changed.vllm_max_model_length or _max_model_len(cfg)}-token request"
        if u < lo
        else "what its card has free at start-up and for the weight push"
    )
    return [Change("vllm_server_share", flag, 0, changed, f"on vLLM's own GPU: {why}")]


def _max_model_len(cfg: RunConfig) -> int:
    """The max_model_len vLLM runs with (layout.max_model_len); the run's own length if the model is unknown."""
    arch = _arch(cfg)
    if arch is None:
        return cfg.vllm_max_model_length or cfg.sequence_length
    return max_model_len(arch, VllmSettings.of(cfg))


def _with_share(cfg: RunConfig, u: float) -> RunConfig:
    """`cfg` with vLLM's share `u`, and vllm_max_model_length cut to prompt + completion where the share is below
    what one request of the current max_model_len needs (`smallest_utilization`)."""
    changed = cfg.with_(vllm_gpu_memory_utilization=u)
    if _max_model_len(cfg) <= cfg.sequence_length:
        return changed
    arch = _arch(cfg)
    if arch is None:
        return changed
    need = smallest_utilization(cfg, arch, VllmSettings.of(cfg), _card_bytes(cfg), False)
    if need is not None and u >= need:
        return changed
    return changed.with_(vllm_max_model_length=cfg.sequence_length)


def _micro_batch(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """Same generation batch and same sequences per optimizer step, in smaller micro-batches."""
    bs = cfg.per_device_train_batch_size
    options = []
    for b in range(bs - 1, 0, -1):
        if bs % b:
            continue
        k = bs // b
        changes: dict = {
            "per_device_train_batch_size": b,
            "gradient_accumulation_steps": cfg.gradient_accumulation_steps * k,
        }
        if cfg.steps_per_generation is not None:
            changes["steps_per_generation"] = cfg.steps_per_generation * k
        c = cfg.with_(**changes)
        if is_valid(c):
            options.append(c)
    if not options:
        return []
    pick = next((c for c in options if fits(c)), options[-1]) if fits else options[len(options) // 2]
    b, ga = pick.per_device_train_batch_size, pick.gradient_accumulation_steps
    return [
        Change(
            "micro",
            f"--per-device-train-batch-size {b} --gradient-accumulation-steps {ga}",
            2,
            pick,
            "same sequences per optimizer step in smaller micro-batches: slower, same result",
        )
    ]


def _fewer_generations(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """Fewer completions per prompt, same prompts per generation batch (so fewer sequences at once)."""
    g, seq = cfg.num_generations, cfg.generation_sequences
    options = []
    for g2 in range(g - 1, min_generations(g) - 1, -1):
        if (seq * g2) % g:
            continue
        c = _with_sequences(cfg.with_(num_generations=g2), seq * g2 // g)
        if c is not None:
            options.append(c)
    if not options:
        return []
    pick = next((c for c in options if fits(c)), None) if fits else options[len(options) // 2]
    if pick is None:
        return []
    return [
        Change(
            "gens",
            f"--num-generations {pick.num_generations}{_geometry_flags(cfg, pick)} "
            f"(generation batch {pick.generation_sequences}/device)",
            6,
            pick,
            "fewer completions per prompt: noisier group-relative advantages",
        )
    ]


def _with_sequences(cfg: RunConfig, seq: int) -> RunConfig | None:
    """`cfg` generating `seq` sequences per device: the largest micro-batch <= the current one dividing it."""
    bs = max(b for b in range(1, min(cfg.per_device_train_batch_size, seq) + 1) if seq % b == 0)
    spg = seq // bs
    if cfg.steps_per_generation is None and cfg.generation_batch_size is None:
        c = cfg.with_(per_device_train_batch_size=bs, gradient_accumulation_steps=spg)
    else:
        c = cfg.with_(per_device_train_batch_size=bs, steps_per_generation=spg, generation_batch_size=None)
    return c if is_valid(c) else None


GEOMETRY_FLAGS = (  # the batch settings a change of num_generations may move with it, and their flags
    ("per_device_train_batch_size", "--per-device-train-batch-size"),
    ("gradient_accumulation_steps", "--gradient-accumulation-steps"),
    ("steps_per_generation", "--steps-per-generation"),
)


def _geometry_flags(before: RunConfig, after: RunConfig) -> str:
    """' --per-device-train-batch-size 2 ...': the flags of the batch settings `after` changes, so that the label is
    the whole change; a generation_batch_size it drops is said in words (no flag unsets it)."""
    out = "".join(
        f" {flag} {getattr(after, name)}"
        for name, flag in GEOMETRY_FLAGS
        if getattr(after, name) != getattr(before, name) and getattr(after, name) is not None
    )
    if before.generation_batch_size is not None and after.generation_batch_size is None:
        out += " (without generation_batch_size)"
    return out


def _shorter_completions(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    n = cfg.max_completion_length
    floor = min_completion_length(n)
    if n <= floor:
        return []
    if fits:
        best = largest_fitting(range(floor, n), lambda m: fits(cfg.with_(max_completion_length=m)))
        if best is None:  # even the floor does not fit: length is not what to change
            return []
    else:
        best = max(floor, n // 2)
    return [
        Change(
            "len",
            f"--max-completion-length {best}",
            6,
            cfg.with_(max_completion_length=best),
            f"completions cut at {best} tokens instead of {n}: long answers are truncated",
        )
    ]


SAME_GPUS_SHARDING = (  # (sharding, flag, cost rank, what it costs), tried in this order on a DDP run's GPUs
    (
        "fsdp",
        "--fsdp",
        2,
        "FSDP2 over the same {n} GPUs: weights, gradients and AdamW state divided, DDP's buckets gone; "
        "each layer is all-gathered in forward and backward",
    ),
    (
        "zero2",
        "--zero 2",
        2,
        "DeepSpeed ZeRO-2 over the same {n} GPUs: gradients and AdamW state divided, DDP's buckets gone "
        "(pip install deepspeed)",
    ),
    (
        "zero3",
        "--zero 3",
        3,
        "DeepSpeed ZeRO-3 over the same {n} GPUs: weights too, gathered for generation and every layer",
    ),
)


def _shard_same_gpus(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """A DDP run (several GPUs, no sharding) sharded over the GPUs it already has: the first of
    `SAME_GPUS_SHARDING` that fits (the first valid one without a budget). A 4-bit or pre-quantized base is offered
    ZeRO-2 only, which leaves the weights whole: sharding packed weights is neither traced nor measured."""
    if cfg.device != "cuda" or cfg.num_gpus < 2 or cfg.sharding != "none":
        return []
    quantized = cfg.load_in_4bit or _prequantized(cfg)
    options = [
        (c, flag, cost, why)
        for sharding, flag, cost, why in SAME_GPUS_SHARDING
        if (sharding == "zero2" or not quantized) and is_valid(c := cfg.with_(sharding=sharding))
    ]
    if not options:
        return []
    c, flag, cost, why = next((o for o in options if fits(o[0])), options[0]) if fits else options[0]
    return [Change("shard", flag, cost, c, why.format(n=cfg.num_gpus))]


def _shard_roles(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """A one-GPU run whose roles placed on their own take several GPUs (MODEL@own:N): FSDP or ZeRO-3 shards each
    such role over its N GPUs (layout._role_bytes), the policy's GPU unchanged in kind; the first that fits (FSDP
    without a budget). Not with a 4-bit or pre-quantized base (packed weights are neither traced nor measured)."""
    if cfg.device != "cuda" or cfg.num_gpus != 1 or cfg.sharding != "none":
        return []
    if cfg.load_in_4bit or _prequantized(cfg) or not any(r.gpus > 1 for r in config_roles(cfg)):
        return []
    options = [(c, flag) for sharding, flag in SHARD_ROLES if is_valid(c := cfg.with_(sharding=sharding))]
    if not options:
        return []
    c, flag = next((o for o in options if fits(o[0])), options[0]) if fits else options[0]
    why = (
        "each role placed on N GPUs of its own (MODEL@own:N) is sharded over them and gathered layer by layer"
    )
    return [Change("shard", flag, 2, c, why)]


SHARD_ROLES = (("fsdp", "--fsdp"), ("zero3", "--zero 3"))  # tried in this order by _shard_roles


def _more_gpus(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    if cfg.device != "cuda":
        return []
    sharding = "fsdp" if cfg.sharding == "fsdp" else "zero3"
    options = [cfg.with_(num_gpus=n, sharding=sharding) for n in MAX_EXTRA_GPUS if n > cfg.num_gpus]
    options = [c for c in options if is_valid(c)]
    if not options:
        return []
    pick = next((c for c in options if fits(c)), options[-1]) if fits else options[0]
    how = "--fsdp" if sharding == "fsdp" else "--zero 3"
    return [
        Change(
            "gpus",
            f"--gpus {pick.num_gpus} {how}",
            3,
            pick,
            f"{pick.num_gpus} GPUs; gathers and reduce-scatters every layer (slower per GPU)",
        )
    ]


ALLOCATOR_KEYS = {
    "expandable_segments": "expandable",
    "max_split_size_mb_128": "max_split",
    "torch_empty_cache_steps_1": "empty_cache",
}


def _allocator_settings(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """The settings that fight the caching allocator's fragmentation (`allocator_term.setting_savings`), each
    proposed only where the simulation says it lowers what the card must hold at this config (the re-estimate
    then measures it). `expandable_segments` is not proposed with a sleeping colocated vLLM: its CuMemAllocator
    pool asserts that expandable segments are off (vllm/device_allocator/cumem.py, pytorch#147851)."""
    if cfg.device != "cuda":
        return []
    try:
        est = estimate(cfg)
    except (ValueError, KeyError):
        return []
    peak, shares = est.peak_allocated_bytes, allocator_term.shares_of(est.phases)
    default = allocator_term.config_variant(cfg) == "default"
    saves = {s.setting: s for s in allocator_term.setting_savings(cfg, peak, shares)}
    conf = cfg.pytorch_cuda_alloc_conf

    def joined(item: str) -> str:
        return f"{conf},{item}" if conf else item

    candidates = []
    if "expandable_segments" not in conf and not (
        cfg.use_vllm and cfg.vllm_mode == "colocate" and cfg.vllm_sleeps
    ):
        candidates.append(
            (
                "expandable_segments",
                "expandable_segments:True",
                cfg.with_(pytorch_cuda_alloc_conf=joined("expandable_segments:True")),
            )
        )
    if "max_split_size_mb" not in conf:
        candidates.append(
            (
                "max_split_size_mb_128",
                "max_split_size_mb:128",
                cfg.with_(pytorch_cuda_alloc_conf=joined("max_split_size_mb:128")),
            )
        )
    if cfg.torch_empty_cache_steps != 1:
        candidates.append(("torch_empty_cache_steps_1", "", cfg.with_(torch_empty_cache_steps=1)))
    out = []
    for variant, item, changed in candidates:
        s = saves[allocator_term.SETTINGS[variant]]
        if default and s.saves_bytes <= 0:  # the simulation says it saves nothing here
            continue
        label = f"PYTORCH_CUDA_ALLOC_CONF={changed.pytorch_cuda_alloc_conf}" if item else s.setting
        cost = s.caveat or "none at this config"
        out.append(
            Change(
                ALLOCATOR_KEYS[variant],
                label,
                1,
                changed,
                f"{cost} ({s.source.split(' ', 1)[0]})",
            )
        )
    return out


MIN_COMPLETION_TOKENS = 64


def min_completion_length(n: int) -> int:
    """Shortest completion advice proposes: an eighth of the asked length, at least 64 tokens (or n itself)."""
    return min(n, max(MIN_COMPLETION_TOKENS, n // 8))


def min_generations(g: int) -> int:
    """Fewest completions per prompt advice proposes: a quarter of the asked group, at least 2 (or g itself)."""
    return min(g, max(2, g // 4))


def vllm_floor(cfg: RunConfig) -> float:
    """Smallest vLLM share (2 decimals) whose KV cache holds one prompt + completion request (layout.py)."""
    arch = _arch(cfg)
    if arch is None:
        return 0.01
    settings = replace(VllmSettings.of(cfg), max_model_length=cfg.sequence_length)
    u = smallest_utilization(cfg, arch, settings, _card_bytes(cfg), False)
    return u if u is not None else cfg.vllm_gpu_memory_utilization


def _card_bytes(cfg: RunConfig) -> int:
    """The total vLLM's share is a fraction of (cudaMemGetInfo's, what torch can use) on a card of gpu_memory_gib
    (80 when unset), by the rule for an unmeasured card: never above a listed card's own, so a share found here
    starts on the listed card too (its floor errs high by at most 0.01)."""
    gib = cfg.gpu_memory_gib or 80.0
    try:
        return gpus.for_memory_gib(gib).usable_bytes
    except gpus.UnknownGPU:
        return int(gib * GIB)


GENERATORS = (
    _allocator_settings,
    load_bf16,
    _grad_ckpt,
    _sdpa,
    _flash_attention,
    _vllm_sleep,
    _vllm_max_len,
    _vllm_share,
    _vllm_server_share,
    _vllm_server,
    _offload_optimizer,
    _no_generation_gather,
    _adam8bit,
    _no_reference,
    _lora,
    qlora,
    _shard_same_gpus,
    _shard_roles,
    _more_gpus,
    _micro_batch,
    _shorter_completions,
    _fewer_generations,
)
CONFLICTS = (
    {"expandable", "max_split"},
    {"shard", "gpus"},
    {"lora", "qlora"},
    {"bf16", "qlora"},
    {"vllm_share", "vllm_server"},
    {"vllm_len", "vllm_share"},  # the share change cuts max_model_len itself where it must
    {"vllm_len", "vllm_server_share"},
    {"sleep", "vllm_server"},
)


def single_changes(cfg: RunConfig, fits: FitsFn | None) -> list[Change]:
    """Every single change that applies to `cfg` (sizing changes pick the largest value that fits)."""
    return [ch for gen in GENERATORS for ch in gen(cfg, fits) if is_valid(ch.config)]


def apply_keys(cfg: RunConfig, keys: tuple[str, ...], fits: FitsFn | None) -> tuple[Change, ...] | None:
    """Apply changes by key in GENERATORS order, each re-derived on the config so far; None if one no longer applies
    (or makes a config TRL refuses)."""
    applied: list[Change] = []
    current = cfg
    for gen in GENERATORS:
        for ch in gen(current, fits):
            if ch.key in keys and is_valid(ch.config):
                applied.append(ch)
                current = ch.config
    if len(applied) != len(keys):
        return None
    return tuple(applied)
