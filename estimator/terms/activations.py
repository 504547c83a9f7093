"""Activations of the policy forward/backward (training) and of no-grad forwards (scoring, prefill).

Per-token byte counts follow the tensors autograd saves in transformers 5.x decoder layers (Qwen2/Llama
layout) under bf16 autocast, in the style of Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", Table 2), re-derived for RMSNorm, rotary, SwiGLU, GQA and fused attention kernels.
`r` is the residual-stream dtype size (the load dtype: fp32 weights keep an fp32 residual even under autocast),
`a` the autocast compute dtype size.
"""

from __future__ import annotations

import math

from estimator.model.architecture import Arch, layer_kinds, layer_windows
from estimator.settings.config import RunConfig
from estimator.terms import moe_lora
from estimator.terms.quantized import arch_quant_spec
from estimator.terms.weights import NF4_BLOCK, adapter_dtype, lora_targets
from estimator.units import nbytes


def residual_bytes(cfg: RunConfig) -> int:
    """r = bytes(load dtype): embeddings and residual adds stay in the parameter dtype under autocast."""
    return nbytes(cfg.dtype)


def compute_bytes(cfg: RunConfig) -> int:
    """a = 2 under bf16/fp16 autocast, else bytes(load dtype)."""
    return 2 if cfg.bf16 or cfg.dtype != "float32" else nbytes(cfg.dtype)


def kv_heads_in_attention(
    cfg: RunConfig, arch: Arch, seq_len: int | None = None, masked: bool | None = None
) -> int:
    """KV heads the attention kernel sees: native GQA for flash-attn/sdpa without mask; eager, and sdpa given a mask
    (transformers 5.23 integrations/sdpa_attention.py `use_gqa_in_sdpa`: only when `attention_mask is None`), repeat
    K/V to all heads. `masked` says whether this layer's sdpa call gets a mask (default: the widest layer's case).

    With a single KV head (MQA, gemma-3-1b) sdpa's `repeat_kv` is a view: `x[:, :, None].expand(B, 1, n_rep, L, d)
    .reshape(B, n_rep, L, d)` merges the size-1 head dim with the stride-0 one, so nothing is copied; eager's
    `matmul` folds the batch dims for `bmm` and copies either way.
    """
    if (
        cfg.attn_implementation == "eager" or cfg.release.sdpa_repeats_kv
    ):  # TRL <=0.19's transformers 4.4x-4.52
        return arch.num_heads
    if masked is None:
        masked = seq_len is not None and sdpa_needs_mask(cfg, arch, seq_len)
    if masked and arch.num_kv_heads > 1:
        return arch.num_heads
    return arch.num_kv_heads


def sdpa_needs_mask(cfg: RunConfig, arch: Arch, seq_len: int) -> bool:
    """sdpa on an unpadded batch gets `is_causal` and no mask, unless a sliding-window layer is shorter than the
    sequence (masking_utils `sliding_window_causal_mask` builds a [B, 1, L, L] bool mask then)."""
    if cfg.attn_implementation != "sdpa":
        return False
    return masked_layers(cfg, arch, seq_len) > 0


def masked_layers(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """How many decoder layers call sdpa with a mask: those whose sliding window is shorter than the sequence
    (full-attention layers of an unpadded batch keep `is_causal` and get none, transformers 5.23 masking_utils
    `sdpa_mask` returns None when the mask is all-causal)."""
    if cfg.attn_implementation != "sdpa":
        return 0
    return sum(1 for w in layer_windows(arch) if w is not None and w < seq_len)


def rmsnorm_saved_per_token(cfg: RunConfig, arch: Arch, consumers: int = 1) -> int:
    """One RMSNorm over H whose output feeds `consumers` linears, per token, transformers 5.23.

    `Qwen2RMSNorm.forward` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/qwen2/modeling_qwen2.py#L201-L206): `x.to(float32)` is saved by
    `pow` and the `rsqrt` multiply (4H, and `rsqrt`'s [T, 1] fp32 output, 4); with a trainable weight,
    `weight * hidden.to(input_dtype)` saves the normalized value (r·H) and each consuming linear its input: the
    r-byte output itself when r = a, else autocast's own a-byte cast per linear call (`cached_cast` caches only
    leaf weights). Gemma's `output * (1.0 + weight.float())` (gemma2 `Gemma2RMSNorm`) and OLMo-2's
    `(self.weight * hidden_states).to(input_dtype)` (`Olmo2RMSNorm.forward`,
    https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L59-L64)
    save the fp32 normalized value instead (4H). Frozen (PEFT): 4H + 4; a LoRA that keeps the output counts it
    (`lora_saved_per_token`).
    """
    r, a, h = residual_bytes(cfg), compute_bytes(cfg), arch.hidden_size
    if cfg.use_peft:
        return 4 * h + 4
    normalized = 4 if arch.family.fp32_norm_product else r
    out = r if r == a else consumers * a
    return (4 + normalized + out) * h + 4


def layer_norms_saved_per_token(
    cfg: RunConfig, arch: Arch, norms: tuple[str, ...] = ("attn_norm", "mlp_norm")
) -> int:
    """The two norms of a decoder layer whose outputs feed linears: input_layernorm (q/k/v, or Phi-3's qkv) and the
    MLP's (gate/up, Phi-3's gate_up, a MoE router), each with its number of consuming linears (`norms`: only these).

    OLMo-2 (`norm_placement` "post") has neither: q/k/v_proj and gate/up_proj read the residual stream itself
    (`Olmo2DecoderLayer.forward`, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L297-L314),
    which each trainable linear keeps for its weight's gradient (`residual_input_saved_per_token`); its two norms
    sit on the branch outputs (`gemma_extra_norms_saved_per_token`)."""
    consumers = {"attn_norm": 0, "mlp_norm": 0}
    for lin in arch.layer_linears:
        source = lora_input_source(lin.name)
        if source in consumers and lin.is_nn_linear:
            consumers[source] += 1
    if arch.family.norm_placement == "post":
        return sum(
            residual_input_saved_per_token(cfg, arch, max(1, n)) for k, n in consumers.items() if k in norms
        )
    return sum(rmsnorm_saved_per_token(cfg, arch, max(1, n)) for k, n in consumers.items() if k in norms)


def residual_input_saved_per_token(cfg: RunConfig, arch: Arch, consumers: int = 1) -> int:
    """The residual stream read by `consumers` linears with no norm in between (OLMo-2's q/k/v and gate/up), per
    token: trainable weights keep their input, the r-byte tensor itself when r = a, else autocast's a-byte cast
    per linear call (as for a norm's output, `rmsnorm_saved_per_token`); frozen (PEFT) weights keep nothing, and a
    LoRA that keeps the input counts it (`lora_saved_per_token`)."""
    if cfg.use_peft:
        return 0
    r, a = residual_bytes(cfg), compute_bytes(cfg)
    return (r if r == a else consumers * a) * arch.hidden_size


def _o_proj_saves_input(cfg: RunConfig, arch: Arch) -> bool:
    """o_proj keeps its input for backward when its weight trains: full fine-tuning, or a LoRA on o_proj."""
    if not cfg.use_peft:
        return True
    return any(lin.name.split(".")[-1] == "o_proj" for lin in lora_targets(cfg, arch))


def qk_norm_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """q_norm / k_norm over head_dim (Qwen3, Gemma3): the fp32 input copy, 4·(q_dim + kv_dim) bytes per token.

    transformers 5.23 `Qwen3RMSNorm.forward` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/qwen3/modeling_qwen3.py#L58-L63), applied to q_proj / k_proj
    outputs in `Qwen3Attention.forward` (:244-245): `hidden_states.to(float32)` is saved by `pow` and by the
    multiply with `rsqrt` (whose [T, heads, 1] fp32 output is saved too); with a trainable weight (full FT) `weight * hidden.to(input_dtype)` also saves the
    a-byte cast (Gemma3's `(1 + weight.float())` form saves the fp32 normalized value instead: 4 bytes). Rotary
    saves only cos/sin, so q and k themselves are counted once, by the attention kernel.

    OLMo-2 (`qk_norm_scope` "full"): one RMSNorm over all of q_dim and one over kv_dim, before the head reshape
    (`Olmo2Attention.forward`, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L227-L228),
    so each keeps a single [T, 1] rsqrt; its `(weight * hidden).to(input_dtype)` saves the fp32 normalized value
    when the weight trains (4 bytes), as Gemma3's does.
    """
    if not arch.family.qk_norm:
        return 0
    per = 4
    if not cfg.use_peft:
        per += 4 if arch.family.fp32_norm_product else linear_output_bytes(cfg)
    if arch.family.qk_norm_scope == "full":
        rsqrt = 4 * 2  # [T, 1] fp32 per norm
    else:
        rsqrt = 4 * (arch.num_heads + arch.num_kv_heads)  # [T, heads, 1] fp32 per norm
    return per * (arch.q_dim + arch.kv_dim) + rsqrt


def gemma_extra_norms_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Gemma2/3's post-attention and post-feedforward RMSNorms, whose outputs go into the residual add (unsaved):
    two of `gemma_post_norm_saved_per_token`. `Gemma2DecoderLayer` applies four norms per layer;
    `layer_norms_saved_per_token` counts the two whose output feeds a linear. OLMo-2's only two norms are these."""
    return 2 * gemma_post_norm_saved_per_token(cfg, arch)


def gemma_post_norm_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """One of Gemma2/3's post-attention / post-feedforward RMSNorms, per token.

    transformers 5.23 `Gemma3RMSNorm.forward` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma3/modeling_gemma3.py#L128-L139;
    gemma2's is the same): `x.float()` is saved by the normalization (4·H, and rsqrt's [T, 1] fp32 output);
    `output * (1.0 + self.weight.float())` saves the fp32 normalized value when the weight trains (4·H more).
    OLMo-2's post_attention_layernorm / post_feedforward_layernorm (`Olmo2RMSNorm.forward`,
    https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L59-L64:
    `x.to(float32)`, then `(self.weight * hidden_states).to(input_dtype)`) save the same. 0 for other families.
    """
    fam = arch.family
    if not (fam.fp32_norm_product and (fam.sandwich_norms or fam.norm_placement == "post")):
        return 0
    return (4 + (0 if cfg.use_peft else 4)) * arch.hidden_size + 4


def rmsnorm_backward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Backward of one RMSNorm over H, beyond its saved tensors and the incoming gradient, per token.

    Every catalog family normalizes in fp32 (transformers 5.23 `LlamaRMSNorm.forward`
    https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L50-L55;
    `Gemma3RMSNorm`, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma3/modeling_gemma3.py#L128-L139):
    the backward of the weight multiply, of `x * rsqrt(mean(x²) + eps)` and of `x.pow(2)` are fp32 [T, H] products,
    and at the pow backward five of them are live at once (the upstream gradient in fp32, its products with x and
    with rsqrt, the mean's gradient spread over H, and pow's `2·x·grad`): 5·4·H, the same with a frozen weight
    (PEFT) and for every load dtype. Counted from the op list of the modules' own backward
    (tests/ground_truth/test_rmsnorm_backward.py), each op an autograd formula that allocates the same on CUDA.
    """
    return 5 * 4 * arch.hidden_size


def final_norm_backward_per_token(cfg: RunConfig, arch: Arch) -> int:
    """The final norm's backward at its largest instant (the pow's), per token: what the norm still holds and its
    fp32 products (`rmsnorm_backward_transient_per_token`), 4·H + 4 + 5·4·H.

    Autograd has already run the weight multiply's backward (`weight * hidden.to(input_dtype)`; Gemma's
    `output * (1.0 + weight.float())`), which releases the incoming gradient and, with a trainable weight, the
    normalized value it saved; the head's backward has released the norm's output. Left: `x.to(float32)` (4·H)
    and `rsqrt`'s [T, 1] output (4). Measured on tiny Llama / Phi-3 models, full fine-tune and LoRA, fp16 / bf16
    / fp32 (tests/ground_truth/test_final_norm_backward.py).
    """
    return 4 * arch.hidden_size + 4 + rmsnorm_backward_transient_per_token(cfg, arch)


def gemma_post_norm_backward_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Gemma2/3's post-feedforward norm at its pow's backward, net of what the layer saved for it, per token:
    `final_norm_backward_per_token` (the norm's fp32 input copy, rsqrt and its five fp32 products) less
    `gemma_post_norm_saved_per_token`, 5·4·H − 4·H with a trainable weight, 5·4·H frozen (PEFT); 0 for others.

    `Gemma3DecoderLayer.forward` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma3/modeling_gemma3.py#L410-L416)
    ends with `post_feedforward_layernorm`, so a layer's backward starts with it. As for the final norm, by the
    pow the weight multiply's backward (`output * (1.0 + weight.float())`) has run and released the fp32
    normalized value it saved when the weight trains. Measured op by op on tiny gemma2 / gemma3 models, fp16 /
    bf16 / fp32, full fine-tune and LoRA (tests/ground_truth/test_final_norm_backward.py).
    """
    if not gemma_post_norm_saved_per_token(cfg, arch):
        return 0
    return final_norm_backward_per_token(cfg, arch) - gemma_post_norm_saved_per_token(cfg, arch)


