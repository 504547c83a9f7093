"""The no-grad rotary instant (`nograd_rotary_per_token`) against transformers' own attention forward, op by op.

A Qwen3-0.6B step loaded in fp32 under bf16 autocast (a 112-sequence prefill) peaks inside
the last layer's `apply_rotary_pos_emb`, before its K/V entered the cache: q after q_norm, `q * cos`,
`rotate_half(q) * sin` and their sum, all fp32, beside k and v. Here a real `Qwen3Attention` / `LlamaAttention`
runs one no-grad forward under a dispatch mode that counts every storage it writes. Its hidden-states input is
given (the residual stream the term adds, 3·r·H, lives outside the module), so the measured peak, less autocast's
cached bf16 copies of fp32 weights (which `autocast_weight_cache` counts), is T times the term less 3·r·H.
"""

from __future__ import annotations

import pytest
import torch
from live_bytes import LivePeak

from estimator.model.architecture import from_config
from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

B, L = 2, 64
TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 128,
    "num_hidden_layers": 1,
    "vocab_size": 100,
}


def _measured_per_token(model_type: str, dtype: str, autocast: bool) -> float:
    import transformers
    from transformers.models.llama import modeling_llama
    from transformers.models.olmo2 import modeling_olmo2
    from transformers.models.qwen3 import modeling_qwen3

    attention, rotary_embedding = {
        "qwen3": (modeling_qwen3.Qwen3Attention, modeling_qwen3.Qwen3RotaryEmbedding),
        "llama": (modeling_llama.LlamaAttention, modeling_llama.LlamaRotaryEmbedding),
        "olmo2": (modeling_olmo2.Olmo2Attention, modeling_olmo2.Olmo2RotaryEmbedding),
    }[model_type]
    conf = transformers.AutoConfig.for_model(model_type, **TINY)
    conf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    attn = attention(conf, 0).to(getattr(torch, dtype))
    rotary = rotary_embedding(conf)
    hidden = torch.randn(B, L, TINY["hidden_size"], dtype=getattr(torch, dtype))
    positions = torch.arange(L)[None].expand(B, L)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        cos, sin = rotary(hidden, positions)
        with LivePeak([*attn.parameters(), hidden, cos, sin]) as mode:
            attn(hidden, (cos, sin), attention_mask=None)
    # autocast caches the bf16 copy of an fp32 leaf weight (q/k/v's here, made before rotary)
    cached = sum(
        2 * p.numel()
        for name, p in attn.named_parameters()
        if autocast and dtype == "float32" and name.split(".")[0] in ("q_proj", "k_proj", "v_proj")
    )
    return (mode.peak - cached) / (B * L)


# the cases where rotary is the attention's largest instant: whenever it promotes (an fp32 load, or fp16 under
# bf16 autocast), and Llama in bf16; a bf16 Qwen3 peaks (by its [T, heads, 1] statistics) inside q_norm instead
CASES = [
    ("qwen3", "float32", True),
    ("qwen3", "float16", True),
    ("llama", "float32", True),
    ("llama", "float16", True),
    ("llama", "bfloat16", True),
    ("llama", "float16", False),
    # OLMo-2: fp32 cos/sin in every dtype, q_embed (fp32) waits for k's rotary, both cast back
    ("olmo2", "float32", True),
    ("olmo2", "bfloat16", True),
    ("olmo2", "float16", False),
    ("olmo2", "float32", False),
]


@pytest.mark.parametrize(("model_type", "dtype", "autocast"), CASES)
def test_rotary_instant_matches_the_attention_forward(model_type, dtype, autocast):
    arch = from_config({"model_type": model_type, **TINY}, name="tiny")
    cfg = RunConfig(model="tiny", dtype=dtype, bf16=autocast, use_peft=False)
    # inputs_embeds, the layer's input and input_layernorm's output; OLMo-2 has no input_layernorm
    residual = (2 if model_type == "olmo2" else 3) * act.residual_bytes(cfg) * TINY["hidden_size"]
    assert (
        _measured_per_token(model_type, dtype, autocast) == act.nograd_rotary_per_token(cfg, arch) - residual
    )


def test_rotary_instant_by_hand_for_the_seed_g_row():
    # Qwen3-0.6B (H 1024, q 16x128, kv 8x128) in fp32 under bf16 autocast, LoRA on q/v: q_norm promotes q and k
    # to fp32 (4 B); q, q*cos, rotate_half(q)*sin, the sum: 4 x 4 x 2048; k 4 x 1024, v (bf16) 2 x 1024;
    # inputs_embeds, the layer's input, its norm's output: 3 x 4 x 1024 -> 51200 bytes a token (the traced
    # row's tensors at its peak: 12,916 MiB over 112 x 2316 tokens, less the 253 MiB rotary tables)
    cfg = RunConfig(model="Qwen/Qwen3-0.6B", dtype="float32", bf16=True, use_peft=True)
    arch = resolve_model("Qwen/Qwen3-0.6B")
    assert act.nograd_rotary_per_token(cfg, arch) == 4 * 4 * 2048 + 4 * 1024 + 2 * 1024 + 3 * 4 * 1024
    # the MLP instant the prefill used alone: 3 residuals + norm (4 x 4 x 1024) + act, up, product (3 x 2 x 3072)
    assert act.nograd_forward_peak(cfg, arch, 1, 1, rotary=False) == 4 * 4 * 1024 + 3 * 2 * 3072
    assert act.nograd_forward_peak(cfg, arch, 1, 1) == 51200
