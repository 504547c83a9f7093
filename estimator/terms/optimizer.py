"""Gradients, optimizer state, optimizer-step temporaries and master weights."""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.terms import moe_lora
from estimator.terms.weights import head_fp32_extra_bytes, lora_targets, trainable_dtype, trainable_params
from estimator.units import nbytes

BNB_BLOCK = 256  # bitsandbytes 8-bit optimizer blockwise quantization block
BNB_MIN_8BIT_NUMEL = 4096  # smaller tensors keep 32-bit state (bnb Optimizer8bit min_8bit_size)
# what counts the tensors: the device's own counters (real tensors) or a Python dispatch mode (FakeTensor traces,
# the measured-cpu probe), where autograd's gradient sums run out of place (`tied_gradients_at_meeting`)
REAL, DISPATCH = "real", "dispatch"
TENSORS = (REAL, DISPATCH)


def gradients(cfg: RunConfig, arch: Arch) -> int:
    """trainable × bytes(param dtype): grads take the parameter's dtype (torch autograd); the fp32-cast head's in fp32."""
    extra = 0 if cfg.use_peft else head_fp32_extra_bytes(cfg, arch)
    return trainable_params(cfg, arch) * nbytes(trainable_dtype(cfg)) + extra


def head_grad_bytes(cfg: RunConfig) -> int:
    """Bytes per element of the head's (or tied embedding's) gradient: 4 with cast_lm_head_to_fp32 (the Parameter
    is fp32, `weights.head_fp32_extra_bytes`), else the trainable dtype."""
    return 4 if cfg.cast_lm_head_to_fp32 else nbytes(trainable_dtype(cfg))


def tied_gradient_buffer(cfg: RunConfig, arch: Arch) -> int:
    """Full FT with tied lm_head/embedding: the head's [V, H] gradient waits in autograd's input buffer for the embedding's, V·H·w."""
    if cfg.use_peft or not arch.tie_word_embeddings:
        return 0
    return arch.embedding_params * head_grad_bytes(cfg)


def gradients_after_head(cfg: RunConfig, arch: Arch) -> int:
    """Gradients that exist once the head's backward is done: (untied lm_head + final norm)·w + the tied buffer (full FT)."""
    if cfg.use_peft:
        return 0
    own = arch.lm_head_params * head_grad_bytes(cfg) + arch.final_norm_params * nbytes(trainable_dtype(cfg))
    return own + tied_gradient_buffer(cfg, arch)


def gradients_before_first_layer(cfg: RunConfig, arch: Arch) -> int:
    """Gradients during the first layer's backward: all but the embedding's and that layer's (+ the tied buffer)."""
    if cfg.use_peft:
        return gradients(cfg, arch)
    early = arch.embedding_params * (
        4 if cfg.cast_lm_head_to_fp32 and arch.tie_word_embeddings else nbytes(trainable_dtype(cfg))
    )
    early += arch.layer_params * nbytes(trainable_dtype(cfg))
    return max(gradients(cfg, arch) - early, 0) + tied_gradient_buffer(cfg, arch)


def _trainable_tensors(cfg: RunConfig, arch: Arch) -> list[int]:
    """numel of every trainable tensor (for per-tensor optimizer rules)."""
    if cfg.use_peft:
        out = []
        for lin in lora_targets(cfg, arch):
            out += [cfg.lora_r * lin.in_features * lin.count, cfg.lora_r * lin.out_features * lin.count]
        out += moe_lora.factor_tensor_numels(cfg, arch)  # LoRA on fused expert stacks (ParamWrapper)
        return out * arch.num_layers
    sizes = [arch.embedding_params]
    layer = [lin.count * lin.in_features * lin.out_features for lin in arch.layer_linears]
    layer += [lin.count * lin.out_features for lin in arch.layer_linears if lin.bias]
    sizes += layer * arch.num_layers
    sizes += [arch.hidden_size] * (arch.num_layers * 2 + 1)  # norms (approximately: 1-D, all < 4096·k)
    if not arch.tie_word_embeddings:
        sizes.append(arch.lm_head_params)
    return sizes


