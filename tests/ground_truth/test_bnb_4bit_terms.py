"""The bnb 4-bit instants, byte for byte, from bitsandbytes 0.50's code paths written out by hand.

Qwen2.5-7B: H = 3584, I = 18944, gate/up/down all [3584 x 18944]; Phi-3-mini: H = 3072, I = 8192, gate_up
[16384 x 3072], down [3072 x 8192]. A load in fp32 under bf16 autocast dequantizes in fp32 (`QuantState.dtype`)
and casts to bf16: 6 bytes per weight element; a bf16 load: 2; an fp16 load under bf16 autocast: 2 + 2."""

from __future__ import annotations

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

Q7 = resolve_model("7B")
PHI3 = resolve_model("microsoft/Phi-3-mini-4k-instruct")
H, INTER = 3584, 18944


def _cfg(dtype: str, **kw) -> RunConfig:
    return RunConfig(model="7B", dtype=dtype, use_peft=True, load_in_4bit=True, **kw)


def test_dequantized_weight_bytes_follow_the_load_dtype_and_autocast():
    assert act.dequantized_weight_transient(_cfg("float32"), Q7) == H * INTER * (4 + 2)
    assert act.dequantized_weight_transient(_cfg("bfloat16"), Q7) == H * INTER * 2
    assert act.dequantized_weight_transient(_cfg("float16"), Q7) == H * INTER * (2 + 2)
    assert act.dequantized_weight_transient(_cfg("float16", bf16=False), Q7) == H * INTER * 2
    phi = RunConfig(
        model="microsoft/Phi-3-mini-4k-instruct", dtype="bfloat16", use_peft=True, load_in_4bit=True
    )
    assert act.dequantized_weight_transient(phi, PHI3) == 16384 * 3072 * 2  # gate_up, the largest
    assert act.dequantized_weight_transient(phi, PHI3, "down_proj") == 3072 * 8192 * 2


def test_forward_at_the_down_projection_holds_the_product_its_cast_and_the_weight():
    tokens = 4096
    # fp32 product, its bf16 cast, and the down weight in fp32 + bf16
    assert (
        act.bnb_4bit_forward_transient(_cfg("float32"), Q7, tokens)
        == tokens * INTER * (4 + 2) + H * INTER * 6
    )
    # bf16 load: no casts
    assert act.bnb_4bit_forward_transient(_cfg("bfloat16"), Q7, tokens) == tokens * INTER * 2 + H * INTER * 2
    # at 1536 rows and fewer an H100 dequantizes too (bitsandbytes' per-card heuristic); only at 4 rows or fewer does
    # every CUDA card run the fused kernel, which writes the output directly
    assert act.bnb_4bit_forward_transient(_cfg("bfloat16"), Q7, 1024) == 1024 * INTER * 2 + H * INTER * 2
    assert act.bnb_4bit_forward_transient(_cfg("float32"), Q7, 4) == 0
    assert act.bnb_4bit_forward_transient(RunConfig(model="7B", use_peft=True), Q7, tokens) == 0


def test_nested_quant_adds_the_fp32_absmax_bitsandbytes_dequantizes():
    # 3584 x 18944 / 64 = 1,060,864 blocks: one fp32 copy is 4,243,456 bytes
    copy = 4_243_456
    nested = _cfg("bfloat16", use_bnb_nested_quant=True)
    # the forward's fallback keeps the dequantized absmax and its sum with the offset: two copies
    assert act.dequantized_weight_transient(nested, Q7) == H * INTER * 2 + 2 * copy
    # backward's dequantize_4bit adds the offset in place: one copy
    assert act.dequantized_weight_transient(nested, Q7, backward=True) == H * INTER * 2 + copy
    # an fp32 load under bf16 autocast: the absmax is freed before backward's bf16 cast, the larger of the two
    n32 = _cfg("float32", use_bnb_nested_quant=True)
    assert act.dequantized_weight_transient(n32, Q7) == H * INTER * 6 + 2 * copy
    assert act.dequantized_weight_transient(n32, Q7, backward=True) == H * INTER * 6
    # without nested quant the absmax is used as stored
    assert act.dequantized_weight_transient(_cfg("bfloat16"), Q7, backward=True) == H * INTER * 2


def test_recompute_holds_the_product_gradient_only_when_down_proj_is_not_wrapped():
    tokens = 4096
    gc = _cfg("float32", gradient_checkpointing=True)
    assert act.bnb_4bit_recompute_gradient(gc, Q7, tokens) == tokens * INTER * 4  # PEFT default targets: q, v
    wrapped = _cfg("float32", gradient_checkpointing=True, lora_target_modules=("all-linear",))
    assert act.bnb_4bit_recompute_gradient(wrapped, Q7, tokens) == 0
    assert act.bnb_4bit_recompute_gradient(_cfg("float32", gradient_checkpointing=False), Q7, tokens) == 0


def test_backward_at_a_dequantized_weight():
    tokens = 4096
    cfg = _cfg("float32")
    incoming = tokens * H * 4  # the layer's incoming gradient, fp32 residual
    grads = tokens * (
        4 * INTER + 2 * H
    )  # a [T, INTER] input gradient (r) and the output gradient's bf16 cast
    assert act.bnb_4bit_backward_instant(cfg, Q7, tokens) == incoming + grads + H * INTER * 6
    assert act.bnb_4bit_backward_instant(RunConfig(model="7B", use_peft=True), Q7, tokens) == 0


def test_the_fused_head_backward_holds_two_weight_chunk_casts():
    """TRL 1.16 chunked_logprob backward: `w_chunk = weight[start:end].to(compute_dtype)` rebinds, so the previous
    chunk's cast is alive while the next one is made. SmolLM2-135M: V = 49152, H = 576: tiles of 32768 and
    16384; an fp32 load under bf16 autocast casts each (2 bytes)."""
    from estimator.terms.logprob_head import weight_cast_rebinding

    smol = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    fp32 = RunConfig(model="HuggingFaceTB/SmolLM2-135M-Instruct", dtype="float32", use_peft=True)
    assert weight_cast_rebinding(fp32, smol, 1000) == 16384 * 576 * 2  # the second tile beside the first
    bf16 = RunConfig(model="HuggingFaceTB/SmolLM2-135M-Instruct", dtype="bfloat16", use_peft=True)
    assert weight_cast_rebinding(bf16, smol, 1000) == 0  # `.to` returns the bf16 weight itself
    # Qwen2.5-7B, V = 152064: four full tiles and a last one of 20992; past one token chunk the last tile meets
    # the next chunk's first, but the first two tiles (32768 each) are the larger pair
    q7 = RunConfig(model="7B", dtype="float32", use_peft=True)
    assert weight_cast_rebinding(q7, Q7, 8192) == 32768 * H * 2
