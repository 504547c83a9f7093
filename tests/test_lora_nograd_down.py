"""The no-grad down_proj LoRA instant (`lora_nograd_down_input_per_token`), op by op.

Generation runs the policy's forward under no_grad in train mode, so a LoRA on down_proj pushes its [T, I] input
through a dtype cast, the adapter's dropout and autocast's cast for lora_A. A validation prefill (gemma-3-1b, bf16
LoRA r64 on every linear, dropout 0.05) was over-predicted by 3 %: the term held the dropout's bool mask beside
autocast's copy (the mask is dropped when the op returns) and left out the base result peft computes first.
Here a real `LlamaMLP` (bf16) with peft's LoRA on down_proj runs one no-grad forward in train mode under CPU
autocast and a dispatch mode that counts every storage it writes. Dropout is sent through `native_dropout`, the
fused kernel `at::dropout` uses on CUDA (ATen Dropout.cpp `is_fused_kernel_acceptable`; CPU decomposes it into
a noise tensor instead); the MLP's input is given.
"""

from __future__ import annotations

import pytest
import torch
from live_bytes import LivePeak
from tiny_models import INTER, TINY_ONE_LAYER, H, cuda_dropout

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

B, L, R = 4, 256, 4
TINY = TINY_ONE_LAYER


def _measured_per_token(dropout: float, monkeypatch) -> float:
    peft = pytest.importorskip("peft")
    import transformers
    from transformers.models.llama import modeling_llama

    monkeypatch.setattr(torch.nn.functional, "dropout", cuda_dropout)
    conf = transformers.AutoConfig.for_model("llama", **TINY)
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = modeling_llama.LlamaMLP(conf).to(torch.bfloat16)

        def forward(self, x):
            return self.mlp(x)

    # peft keeps the adapters in fp32 on a bf16 base (autocast_adapter_dtype=True)
    model = peft.get_peft_model(
        Block(), peft.LoraConfig(r=R, lora_dropout=dropout, target_modules=["down_proj"])
    )
    model.train()
    x = torch.randn(B, L, H, dtype=torch.bfloat16)
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16),
        LivePeak([*model.parameters(), *model.buffers(), x]) as mode,
    ):
        model(x)
    return mode.peak / (B * L)


def _cfg(dropout: float) -> tuple[RunConfig, object]:
    arch = from_config({"model_type": "llama", **TINY}, name="tiny")
    cfg = RunConfig(
        model="tiny",
        dtype="bfloat16",
        bf16=True,
        use_peft=True,
        lora_r=R,
        lora_target_modules=["down_proj"],
        lora_dropout=dropout,
    )
    return cfg, arch


@pytest.mark.parametrize("dropout", [0.05, 0.0])
def test_down_proj_adapter_chain_beside_the_base_result(dropout, monkeypatch):
    measured = _measured_per_token(dropout, monkeypatch)
    # by hand, at lora_A's matmul: the bf16 act·up product (2·I), down_proj's bf16 base result (2·H), the
    # product's fp32 copy for the fp32 adapter (4·I), dropout's fp32 output (4·I; its bool mask is gone) and
    # autocast's bf16 copy of it (2·I); without dropout the fp32 copy goes to lora_A directly. Beside them:
    # lora_A's [T, r] bf16 output and autocast's bf16 casts of the two adapter weights (a few bytes per token).
    chain = (2 + 4 + (4 if dropout else 0) + 2) * INTER + 2 * H
    small = 2 * R + 2 * R * (INTER + H) / (B * L)
    assert measured == pytest.approx(chain + small, abs=2)
    cfg, arch = _cfg(dropout)
    assert act.lora_nograd_down_input_per_token(cfg, arch) == chain
