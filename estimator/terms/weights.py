"""Resident weights: the policy, the reference copy, LoRA adapters, and a 4-bit (NF4) quantized base.

Line references (`GT:N-M`, `CK:N`, ...) are upstream files at pinned versions: estimator/terms/SOURCES.md.
"""

from __future__ import annotations

from estimator.model.architecture import Arch, Linear
from estimator.settings.config import RunConfig
from estimator.terms.moe_lora import expert_lora_params
from estimator.terms.quantized import arch_quant_spec, packed_base_weights
from estimator.units import nbytes

NF4_BLOCK = 64  # bitsandbytes blocksize for 4-bit weights (bnb.functional.quantize_4bit default)
NESTED_BLOCK = 256  # double quantization: absmax of absmax per 256 blocks


def dense_weights(arch: Arch, dtype: str) -> int:
    """P × bytes(dtype): every parameter in the load dtype (TRL's default load dtype is float32, TU:1332)."""
    return arch.total_params * nbytes(dtype)


def quantized_linears(arch: Arch) -> list[Linear]:
    """The nn.Linear layers bitsandbytes replaces with Linear4bit: every decoder linear (lm_head stays dense)."""
    return [lin for lin in arch.layer_linears if lin.is_nn_linear]


def nf4_linear_bytes(lin: Linear, nested: bool) -> int:
    """numel/2 packed uint8 + absmax: fp32 per 64 (or uint8 per 64 + fp32 per 64·256 nested) (QLoRA paper §2, bnb)."""
    numel = lin.count * lin.in_features * lin.out_features
    blocks = -(-numel // NF4_BLOCK)
    absmax = blocks * 1 + -(-blocks // NESTED_BLOCK) * 4 if nested else blocks * 4
    return numel // 2 + absmax


def qlora_base_weights(arch: Arch, dtype: str, nested: bool = False) -> int:
    """Σ NF4 linears + (P − Σ quantized weight numel) × bytes(dtype): 4-bit base, the rest (embeddings, norms, biases, lm_head) in the load dtype."""
    q = quantized_linears(arch)
    per_layer_q = sum(nf4_linear_bytes(lin, nested) for lin in q)
    per_layer_q_numel = sum(lin.count * lin.in_features * lin.out_features for lin in q)
    rest = arch.total_params - arch.num_layers * per_layer_q_numel
    return arch.num_layers * per_layer_q + rest * nbytes(dtype)


def head_fp32_extra_bytes(cfg: RunConfig, arch: Arch) -> int:
    """cast_lm_head_to_fp32: TRL 1.16 `GRPOTrainer.__init__` (grpo_trainer.py:1012-1047) runs
    `target_model.lm_head.float()`, which casts the head's weight Parameter itself to fp32, on the policy and the
    reference model; with tied embeddings that Parameter is the embedding's. Extra bytes: V·H·(4 − bytes(dtype))."""
    w = nbytes(cfg.dtype)
    if not cfg.cast_lm_head_to_fp32 or w >= 4:
        return 0
    return arch.vocab_size * arch.hidden_size * (4 - w)


def policy_weights(cfg: RunConfig, arch: Arch) -> int:
    """Policy weights: dense P × bytes(dtype), the NF4 base with QLoRA, or a GPTQ/AWQ checkpoint's packed base;
    + the fp32 head with cast_lm_head_to_fp32."""
    spec = arch_quant_spec(arch)
    if (
        spec is not None
    ):  # the checkpoint is quantized: its packed linears load as they are (terms/quantized.py)
        return packed_base_weights(arch, spec, nbytes(cfg.dtype)) + head_fp32_extra_bytes(cfg, arch)
    if cfg.load_in_4bit:
        return qlora_base_weights(arch, cfg.dtype, cfg.use_bnb_nested_quant) + head_fp32_extra_bytes(
            cfg, arch
        )
    return dense_weights(arch, cfg.dtype) + head_fp32_extra_bytes(cfg, arch)


def reference_weights(cfg: RunConfig, arch: Arch) -> int:
    """A second full copy in the policy dtype when beta != 0 without PEFT (GT:982-1003); 0 otherwise."""
    return policy_weights(cfg, arch) if cfg.has_reference_model else 0


def lora_targets(cfg: RunConfig, arch: Arch) -> list[Linear]:
    """Linears LoRA wraps: `all-linear` = every decoder nn.Linear; None = PEFT's per-model default (q_proj, v_proj)."""
    linears = [lin for lin in arch.layer_linears if lin.is_nn_linear]
    targets = cfg.lora_target_modules
    if targets is None:
        targets = arch.family.peft_default_targets or ("q_proj", "v_proj")  # none: refused by compat
    if tuple(targets) == ("all-linear",):
        return linears
    wanted = set(targets)
    return [lin for lin in linears if lin.name.split(".")[-1] in wanted]


def lora_params(cfg: RunConfig, arch: Arch) -> int:
    """layers × Σ_targets r × (in + out): A is [r, in], B is [out, r] (Hu et al. 2021); plus, on a MoE model, the
    fused experts and router peft wraps in `lora.ParamWrapper` (estimator/terms/moe_lora.py)."""
    if not cfg.use_peft:
        return 0
    return arch.num_layers * sum(
        lin.count * cfg.lora_r * (lin.in_features + lin.out_features) for lin in lora_targets(cfg, arch)
    ) + expert_lora_params(cfg, arch)


def adapter_dtype(cfg: RunConfig) -> str:
    """fp32 adapters (PEFT autocast_adapter_dtype=True), bf16 with a quantized base (GT:538-541)."""
    return "bfloat16" if cfg.load_in_4bit else "float32"


def lora_adapters(cfg: RunConfig, arch: Arch) -> int:
    """LoRA params × bytes(adapter dtype)."""
    return lora_params(cfg, arch) * nbytes(adapter_dtype(cfg))


def trainable_params(cfg: RunConfig, arch: Arch) -> int:
    """P for full fine-tuning, the LoRA parameters with PEFT."""
    return lora_params(cfg, arch) if cfg.use_peft else arch.total_params


def trainable_dtype(cfg: RunConfig) -> str:
    """dtype of the trainable parameters (and so of their gradients and fused-AdamW state)."""
    return adapter_dtype(cfg) if cfg.use_peft else cfg.dtype
