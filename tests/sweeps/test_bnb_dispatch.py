"""The tracer's 4-bit matmuls follow bitsandbytes' own CUDA dispatch for the card a trace stands for.

Cases worked by hand from bitsandbytes 0.50.2 backends/cuda/ops.py (`bitsandbytes::gemm_4bit` and
`_gemm_4bit_use_custom_cuda`): past 1536 rows the weight is always dequantized; at 4 rows or fewer the fused kernel
always runs; between, a Qwen3-4B down projection (N = 2560, K = 9728: 40 blocks of 64 outputs) on an H100 (sm90,
132 SMs; under half a wave) dequantizes from 8 rows, while its gate projection (N = 9728, K = 2560: 152 blocks) on
an A100 (sm80, 108 SMs; over one wave, K < N) keeps the fused kernel up to 64 rows."""

from __future__ import annotations

import pytest
import torch

from sweeps.trace import bnb_dispatch
from sweeps.trace.bnb_dispatch import H100, TargetGPU, dequantizes

A100 = TargetGPU("A100 SXM", 108, 8, 0)


def test_past_1536_rows_and_at_four_or_fewer():
    assert dequantizes(1537, 2560, 9728, torch.bfloat16)
    assert not dequantizes(4, 2560, 9728, torch.bfloat16) and not dequantizes(1, 9728, 2560, torch.bfloat16)


def test_the_card_decides_between():
    assert bnb_dispatch._heuristic() is not None  # read from the installed bitsandbytes
    assert dequantizes(8, 2560, 9728, torch.bfloat16, H100)
    assert not dequantizes(64, 9728, 2560, torch.bfloat16, A100)
    assert dequantizes(65, 9728, 2560, torch.bfloat16, A100)


def test_the_emulated_layer_dequantizes_at_a_decode_step_on_an_h100():
    pytest.importorskip("bitsandbytes")
    from torch.utils._python_dispatch import TorchDispatchMode

    from sweeps.trace.fake_model import bnb_subclass

    class Shapes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):
                self.seen.append(tuple(out.shape))
            return out

    model = bnb_subclass()(torch.nn.Linear(9728, 2560, bias=False), torch.bfloat16, False)
    for rows, weight_seen in ((8, True), (4, False)):  # a decode step of 8 sequences; one of 4
        rec = Shapes()
        with torch.no_grad(), rec:
            model(torch.zeros(rows, 1, 9728, dtype=torch.bfloat16))
        assert ((2560, 9728) in rec.seen) == weight_seen
