"""The tracer's 4-bit emulation allocates the same weight-shaped tensors in backward as bitsandbytes itself.

The oracle is a real `bnb.nn.Linear4bit` quantized on CPU (bitsandbytes 0.50's `MatMul4Bit.backward` runs the same
code on every device): what its backward writes at the weight's shape, dtype by dtype, is compared with
`fake_model.Emulated4bitLinear`'s."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

OUT, IN, ROWS = 96, 64, 2048  # ROWS > GEMM_4BIT_CUSTOM_MAX_M: the dequantize + F.linear path


class _WeightShaped(TorchDispatchMode):
    """Records the dtype of every op output shaped like the [OUT, IN] weight (or its transpose)."""

    def __init__(self) -> None:
        super().__init__()
        self.dtypes: list[torch.dtype] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and tuple(t.shape) in ((OUT, IN), (IN, OUT)) and t._base is None:
                self.dtypes.append(t.dtype)
        return out


def _backward_weight_dtypes(layer: torch.nn.Module, load: torch.dtype) -> list[torch.dtype]:
    x = torch.randn(ROWS, IN, dtype=load, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    rec = _WeightShaped()
    with rec:
        y.float().sum().backward()
    return sorted(rec.dtypes, key=str)


@pytest.mark.parametrize("load", [torch.float32, torch.bfloat16])
def test_emulated_4bit_backward_dequantizes_like_bitsandbytes(load):
    bnb = pytest.importorskip("bitsandbytes")
    from sweeps.trace import fake_model

    torch.manual_seed(0)
    base = torch.nn.Linear(IN, OUT, bias=False, dtype=load)
    real = bnb.nn.Linear4bit(IN, OUT, bias=False, compute_dtype=load, quant_type="nf4")
    real.weight = bnb.nn.Params4bit(base.weight.data.clone(), requires_grad=False, quant_type="nf4")
    real = real.to("cpu")  # quantizes: QuantState.dtype is the load dtype
    assert real.weight.dtype == torch.uint8 and real.weight.quant_state.dtype == load
    emulated = fake_model.Emulated4bitLinear(base, load, nested=False)

    expected = _backward_weight_dtypes(real, load)
    # written out by hand: an fp32 load under bf16 autocast dequantizes in fp32 and casts to the bf16 gradient;
    # a bf16 load dequantizes once
    assert expected == ([torch.bfloat16, torch.float32] if load == torch.float32 else [torch.bfloat16])
    assert _backward_weight_dtypes(emulated, load) == expected
