"""Build a real-size causal LM from its shipped config.json (fake or real weights), and emulate a bnb 4-bit load.

QLoRA emulation (bitsandbytes kernels cannot run on FakeTensors). transformers' bnb quantizer turns every
`nn.Linear` except `lm_head` into `bnb.nn.Linear4bit`; each becomes an `Emulated4bitLinear` holding exactly what
bnb 0.50 keeps resident: the packed weight as a frozen uint8 parameter of `ceil(out*in/2)` bytes (shape
`[n, 1]`), an fp32 `absmax` of `out*in/64` elements (blocksize 64), or with nested quant a uint8 `absmax`
plus fp32 `absmax2` per 256 of them and a 256-entry fp32 code. Its matmul follows bnb's `gemm_4bit` dispatch on
CUDA for the card the trace stands for (`bnb_dispatch.dequantizes`, an H100): where it dequantizes (past 1536
rows always; below, by bitsandbytes' own per-card heuristic, on an H100 most linears from 8 rows on) a transient
dequantized `[out, in]` weight in the activation's dtype (with nested quant, after two fp32 absmax copies of
`out*in/64` elements), then `F.linear` (under the ambient autocast, as the bnb kernel call is); where it runs the
fused kernel, the output directly, with no transient weight. Backward materialises the dequantized weight in the
dtype it was quantized from (the load dtype, `QuantState.dtype`; with nested quant beside one fp32 absmax copy)
and casts it to the gradient's dtype when that differs (bnb's `MatMul4Bit.backward`:
`F.dequantize_4bit(B, ctx.state).to(grad_output.dtype)`; under bf16 autocast an fp32 load's gradient is bf16, so
both copies are live). The input is first cast to the compute dtype (`bnb_4bit_compute_dtype` = the load dtype,
as TRL's `get_quantization_config` sets it).

It is also a `bnb.nn.Linear4bit` (a subclass of `nn.Linear`), with the `weight.compress_statistics`,
`weight.quant_type` and `compute_dtype` that peft's `dispatch_bnb_4bit` reads, so peft wraps it with its
`lora.bnb.Linear4bit` exactly as it wraps a real one on a GPU
(https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/bnb.py#L527-L557: the base result is
cloned; without autocast the adapter output is cast to the result's dtype before the add, under autocast the
promoted sum is returned uncast); a plain `nn.Linear` would get peft's generic `lora.Linear` instead, whose adds
are wider than a GPU's for an fp16 or fp32 load. `tests/ground_truth/test_fake_model_4bit.py` checks peft picks the same wrapper
for this layer as for a real `bnb.nn.Linear4bit`, and that both allocate the same output-shaped tensors.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import torch

from estimator.model import catalog as cat
from sweeps.trace import bnb_dispatch


def config_path(spec: str) -> Path:
    """The config.json a model spec names: shorthand size, catalog id, or a path."""
    s = spec.upper().replace("b", "B")
    name = cat.SHORTHANDS.get(s, spec)
    by_lower = {k.lower(): v for k, v in cat.catalog().items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    p = Path(spec)
    p = p / "config.json" if p.is_dir() else p
    if p.is_file():
        return p
    raise cat.UnknownModel(f"unknown model {spec!r}")


def truncated_config_dict(spec: str, num_layers: int) -> dict:
    """The model's config.json with only its first `num_layers` decoder layers (a depth-reduced trace)."""
    d = dict(cat.load_config(config_path(spec)))
    d["num_hidden_layers"] = min(num_layers, d["num_hidden_layers"])
    if isinstance(d.get("layer_types"), list):
        d["layer_types"] = d["layer_types"][: d["num_hidden_layers"]]
    return d


def hf_config(spec: str | dict, attn_implementation: str = "sdpa"):
    """A transformers config object for `spec` (or a config dict)."""
    from transformers import AutoConfig

    d = dict(spec) if isinstance(spec, dict) else cat.load_config(config_path(spec))
    d.pop("quantization_config", None)
    model_type = d.pop("model_type")
    d.pop("torch_dtype", None)
    d.pop("dtype", None)
    conf = AutoConfig.for_model(model_type, **d)
    conf._attn_implementation = attn_implementation
    return conf


def build_model(conf, dtype: torch.dtype) -> torch.nn.Module:
    """`AutoModelForCausalLM.from_config` with every parameter in `dtype` (in whatever tensor mode is active)."""
    from transformers import AutoModelForCausalLM

    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype)
    finally:
        torch.set_default_dtype(prev)
    return model


