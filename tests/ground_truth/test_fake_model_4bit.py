"""The tracer's 4-bit emulation allocates the same weight-shaped tensors in backward as bitsandbytes itself.

The oracle is a real `bnb.nn.Linear4bit` quantized on CPU (bitsandbytes 0.50's `MatMul4Bit.backward` runs the same
code on every device): what its backward writes at the weight's shape, dtype by dtype, is compared with
`fake_model.Emulated4bitLinear`'s; and peft wraps the emulated layer as it wraps the real one, so a LoRA forward
allocates the same output-shaped tensors on both."""

from __future__ import annotations

import weakref

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
    emulated = fake_model.bnb_subclass()(base, load, nested=False)

    expected = _backward_weight_dtypes(real, load)
    # written out by hand: an fp32 load under bf16 autocast dequantizes in fp32 and casts to the bf16 gradient;
    # a bf16 load dequantizes once
    assert expected == ([torch.bfloat16, torch.float32] if load == torch.float32 else [torch.bfloat16])
    assert _backward_weight_dtypes(emulated, load) == expected


class _OutputShaped(TorchDispatchMode):
    """Records (op, dtype) of every op output shaped [ROWS, OUT]: the base result, its clone, the adapter's adds."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and tuple(t.shape) == (ROWS, OUT):
                self.ops.append((func.overloadpacket.__name__, t.dtype))
        return out


def _lora_forward(layer: torch.nn.Module, load: torch.dtype, autocast: bool):
    """peft's LoRA on `layer` as get_peft_model builds it for a 4-bit model; (wrapper class, output-shaped ops)."""
    peft = pytest.importorskip("peft")

    class Tiny(torch.nn.Module):
        is_loaded_in_4bit = True  # what LoraModel reads to offer the bnb 4-bit dispatcher

        def __init__(self) -> None:
            super().__init__()
            self.proj = layer

        def forward(self, x):
            return self.proj(x)

    model = peft.get_peft_model(Tiny(), peft.LoraConfig(r=4, target_modules=["proj"], lora_dropout=0.0))
    x = torch.randn(ROWS, IN, dtype=load)
    rec = _OutputShaped()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast), rec:
        model(x)
    return type(model.base_model.model.proj), rec.ops


@pytest.mark.parametrize(
    "load,autocast",
    [(torch.float16, False), (torch.float32, False), (torch.bfloat16, False), (torch.float32, True)],
)
def test_peft_wraps_emulated_4bit_like_real_bitsandbytes(load, autocast):
    bnb = pytest.importorskip("bitsandbytes")
    from peft.tuners.lora.bnb import Linear4bit as PeftLinear4bit

    from sweeps.trace import fake_model

    torch.manual_seed(0)
    base = torch.nn.Linear(IN, OUT, bias=False, dtype=load)
    real = bnb.nn.Linear4bit(IN, OUT, bias=False, compute_dtype=load, quant_type="nf4")
    real.weight = bnb.nn.Params4bit(base.weight.data.clone(), requires_grad=False, quant_type="nf4")
    real = real.to("cpu")
    real_cls, real_ops = _lora_forward(real, load, autocast)
    emu_cls, emu_ops = _lora_forward(fake_model.bnb_subclass()(base, load, nested=False), load, autocast)

    assert real_cls is PeftLinear4bit and emu_cls is PeftLinear4bit
    # written out by hand from peft's lora.bnb.Linear4bit.forward: the base result, its defensive clone, the
    # adapter's B output and its scaling, then (without autocast) the cast back to the result dtype and the add
    assert [op for op, _ in real_ops].count("clone") == 1
    if autocast:
        return  # bnb's CPU kernel returns fp32 under autocast where the CUDA path's F.linear returns bf16
    # the base matmul itself is bnb's CPU kernel on one side and the CUDA path's dequantize + mm on the other;
    # its output's dtype, and every op after it, must agree
    assert real_ops[0][1] == emu_ops[0][1] == load and emu_ops[1:] == real_ops[1:]