def attention_saved_per_token(cfg: RunConfig, arch: Arch, seq_len: int, masked: bool | None = None) -> int:
    """q, k, v after rotary + output (a bytes) + fp32 logsumexp per head (fused kernels); eager saves the [heads, L]
    softmax and scores instead of a logsumexp, a masked sdpa layer its additive mask. `masked`: this layer gets an sdpa mask (default: the widest
    layer's case, `sdpa_needs_mask`)."""
    a = compute_bytes(cfg)
    if masked is None:
        masked = sdpa_needs_mask(cfg, arch, seq_len)
    kv = kv_heads_in_attention(cfg, arch, seq_len, masked=masked) * arch.head_dim
    eager = cfg.attn_implementation == "eager"
    if eager:  # matmuls save q, k, v; the output is kept only by an o_proj that saves its input
        per_tok = a * (arch.q_dim + 2 * kv) + (0 if cfg.use_peft else a * arch.q_dim)
    else:  # the fused kernel saves q, k, v, its output and a [heads] fp32 logsumexp
        per_tok = a * (2 * arch.q_dim + 2 * kv) + 4 * arch.num_heads
        if fused_qkv(arch) and linear_output_dtype(cfg) == compute_dtype(cfg):
            # Phi-3 slices v out of qkv_proj's output (`qkv[..., query_pos + kv_dim:]`, a view): the saved v keeps
            # the whole [T, q + 2·kv] storage alive (modeling_phi3.py Phi3Attention.forward); unless autocast
            # casts v for the kernel (a 4-bit base's output in another load dtype), when the cast is what is saved
            per_tok += a * (arch.q_dim + arch.kv_dim)
        if not attention_output_is_kernel_output(cfg, arch) and not cfg.use_peft:
            per_tok += a * arch.q_dim  # o_proj saves its own contiguous copy
    if cfg.attn_implementation == "sdpa" and cfg.release.sdpa_repeats_kv and _o_proj_saves_input(cfg, arch):
        # transformers 4.48-4.52 make the query contiguous ([B, h, L, d]) before sdpa, so the output's
        # transpose(1, 2).contiguous() is a real copy that o_proj saves (transformers 4.48 integrations/sdpa_attention.py L38-62)
        per_tok += a * arch.q_dim
    if eager:
        per_tok += arch.num_heads * seq_len * (eager_scores_saved_bytes(cfg) + softcap_saved_bytes(cfg, arch))
    elif masked:
        # torch's scaled_dot_product_attention turns the bool mask into an additive one in the query dtype
        # (aten/src/ATen/native/transformers/attention.cpp `convert_boolean_attn_mask`), per layer, and the
        # kernel saves it for backward: [B, 1, L, L] × a, i.e. L·a per token
        per_tok += seq_len * a
    return per_tok


def eager_scores_saved_bytes(cfg: RunConfig) -> int:
    """Bytes per [heads, L, L] score element eager attention saves: the fp32 softmax output + its a-byte cast.

    transformers 5.23 `eager_attention_forward` (e.g. models/qwen2/modeling_qwen2.py): `softmax(dtype=float32)`
    saves its fp32 output; `.to(query.dtype)` gives the a-byte weights `matmul(attn_weights, value)` saves. The
    pre-softmax scores are not saved (scalar multiply, mask add), and `dropout(p=attention_dropout=0.0)` returns
    its input (no mask) for every catalog model.
    """
    return 4 + compute_bytes(cfg)


def attn_logit_softcapping(arch: Arch) -> float | None:
    """The config's `attn_logit_softcapping` (Gemma 2: 50.0), or None."""
    return ((arch.extra or {}).get("config") or {}).get("attn_logit_softcapping")


def softcap_saved_bytes(cfg: RunConfig, arch: Arch) -> int:
    """Bytes per score element eager attention's logit soft-capping saves: transformers 5.23 Gemma 2
    `eager_attention_forward` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma2/modeling_gemma2.py#L195-L198)
    computes `tanh(scores / softcap) * softcap`, and `tanh` saves its a-byte output for backward; 0 without it."""
    return compute_bytes(cfg) if attn_logit_softcapping(arch) else 0


def softmax_half_to_float(cfg: RunConfig) -> bool:
    """Eager attention's scores are fp16 (an fp16 model without autocast): on CUDA ATen's `softmax(x, dtype=float32)`
    runs `_softmax(x, half_to_float=True)` (aten/src/ATen/native/SoftMax.cpp), with no fp32 copy of the input."""
    return cfg.dtype == "float16" and not cfg.bf16