class _Matmul4bit(torch.autograd.Function):
    """bnb MatMul4Bit's allocations: a transient dequantized weight where bitsandbytes' dispatch dequantizes
    (`bnb_dispatch.dequantizes` on the target GPU), again in backward."""

    @staticmethod
    def forward(ctx, x, packed, out_features, in_features, bias, quant_dtype, nested):
        m = x.numel() // x.shape[-1]
        ctx.shape = (out_features, in_features)
        ctx.quant_dtype = quant_dtype
        ctx.nested = nested
        ctx.device = x.device
        ctx.save_for_backward(packed)
        if bnb_dispatch.dequantizes(m, out_features, in_features, x.dtype):
            # `_dequant_linear_fallback`: with nested quant, the dequantized absmax and its sum with the offset
            # (two fp32 copies, one per block of 64) stay live through the weight's dequantization and F.linear
            scales = _nested_absmax(ctx.shape, x.device, copies=2) if nested else ()
            w = torch.empty((out_features, in_features), dtype=x.dtype, device=x.device)
            out = torch.nn.functional.linear(x, w, bias)
            del scales, w
            return out
        out = x.new_empty((*x.shape[:-1], out_features))
        return out if bias is None else out.add_(bias)

    @staticmethod
    def backward(ctx, grad_out):
        # `F.dequantize_4bit`: with nested quant one fp32 absmax (`dequantize_blockwise`, offset added in place)
        # is live while the weight is dequantized, and freed on return, before the cast to the gradient's dtype
        scales = _nested_absmax(ctx.shape, ctx.device, copies=1) if ctx.nested else ()
        w = torch.empty(ctx.shape, dtype=ctx.quant_dtype, device=ctx.device)
        del scales
        w = w.to(grad_out.dtype)
        return torch.matmul(grad_out, w), None, None, None, None, None, None


def _nested_absmax(shape: tuple[int, int], device, copies: int) -> tuple[torch.Tensor, ...]:
    """The fp32 absmax that bitsandbytes dequantizes from a nested quant state: one element per 4-bit block."""
    blocks = math.ceil(shape[0] * shape[1] / bnb_dispatch.BLOCKSIZE)
    return tuple(torch.empty(blocks, dtype=torch.float32, device=device) for _ in range(copies))


class Emulated4bitLinear(torch.nn.Linear):
    """A Linear whose weight is what bnb Linear4bit keeps (uint8 packed + absmax), with bnb's matmul allocations.

    `emulate_4bit` instantiates `bnb_subclass()`, the same layer that is also a `bnb.nn.Linear4bit`, so peft
    dispatches its bnb LoRA wrapper to it; this base class stays importable without bitsandbytes."""

    def __init__(self, base: torch.nn.Linear, compute_dtype: torch.dtype, nested: bool) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        n = self.in_features * self.out_features
        dev = base.weight.device
        self.weight = torch.nn.Parameter(
            torch.empty((math.ceil(n / 2), 1), dtype=torch.uint8, device=dev), requires_grad=False
        )
        self.bias = base.bias
        blocks = math.ceil(n / bnb_dispatch.BLOCKSIZE)
        if nested:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=dev))
            self.register_buffer(
                "absmax2", torch.empty(math.ceil(blocks / 256), dtype=torch.float32, device=dev)
            )
            self.register_buffer("code", torch.empty(256, dtype=torch.float32, device=dev))
        else:
            self.register_buffer("absmax", torch.empty(blocks, dtype=torch.float32, device=dev))
        self.compute_dtype = compute_dtype
        self.nested = nested
        # what peft's dispatch_bnb_4bit reads off a Linear4bit and its Params4bit weight
        self.weight.compress_statistics = nested
        self.weight.quant_type = "nf4"
        self.quant_state = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        bias = None if self.bias is None else self.bias.to(self.compute_dtype)
        out = _Matmul4bit.apply(
            x, self.weight, self.out_features, self.in_features, bias, self.compute_dtype, self.nested
        )
        return out.to(inp_dtype)


@functools.cache
def bnb_subclass() -> type:
    """`Emulated4bitLinear` that is also a `bnb.nn.Linear4bit` (its forward and init win in the MRO), made once;
    bitsandbytes is imported only when a 4-bit load is emulated."""
    import bitsandbytes as bnb

    return type("Emulated4bitLinear", (Emulated4bitLinear, bnb.nn.Linear4bit), {"__module__": __name__})


def emulate_4bit(model: torch.nn.Module, compute_dtype: torch.dtype, nested: bool = False) -> int:
    """Swap every nn.Linear except the output head for an Emulated4bitLinear; returns how many were swapped."""
    head = model.get_output_embeddings()
    cls = bnb_subclass()
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is torch.nn.Linear and child is not head:
                swaps.append((parent, name, child))
    for parent, name, child in swaps:
        setattr(parent, name, cls(child, compute_dtype, nested))
    model.is_loaded_in_4bit = True
    return len(swaps)