def test_under_the_tracer_patches_peft_sees_autocast_as_on_a_gpu():
    """peft's bnb wrapper asks `torch.is_autocast_enabled()` (CUDA's state) whether to cast the adapter's input and
    output; the tracer autocasts on CPU tensors, so `patches.patched()` answers with CPU's. On a GPU under bf16
    autocast an fp32 QLoRA layer adds the bf16 scaled adapter output to the fp32 clone as it is (no cast back)."""
    pytest.importorskip("bitsandbytes")
    from sweeps.trace import fake_model, patches

    base = torch.nn.Linear(IN, OUT, bias=False, dtype=torch.float32)
    with patches.patched():
        cls, ops = _lora_forward(
            fake_model.bnb_subclass()(base, torch.float32, nested=False), torch.float32, True
        )
    # by hand: the base matmul under autocast (bf16) and bnb's cast back to the input's fp32, peft's clone, lora_B's
    # bf16 output and its scaled product, the promoted fp32 sum; no `output.to(expected_dtype)` copy
    assert ops == [
        ("mm", torch.bfloat16),
        ("_to_copy", torch.float32),
        ("clone", torch.float32),
        ("mm", torch.bfloat16),
        ("mul", torch.bfloat16),
        ("add", torch.float32),
    ]


BLOCKS = OUT * IN // 64  # the nested absmax, dequantized: one fp32 element per 4-bit block


class _AbsmaxCopies(TorchDispatchMode):
    """Every new fp32 tensor of BLOCKS elements (in-place ops left out), and how many of them are still referenced
    when a matmul runs."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list = []
        self.live_at_matmul: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in ("mm", "addmm", "matmul", "linear", "bmm"):
            self.live_at_matmul.append(sum(r() is not None for r in self.made))
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and not name.endswith("_") and out.dtype == torch.float32:
            if tuple(out.shape) == (BLOCKS,):
                self.made.append(weakref.ref(out))
        return out


def _nested_layer(real: bool):
    bnb = pytest.importorskip("bitsandbytes")
    from sweeps.trace import fake_model

    torch.manual_seed(0)
    base = torch.nn.Linear(IN, OUT, bias=False, dtype=torch.bfloat16)
    if not real:
        return fake_model.bnb_subclass()(base, torch.bfloat16, nested=True)
    layer = bnb.nn.Linear4bit(IN, OUT, bias=False, compute_dtype=torch.bfloat16, compress_statistics=True)
    layer.weight = bnb.nn.Params4bit(
        base.weight.data.clone(), requires_grad=False, quant_type="nf4", compress_statistics=True
    )
    layer = layer.to("cpu")  # quantizes, with the absmax itself quantized (nested)
    assert layer.weight.quant_state.nested
    return layer


def _backward_absmax_copies(layer) -> int:
    x = torch.randn(ROWS, IN, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    rec = _AbsmaxCopies()
    with rec:
        y.float().sum().backward()
    return len(rec.made)


def test_nested_quant_backward_dequantizes_one_absmax_like_bitsandbytes():
    # bitsandbytes' own backward on CPU runs the device-independent `F.dequantize_4bit`: one fp32 absmax
    expected = _backward_absmax_copies(_nested_layer(real=True))
    assert expected == 1
    assert _backward_absmax_copies(_nested_layer(real=False)) == expected


def test_nested_quant_forward_fallback_holds_two_absmax_copies_at_the_matmul():
    # CUDA's `_dequant_linear_fallback` (read, not runnable here): `absmax_dq` and `absmax_dq + absmax_offset`, both
    # referenced until F.linear returns; ROWS > 1536 takes that path on every card
    layer = _nested_layer(real=False)
    rec = _AbsmaxCopies()
    with torch.no_grad(), rec:
        layer(torch.randn(ROWS, IN, dtype=torch.bfloat16))
    assert len(rec.made) == 2 and rec.live_at_matmul == [2]