def eager_backward_transient_per_token(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """Eager attention's backward at `_softmax_backward_data`, beyond the recomputed layer's saved tensors.

    Live then: the fp32 incoming gradient (the backward of `.to(query.dtype)`) and the result, fp32 (heads·L·8),
    or fp16 with CUDA's `half_to_float` softmax, whose backward writes the input dtype (heads·L·(4 + a)); on CUDA
    also `softmax_backward_cuda_out`'s `tmp = grad * output` (`softmax_backward_cuda_tmp_bytes`, fp32), made
    after the result and freed when the kernel returns; already released by autograd: the a-byte weights cast
    (the value matmul's backward ran) and what the ops after attention saved, whose backward ran first: o_proj's
    LoRA, the post-attention norms, the MLP and its LoRA (`released_before_attention_backward_per_token`). What
    the ops before attention saved (input_layernorm, q/k/v's LoRA, q_norm / k_norm) is still held. The excess is
    heads·L·(8 − a + tmp) (4 + tmp with `half_to_float`) − released, or 0.
    """
    if cfg.attn_implementation != "eager":
        return 0
    released = released_before_attention_backward_per_token(cfg, arch, seq_len)
    excess = 4 if softmax_half_to_float(cfg) else 8 - compute_bytes(cfg)
    excess += softmax_backward_cuda_tmp_bytes(cfg)
    return max(0, arch.num_heads * seq_len * excess - released)


def softmax_backward_cuda_tmp_bytes(cfg: RunConfig) -> int:
    """Bytes per score element of the temporary CUDA's softmax backward makes: `softmax_backward_cuda_out`
    (aten/src/ATen/native/cuda/SoftMax.cu) computes `Tensor tmp = grad * output;` before its kernel, after the
    structured op allocated the result, and frees it on return. Both operands are the softmax's dtype, fp32 for
    eager attention's `softmax(dtype=float32)`, so 4. The CPU kernel (`softmax_backward_cpu_out`) reads `grad`
    and `output` directly and a FakeTensor trace runs the meta kernel, the result only: 0 off CUDA (the tracer
    makes the temporary for CUDA runs, sweeps/trace/patches.py `CudaSoftmaxBackward`)."""
    return 4 if cfg.device == "cuda" else 0


def released_before_attention_backward_per_token(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """Per token, what a decoder layer's backward has released when it reaches attention: everything the layer
    saved except attention's own tensors and those of the ops before it (input_layernorm, q/k/v and their LoRA,
    q_norm / k_norm), whose backward runs after attention's."""
    before = (
        attention_saved_per_token(cfg, arch, seq_len)
        + layer_norms_saved_per_token(cfg, arch, norms=("attn_norm",))
        + qk_norm_saved_per_token(cfg, arch)
        + lora_saved_per_token(cfg, arch, sources=("attn_norm",))
    )
    return layer_saved_per_token(cfg, arch, seq_len) - before


def attention_mask_bytes(cfg: RunConfig, arch: Arch, batch: int, seq_len: int) -> int:
    """Eager attention's 4-D additive masks [B, 1, L, L] in the model dtype (transformers masking_utils
    `eager_mask`), held through the forward and (as a checkpoint input) the backward; sdpa on unpadded batches
    uses `is_causal` and builds none.

    A model with both full and sliding layers builds one eager mask per kind, both held by the model's forward
    (transformers 5.23 gemma2 `causal_mask_mapping = {"full_attention": create_causal_mask(...),
    "sliding_attention": create_sliding_window_causal_mask(...)}`,
    https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma2/modeling_gemma2.py#L430-L433;
    gemma3 and Qwen2's `has_sliding_layers` the same), distinct tensors even when the window covers the sequence.
    """
    if sdpa_needs_mask(cfg, arch, seq_len):
        return batch * seq_len * seq_len  # bool
    if cfg.attn_implementation != "eager":
        return 0
    return layer_kinds(arch) * batch * seq_len * seq_len * residual_bytes(cfg)


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
        return arch.num_experts_per_tok * moe_expert_saved_per_copy(cfg, arch) + 4 * arch.num_experts
    return saved * a * arch.intermediate_size


def moe_expert_saved_per_copy(cfg: RunConfig, arch: Arch) -> int:
    """What one routed token copy keeps for backward in transformers 5.23 `grouped_mm_experts_forward`
    (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/integrations/moe.py#L424-L537).

    Autograd saves an operand only for a gradient it will compute (`_grouped_mm` keeps its input only when the
    weight requires grad): gate_up's output [2I] (act and the up half), act(gate) [I], and the down projection's
    output [H], which `proj_out * sample_weights_g` keeps because the routing weights require grad; plus the
    gathered input [H] when gate_up trains and the act·up product [I] when down_proj trains (full fine-tuning,
    or LoRA wrapping the stacks, terms/moe_lora.py). All a bytes.
    """
    a, h, i = compute_bytes(cfg), arch.hidden_size, arch.moe_intermediate_size
    wrapped = moe_lora.wrapped_expert_params(cfg, arch)
    gate_up_trains = not cfg.use_peft or "gate_up" in wrapped
    down_trains = not cfg.use_peft or "down" in wrapped
    return a * (3 * i + h + (h if gate_up_trains else 0) + (i if down_trains else 0))


def compute_dtype(cfg: RunConfig) -> str:
    """The dtype matmuls run in: bf16 under bf16 autocast, else the load dtype."""
    return "bfloat16" if cfg.bf16 else cfg.dtype


def linear_output_dtype(cfg: RunConfig) -> str:
    """A decoder linear's output dtype: autocast's; the input's (the load dtype) from a bnb 4-bit base."""
    return cfg.dtype if cfg.load_in_4bit else compute_dtype(cfg)


def lora_input_source(lin_name: str) -> str:
    """Which tensor feeds a wrapped linear: the attention or MLP norm's output, attention's output, or the MLP's
    act·up product (transformers 5.23 decoder layers: q/k/v (Phi-3 qkv) after input_layernorm, o_proj after
    attention, gate/up (Phi-3 gate_up) after post_attention_layernorm, down_proj after act(gate)·up)."""
    leaf = lin_name.split(".")[-1]
    if leaf in ("q_proj", "k_proj", "v_proj", "qkv_proj"):
        return "attn_norm"
    if leaf == "o_proj":
        return "attn_out"
    if leaf == "down_proj":
        return "mlp_product"
    return "mlp_norm"


def _lora_source_dtype(cfg: RunConfig, source: str) -> str:
    """dtype of a wrapped linear's input: norm outputs keep the load dtype (`weight * x.to(input_dtype)`),
    attention's output is the compute dtype, the act·up product a linear's output dtype."""
    if source in ("attn_norm", "mlp_norm"):
        return cfg.dtype
    return compute_dtype(cfg) if source == "attn_out" else linear_output_dtype(cfg)


def lora_cast_input_dtype(cfg: RunConfig, x_dtype: str) -> str:
    """dtype of a wrapped linear's input after peft's `_cast_input_dtype` (the adapter dtype; a copy when it
    differs), which the bnb 4-bit layer skips under autocast (see `lora_a_saved_input`)."""
    return x_dtype if cfg.load_in_4bit and cfg.bf16 else adapter_dtype(cfg)


def lora_a_saved_input(cfg: RunConfig, x_dtype: str) -> tuple[str, bool]:
    """The tensor `lora_A`'s matmul keeps for backward, given the wrapped linear's input dtype: (dtype, whether
    it is a new tensor rather than the input itself).

    peft 0.21 `lora.Linear.forward` (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L1074-L1115)
    runs `lora_B(lora_A(dropout(self._cast_input_dtype(x, lora_A.weight.dtype))))`: `_cast_input_dtype` copies when
    the dtypes differ; the bnb 4-bit layer (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/bnb.py#L543-L549)
    skips that cast under autocast. `native_dropout` writes a new tensor when lora_dropout > 0, and autocast casts
    the matmul's input to bf16 when it is not already (torch autocast `cached_cast`, a new tensor each call).
    """
    x = lora_cast_input_dtype(cfg, x_dtype)
    new = x != x_dtype
    if cfg.lora_dropout > 0:
        new = True
    if cfg.bf16 and x != compute_dtype(cfg):
        x, new = compute_dtype(cfg), True
    return x, new


def lora_dropout_mask_bytes(cfg: RunConfig, x_dtype: str) -> int:
    """Bytes per input element lora dropout keeps for backward: `native_dropout`'s bool mask on CUDA (1); CPU's
    kernel keeps a noise tensor of dropout's input dtype (peft's cast of `x_dtype`); 0 without dropout."""
    if cfg.lora_dropout <= 0:
        return 0
    return 1 if cfg.device == "cuda" else nbytes(lora_cast_input_dtype(cfg, x_dtype))


def lora_saved_per_token(cfg: RunConfig, arch: Arch, sources: tuple[str, ...] | None = None) -> int:
    """Per token, what the wrapped linears keep for backward beyond the frozen layer's own tensors.

    Per wrapped linear of input width n: the input `lora_A` saves (`lora_a_saved_input`) when it is a new tensor,
    dropout's mask (1·n bool on CUDA; CPU's `native_dropout` keeps a noise tensor of the input dtype) and A's
    r-wide output, which `lora_B` saves. When `lora_A` saves the input itself, that input stays alive: a norm's
    output (once per norm, however many linears share it), the act·up product (which a frozen down_proj does
    not keep) or attention's output when it is a copy (`attention_output_is_kernel_output`); a kernel's own
    output is counted by `attention_saved_per_token`. `sources`: only the linears fed by these
    (`lora_input_source`), default all.
    """
    if not cfg.use_peft:
        return 0
    b_input = nbytes(compute_dtype(cfg) if cfg.bf16 else adapter_dtype(cfg))
    per = 0
    kept_sources: dict[str, int] = {}
    for lin in lora_targets(cfg, arch):
        source = lora_input_source(lin.name)
        if sources is not None and source not in sources:
            continue
        x_dtype = _lora_source_dtype(cfg, source)
        saved, new = lora_a_saved_input(cfg, x_dtype)
        if new:
            per += nbytes(saved) * lin.in_features
        elif source != "attn_out" or not attention_output_is_kernel_output(cfg, arch):
            kept_sources[source] = nbytes(x_dtype) * lin.in_features
        per += lora_dropout_mask_bytes(cfg, x_dtype) * lin.in_features
        per += b_input * cfg.lora_r
    return per + sum(kept_sources.values())


def first_layer_unsaved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """What the first decoder layer does not save when its input needs no gradient, per token.

    TRL 1.16 `GRPOTrainer.__init__` calls `model.enable_input_require_grads()` only for PEFT with gradient
    checkpointing (https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L527-L530). Without it a
    PEFT model's frozen embedding hands layer 0 a tensor that needs no gradient, so autograd records nothing until
    the first op with a trainable operand: the frozen `input_layernorm` saves nothing (4H + 4), nor does lora
    dropout on its output (the mask, per wrapped q/k/v), nor q_norm / k_norm on a projection LoRA does not wrap
    (Qwen3, Gemma3). `lora_A` still keeps its input, for its own weight's gradient.
    """
    if not cfg.use_peft or cfg.gradient_checkpointing:
        return 0
    # OLMo-2 has no input_layernorm: its frozen q/k/v read the embedding output and keep nothing anyway
    out = rmsnorm_saved_per_token(cfg, arch) if arch.family.norm_placement == "pre" else 0
    wrapped = set()
    for lin in lora_targets(cfg, arch):
        if lora_input_source(lin.name) != "attn_norm":
            continue
        wrapped.add(lin.name.split(".")[-1])
        out += lora_dropout_mask_bytes(cfg, _lora_source_dtype(cfg, "attn_norm")) * lin.in_features
    if arch.family.qk_norm:
        full = arch.family.qk_norm_scope == "full"  # one [T, 1] rsqrt per norm (OLMo-2)
        if not wrapped & {"q_proj", "qkv_proj"}:
            out += 4 * arch.q_dim + 4 * (1 if full else arch.num_heads)
        if not wrapped & {"k_proj", "qkv_proj"}:
            out += 4 * arch.kv_dim + 4 * (1 if full else arch.num_kv_heads)
    return out


def layer_saved_per_token(cfg: RunConfig, arch: Arch, seq_len: int) -> int:
    """Everything one decoder layer keeps for backward, per token: its norms + attention + MLP + LoRA."""
    return (
        layer_norms_saved_per_token(cfg, arch)
        + gemma_extra_norms_saved_per_token(cfg, arch)
        + qk_norm_saved_per_token(cfg, arch)
        + attention_saved_per_token(cfg, arch, seq_len)
        + mlp_saved_per_token(cfg, arch)
        + lora_saved_per_token(cfg, arch)
    )


def layer_weight_casts(cfg: RunConfig, arch: Arch) -> int:
    """One decoder layer's nn.Linear weights cast by bf16 autocast when they are fp32: Σ numel × a (0 when the
    weights are not fp32, without autocast, or for a 4-bit base, whose layer dequantizes instead)."""
    if residual_bytes(cfg) != 4 or compute_bytes(cfg) == 4 or cfg.load_in_4bit:
        return 0
    numel = sum(
        lin.count * lin.in_features * lin.out_features for lin in arch.layer_linears if lin.is_nn_linear
    )
    return numel * compute_bytes(cfg)


def autocast_weight_cache(
    cfg: RunConfig, arch: Arch, include_lm_head: bool, saved_for_backward: bool = False
) -> int:
    """fp32 weights under bf16 autocast: each trainable nn.Linear weight's bf16 cast is cached until the forward's autocast exits (torch cached_cast), layers × `layer_weight_casts`; the lm_head cast (the logits step) as a transient."""
    if residual_bytes(cfg) != 4 or compute_bytes(cfg) == 4:
        return 0
    out = 0
    # only leaves that require grad are cached; frozen weights' casts live on only where autograd saves them (no GC)
    if not cfg.use_peft or saved_for_backward:
        out = arch.num_layers * layer_weight_casts(cfg, arch)
    if include_lm_head:
        out += arch.vocab_size * arch.hidden_size * compute_bytes(cfg)
    return out


def fp32_head_cast_in_generation(cfg: RunConfig, arch: Arch) -> int:
    """`cast_lm_head_to_fp32` under bf16/fp16 autocast: generation calls the fp32 head through the model's own
    forward, where autocast casts its [V, H] weight to a bytes for each call (torch autocast `cached_cast` caches
    only leaves that require grad; the head is frozen with LoRA and the cast is short-lived either way): V·H·a.
    TRL's fused head disables autocast for scoring and training (grpo_trainer.py `_fused_forward`), so only
    generation pays it."""
    if not (cfg.cast_lm_head_to_fp32 and cfg.bf16) or nbytes(cfg.dtype) == 4 or residual_bytes(cfg) == 4:
        return 0
    return arch.vocab_size * arch.hidden_size * compute_bytes(cfg)


def layer_backward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Inside the MLP's backward six [T, I] tensors are live: those not saved are gradients in flight, (6 − saved)·a·I (2 full, 3 frozen); or the LoRA backward instant, if larger.

    At the act·up multiply's backward the product's gradient and the two it makes (for act(gate) and up) are live
    beside the saved gate, act(gate) and up, all in the linears' output dtype. With a 4-bit base the down
    projection's backward returns an a-byte gradient for its r-byte input (bnb `MatMul4Bit.backward` computes in
    the gradient's dtype) and autograd casts it to the input's dtype (`validate_outputs`) before the a-byte one is
    dropped: the multiply's instant, in r bytes, is the larger.

    By the multiply's backward the down projection's own backward has run, so what a LoRA on down_proj saved
    (lora_A's input: the product or its cast copy, dropout's mask, A's output) is released: the multiply's
    instant holds that much less than the layer's saved set (`lora_saved_per_token` of the `mlp_product`
    source). The LoRA instant (`lora_backward_transient_per_token`) is down_proj's own, with all of it live.
    """
    inter = arch.num_experts_per_tok * arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size
    out = (6 - mlp_saved_tensors(cfg)) * linear_output_bytes(cfg) * inter
    if not arch.is_moe:  # a MoE block's experts are not peft Linears: their factors are terms/moe_lora.py's
        out -= lora_saved_per_token(cfg, arch, sources=("mlp_product",))
    return max(out, lora_backward_transient_per_token(cfg, arch), moe_combine_backward_per_token(cfg, arch))


def moe_combine_backward_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Backward of the experts' combine step, per token: `weighted_out.view(T, k, H).sum(1)` hands back an expanded
    gradient that is made contiguous [T, k, H], and `weighted_out[inv_perm]`'s backward scatters it into a zeroed
    [S, H] (torch FunctionsManual.cpp `index_backward`, `index_put_` in place on CUDA): 2·k·H·a.

    (Under a dispatch mode `index_backward` takes its out-of-place `index_put` branch; the tracer runs it in place,
    as CUDA does: sweeps/trace/patches.py `CudaIndexBackward`.)"""
    if not arch.is_moe:
        return 0
    return 2 * arch.num_experts_per_tok * arch.hidden_size * compute_bytes(cfg)


def lora_backward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Backward through the widest-input LoRA-wrapped linear: its input-gradient chain
    (`lora_input_gradient_peak`, bytes per input element) × that input width."""
    if not cfg.use_peft:
        return 0
    targets = lora_targets(cfg, arch)
    if not targets:
        return 0
    widest = max(targets, key=lambda lin: lin.in_features)
    x_dtype = _lora_source_dtype(cfg, lora_input_source(widest.name))
    return lora_input_gradient_peak(cfg, x_dtype) * widest.in_features


def lora_input_gradient_peak(cfg: RunConfig, x_dtype: str) -> int:
    """Bytes per input element at the largest instant of a LoRA-wrapped linear's input-gradient backward, net of
    the saved tensors it releases on the way (lora_A's input, dropout's mask), for an input in `x_dtype`.

    peft 0.21 `lora.Linear.forward` (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L1086-L1102)
    runs `result = self.base_layer(x)` first and the adapter chain (`lora_input_chain`, then lora_A, lora_B) after
    it, so every adapter node has a higher sequence number than the base's, and autograd's ready queue runs the
    highest first (torch/csrc/autograd/engine.cpp `CompareNodeTaskTime`): the whole adapter backward runs before the
    base layer's. lora_A writes its input's gradient (autocast's a bytes, else the adapter's) and releases the
    input it saved; each op of the chain, back to front, writes its input's gradient while its own is live, then
    frees it (`native_dropout_backward` also frees the bool mask); then the base writes the input's gradient (in a
    bytes under autocast, cast to the input's dtype when it differs) and the input buffer sums the two out of
    place. Walked op by op here; measured on peft-wrapped linears in seven adapter / input / autocast / dropout
    cases (tests/ground_truth/test_lora_backward_chain.py).
    """
    a, x = compute_bytes(cfg), nbytes(x_dtype)
    chain = lora_input_chain(cfg, x_dtype)
    # dropout's place in the chain: right after peft's cast, when there is one (`lora_input_chain`'s order)
    dropout_at = (
        (1 if lora_cast_input_dtype(cfg, x_dtype) != x_dtype else 0) if cfg.lora_dropout > 0 else None
    )
    grad = a if cfg.bf16 else nbytes(adapter_dtype(cfg))  # lora_A's input gradient
    live = peak = grad
    live -= chain[-1] if chain else x  # lora_A's saved input, released
    for i in reversed(range(len(chain))):
        new = chain[i - 1] if i else x  # the gradient of this op's input, in its dtype
        live += new
        peak = max(peak, live)
        live -= grad + (1 if i == dropout_at else 0)
        grad = new
    base = a if cfg.bf16 else x
    live += base
    peak = max(peak, live)
    if base != x:  # cast to the input's dtype, then the a-byte one is dropped
        live += x
        peak = max(peak, live)
        live -= base
    return max(peak, live + x)  # the input buffer's sum beside both gradients


def mlp_call_locals_per_token(cfg: RunConfig, arch: Arch) -> int:
    """What the decoder layer holds around its MLP call in a forward with grad, unsaved with a frozen norm:
    `residual` and the post-attention norm's output, 2·r·H (transformers 5.23
    https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/qwen2/modeling_qwen2.py#L283-L288).
    OLMo-2's MLP reads `residual` itself (`norm_placement` post,
    https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L311-L312):
    r·H; beside it the layer's input, which the model's layer loop still binds, and `inputs_embeds`, which the
    model's forward binds through the loop (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L390-L394),
    r·H each: nothing saves them when q/k/v are frozen (no input_layernorm keeps a copy), unless they are
    checkpoint inputs (GC, counted with `checkpoint_inputs`) or a LoRA on q/k/v keeps its input itself
    (`lora_saved_per_token`)."""
    r, h = residual_bytes(cfg), arch.hidden_size
    if arch.family.norm_placement == "post":
        kept = layer_input_saved_per_token(cfg, arch) > 0
        inputs = 0 if cfg.gradient_checkpointing or kept else min(2, arch.num_layers)
        return r * h * (1 + inputs)
    return 2 * r * h


def layer_input_saved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """The decoder layer's input tensor itself among what the layer saves, per token: OLMo-2's q/k/v read it with no
    norm in between, so trainable weights keep it when r = a (`residual_input_saved_per_token`), and a LoRA on
    q/k/v whose `lora_A` makes no copy of it keeps it (`lora_saved_per_token`): r·H; 0 otherwise and for
    families with an input_layernorm."""
    if arch.family.norm_placement != "post":
        return 0
    r, h = residual_bytes(cfg), arch.hidden_size
    if not cfg.use_peft:
        return r * h if r == compute_bytes(cfg) else 0
    kept = any(
        lora_input_source(lin.name) == "attn_norm" and not lora_a_saved_input(cfg, cfg.dtype)[1]
        for lin in lora_targets(cfg, arch)
    )
    return r * h if kept else 0


def post_feedforward_norm_unsaved_per_token(cfg: RunConfig, arch: Arch) -> int:
    """What a layer's post-feedforward norm has not yet saved while its MLP runs, per token: OLMo-2's
    (`norm_placement` post) runs after the down projection, so an instant inside the MLP holds the layer's
    saved set less `gemma_post_norm_saved_per_token`; 0 for other families (unchanged here)."""
    if arch.family.norm_placement != "post":
        return 0
    return gemma_post_norm_saved_per_token(cfg, arch)


def lora_input_chain(cfg: RunConfig, x_dtype: str) -> list[int]:
    """Bytes per input element of each new tensor peft 0.21 makes from a wrapped linear's input before `lora_A`'s
    matmul, in order: `_cast_input_dtype`'s copy when the adapter dtype differs, `native_dropout`'s output when
    lora_dropout > 0, and bf16 autocast's cast of the matmul input when it is not already bf16. The last one is what
    `lora_A` saves (`lora_a_saved_input`); the others are bound in the frame until the forward returns."""
    cast = lora_cast_input_dtype(cfg, x_dtype)
    chain = [nbytes(cast)] if cast != x_dtype else []
    if cfg.lora_dropout > 0:
        chain.append(nbytes(cast))
    if cfg.bf16 and cast != compute_dtype(cfg):
        chain.append(nbytes(compute_dtype(cfg)))
    return chain


def lora_forward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Forward with grad through the widest-input LoRA-wrapped linear: what is live at `lora_A`'s matmul beyond
    what the layer saves, per token.

    peft 0.21 `lora.Linear.forward` (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L1086-L1102):
    `result = self.base_layer(x)` (a-byte [T, out]), then `x = self._cast_input_dtype(x, lora_A.weight.dtype)` (a
    copy [T, n] in the adapter dtype when it differs; the caller's x, unsaved when the base is frozen, outlives
    it), then `lora_A(dropout(x))`: `native_dropout` writes a second [T, n] when lora_dropout > 0, and bf16
    autocast casts that to the bf16 input the matmul runs on. Each of these new tensors is still bound at the
    matmul; the last one is what `lora_A` saves (`lora_a_saved_input`, counted with the layer), the others are
    transient: fp32 adapters under autocast hold the copy and the dropout output (8·n), without autocast (fp16 or
    bf16 weights, `bf16=False`) lora_A saves the dropout output itself and only the copy is extra (4·n). Beside
    them the caller's x (its dtype · n), the base result (a·out) and `mlp_call_locals_per_token` (2·r·H). The
    adapter's add comes later, with only the rebound copy left of the chain beside lora_B's output, the scaled
    product and the sum (`lora_output_peak_per_out`, × out); the larger instant counts. Same-dtype adapters
    (QLoRA) make no transient copy, but the caller's x is still live (the adapter's backward no longer hides it:
    `lora_input_gradient_peak`). With GC this instant is the top layer's recompute, and non-reentrant
    `torch.utils.checkpoint` stops recomputing once the last saved tensor is back (`early_stop=True`, the
    default, https://github.com/pytorch/pytorch/blob/v2.13.0/torch/utils/checkpoint.py): lora_B's input
    and weight cast exist before its matmul runs, so the adapter's add never runs there.
    Only the down projection (input I > H) is counted: it runs last, when the layer has saved all but its own
    adapter input; a q/k/v or gate/up LoRA runs before the MLP saves its [T, I] tensors.
    """
    if not cfg.use_peft:
        return 0
    targets = lora_targets(cfg, arch)
    if not targets:
        return 0
    lin = max(targets, key=lambda t: t.in_features)
    if lin.in_features <= arch.hidden_size:  # not the down projection (see above)
        return 0
    x_dtype = _lora_source_dtype(cfg, lora_input_source(lin.name))
    chain = lora_input_chain(cfg, x_dtype)
    n, out = lin.in_features, lin.out_features
    at_lora_a = sum(chain[:-1]) * n + compute_bytes(cfg) * out  # the last new tensor is the one lora_A saves
    # after lora_A the dropout output and autocast's copy are gone unless saved; peft's rebound `x` (the copy in
    # the adapter dtype) stays bound through the adapter's add (`lora_output_peak_per_out`)
    bound = chain[0] if len(chain) > 1 and lora_cast_input_dtype(cfg, x_dtype) != x_dtype else 0
    at_add = bound * n + lora_output_peak_per_out(cfg) * out
    # the recompute stops once lora_B's saved inputs exist, before the add; OLMo-2's post-feedforward norm saves
    # after it, so its recompute runs the add too
    if cfg.gradient_checkpointing and arch.family.norm_placement == "pre":
        at_add = 0
    return (
        nbytes(x_dtype) * n
        + max(at_lora_a, at_add)
        + mlp_call_locals_per_token(cfg, arch)
        - post_feedforward_norm_unsaved_per_token(cfg, arch)
    )


def moe_forward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Forward with grad through the routed experts, at the un-permuting gather, beyond what the layer saves.

    transformers 5.23 `grouped_mm_experts_forward`
    (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/integrations/moe.py#L441-L519): the
    local `selected_hidden_states_g` [S, H] lives until the function returns, `weighted_out = proj_out *
    sample_weights_g.unsqueeze(-1)` [S, H] is still bound when `weighted_out[inv_perm]` writes a third [S, H]
    (the down projection's output, saved, is counted with the layer). S = k routed copies per token: 3·k·H·a, plus
    `mlp_call_locals_per_token` (2·r·H).
    """
    if not arch.is_moe:
        return 0
    return 3 * arch.num_experts_per_tok * arch.hidden_size * compute_bytes(cfg) + mlp_call_locals_per_token(
        cfg, arch
    )


def _promoted_bytes(a: str, b: str) -> int:
    """Bytes of `a + b`'s result (torch type promotion): the same dtype stays, fp16 with bf16 or anything with fp32
    gives fp32."""
    return nbytes(a) if a == b else 4


def lora_output_peak_per_out(cfg: RunConfig) -> int:
    """Bytes live per output feature while a LoRA-wrapped linear adds its adapter to the base result, forward with
    grad (the scalar multiply and the add save nothing of these [T, out] tensors).

    peft 0.21 `lora.Linear.forward` (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L1086-L1113):
    `result = result + lora_B(lora_A(dropout(x))) * scaling`: at the multiply the base result (a), lora_B's output
    and the product (p each, p = autocast's dtype, else the adapter's) are live; the add writes the promoted sum
    beside the base result and the product; `result.to(torch_result_dtype)` copies back when they differ. The bnb
    4-bit layer (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/bnb.py#L527-L557) clones
    the base result first (two a) and, without autocast, casts the scaled output to the result dtype before the
    add (the product and its cast live together).
    """
    a_dtype = linear_output_dtype(cfg)
    p_dtype = compute_dtype(cfg) if cfg.bf16 else adapter_dtype(cfg)
    a, p = nbytes(a_dtype), nbytes(p_dtype)
    if not cfg.load_in_4bit:
        s = _promoted_bytes(a_dtype, p_dtype)
        return max(a + 2 * p, a + p + s, s + a if s != a else 0)
    out_dtype = p_dtype
    peaks = [2 * a, a + 2 * p]
    if not cfg.bf16 and p_dtype != a_dtype:  # output.to(expected_dtype) beside the product
        peaks.append(a + p + a)
        out_dtype = a_dtype
    peaks.append(a + nbytes(out_dtype) + _promoted_bytes(a_dtype, out_dtype))
    return max(peaks)


def lora_mlp_input_forward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Forward with grad through a LoRA on the MLP's input projections (gate/up, Phi-3's fused gate_up), at the
    adapter's add (`lora_output_peak_per_out` × out), beyond what the layer saves, per token.

    It runs before the MLP saves its [T, I] tensors and the down projection's adapter its input, so those are
    subtracted from the layer's saved total; act(gate) and gate's output are already saved when up_proj runs
    (`down_proj(act_fn(gate_proj(x)) * up_proj(x))`, transformers 5.23 LlamaMLP; Phi-3's gate_up runs first).
    Beside it: peft's input copies still bound in the frame (as in `lora_forward_transient_per_token`) and the
    decoder layer's locals (`mlp_call_locals_per_token`). 0 for MoE blocks and without a wrapped gate/up.
    """
    if not cfg.use_peft or arch.is_moe:
        return 0
    a = linear_output_bytes(cfg)
    unsaved_inputs = sum(lora_input_chain(cfg, _lora_source_dtype(cfg, "mlp_norm"))[:-1]) * arch.hidden_size
    saved_after = mlp_saved_per_token(cfg, arch) + lora_saved_per_token(cfg, arch, ("mlp_product",))
    best = 0
    for lin in lora_targets(cfg, arch):
        leaf = lin.name.split(".")[-1]
        if leaf not in ("gate_proj", "up_proj", "gate_up_proj"):
            continue
        saved_before = 2 * a * arch.intermediate_size if leaf == "up_proj" else 0
        live = (
            lora_output_peak_per_out(cfg) * lin.out_features
            + unsaved_inputs
            + mlp_call_locals_per_token(cfg, arch)
            + saved_before
        )
        best = max(best, live - saved_after - post_feedforward_norm_unsaved_per_token(cfg, arch))
    return best


def layer_forward_transient_per_token(cfg: RunConfig, arch: Arch) -> int:
    """The largest forward-with-grad instant inside a decoder layer, beyond its saved tensors (LoRA input cast at
    down_proj, the adapter's add at gate/up, or the experts' un-permuting gather)."""
    return max(
        lora_forward_transient_per_token(cfg, arch),
        lora_mlp_input_forward_transient_per_token(cfg, arch),
        moe_forward_transient_per_token(cfg, arch),
    )


def bnb_4bit_cast_bytes(cfg: RunConfig) -> int:
    """Bytes per element of bf16 autocast's copy of a tensor in the load dtype (a dequantized weight, the act·up
    product): a under bf16 autocast when the load dtype is not bf16, else 0 (no copy)."""
    return compute_bytes(cfg) if cfg.bf16 and cfg.dtype != "bfloat16" else 0


def dequantized_weight_transient(
    cfg: RunConfig, arch: Arch, name: str | None = None, backward: bool = False
) -> int:
    """The dequantized copy of a packed layer weight (`name`, default the largest), while a matmul uses it.

    GPTQ/AWQ base: one fp16 copy (gptqmodel TorchQuantLinear `dequantize_weight`). bnb 4-bit base: bitsandbytes
    0.50 dequantizes in the dtype the weight was quantized from (`QuantState.dtype`, the load dtype) and casts it to
    the activation's (`_dequant_linear_fallback` then F.linear under autocast in the forward; `MatMul4Bit.backward`:
    `F.dequantize_4bit(B, ctx.state).to(grad_output.dtype)`): load-dtype bytes, plus a bf16 copy under bf16
    autocast when the load dtype is another, plus the nested quant's fp32 absmax (`nested_absmax_bytes`: two
    copies in the forward's fallback, one in `backward`, where the cast outlives it).
    """
    linears = [lin for lin in arch.layer_linears if lin.is_nn_linear and (name is None or lin.name == name)]
    largest = max(lin.in_features * lin.out_features for lin in linears)
    if arch_quant_spec(arch) is not None:  # GPTQ/AWQ torch kernels dequantize the packed weight to fp16
        return 2 * largest
    if not cfg.load_in_4bit:
        return 0
    cast = bnb_4bit_cast_bytes(cfg)
    scales = nested_absmax_bytes(cfg, largest, copies=(0 if cast else 1) if backward else 2)
    return largest * (residual_bytes(cfg) + cast) + scales


def nested_absmax_bytes(cfg: RunConfig, weight_elements: int, copies: int) -> int:
    """With nested 4-bit quantization (`use_bnb_nested_quant`), the fp32 absmax bitsandbytes 0.50 dequantizes
    from its uint8 form beside a dequantized weight: 4 bytes per block of 64 elements, per copy (0 otherwise).

    `_dequant_linear_fallback` (https://github.com/bitsandbytes-foundation/bitsandbytes/blob/v0.50.2/bitsandbytes/backends/cuda/ops.py#L904-L916)
    keeps the dequantized absmax and its sum with the offset (2 copies) through the weight's dequantization and
    F.linear. `F.dequantize_4bit` (https://github.com/bitsandbytes-foundation/bitsandbytes/blob/v0.50.2/bitsandbytes/functional.py#L1052-L1056),
    which backward calls, adds the offset in place (1 copy) and frees it on return, before the cast to the
    gradient's dtype; where that cast exists it is the larger, so backward counts none.
    """
    if not (cfg.load_in_4bit and cfg.use_bnb_nested_quant):
        return 0
    return copies * 4 * math.ceil(weight_elements / NF4_BLOCK)


BNB_GEMM_4BIT_CUSTOM_FLOOR_M = 4  # bitsandbytes 0.50 backends/cuda/ops.py `_GEMM_4BIT_CUSTOM_FLOOR_M`


def bnb_4bit_forward_transient(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """A 4-bit down projection's forward with grad (the top layer's, or its recompute under GC), beyond the
    layer's saved tensors (0 without a bnb base, or at most 4 rows, where every CUDA card runs the fused kernel).

    bitsandbytes 0.50 `gemm_4bit` on CUDA (https://github.com/bitsandbytes-foundation/bitsandbytes/blob/v0.50.2/bitsandbytes/backends/cuda/ops.py#L934-L978):
    past 1536 rows, and below that wherever `_gemm_4bit_use_custom_cuda` prefers it by the card and the shape (on
    an H100 or H200, every catalog model's down projection from 33 rows on), `_dequant_linear_fallback` writes the weight in the
    input's dtype and calls F.linear, which under bf16 autocast casts both the weight and the input; the act·up
    product (r·I, which a frozen down_proj does not save) and its cast (a·I) are live beside the dequantized weight.
    A card whose fused kernel wins at the run's rows holds neither the weight nor the cast: the term errs high there
    by them.
    """
    if not cfg.load_in_4bit or arch.is_moe or tokens <= BNB_GEMM_4BIT_CUSTOM_FLOOR_M:
        return 0
    product = tokens * (residual_bytes(cfg) + bnb_4bit_cast_bytes(cfg)) * arch.intermediate_size
    return product + dequantized_weight_transient(cfg, arch, "down_proj")


def bnb_4bit_recompute_gradient(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """Under GC, the act·up product's gradient that waits through the top layer's recompute with a 4-bit down
    projection LoRA does not wrap (0 otherwise).

    bitsandbytes 0.50 `MatMul4Bit.forward` keeps the packed weight on `ctx.tensors`, not as a saved tensor
    (https://github.com/bitsandbytes-foundation/bitsandbytes/blob/v0.50.2/bitsandbytes/autograd/_functions.py#L357-L360),
    so the checkpoint's unpack hook does not fire there: the down projection's backward runs first and its input
    gradient (r·I after autograd casts it to the input's dtype) is live while the multiply's backward triggers the
    recompute, which re-runs the down projection's forward (`bnb_4bit_forward_transient`). A wrapped down_proj's
    adapter backward recomputes first, before any [T, I] gradient exists.
    """
    if not cfg.gradient_checkpointing or not bnb_4bit_forward_transient(cfg, arch, tokens):
        return 0
    if any(lin.name == "down_proj" for lin in lora_targets(cfg, arch)):
        return 0
    return tokens * residual_bytes(cfg) * arch.intermediate_size


def recompute_waiting_gradients(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """Under GC, the gradients that wait, beside the incoming residual gradient (`hidden_states`), while the top
    layer's recompute runs (0 without GC, and for MoE blocks, whose unwinding is not modelled here).

    Autograd runs the nodes created last first, and the non-reentrant checkpoint recomputes the layer at the first
    saved tensor a node unpacks; every gradient written before that node waits through the recompute:
    - the residual add's cast of the gradient to the MLP output's dtype (d·H, d = `linear_output_dtype`) when it
      differs from the residual's (an fp32 load under bf16 autocast);
    - Gemma2/3 instead: the post-feedforward norm's `output.type_as(x)` hands its fp32 `output` the gradient as a
      new fp32 tensor (4·H, unless x is fp32; the residual add's cast is freed once copied), and the norm's
      multiply unpacks next
      (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma3/modeling_gemma3.py#L128-L139;
      OLMo-2's post_feedforward_layernorm the same with `.to(input_dtype)`);
    - otherwise, a LoRA-wrapped down projection: peft 0.21 `lora.Linear.forward`
      (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L1086-L1113;
      `result = result + lora_B(lora_A(dropout(x))) * scaling`, then `result.to(torch_result_dtype)`) unwinds
      with nothing to unpack: the copy back, the add (casting the base result's gradient to its dtype when the
      sum was promoted: a·H), the scalar multiply (a new p-byte gradient, p·H, p as in
      `lora_output_peak_per_out`); then `lora_B`'s matmul unpacks its input. The bnb 4-bit layer
      (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/bnb.py#L527-L557) adds a clone of
      the base result, which takes the gradient as it is: p·H only. A frozen or fully trained down projection
      unpacks at once.
    Measured op by op in tests/ground_truth/test_recompute_waiting_gradients.py (tiny Llama / Phi-3 / Gemma2 under a
    non-reentrant checkpoint, the live gradients at the top layer's first recomputed op).
    """
    if not cfg.gradient_checkpointing or arch.is_moe:
        return 0
    d_dtype = linear_output_dtype(cfg)
    if gemma_post_norm_saved_per_token(
        cfg, arch
    ):  # the residual add's cast is consumed by type_as's backward
        return 0 if d_dtype == "float32" else tokens * 4 * arch.hidden_size
    per_token = nbytes(d_dtype) if nbytes(d_dtype) != residual_bytes(cfg) else 0
    if cfg.use_peft and any(lin.name.split(".")[-1] == "down_proj" for lin in lora_targets(cfg, arch)):
        p_dtype = compute_dtype(cfg) if cfg.bf16 else adapter_dtype(cfg)
        per_token += nbytes(p_dtype)
        if not cfg.load_in_4bit and _promoted_bytes(d_dtype, p_dtype) != nbytes(d_dtype):
            per_token += nbytes(d_dtype)
    return tokens * per_token * arch.hidden_size


def bnb_4bit_backward_instant(cfg: RunConfig, arch: Arch, tokens: int) -> int:
    """A 4-bit layer's backward at a dequantized weight, beyond the layer's saved tensors (0 without a bnb base).

    bitsandbytes 0.50 `MatMul4Bit.backward` (https://github.com/bitsandbytes-foundation/bitsandbytes/blob/v0.50.2/bitsandbytes/autograd/_functions.py#L364-L385)
    materialises the weight (`dequantized_weight_transient`) while the MLP's own backward is elsewhere: at the down
    projection, before the act·up multiply's backward, the incoming gradient (r·H) and its a-byte cast (a·H) are
    live, with the LoRA branch's [T, I] input gradient already waiting in autograd's buffer (peft's adapter path
    runs after the base layer, so its backward runs first); at up / gate(_up), after that multiply's backward has
    released act(gate) and up, the output gradient and its cast take their place. Bounded per token by
    r·I + a·H, beside the incoming gradient and the largest dequantized weight. The MLP's gradients of
    `layer_backward_transient_per_token` are not live at either instant.
    """
    if not cfg.load_in_4bit:
        return 0
    r, a = residual_bytes(cfg), compute_bytes(cfg)
    inter = arch.num_experts_per_tok * arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size
    grads = tokens * (r * inter + a * arch.hidden_size)
    return hidden_states(cfg, arch, tokens) + grads + dequantized_weight_transient(cfg, arch, backward=True)


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
    mask = attention_mask_bytes(cfg, arch, batch, seq_len)
    if cfg.gradient_checkpointing:
        return checkpoint_inputs(cfg, arch, tokens) + mask
    per_layer = tokens * layer_saved_per_token(cfg, arch, seq_len) + moe_lora.saved_per_layer(cfg, arch)
    total = arch.num_layers * per_layer + mask
    unmasked = arch.num_layers - masked_layers(cfg, arch, seq_len)
    if sdpa_needs_mask(cfg, arch, seq_len) and unmasked:  # full-attention layers of a sliding-window model
        lighter = attention_saved_per_token(cfg, arch, seq_len) - attention_saved_per_token(
            cfg, arch, seq_len, masked=False
        )
        total -= unmasked * tokens * lighter
    return total


def recompute_layer(cfg: RunConfig, arch: Arch, batch: int, seq_len: int) -> int:
    """With GC, backward re-runs one layer's forward at a time: one layer's saved tensors, tokens × per-layer bytes,
    and, for fp32 weights under bf16 autocast, that layer's bf16 weight casts: torch.utils.checkpoint re-enters
    autocast for the recompute and each linear's matmul saves the cast weight for its input gradient, so they live
    until the layer's backward is done (`layer_weight_casts`; the no-GC case keeps every layer's,
    `autocast_weight_cache`).

    An OLMo-2 layer whose q/k/v keep their input itself (`layer_input_saved_per_token`) keeps the checkpoint's own
    input tensor, already counted by `checkpoint_inputs`: not counted twice."""
    if not cfg.gradient_checkpointing:
        return 0
    return (
        batch * seq_len * (layer_saved_per_token(cfg, arch, seq_len) - layer_input_saved_per_token(cfg, arch))
        + moe_lora.saved_per_layer(cfg, arch)
        + layer_weight_casts(cfg, arch)
    )


def moe_nograd_per_token(cfg: RunConfig, arch: Arch) -> int:
    """Routed experts without grad, per token, S = k routed copies of it (transformers 5.23
    integrations/moe.py `grouped_mm_experts_forward`): at the end `selected_hidden_states_g`, the down
    projection's output, `weighted_out` and its `[inv_perm]` gather are live, 4·k·H·a; earlier, the gathered input,
    gate_up [S, 2I] and act·up [S, I], k·(H + 3I)·a. The larger of the two."""
    a, k = compute_bytes(cfg), arch.num_experts_per_tok
    return a * k * max(4 * arch.hidden_size, arch.hidden_size + 3 * arch.moe_intermediate_size)


def query_bytes(cfg: RunConfig, arch: Arch | None = None) -> int:
    """Bytes of the query eager attention casts its probabilities to (`.to(query.dtype)`).

    Every catalog family applies rotary to q after its projection: `q * cos + rotate_half(q) * sin` (transformers
    5.23 `apply_rotary_pos_emb`, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L127-L149) with cos/sin in the
    hidden states' r-byte dtype (`LlamaRotaryEmbedding.forward` returns `cos.to(x.dtype)`), and the multiply
    promotes: q takes the linear's output dtype when it equals the load dtype, else fp32 (bf16·fp32, fp16·bf16).
    Qwen3's q_norm (`weight * hidden.to(input_dtype)`, r-byte weight) promotes the same way before rotary.
    OLMo-2 (`rotary_fp32`) keeps fp32 cos/sin and casts back, `q_embed.to(q_type)` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L172-L177),
    after a q_norm that returns its input's dtype: q keeps the linear's output dtype.
    """
    out = linear_output_dtype(cfg)
    if arch is not None and arch.family.rotary_fp32:
        return nbytes(out)
    return nbytes(out) if out == cfg.dtype else 4


def eager_nograd_bytes(cfg: RunConfig, arch: Arch) -> int:
    """Bytes per score element live at eager attention's softmax without grad: the masked scores, their fp32 copy,
    the fp32 softmax.

    transformers 5.23 `eager_attention_forward`: `matmul(q, kᵀ) * scaling + causal_mask` (a bytes, or 4 when the
    model-dtype mask is fp32), then `softmax(dim=-1, dtype=float32)`; ATen `softmax(input, dim, dtype)`
    (aten/src/ATen/native/SoftMax.cpp) converts the input with `input.to(dtype)` first, except for fp16 on CUDA
    (`half_to_float`), then writes a fp32 output. Its `.to(query.dtype)` then writes an a-byte copy while the
    masked scores are still bound to `attn_weights` (rebound only after the cast): added + 4 + q, when the
    query's q bytes (`query_bytes`) are < 4.
    """
    q = query_bytes(cfg, arch)
    added = max(compute_bytes(cfg), residual_bytes(cfg))
    copy = 0 if added == 4 or softmax_half_to_float(cfg) else 4
    return max(added + copy + 4, added + 4 + (q if q != 4 else 0))


def lora_nograd_mlp_per_token(cfg: RunConfig, arch: Arch) -> int:
    """No-grad MLP with LoRA on gate/up_proj: at peft's `result = result + lora_B(lora_A(dropout(x))) * scaling`
    (peft 0.21 https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L1103) act(gate), the base result, the scaled adapter output and the sum are live [T, I].

    Base and adapter outputs take autocast's a bytes (a 4-bit base's output and act(gate) the input's r bytes,
    bnb `Linear4bit.forward` casting back with `.to(inp_dtype)`); without autocast the base output has the model dtype and the
    adapter's the adapter dtype (fp32, or bf16 with QLoRA, grpo_trainer.py:538-541), and a 16-bit sum of fp16 and
    bf16 (or anything with fp32) promotes to fp32 (torch type promotion) before `result.to(torch_result_dtype)`;
    peft's bnb wrapper for a 4-bit base casts the adapter output back before the add instead (see below).
    """
    if not cfg.use_peft or arch.is_moe:
        return 0
    fused = fused_gate_up(arch)
    width = 2 * arch.intermediate_size if fused else arch.intermediate_size
    wrapped = [lin for lin in lora_targets(cfg, arch) if lin.out_features == width]
    down = lora_nograd_down_input_per_token(cfg, arch)
    if not wrapped:
        return down
    if cfg.bf16:  # autocast: the adapter's output in a bytes; the base's too, but r from a 4-bit base
        base, adapter = linear_output_bytes(cfg), compute_bytes(cfg)
        total = base if base == adapter else 4  # bf16 + fp32 -> fp32
    else:
        base = residual_bytes(cfg)
        adapter = nbytes(adapter_dtype(cfg))
        total = (
            4 if cfg.dtype != adapter_dtype(cfg) else adapter
        )  # fp16 + bf16 -> fp32; anything + fp32 -> fp32
    # peft rebinds `x = self._cast_input_dtype(x, lora_A.weight.dtype)` before the sum, so the norm output's
    # adapter-dtype copy [T, H] is live through it when the dtypes differ
    x_dtype = _lora_source_dtype(cfg, "mlp_norm")
    cast = (
        0 if lora_cast_input_dtype(cfg, x_dtype) == x_dtype else nbytes(adapter_dtype(cfg)) * arch.hidden_size
    )
    # the adapter's part of the instant beside the base result: the scaled output and the sum
    adapter_live = adapter + total
    if cfg.load_in_4bit and not cfg.bf16:
        # peft's bnb wrapper (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/bnb.py#L527-L557)
        # adds to a clone of the base result and, without autocast, casts the scaled output to the result's
        # dtype first: lora_B's output and the product, then the product and its cast, then the cast and the
        # (unpromoted) sum are live beside the clone
        adapter_live = max(2 * adapter, adapter + base, 2 * base)
    if fused:  # Phi-3: gate_up_proj's base result, scaled adapter output and sum, each [T, 2I]; no act yet
        return max((base + adapter_live) * width + cast, down)
    return max((base + base + adapter_live) * arch.intermediate_size + cast, down)


def lora_nograd_down_input_per_token(cfg: RunConfig, arch: Arch) -> int:
    """No-grad down_proj with LoRA, per token: its [T, I] input chain at `lora_A`, beside the base result [T, H].

    peft 0.21 `lora.Linear.forward` (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L1074-L1115):
    `result = self.base_layer(x)` runs first and is held through the adapter (the linears' output bytes × H);
    then the act·up product x (held by the caller) is cast to the adapter dtype (`_cast_input_dtype`, a copy when
    the dtypes differ), passed through `lora_dropout` and, under autocast, cast to a bytes for `lora_A`'s matmul.
    Generation runs with the policy in train mode, so with lora_dropout > 0 CUDA's fused `native_dropout` writes
    an output and a bool mask; under no_grad nothing saves the mask, and `at::dropout` drops it when the op
    returns (ATen Dropout.cpp), so the mask (1 byte) and autocast's copy (a bytes) are never live together:
    x + cast + out + max(mask, autocast copy), × I.
    """
    if not cfg.use_peft or not any(
        lin.in_features == arch.intermediate_size for lin in lora_targets(cfg, arch)
    ):
        return 0
    a = compute_bytes(cfg)
    x_dtype = linear_output_dtype(cfg)  # the product's dtype: autocast's, else the model's (a 4-bit base: r)
    adapter = nbytes(adapter_dtype(cfg))
    live = nbytes(x_dtype) + (0 if lora_cast_input_dtype(cfg, x_dtype) == x_dtype else adapter)
    copy = a if cfg.bf16 and adapter != a else 0
    if cfg.lora_dropout > 0:
        live += adapter + max(1, copy)
    else:
        live += copy
    return live * arch.intermediate_size + linear_output_bytes(cfg) * arch.hidden_size


def attention_output_is_kernel_output(cfg: RunConfig, arch: Arch) -> bool:
    """Whether o_proj reads the attention kernel's own output tensor (so saving it costs nothing more).

    `sdpa_attention_forward` returns `attn_output.transpose(1, 2).contiguous()` (transformers 5.23
    integrations/sdpa_attention.py); the flash kernels write their output in the query's layout (CPU
    `_scaled_dot_product_flash_attention_cpu`; CUDA flash_api.cpp `empty_like(q)`), and rotary keeps the
    [B, L, h, d] layout of a query viewed out of q_proj's output, so the transpose is already contiguous. Phi-3's
    query is a slice of qkv_proj's output, not dense, so rotary writes a [B, h, L, d]-contiguous tensor and the
    transpose copies; eager's `matmul` output is [B, h, L, d] too.
    """
    return cfg.attn_implementation != "eager" and not fused_qkv(arch)


def fused_qkv(arch: Arch) -> bool:
    """Phi-3's attention: one qkv_proj whose output is sliced into q, k and v."""
    return any(lin.name == "qkv_proj" for lin in arch.layer_linears)


def nograd_4bit_down_proj_per_token(cfg: RunConfig, arch: Arch) -> int:
    """No-grad MLP at a 4-bit down_proj's call, per token (the dequantized weight is `dequantized_weight_transient`).

    bnb `Linear4bit.forward` casts its input to the compute dtype (`x.to(self.compute_dtype)`) and its output back
    to the input's (`.to(inp_dtype)`), so gate/up outputs, act and the product are r-byte: live are the product
    (r·I), its a-byte cast (a·I) and, in Phi-3's fused MLP, the [T, 2I] gate_up output it was chunked from (2·r·I).
    0 without a 4-bit base.
    """
    if not cfg.load_in_4bit:
        return 0
    out, inter = linear_output_bytes(cfg), arch.intermediate_size
    return (2 * out * inter if fused_gate_up(arch) else 0) + out * inter + compute_bytes(cfg) * inter


def fused_gate_up(arch: Arch) -> bool:
    """Phi-3's MLP (transformers 5.23 Phi3MLP.forward, https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/phi3/modeling_phi3.py#L57-L63): one gate_up_proj [T, 2I], chunked."""
    return any(lin.name == "gate_up_proj" for lin in arch.layer_linears)


def pre_rotary_bytes(cfg: RunConfig, arch: Arch) -> int:
    """Bytes per element of q and k as rotary receives them: the projection's output dtype, or what a q/k norm returns.

    transformers 5.23 `Qwen3RMSNorm.forward` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/qwen3/modeling_qwen3.py#L58-L63) returns `self.weight * hidden_states.to(input_dtype)`: the
    r-byte weight times the projection's a-byte output promotes (bf16·fp32 -> fp32, fp16·bf16 -> fp32), the
    rotary output's dtype (`query_bytes`). Gemma3's norm returns `output.type_as(x)`: the projection's dtype.
    """
    if arch.family.qk_norm and not arch.family.fp32_norm_product:
        return query_bytes(cfg)
    return linear_output_bytes(cfg)


def nograd_rotary_per_token(cfg: RunConfig, arch: Arch) -> int:
    """No-grad attention at rotary's `q_embed = (q * cos) + (rotate_half(q) * sin)`, per token.

    transformers 5.23 `apply_rotary_pos_emb` (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L127-L149) runs on q before k, with the caller's
    `query_states`, `key_states` and `value_states` (or Phi-3's `qkv` they are views of) still bound. At the sum,
    q (p bytes, `pre_rotary_bytes`), `q * cos`, `rotate_half(q) * sin` and the sum itself (q bytes each,
    `query_bytes`: promoted by the r-byte cos/sin) are live [T, q_dim]; at the second product `rotate_half`'s
    p-byte `cat` stands in for the sum, which is no larger. Beside them: k (p bytes) and v (a bytes), and the
    residual stream of `nograd_forward_peak` before the MLP: `inputs_embeds`, the layer's input and its norm's
    output (r bytes each). In a generation's prefill the layer's own K/V are not yet in the cache
    (`past_key_values.update` runs after rotary): the prefill charges this instant with one layer less of cache.
    """
    r, a, p, q = (
        residual_bytes(cfg),
        linear_output_bytes(cfg),
        pre_rotary_bytes(cfg, arch),
        query_bytes(cfg, arch),
    )
    projections = (
        a * (arch.q_dim + 2 * arch.kv_dim) if fused_qkv(arch) else p * arch.q_dim + (p + a) * arch.kv_dim
    )
    if arch.family.rotary_fp32:
        # OLMo-2 (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/olmo2/modeling_olmo2.py#L154-L177):
        # fp32 cos/sin make fp32 products, and `q_embed` (fp32) waits for k's before both are cast back: the
        # larger of q's sum (3 · 4 · q_dim), k's sum beside q_embed (4 · q_dim + 3 · 4 · kv_dim) and the casts
        # beside both fp32 results ((4 + p) · (q_dim + kv_dim)); no norm output beside the layer's input
        # (`norm_placement` post: q/k/v read the residual stream)
        rot = max(12 * arch.q_dim, 4 * arch.q_dim + 12 * arch.kv_dim, (4 + p) * (arch.q_dim + arch.kv_dim))
        return projections + rot + _residuals_at_attention(arch) * r * arch.hidden_size
    return projections + 3 * q * arch.q_dim + _residuals_at_attention(arch) * r * arch.hidden_size


def _residuals_at_attention(arch: Arch) -> int:
    """[T, H] residual-dtype tensors live at attention in a no-grad forward: `inputs_embeds`, the layer's input and
    input_layernorm's output (3); OLMo-2 has no input_layernorm (2)."""
    return 3 if arch.family.norm_placement == "pre" else 2


def nograd_rotary_peak(cfg: RunConfig, arch: Arch, batch: int, seq_len: int) -> int:
    """The no-grad rotary instant of a [batch, seq_len] forward: `nograd_rotary_per_token` per token, and the mask
    the model's forward holds through its layer loop (`attention_mask_bytes`)."""
    return batch * seq_len * nograd_rotary_per_token(cfg, arch) + attention_mask_bytes(
        cfg, arch, batch, seq_len
    )


def nograd_forward_peak(cfg: RunConfig, arch: Arch, batch: int, seq_len: int, rotary: bool = True) -> int:
    """No-grad forward transient: residual + norm + the MLP's three live [T, I] tensors (act, up, product), or
    the attention's instants (eager's scores; rotary's, unless `rotary=False`), whichever is larger."""
    tokens = batch * seq_len
    r = residual_bytes(cfg)
    inter = arch.num_experts_per_tok * arch.moe_intermediate_size if arch.is_moe else arch.intermediate_size
    # residuals: the layer's input, the post-attention sum, and `inputs_embeds`, which the model's forward keeps
    # referenced through the whole layer loop (transformers 5.23 LlamaModel.forward: `hidden_states = inputs_embeds`,
    # https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L388-L391; the same in every catalog family)
    resid = 3 * r * arch.hidden_size
    # the MLP's input: post_attention_layernorm's output; OLMo-2's MLP reads the post-attention sum itself
    norm_out = r * arch.hidden_size if arch.family.norm_placement == "pre" else 0
    # live at act·up: act, up and the product in the linears' output dtype (r with a 4-bit base, whose layer
    # casts its output back to the input dtype); fused: the [T, 2I] output lives beside act and product
    out = linear_output_bytes(cfg)
    mlp_live = (4 if fused_gate_up(arch) else 3) * out * inter
    mlp = tokens * (resid + norm_out + max(mlp_live, lora_nograd_mlp_per_token(cfg, arch)))
    if cfg.load_in_4bit:  # the down_proj call's instant, if larger
        at_down = tokens * (resid + norm_out + nograd_4bit_down_proj_per_token(cfg, arch))
        down = "down_proj" if any(lin.name == "down_proj" for lin in arch.layer_linears) else None
        mlp = max(mlp, at_down + dequantized_weight_transient(cfg, arch, down))
    if arch.is_moe:  # + the wrapped expert stacks merged for this layer's forward (terms/moe_lora.py)
        mlp = tokens * (resid + norm_out + moe_nograd_per_token(cfg, arch))
        mlp += moe_lora.merged_weights(cfg, arch) + moe_lora.factor_copies(cfg, arch)
    # the model's forward builds the mask once and holds it through the layer loop (transformers 5.23
    # https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L380;
    # https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/gemma3/modeling_gemma3.py#L541-L555), so it is live at
    # the MLP too: eager's additive mask, sdpa's bool mask when a sliding layer needs one, else nothing
    mask = attention_mask_bytes(cfg, arch, batch, seq_len)
    rot = nograd_rotary_peak(cfg, arch, batch, seq_len) if rotary else 0
    if cfg.attn_implementation != "eager":
        return max(mlp + mask, rot)
    # beside the scores: the rotated q (`query_bytes`), K/V repeated to every head from the r-byte cache
    # (`repeat_kv` copies them when 1 < kv_heads < heads), the layer's input, its norm's output and `inputs_embeds`
    # (as above); Phi-3's fused projection output stays bound to the local `qkv` through the attention call
    # (transformers 5.23 https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/phi3/modeling_phi3.py#L218-L238), q/k/v being views of it
    qkv = query_bytes(cfg, arch) * arch.q_dim
    # (with one KV head `repeat_kv`'s reshape is a view, see `kv_heads_in_attention`; the copy eager's matmul
    # makes for bmm is freed when the matmul returns, before the softmax)
    qkv += 2 * r * arch.num_heads * arch.head_dim if 1 < arch.num_kv_heads < arch.num_heads else 0
    if fused_qkv(arch):
        qkv += linear_output_bytes(cfg) * (arch.q_dim + 2 * arch.kv_dim)
    attn = tokens * (
        arch.num_heads * seq_len * eager_nograd_bytes(cfg, arch)
        + _residuals_at_attention(arch) * arch.hidden_size * r
        + qkv
    )
    # the probabilities (in q's dtype) outlive the attention: every catalog decoder layer binds them to a local
    # (`hidden_states, _ = self.self_attn(...)`, transformers 5.23
    # https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/models/llama/modeling_llama.py#L297)
    # until the layer returns, so they are live through the MLP
    probs = tokens * arch.num_heads * seq_len * query_bytes(cfg, arch)
    return max(max(mlp + probs, attn) + mask, rot)
