"""A tiny two-layer causal LM built from a catalog family's transformers config, for tests that measure a real
forward / backward op by op against a memory term (nothing downloaded; random weights)."""

from __future__ import annotations

import torch

H = 64
TINY_TWO_LAYER = {
    "hidden_size": H,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "vocab_size": 50,
    "pad_token_id": 0,
}
INTER = TINY_TWO_LAYER["intermediate_size"]
TINY_ONE_LAYER = {**TINY_TWO_LAYER, "num_hidden_layers": 1}  # for a single decoder layer or MLP


def attn_implementation(model_type: str) -> str:
    """sdpa, except Gemma2/3, which transformers runs eagerly here (Gemma2 refuses sdpa)."""
    return "eager" if model_type.startswith("gemma") else "sdpa"


def tiny_causal_lm(model_type: str, dtype: str) -> torch.nn.Module:
    """`TINY_TWO_LAYER` as a `model_type` causal LM in `dtype` (seeded), in train mode is left to the caller."""
    import transformers

    conf = transformers.AutoConfig.for_model(model_type, **TINY_TWO_LAYER)
    conf._attn_implementation = attn_implementation(model_type)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(conf).to(getattr(torch, dtype))


def cuda_dropout(x, p=0.5, training=True, inplace=False):
    """`F.dropout` as CUDA runs it: `at::dropout` takes the fused `native_dropout` (an output and a bool mask;
    ATen Dropout.cpp `is_fused_kernel_acceptable`), where CPU decomposes it into a noise tensor instead."""
    return torch.ops.aten.native_dropout(x, p, training)[0] if training and p > 0 else x
