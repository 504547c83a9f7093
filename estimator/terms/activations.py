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
from estimator.terms.quantized import arch_quant_spec
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
    if (
        cfg.attn_implementation == "eager" or cfg.release.sdpa_repeats_kv
    ):  # TRL ≤0.19's transformers 4.4x-4.52
        return arch.num_heads
    return arch.num_kv_heads


def rmsnorm_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """RMSNorm saves its fp32 input (4H), the normalized value and output (r·H each) + autocast's a-byte cast (r ≠ a); frozen (PEFT): (4 + a)·H."""
    r, a = residual_bytes(cfg), compute_bytes(cfg)
    if (
        cfg.use_peft
    ):  # frozen weight: the fp32 input, + the a-byte output LoRA's A keeps when no dropout sits between
        return (4 + (a if cfg.lora_dropout == 0 else 0)) * arch.hidden_size
    return (4 + 2 * r + (a if r != a else 0)) * arch.hidden_size


def _o_proj_saves_input(cfg: RunConfig, arch: Arch) -> bool:
    """o_proj keeps its input for backward when its weight trains: full fine-tuning, or a LoRA on o_proj."""
    if not cfg.use_peft:
        return True
    return any(lin.name.split(".")[-1] == "o_proj" for lin in lora_targets(cfg, arch))


def attention_saved_per_token(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """q, k, v after rotary + output (a bytes) + fp32 logsumexp per head; eager adds the [heads, L] softmax and scores."""
    a = compute_bytes(cfg)
    kv = kv_heads_in_attention(cfg, arch) * arch.head_dim
    per_tok = a * (2 * arch.q_dim + 2 * kv) + 4 * arch.num_heads
    if cfg.attn_implementation == "sdpa" and cfg.release.sdpa_repeats_kv and _o_proj_saves_input(cfg, arch):
        # transformers 4.48-4.52 make the query contiguous ([B, h, L, d]) before sdpa, so the output's
        # transpose(1, 2).contiguous() is a real copy that o_proj saves (transformers 4.48 integrations/sdpa_attention.py L38-62)
        per_tok += a * arch.q_dim
    if cfg.attn_implementation == "eager":
        per_tok += arch.num_heads * seq_len * (a + 4 + 1)  # scores (a), fp32 softmax, dropout mask
    return per_tok


def linear_output_bytes(cfg: RunConfig) -> int:
    """Bytes of a decoder linear's output: a under autocast; r with a 4-bit base (bnb Linear4bit casts its output back to the input dtype)."""
    return residual_bytes(cfg) if cfg.load_in_4bit else compute_bytes(cfg)


def mlp_saved_tensors(cfg: RunConfig) -> int:
    """[T, I] tensors SwiGLU saves: gate, act(gate), up, and the product unless down_proj is frozen (PEFT): 4 or 3."""
    return 3 if cfg.use_peft else 4


def mlp_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """SwiGLU: gate, act(gate), up (and the product when down_proj trains) in a bytes: 4·a·I full, 3·a·I frozen (MoE: per top-k expert)."""
    a = linear_output_bytes(cfg)
    saved = mlp_saved_tensors(cfg)
    if arch.is_moe:
        return arch.num_experts_per_tok * saved * a * arch.moe_intermediate_size + 4 * arch.num_experts
    return saved * a * arch.intermediate_size


def lora_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Per wrapped linear: A's r-wide output (a bytes), + dropout's output (a·in) and mask (1·in on CUDA, a·in on CPU) when lora_dropout > 0."""
    if not cfg.use_peft:
        return 0
    a = compute_bytes(cfg)
    per = 0
    for lin in lora_targets(cfg, arch):
        if cfg.lora_dropout > 0:  # CUDA's native_dropout keeps a bool mask; CPU keeps an a-byte noise tensor
            per += (a + (1 if cfg.device == "cuda" else a)) * lin.in_features
        per += a * cfg.lora_r
    return per


def layer_saved_per_token(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """Everything one decoder layer keeps for backward, per token: 2 RMSNorms + attention + MLP + LoRA."""
    return (
        2 * rmsnorm_saved_per_token(cfg, arch)
        + attention_saved_per_token(cfg, arch, seq_len)
        + mlp_saved_per_token(cfg, arch)
        + lora_saved_per_token(cfg, arch)
    )


def autocast_weight_cache(
    cfg: RunConfig, arch: Arch, include_lm_head: bool, saved_for_backward: bool = False
) -> int:
    """fp32 weights under bf16 autocast: each trainable nn.Linear weight's bf16 cast is cached until the forward's autocast exits (torch cached_cast), Σ numel × 2; the lm_head cast (the logits step) as a transient."""
    if residual_bytes(cfg) != 4 or compute_bytes(cfg) == 4:
        return 0
    numel = 0
    # only leaves that require grad are cached; frozen weights' casts live on only where autograd saves them (no GC)
    if (not cfg.use_peft or saved_for_backward) and not cfg.load_in_4bit:
        numel = arch.num_layers * sum(
            lin.count * lin.in_features * lin.out_features for lin in arch.layer_linears if lin.is_nn_linear
        )
    if include_lm_head:
        numel += arch.vocab_size * arch.hidden_size
    return numel * compute_bytes(cfg)


def layer_backward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Inside the MLP's backward six [T, I] tensors are live: those not saved are gradients in flight, (6 − saved)·a·I (2 full, 3 frozen).

    With a 4-bit base whose outputs are r-byte, one more a-byte [T, I] copy (down_proj's input cast by autocast) is
    added because traces show it, not because a code path was read for it: observed, not derived.
    """
    inter = arch.num_experts_per_tok * arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size
    out = (6 - mlp_saved_tensors(cfg)) * linear_output_bytes(cfg) * inter
    if cfg.load_in_4bit and linear_output_bytes(cfg) != compute_bytes(cfg):
        # observed in traces (not derived from a code path): autocast's a-byte copy of down_proj's r-byte input
        out += (compute_bytes(cfg) - linear_output_bytes(cfg)) * inter
    return out


def dequantized_weight_transient(cfg: RunConfig, arch: Arch) -> int:
    """GPTQ/AWQ base: one fp16 dequantized copy of the largest packed weight (gptqmodel TorchQuantLinear
    `dequantize_weight`); 4-bit base: backward dequantizes the largest layer weight in the gradient dtype (r) plus autocast's a-byte cast (bnb MatMul4Bit.backward)."""
    if arch_quant_spec(arch) is not None:  # GPTQ/AWQ torch kernels dequantize the packed weight to fp16
        return 2 * max(lin.in_features * lin.out_features for lin in arch.layer_linears if lin.is_nn_linear)
    if not cfg.load_in_4bit:
        return 0
    largest = max(lin.in_features * lin.out_features for lin in arch.layer_linears if lin.is_nn_linear)
    r, a = residual_bytes(cfg), compute_bytes(cfg)
    return largest * (r + (a if a != r else 0))


def hidden_states(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """One residual-stream tensor [tokens, H] in the residual dtype: tokens·H·r."""
    return tokens * arch.hidden_size * residual_bytes(cfg)


def residual_gradients(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """Backward carries the residual's gradient and one partial sum of it: 2·tokens·H·r."""
    return 2 * hidden_states(cfg, arch, tokens)


def checkpoint_inputs(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """With gradient checkpointing: each layer keeps only its input, layers × tokens × H × r."""
    return arch.num_layers * hidden_states(cfg, arch, tokens)


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
