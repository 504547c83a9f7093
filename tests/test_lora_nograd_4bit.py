"""The no-grad LoRA MLP instant on a 4-bit base without autocast (`lora_nograd_mlp_per_token`), op by op.

The tracer's emulated 4-bit layers are `bnb.nn.Linear4bit` subclasses, so peft wraps them with its bnb
wrapper as on a GPU: the base result is cloned and, without autocast, the scaled adapter output is cast to the
result's dtype before the add, so nothing promotes. Here a real `LlamaMLP` with that emulated 4-bit base (on real CPU tensors, M below
bnb's dequantize threshold) and peft's LoRA on gate/up/down runs one no-grad forward under a dispatch mode that
counts every storage it writes; its input is given.
"""

from __future__ import annotations

import pytest
import torch
from live_bytes import LivePeak
from tiny_models import INTER, TINY_ONE_LAYER, H

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

B, L = 2, 96
TINY = TINY_ONE_LAYER


def _measured_per_token(load: torch.dtype) -> float:
    peft = pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    import transformers
    from transformers.models.llama import modeling_llama

    from sweeps.trace import fake_model

    conf = transformers.AutoConfig.for_model("llama", **TINY)
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        is_loaded_in_4bit = True  # what LoraModel reads to offer peft's bnb dispatcher

        def __init__(self) -> None:
            super().__init__()
            self.mlp = modeling_llama.LlamaMLP(conf).to(load)

        def forward(self, x):
            return self.mlp(x)

    block = Block()
    for name in ("gate_proj", "up_proj", "down_proj"):
        base = getattr(block.mlp, name)
        setattr(block.mlp, name, fake_model.bnb_subclass()(base, load, nested=False))
    model = peft.get_peft_model(
        block, peft.LoraConfig(r=4, lora_dropout=0.0, target_modules=["gate_proj", "up_proj", "down_proj"])
    )
    for name, p in model.named_parameters():  # TRL casts a QLoRA's adapters to bf16 (grpo_trainer.py:538-541)
        if "lora_" in name:
            p.data = p.data.to(torch.bfloat16)
    model.train()
    x = torch.randn(B, L, H, dtype=load)
    with torch.no_grad(), LivePeak([*model.parameters(), *model.buffers(), x]) as mode:
        model(x)
    return mode.peak / (B * L)


def test_fp16_qlora_up_proj_instant_holds_no_promoted_sum():
    measured = _measured_per_token(torch.float16)
    # written out by hand: at up_proj's adapter, act(gate), the cloned base result, then lora_B's output and its
    # scaled product (all 2-byte [T, I]; the cast back and the fp16 sum take their places), and x's bf16 copy
    # for lora_A [T, H]. peft's generic wrapper would promote the fp16 + bf16 sum to fp32: 10 · I.
    assert measured == 8 * INTER + 2 * H
    arch = from_config({"model_type": "llama", **TINY}, name="tiny")
    cfg = RunConfig(
        model="tiny",
        dtype="float16",
        bf16=False,
        use_peft=True,
        load_in_4bit=True,
        lora_target_modules=["gate_proj", "up_proj", "down_proj"],
        lora_dropout=0.0,
    )
    assert act.lora_nograd_mlp_per_token(cfg, arch) == measured
