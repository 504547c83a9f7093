"""Which kernel bitsandbytes' CUDA backend runs for a 4-bit matmul on a given GPU: its own heuristic, read from the
installed source.

Every 4-bit matmul, with grad (`MatMul4Bit.forward`) or without (`bnb.matmul_4bit`: generation, scoring), calls
`bitsandbytes::gemm_4bit`, whose CUDA kernel either runs the fused 4-bit kernel (the output only) or dequantizes the
whole weight into a transient `[N, K]` tensor in the activation's dtype and calls `F.linear`
(`_dequant_linear_fallback`; with nested quantization first two fp32 copies of the absmax, 1/16 of the weight's
bf16 bytes). It takes the fallback past M = 1536 rows, for K not a multiple of the blocksize, and otherwise where
`_gemm_4bit_use_custom_cuda(device, dtype, M, N, K)` says so, by the GPU's SM count and compute capability: on an
H100 (sm90, 132 SMs) most linears of a decode step with 8 or more rows dequantize
(https://github.com/bitsandbytes-foundation/bitsandbytes/blob/v0.50.2/bitsandbytes/backends/cuda/ops.py).

That module cannot be imported without a CUDA build of torch, so the heuristic is compiled from the installed
file's own source (its `_gemm_4bit_use_custom_cuda` and `_GEMM_4BIT_CUSTOM_FLOOR_M`), with the target GPU's
properties in place of `torch.cuda.get_device_properties`: the traced choice follows the installed release, never a
copy of it. Where the installed source has no such function, every call dequantizes (the side that holds more
memory).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import torch

from estimator.terms.weights import NF4_BLOCK

FALLBACK_PAST_M = 1536  # `_gemm_4bit_custom_max_m` on CUDA: dequant + F.linear past this many rows
BLOCKSIZE = NF4_BLOCK  # the 4-bit blocksize TRL's BitsAndBytesConfig leaves at bitsandbytes' default


@dataclass(frozen=True)
class TargetGPU:
    """The GPU a trace stands for, as bitsandbytes' dispatch reads it (`multi_processor_count`, `major`, `minor`)."""

    name: str
    sms: int
    major: int
    minor: int


# The card the traces stand for: the H100 SXM the lent machines and most rentals have (the H200 shares its 132 SMs
# and sm90 dispatch). NVIDIA H100 datasheet: 132 SMs (SXM5).
H100 = TargetGPU("H100 SXM", 132, 9, 0)


@functools.cache
def _heuristic():
    """bitsandbytes' `_gemm_4bit_use_custom_cuda` compiled from the installed source, or None where absent."""
    spec = find_spec("bitsandbytes")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "backends" / "cuda" / "ops.py"
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text())
    keep = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == "_gemm_4bit_use_custom_cuda")
        or (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "_GEMM_4BIT_CUSTOM_FLOOR_M" for t in node.targets)
        )
    ]
    if not any(isinstance(n, ast.FunctionDef) for n in keep):
        return None
    for node in keep:  # its @functools.cache keys on the device index alone; the target GPU is ours to vary
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = []
    namespace: dict = {"torch": torch, "_gpu_dispatch_props": None}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def dequantizes(m: int, n: int, k: int, dtype: torch.dtype, gpu: TargetGPU = H100) -> bool:
    """Whether a 4-bit matmul of M rows against an [N, K] weight dequantizes the weight on `gpu`."""
    if m > FALLBACK_PAST_M or k % BLOCKSIZE != 0:
        return True
    ns = _heuristic()
    if ns is None:
        return True
    ns["_gpu_dispatch_props"] = lambda device_index: (gpu.sms, gpu.major, gpu.minor)
    return not ns["_gemm_4bit_use_custom_cuda"](0, dtype, m, n, k)
