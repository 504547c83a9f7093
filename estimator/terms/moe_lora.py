"""LoRA on a mixture-of-experts model's fused expert weights (peft 0.21 `lora.ParamWrapper`).

Since transformers 5 the experts of a MoE layer are two 3-D parameters, `gate_up_proj` [E, 2I, H] and
`down_proj` [E, H, I], and the router is a custom module, none of them an `nn.Linear`. peft 0.21
`_convert_peft_config_moe` (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/utils/transformers_weight_conversion.py#L402-L482)
maps the transformers-4 names a LoRA config targets onto them: `all-linear` (or naming `gate_proj` + `up_proj`,
`down_proj`, `gate`) adds `gate_up_proj` with rank 2r (two fused projections, `rank_pattern` r × 2), `down_proj`
with rank r, and the router weight with rank r, as `target_parameters`. Each is wrapped in `lora.ParamWrapper`,
whose A is [rank·E, in] and B [out, rank·E].

On every forward `ParamWrapper._activate_lora` (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L2572-L2601)
registers a parametrization that returns `baddbmm(W, lhs, rhs)` (`_LoraFactorsProxy`, autocast off, in W's
dtype), cached for the forward: a merged copy of the whole expert stack per layer, beside the frozen W. The
factors `lhs`, `rhs` are `.to(W.dtype)` copies of A and B. With grad, `baddbmm` saves both factors and the
grouped matmul saves the merged weight as its weight operand, so each layer keeps them until its backward; the
backward of the grouped matmul then produces the merged weight's full-size gradient before `baddbmm`'s backward
reduces it to the factors' gradients.

The transformers-4 names peft maps, per family: `Family.moe_expert_names` (estimator/model/families.py).
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.units import nbytes


def wrapped_expert_params(cfg: RunConfig, arch: Arch) -> frozenset[str]:
    """Which of "gate_up", "down", "router" peft wraps in a ParamWrapper for this config (empty off MoE / PEFT)."""
    names = arch.family.moe_expert_names
    if not (cfg.use_peft and arch.is_moe and names):
        return frozenset()
    targets = cfg.lora_target_modules
    if targets is None:  # PEFT's per-model defaults are attention projections
        return frozenset()
    if tuple(targets) == ("all-linear",):
        return frozenset(names)
    wanted = set(targets)
    return frozenset(k for k, old in names.items() if set(old) <= wanted)


def _factor_shapes(cfg: RunConfig, arch: Arch) -> dict[str, tuple[int, int]]:
    """numel of A and B of each stack ParamWrapper can wrap (A [rank·E, in], B [out, rank·E]): gate_up 2r·E·H and
    2I·2r·E (rank 2r), down r·E·I and H·r·E, router r·H and E·r."""
    h, i, e, r = arch.hidden_size, arch.moe_intermediate_size, arch.num_experts, cfg.lora_r
    return {
        "gate_up": (2 * r * e * h, 2 * i * 2 * r * e),
        "down": (r * e * i, h * r * e),
        "router": (r * h, e * r),
    }


def _factor_numel(cfg: RunConfig, arch: Arch, which: str) -> int:
    """A + B of one wrapped stack: gate_up 2r·E·(H + 2I) (rank 2r), down r·E·(I + H), router r·(H + E)."""
    return sum(_factor_shapes(cfg, arch)[which])


def factor_tensor_numels(cfg: RunConfig, arch: Arch) -> list[int]:
    """numel of each trainable tensor one layer's wrapped stacks add, A then B per stack (`_factor_shapes`)."""
    shapes = _factor_shapes(cfg, arch)
    wrapped = wrapped_expert_params(cfg, arch)
    return [n for k in ("gate_up", "down", "router") if k in wrapped for n in shapes[k]]


def expert_lora_params(cfg: RunConfig, arch: Arch) -> int:
    """Per model: layers × Σ over the wrapped stacks of their A + B (`_factor_numel`)."""
    return arch.num_layers * sum(_factor_numel(cfg, arch, k) for k in wrapped_expert_params(cfg, arch))


def _stack_numel(arch: Arch, which: str) -> int:
    h, i, e = arch.hidden_size, arch.moe_intermediate_size, arch.num_experts
    return {"gate_up": e * 2 * i * h, "down": e * h * i, "router": e * h}[which]


def merged_weights(cfg: RunConfig, arch: Arch) -> int:
    """One layer's merged copies W + ΔW of the wrapped stacks, in the base weights' dtype: Σ numel × w."""
    w = nbytes(cfg.dtype)
    return w * sum(_stack_numel(arch, k) for k in wrapped_expert_params(cfg, arch))


def factor_copies(cfg: RunConfig, arch: Arch) -> int:
    """One layer's `.to(W.dtype)` copies of A and B for the stacks folded by `baddbmm` (saved with grad)."""
    wrapped = wrapped_expert_params(cfg, arch) - {"router"}
    return nbytes(cfg.dtype) * sum(_factor_numel(cfg, arch, k) for k in wrapped)


def saved_per_layer(cfg: RunConfig, arch: Arch) -> int:
    """What one layer keeps for backward: its merged stacks and the factor copies."""
    if not wrapped_expert_params(cfg, arch):
        return 0
    return merged_weights(cfg, arch) + factor_copies(cfg, arch)


def backward_transient(cfg: RunConfig, arch: Arch) -> int:
    """A merged stack's gradient, alive between the grouped matmul's backward and `baddbmm`'s, net of what the
    layer has released by then.

    The experts run gate_up, then down (transformers 5.23 `grouped_mm_experts_forward`), so backward meets the
    down stack first, with every merged stack still held: its gradient (E·H·I). The gate_up stack's gradient
    (E·2I·H) comes after `baddbmm`'s backward has released the merged down stack it saved: 2I·H − H·I per expert
    beyond what is counted as saved. The larger of the two, in the base weights' dtype.
    """
    wrapped = wrapped_expert_params(cfg, arch) - {"router"}
    if not wrapped:
        return 0
    down = _stack_numel(arch, "down") if "down" in wrapped else 0
    gate_up = _stack_numel(arch, "gate_up") - down if "gate_up" in wrapped else 0
    return nbytes(cfg.dtype) * max(down, gate_up)
