"""Activations of the policy forward/backward (training) and of no-grad forwards (scoring, prefill).

Per-token byte counts follow the tensors autograd saves in transformers 5.x decoder layers (Qwen2/Llama
layout) under bf16 autocast, in the style of Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", Table 2), re-derived for RMSNorm, rotary, SwiGLU, GQA and fused attention kernels.
`r` is the residual-stream dtype size (the load dtype: fp32 weights keep an fp32 residual even under autocast),
`a` the autocast compute dtype size.
"""

from __future__ import annotations

from estimator.architecture import Arch
from estimator.config import RunConfig
from estimator.terms.weights import lora_targets
from estimator.units import nbytes


def residual_bytes(cfg: RunConfig) -> int:
    """r = bytes(load dtype): embeddings and residual adds stay in the parameter dtype under autocast."""
    return nbytes(cfg.dtype)


def compute_bytes(cfg: RunConfig) -> int:
    """a = 2 under bf16/fp16 autocast, else bytes(load dtype)."""
    return 2 if cfg.bf16 or cfg.dtype != "float32" else nbytes(cfg.dtype)


def kv_heads_in_attention(cfg: RunConfig, arch: Arch) -> int:
    """KV heads the attention kernel sees: native GQA for flash-attn/sdpa without mask; eager repeats K/V to all heads."""
    return arch.num_heads if cfg.attn_implementation == "eager" else arch.num_kv_heads


def rmsnorm_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """RMSNorm saves its fp32 input (a copy when r = 2), x·rsqrt in fp32 and the r-byte normalized value: (4·[r=2] + 4 + r)·H."""
    r = residual_bytes(cfg)
    return (4 * (r == 2) + 4 + r) * arch.hidden_size


def attention_saved_per_token(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """q, k, v after rotary + output (a bytes) + fp32 logsumexp per head; eager adds the [heads, L] softmax and scores."""
    a = compute_bytes(cfg)
    kv = kv_heads_in_attention(cfg, arch) * arch.head_dim
    per_tok = a * (2 * arch.q_dim + 2 * kv) + 4 * arch.num_heads
    if cfg.attn_implementation == "eager":
        per_tok += arch.num_heads * seq_len * (a + 4 + 1)  # scores (a), fp32 softmax, dropout mask
    return per_tok


def mlp_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """SwiGLU: gate, act(gate), up and their product saved in a bytes: 4·a·I (MoE: top-k experts' 4·a·I_moe + router)."""
    a = compute_bytes(cfg)
    if arch.is_moe:
        return arch.num_experts_per_tok * 4 * a * arch.moe_intermediate_size + 4 * arch.num_experts
    return 4 * a * arch.intermediate_size


def lora_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Per wrapped linear: the fp32 (adapter-dtype) input cast + the r-wide A output, both saved for backward."""
    if not cfg.use_peft:
        return 0
    ab = 2 if cfg.load_in_4bit else 4
    return sum(ab * lin.in_features + ab * cfg.lora_r for lin in lora_targets(cfg, arch))


def layer_saved_per_token(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """Everything one decoder layer keeps for backward, per token: 2 norms + attention + MLP + residual + LoRA."""
    r = residual_bytes(cfg)
    a = compute_bytes(cfg)
    linear_input_cast = (
        a * arch.hidden_size * 2 if r != a else 0
    )  # autocast's bf16 copies of the two norm outputs
    return (
        2 * rmsnorm_saved_per_token(cfg, arch)
        + linear_input_cast
        + attention_saved_per_token(cfg, arch, seq_len)
        + r * arch.hidden_size  # residual after attention (input of the 2nd norm)
        + mlp_saved_per_token(cfg, arch)
        + lora_saved_per_token(cfg, arch)
    )


def checkpoint_inputs(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """With gradient checkpointing: each layer keeps only its input, layers × tokens × H × r."""
    return arch.num_layers * tokens * arch.hidden_size * residual_bytes(cfg)


def saved_activations(cfg: RunConfig, arch: Arch, batch: int, seq_len: int) -> int:
    """Activations held at the end of the training forward: checkpoint inputs with GC, all layers' saved tensors without."""
    tokens = batch * seq_len
    if cfg.gradient_checkpointing:
        return checkpoint_inputs(cfg, arch, tokens)
    return arch.num_layers * tokens * layer_saved_per_token(cfg, arch, seq_len)


def recompute_layer(cfg: RunConfig, arch: Arch, batch: int, seq_len: int) -> int:
    """With GC, backward re-runs one layer's forward at a time: one layer's saved tensors, tokens × per-layer bytes."""
    return batch * seq_len * layer_saved_per_token(cfg, arch, seq_len) if cfg.gradient_checkpointing else 0


def nograd_forward_peak(cfg: RunConfig, arch: Arch, batch: int, seq_len: int) -> int:
    """No-grad forward transient: residual + norm + the MLP's three live [T, I] tensors (act, up, product)."""
    tokens = batch * seq_len
    r, a = residual_bytes(cfg), compute_bytes(cfg)
    inter = arch.num_experts_per_tok * arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size
    return tokens * (2 * r * arch.hidden_size + 4 * arch.hidden_size + 3 * a * inter)
