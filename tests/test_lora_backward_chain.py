"""A LoRA-wrapped linear's input-gradient backward (`lora_input_gradient_peak`), op by op.

Validation's worst row (+6.0 %, Qwen2.5-1.5B bf16 QLoRA on every linear, dropout 0.05, GC) was over-predicted at
the MLP's backward: the term held the base layer's input gradient waiting while the adapter chain ran its
backward, with everything the chain saved still live. The traced step shows the opposite order: peft builds the
adapter's nodes after the base's, autograd runs the adapter chain first and releases lora_A's saved input and
dropout's mask on the way, and the base's gradient comes last, summed out of place with the adapter's.

Here one peft-wrapped linear runs its forward with grad (train mode, dropout through `native_dropout`, CUDA's
fused kernel, as in tests/test_lora_nograd_down.py) and its backward under a dispatch mode that logs, op by op,
the bytes the backward wrote that are live and the forward bytes released; the largest net per input element is
the term. The input is held by autograd only, as the MLP's act·up product is.
"""

from __future__ import annotations

import pytest
import torch
from live_bytes import BackwardBorn
from tiny_models import cuda_dropout

from estimator.settings.config import RunConfig
from estimator.terms import activations as act

T, N, OUT, R = 512, 160, 8, 4


def _measured(load: str, adapter: str, autocast: bool, dropout: float, monkeypatch) -> float:
    peft = pytest.importorskip("peft")
    monkeypatch.setattr(torch.nn.functional, "dropout", cuda_dropout)
    torch.manual_seed(0)
    base = torch.nn.Sequential()
    base.add_module("proj", torch.nn.Linear(N, OUT, bias=False, dtype=getattr(torch, load)))
    model = peft.get_peft_model(base, peft.LoraConfig(r=R, target_modules=["proj"], lora_dropout=dropout))
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(getattr(torch, adapter))
    model.train()
    lin = model.base_model.model.proj
    x0 = torch.randn(T, N, dtype=getattr(torch, load), requires_grad=True)
    mode = BackwardBorn([*lin.parameters(), x0])
    with mode:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = lin(x0 * 1)
        grad = torch.ones_like(y)
        mode.backward = True
        y.backward(grad)
    return max(born - released for _, born, released in mode.log) / (T * N)


CASES = [
    # load, adapter, bf16 autocast, lora_dropout, by hand (bytes per input element)
    # bf16 base, bf16 adapters (a QLoRA's): lora_A's grad 2, its saved dropout output freed (-2), dropout's grad 2
    # then its own grad and the mask freed (-3), the base's grad 2 and the sum 2: 3
    ("bfloat16", "bfloat16", True, 0.05, 3),
    # no dropout: lora_A saved the input itself, released with it: grad 2 - 2, base 2, sum 2: 4
    ("bfloat16", "bfloat16", True, 0.0, 4),
    # fp32 adapters under autocast: lora_A's bf16 grad 2, its bf16 copy freed (-2), the copy's backward 4, the
    # bf16 grad freed (-2), dropout's grad 4 beside the first: 6
    ("bfloat16", "float32", True, 0.05, 6),
    ("bfloat16", "float32", True, 0.0, 4),
    # fp16 base, fp32 adapters, no autocast: lora_A's fp32 grad 4 while its input (dropout's fp32 output) is
    # released: 4 at the first op
    ("float16", "float32", False, 0.05, 4),
    # fp16 base, bf16 adapters (a QLoRA without autocast): as the first case, 3
    ("float16", "bfloat16", False, 0.05, 3),
    # fp32 load under autocast: the base's bf16 grad 2 cast to fp32 4 beside the adapter's fp32 4, then the sum 4
    ("float32", "float32", True, 0.05, 9),
]


@pytest.mark.parametrize(("load", "adapter", "autocast", "dropout", "by_hand"), CASES)
def test_adapter_chain_backward_matches_a_real_backward(
    load, adapter, autocast, dropout, by_hand, monkeypatch
):
    measured = _measured(load, adapter, autocast, dropout, monkeypatch)
    # the [T, OUT] gradients beside (lora_B's, the scaling's) add at most a byte or so per input element here
    assert measured == pytest.approx(by_hand, abs=0.5)
    # bf16 adapters are a QLoRA's (TRL casts a 4-bit base's adapters to bf16); the emulated 4-bit base computes its
    # input gradient as the 16-bit linear here does
    cfg = RunConfig(
        dtype=load, bf16=autocast, use_peft=True, lora_dropout=dropout, load_in_4bit=adapter == "bfloat16"
    )
    assert act.lora_input_gradient_peak(cfg, load) == by_hand
