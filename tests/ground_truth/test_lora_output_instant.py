"""The LoRA adapter's add (`lora_output_peak_per_out`) against peft's own `lora.Linear` forward, measured op by op.

peft 0.21 computes `result = result + lora_B(lora_A(dropout(x))) * scaling` and casts the sum back to the base
result's dtype. A dispatch mode counts every tensor the forward writes (freed ones leave the count); beyond the
term's [T, out] tensors only the input's adapter-dtype copy [T, in] and lora_A's [T, r] output are live, so the
measured peak minus those two is exactly T · out · the term."""

from __future__ import annotations

import pytest
import torch
from harness import LivePeak

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

T, IN, OUT, R = 256, 64, 4096, 4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_adapter_add_matches_peft_forward(dtype):
    import peft

    base = torch.nn.Sequential()
    base.add_module("proj", torch.nn.Linear(IN, OUT, bias=False, dtype=getattr(torch, dtype)))
    model = peft.get_peft_model(base, peft.LoraConfig(r=R, target_modules=["proj"], lora_dropout=0.0))
    lora = model.base_model.model.proj
    assert lora.lora_A["default"].weight.dtype == torch.float32  # peft's autocast_adapter_dtype
    x = torch.randn(T, IN, dtype=getattr(torch, dtype), requires_grad=True)
    with LivePeak([*lora.parameters(), x]) as mode:
        y = lora(x)
    assert y.dtype == getattr(torch, dtype)
    cfg = RunConfig(model="0.5B", dtype=dtype, bf16=False, use_peft=True, lora_r=R, lora_dropout=0.0)
    copy = 0 if dtype == "float32" else 4 * T * IN  # _cast_input_dtype's fp32 copy, saved by lora_A
    measured = mode.peak - copy - 4 * T * R
    assert measured == T * OUT * act.lora_output_peak_per_out(cfg)


def test_adapter_add_by_hand():
    # fp16 base, fp32 adapter, no autocast: base 2 + lora_B 4 + product 4 at the multiply, 10 bytes per output;
    # bf16 autocast: all three in bf16, 6; a bnb 4-bit fp16 base with bf16 adapters: clone 2 + 2, then
    # base 2 + lora_B 2 + product 2, then product 2 + its fp16 cast 2 beside the clone 2: 6
    assert act.lora_output_peak_per_out(RunConfig(dtype="float16", bf16=False, use_peft=True)) == 10
    assert act.lora_output_peak_per_out(RunConfig(dtype="float32", bf16=True, use_peft=True)) == 6
    four_bit = RunConfig(dtype="float16", bf16=False, use_peft=True, load_in_4bit=True)
    assert act.lora_output_peak_per_out(four_bit) == 6


def test_fused_gate_up_add_exceeds_the_down_projection_instant():
    # Phi-3's gate_up_proj (out 2I) adds its fp32 adapter to an fp16 base before the MLP saves anything: 10·2I per
    # token, more than the down projection's input chain; a Qwen2 MLP's separate gate/up (out I) stays below it
    phi = resolve_model("microsoft/Phi-3-mini-4k-instruct")
    cfg = RunConfig(model="microsoft/Phi-3-mini-4k-instruct", dtype="float16", bf16=False, use_peft=True,
                    lora_target_modules=("all-linear",), lora_r=64, lora_dropout=0.05)  # fmt: skip
    assert act.lora_mlp_input_forward_transient_per_token(cfg, phi) > act.lora_forward_transient_per_token(
        cfg, phi
    )
    qwen = resolve_model("7B")
    cfg_q = RunConfig(
        model="7B", dtype="float16", bf16=False, use_peft=True, lora_target_modules=("all-linear",)
    )
    assert act.lora_mlp_input_forward_transient_per_token(cfg_q, qwen) < act.lora_forward_transient_per_token(
        cfg_q, qwen
    )


def test_down_proj_lora_input_is_released_before_the_multiply_backward():
    """A Llama-3.2-1B QLoRA step (fp32 load, bf16 autocast, all-linear r16, GC) peaks at the MLP's act·up
    backward: six fp32 [T, I] tensors live and no bf16 copy of the product, because down_proj's backward
    (which frees what its lora_A saved) runs first."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "results" / "traced" / "random" / "validation.jsonl"
    rows = [
        r
        for r in map(json.loads, path.read_text().splitlines())
        if r.get("status") == "ok" and r["seed"] == 73519 and r["config"]["max_completion_length"] == 5737
    ]
    assert len(rows) == 1, f"{path.name} should hold the one Llama-3.2-1B row with 5737-token completions"
    (row,) = rows
    cfg = RunConfig.from_dict(row["config"])
    inter = resolve_model(cfg.model).intermediate_size
    at_peak = row["observed"]["probes"]["tensors"]["phase_at_peak"]["train"]
    wide = [t for t in at_peak if t["shape"] and t["shape"][-1] == inter and len(t["shape"]) == 3]
    assert sum(t["count"] for t in wide if t["dtype"] == "float32") == 6
    assert not [t for t in wide if t["dtype"] == "bfloat16"]
    arch = resolve_model(cfg.model)
    # the multiply's three fp32 gradients (4-bit base: r-byte), less down's bf16 input copy and lora_A's bf16
    # output
    multiply = 3 * 4 * inter - (2 * inter + 2 * cfg.lora_r)
    # down_proj's own backward (bf16 adapters, no dropout) reaches the same, but for lora_A's [T, r] output:
    # lora_A's bf16 gradient 2 as its bf16 input copy is released (-2), the copy's backward in fp32 4, the base's
    # bf16 gradient cast to fp32 4 and the input buffer's fp32 sum 4: 10 x I
    chain = 10 * inter
    assert abs(chain - multiply) < 0.001 * chain
    assert act.layer_backward_transient_per_token(cfg, arch) == max(multiply, chain)
