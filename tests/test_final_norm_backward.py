"""The final norm's backward instant (`final_norm_backward_per_token`) against a real backward, op by op.

Thirty traced rows peaked in the final norm's backward and the estimate was above every one of them (up to
+3.3 %, a Phi-3-mini fp16 full fine-tune): it held the incoming gradient, the normalized value the weight
multiply saves and the norm's output, all released by the time the norm's pow runs its backward. Here a tiny
two-layer model runs its forward and backward under a dispatch mode that counts every storage it writes. At the
largest instant of the norm's backward (from the start of backward to its closing add), what the backward wrote
is the norm's five fp32 products and nothing else (the incoming gradient is gone), and of what the forward left
only the normalized value of a trainable weight has been released; the norm's fp32 copy of its input is counted
with the term.
"""

from __future__ import annotations

import pytest
import torch
from live_bytes import BackwardBorn
from tiny_models import TINY_TWO_LAYER, H, tiny_causal_lm

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms import activations as act

B, L = 2, 48


def _backward_log(model_type: str, dtype: str, lora: bool) -> list[tuple[str, int, int]]:
    """The tiny model's backward, op by op: (op, bytes the backward wrote that are live, forward bytes released)."""
    model = tiny_causal_lm(model_type, dtype)
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).base_model.model
    model.train()
    mode = BackwardBorn(list(model.parameters()))
    ids = torch.randint(1, TINY_TWO_LAYER["vocab_size"], (B, L))
    with mode:
        loss = model.model(input_ids=ids).last_hidden_state.float().sum()
        mode.backward = True
        loss.backward()
    return mode.log


def _measured_per_token(model_type: str, dtype: str, lora: bool) -> tuple[float, float]:
    """(bytes the backward wrote that are live at the norm's largest instant, forward bytes released by then),
    per token."""
    log = _backward_log(model_type, dtype, lora)
    # the norm's backward ends by adding the pow's gradient to the multiply's (Gemma's top layer then runs its
    # post-feedforward norm's backward before any matmul's)
    ops = [op for op, _, _ in log]
    end = ops.index("add", ops.index("pow"))
    op, born, released = max(log[:end], key=lambda e: e[1])
    return born / (B * L), released / (B * L)


def _post_norm_measured_per_token(model_type: str, dtype: str, lora: bool) -> tuple[float, float]:
    """Gemma's top-layer post-feedforward norm, the second norm whose backward runs (after the final norm's):
    (bytes the backward wrote that are live at its largest instant, forward bytes released since it began), per
    token."""
    log = _backward_log(model_type, dtype, lora)
    ops = [op for op, _, _ in log]
    start = ops.index("add", ops.index("pow"))  # the final norm's backward ends here
    end = ops.index("add", ops.index("pow", start))
    _, born, released = max(log[start + 1 : end], key=lambda e: e[1])
    # what the final norm's backward left: its fp32 sum and the two addends (the add's own inputs, still live
    # while it returns), freed before the post-norm's products
    return born / (B * L), (released - log[start][2]) / (B * L)


@pytest.mark.parametrize(
    ("model_type", "dtype", "lora"),
    [
        ("gemma3_text", "float16", False),
        ("gemma3_text", "bfloat16", False),
        ("gemma2", "float32", False),
        ("gemma3_text", "float16", True),
        # OLMo-2's layer ends with its post-feedforward norm too
        ("olmo2", "bfloat16", False),
        ("olmo2", "float32", False),
        ("olmo2", "float16", True),
    ],
)
def test_gemma_post_norm_backward_matches_a_real_backward(model_type, dtype, lora):
    born, released = _post_norm_measured_per_token(model_type, dtype, lora)
    r = torch.finfo(getattr(torch, dtype)).bits // 8
    # by hand: the incoming residual gradient (r·H, live across the layer) and the five fp32 products
    assert born == pytest.approx(r * H + 5 * 4 * H, abs=0.1 * H)
    # the weight multiply released the fp32 normalized value it saved when the weight trains
    assert released == pytest.approx(0 if lora else 4 * H, abs=0.15 * H)
    arch = from_config({"model_type": model_type, **TINY_TWO_LAYER}, name="tiny")
    cfg = RunConfig(
        model="tiny", dtype=dtype, bf16=False, use_peft=lora, lora_target_modules=["q_proj", "v_proj"]
    )
    # the term: the products, net of what the norm had saved and released (the gradient is hidden_states)
    assert act.gemma_post_norm_backward_per_token(cfg, arch) == pytest.approx(
        born - r * H - released, abs=0.15 * H
    )


def test_other_families_have_no_post_norm_backward():
    arch = from_config({"model_type": "llama", **TINY_TWO_LAYER}, name="tiny")
    assert act.gemma_post_norm_backward_per_token(RunConfig(model="tiny"), arch) == 0
