"""`recompute_waiting_gradients` against a real checkpointed backward, op by op.

The held-out round-6 miss (Phi-3-mini fp16 LoRA on all linears, GC, -4.8 %) peaked in the top layer's recompute
with an fp32 [T, H] gradient and an fp16 one that the estimate did not hold: peft's adapter branch of down_proj
had already unwound (the copy back, the promoted add, the scalar multiply) when `lora_B`'s matmul unpacked its
input and started the recompute. Here a tiny two-layer model runs one forward and a backward under a
non-reentrant checkpoint; a pre-hook on the top layer's first module reads, at the first recomputed op, the bytes
of every tensor the backward has written and still holds. The expected bytes per token are written out by hand
from the code paths (the incoming residual gradient in the residual dtype, plus what waits), in units of H.
"""

from __future__ import annotations

import pytest
import torch
from live_bytes import LivePeak
from tiny_models import TINY_TWO_LAYER, H, attn_implementation, tiny_causal_lm

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

B, L = 2, 48

ALL = ["all-linear"]
QV = ["q_proj", "v_proj"]
# (model_type, load dtype, bf16 autocast, LoRA targets, hand-computed bytes per token / H at the recompute:
#  incoming gradient + what waits)
CASES = [
    # fp16 residual gradient 2; the add promoted fp16 + fp32 adapter: base-branch cast 2, fp32 scaled 4
    ("phi3", "float16", False, ALL, 2 + 2 + 4),
    ("llama", "float16", False, ALL, 2 + 2 + 4),
    # same dtype everywhere: the scaled gradient only
    ("llama", "bfloat16", True, ALL, 2 + 2),
    ("llama", "float32", False, ALL, 4 + 4),
    # fp32 residual, bf16 MLP output: the residual add's cast 2, the bf16 scaled gradient 2
    ("llama", "float32", True, ALL, 4 + 2 + 2),
    ("llama", "float32", True, QV, 4 + 2),
    # a frozen down_proj unpacks its weight at once: the incoming gradient alone
    ("llama", "float16", False, QV, 2),
    # Gemma: the post-feedforward norm's fp32 gradient (type_as's backward) waits, whatever LoRA wraps
    ("gemma2", "float32", True, ALL, 4 + 4),
    ("gemma3_text", "bfloat16", True, ALL, 2 + 4),
    ("gemma3_text", "bfloat16", True, QV, 2 + 4),
    # OLMo-2's post-feedforward norm ends the layer the same way (`(weight * x).to(input_dtype)`)
    ("olmo2", "bfloat16", True, ALL, 2 + 4),
    ("olmo2", "float32", True, QV, 4 + 4),
]


def _measured_per_token(model_type: str, dtype: str, autocast: bool, targets: list[str]) -> float:
    from peft import LoraConfig, get_peft_model

    model = tiny_causal_lm(model_type, dtype)
    model = get_peft_model(
        model, LoraConfig(r=4, lora_dropout=0.0, target_modules="all-linear" if targets == ALL else targets)
    )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    mode = LivePeak(list(model.parameters()))
    at_recompute: list[int] = []

    def first_recomputed_op(module, args):
        if mode_active and not at_recompute:
            at_recompute.append(mode.current)

    top = model.base_model.model.model.layers[-1]
    # the layer's first module: input_layernorm, or OLMo-2's attention (it has no input norm)
    getattr(top, "input_layernorm", top.self_attn).register_forward_pre_hook(first_recomputed_op)
    ids = torch.randint(1, TINY_TWO_LAYER["vocab_size"], (B, L))
    mode_active = False
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids).logits.float().sum()
    mode_active = True
    with mode:
        loss.backward()
    assert at_recompute, "the top layer was not recomputed"
    return at_recompute[0] / (B * L) / H


@pytest.mark.parametrize(("model_type", "dtype", "autocast", "targets", "expected"), CASES)
def test_gradients_waiting_at_the_recompute(model_type, dtype, autocast, targets, expected):
    measured = _measured_per_token(model_type, dtype, autocast, targets)
    # beside [T, H] tensors only scalars (the loss's ones_like, [T, 1] statistics): well under 0.1 · H per token
    assert measured == pytest.approx(expected, abs=0.1)

    arch = from_config({"model_type": model_type, **TINY_TWO_LAYER}, name="tiny")
    cfg = RunConfig(
        model="tiny",
        dtype=dtype,
        bf16=autocast,
        use_peft=True,
        lora_target_modules=targets,
        gradient_checkpointing=True,
        attn_implementation=attn_implementation(model_type),
    )
    tokens = B * L
    incoming = act.hidden_states(cfg, arch, tokens)
    assert (incoming + act.recompute_waiting_gradients(cfg, arch, tokens)) / tokens / H == expected


def test_nothing_waits_without_checkpointing():
    arch = from_config({"model_type": "llama", **TINY_TWO_LAYER}, name="tiny")
    cfg = RunConfig(
        model="tiny", dtype="float16", use_peft=True, lora_target_modules=ALL, gradient_checkpointing=False
    )
    assert act.recompute_waiting_gradients(cfg, arch, B * L) == 0
