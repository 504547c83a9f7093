"""The RMSNorm backward term against the modules' own backward, measured op by op.

`rmsnorm_backward_transient_per_token` says every catalog family's RMSNorm backward holds five fp32 [T, H]
products at once beyond what the norm saved and its incoming gradient. Here transformers' own `LlamaRMSNorm` and
`Gemma3RMSNorm` run a backward under a dispatch mode that counts every tensor the backward writes; the peak of
those, per token, is compared with the term (the [T, 1] fp32 statistics are the only slack)."""

from __future__ import annotations

import pytest
import torch
from live_bytes import LivePeak

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

T = 512


@pytest.mark.parametrize("model", ["HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-1b-it"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("trainable", [True, False])
def test_rmsnorm_backward_holds_five_fp32_products(model, dtype, trainable):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    arch = resolve_model(model)
    h = arch.hidden_size
    norm = (Gemma3RMSNorm if "gemma" in model else LlamaRMSNorm)(h).to(getattr(torch, dtype))
    norm.weight.requires_grad_(trainable)
    x = torch.randn(T, h, dtype=getattr(torch, dtype), requires_grad=True)
    y = norm(x)
    grad = torch.randn_like(y)
    peak = LivePeak()
    with peak:
        y.backward(grad)
    cfg = RunConfig(model=model, dtype=dtype, use_peft=not trainable)
    expected = T * act.rmsnorm_backward_transient_per_token(cfg, arch)
    assert expected == T * 20 * h  # five fp32 [T, H], written out
    slack = T * 4 * 4 + 2 * 4 * h  # a few [T, 1] fp32 statistics; the weight's [H] gradient and its fp32 copy
    assert expected <= peak.peak <= expected + slack