def bnb_8bit_state(cfg: RunConfig, arch: Arch) -> int:
    """2 × (numel uint8 + numel/256 fp32 absmax) per tensor ≥ 4096 elements; 2 × 4 B/elem for smaller ones and embeddings (transformers forces nn.Embedding to 32-bit)."""
    total = 0
    sizes = _trainable_tensors(cfg, arch)
    embedding = arch.embedding_params if not cfg.use_peft else -1
    for i, n in enumerate(sizes):
        if n < BNB_MIN_8BIT_NUMEL or (i == 0 and n == embedding):
            total += 2 * n * 4
        else:
            total += 2 * (n + -(-n // BNB_BLOCK) * 4)
    return total


def optimizer_state(cfg: RunConfig, arch: Arch) -> int:
    """AdamW: 2 × trainable × bytes(param dtype) (torch fused/foreach); 8-bit: blockwise uint8; paged: same bytes in unified memory."""
    n = trainable_params(cfg, arch)
    if cfg.sharding in ("zero2", "zero3") and cfg.bf16 and not cfg.use_peft:
        return 2 * n * 4  # DeepSpeed's optimizer keeps fp32 m and v beside the fp32 master copy
    if cfg.optim in (
        "adamw_torch_fused",
        "adamw_torch",
    ):  # state takes each parameter's dtype (fp32-cast head)
        return 2 * (
            n * nbytes(trainable_dtype(cfg)) + (0 if cfg.use_peft else head_fp32_extra_bytes(cfg, arch))
        )
    if cfg.optim in ("adamw_bnb_8bit", "paged_adamw_8bit"):
        return bnb_8bit_state(cfg, arch)
    if cfg.optim == "paged_adamw_32bit":
        return 2 * n * 4
    if cfg.optim == "sgd":
        return 0
    raise ValueError(f"unknown optimizer {cfg.optim!r}")


def largest_trainable(cfg: RunConfig, arch: Arch) -> int:
    """numel of the largest single trainable tensor (a LoRA A/B matrix, a decoder weight, the embedding or head)."""
    if cfg.use_peft:
        linears = [cfg.lora_r * max(lin.in_features, lin.out_features) for lin in lora_targets(cfg, arch)]
        return max(linears + moe_lora.factor_tensor_numels(cfg, arch), default=0)
    sizes = [arch.embedding_params] + [lin.in_features * lin.out_features for lin in arch.layer_linears]
    if not arch.tie_word_embeddings:
        sizes.append(arch.lm_head_params)
    return max(sizes)


def optimizer_temporaries(cfg: RunConfig, arch: Arch) -> int:
    """`adamw_torch`: foreach on CUDA, one param-sized temporary (sqrt(v) via _foreach_sqrt); on CPU torch picks the
    single-tensor loop (torch/optim/optimizer.py `_default_to_fused_or_foreach`), whose sqrt(v) and denominator
    live for one tensor at a time: 2 × the largest (measured under TRL 0.23 on CPU). Fused and bnb kernels: 0."""
    if cfg.optim == "adamw_torch":
        if cfg.device == "cpu":
            return 2 * largest_trainable(cfg, arch) * nbytes(trainable_dtype(cfg))
        return gradients(cfg, arch)
    return 0


def master_weights(cfg: RunConfig, arch: Arch) -> int:
    """fp32 master copy: only under DeepSpeed ZeRO with a 16-bit model (ZeRO paper: 4Ψ of the 12Ψ optimizer bytes); TRL alone keeps none."""
    if cfg.sharding in ("zero2", "zero3") and cfg.bf16 and not cfg.use_peft:
        return trainable_params(cfg, arch) * 4
    return 0


def accumulated_gradients(cfg: RunConfig, arch: Arch) -> int:
    """Gradients resident through every micro-step after the first: full trainable × bytes, when GA > 1.

    transformers 5.23 `Trainer._inner_training_loop` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/trainer.py#L1890-L1946) runs `training_step` on
    `gradient_accumulation_steps` micro-batches and calls `model.zero_grad()` only after `optimizer.step()`;
    autograd's AccumulateGrad adds each new gradient into the existing `.grad` in place
    (torch/csrc/autograd/functions/accumulate_grad.h `accumulateGrad`). So from the second micro-step on, the
    forward and the backward run with every `.grad` already allocated; only the tied-embedding buffer is new.
    """
    if cfg.gradient_accumulation_steps <= 1:
        return 0
    return gradients(cfg, arch)


def gradients_during_generation(cfg: RunConfig, arch: Arch) -> int:
    """Gradients resident while generating / scoring: when a generation falls inside an accumulation window.

    TRL 1.16 `GRPOTrainer._prepare_inputs` (grpo_trainer.py:1538-1546) regenerates when
    `_step % (steps_per_generation × num_iterations) == 0`; the optimizer zeroes grads every
    `gradient_accumulation_steps` micro-steps. Unless the generation period is a multiple of GA, some generation
    starts mid-window with the previous micro-steps' `.grad` resident.
    """
    period = cfg.resolved_steps_per_generation * cfg.num_iterations
    if cfg.gradient_accumulation_steps <= 1 or period % cfg.gradient_accumulation_steps == 0:
        return 0
    return gradients(cfg, arch)


def tied_gradients_at_meeting(
    cfg: RunConfig, arch: Arch, tensors: str = REAL, resident_grad: bool = False
) -> int:
    """[V, H] gradients in flight beside the `.grad`s already counted, at the end of backward where a tied head's
    gradient (waiting in autograd's input buffer since the head's backward) meets the embedding's own.

    torch's `InputBuffer::accumulate` (torch/csrc/autograd/input_buffer.cpp, `can_accumulate_inplace`) adds the
    embedding's gradient into the waiting one in place when that one is a plain tensor holding its last reference:
    TRL's fused head (`logprob_head` chunked) returns `grad_weight.to(weight.dtype)`, a fresh tensor, so on real
    tensors the sum is in place and two [V, H] meet; through the model's own `lm_head` (full, rowwise, selective:
    `F.linear` with the tied weight) real tensors sum out of place: three. Seen through a Python dispatch mode
    (`tensors="dispatch"`: the FakeTensor traces, the measured-cpu probe) every sum is out of place, as a
    FakeTensor is a tensor subclass and a mode holds the tensors' Python objects
    (tests/ground_truth/test_tied_gradient_sum.py pins all three cases). Where no `.grad` is resident (the first
    micro-step) the sum becomes `.grad`, which `gradients` counts: one [V, H] beside it in place, two out of
    place; with a resident `.grad` (GA > 1) AccumulateGrad adds the sum into it in place, and the sum itself is
    one more in flight."""
    tied = tied_gradient_buffer(cfg, arch)
    if tensors not in TENSORS:
        raise ValueError(f"tensors={tensors!r}: accepted values are {', '.join(TENSORS)}")
    in_place = tensors == REAL and cfg.logprob_head == "chunked"
    return tied * ((1 if in_place else 2) + (1 if resident_grad else 0))


def micro_step_gradients(cfg: RunConfig, arch: Arch, instant: str, tensors: str = REAL) -> int | None:
    """`.grad` bytes at a training instant of a later micro-step (GA > 1), or None with GA = 1.

    Every `.grad` is resident (`accumulated_gradients`); the head's backward adds nothing new (its [V, H]
    gradient is in the head term), and with tied embeddings the head's gradient waits in autograd's input buffer
    after the head (once) and meets the embedding's own at the end (`tied_gradients_at_meeting`, with the
    resident `.grad`).
    """
    acc = accumulated_gradients(cfg, arch)
    if not acc:
        return None
    tied = tied_gradient_buffer(cfg, arch)
    if instant == "backward_end":
        return acc + tied_gradients_at_meeting(cfg, arch, tensors, resident_grad=True)
    return acc + {"head_forward": 0, "head_backward": 0}.get(instant, tied)


def default_optimizer_note(
    cfg: RunConfig, arch: Arch, given: set[str] | frozenset[str], torch_version: tuple[int, int] | None = None
) -> list[str]:
    """One line where `optim` was not given and the estimate counts adamw_torch, transformers' default before
    torch 2.8 (training_args.py `default_optim`; adamw_torch_fused from 2.8, transformers PR #37358): for the TRL
    releases of that time (`estimator/settings/trl_versions.py`), or where the `torch_version` installed here is
    older. adamw_torch's foreach step holds one more gradient-sized tensor (`optimizer_temporaries`) per GPU."""
    from estimator.terms.sharding import shard
    from estimator.units import gib

    if "optim" in given or cfg.device != "cuda" or cfg.offload_optimizer or cfg.optim != "adamw_torch":
        return []
    extra = shard(cfg, "optimizer_temporaries", optimizer_temporaries(cfg, arch))
    if gib(extra) < 0.05:
        return []
    old_torch = torch_version is not None and torch_version < (2, 8)
    why = (
        f"under the torch installed here ({torch_version[0]}.{torch_version[1]}, older than 2.8)"
        if old_torch
        else f"before torch 2.8, as in TRL {cfg.trl_version}'s time"
    )
    return [
        f"optimizer: adamw_torch, transformers' default {why}; its step holds one more gradient-sized tensor "
        f"({gib(extra):.1f} GiB, estimated and counted); with torch 2.8 or newer it is adamw_torch_fused (transformers PR "
        "#37358): --optim adamw_torch_fused"
    ]
