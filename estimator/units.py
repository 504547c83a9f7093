"""Bytes per element of each dtype, and unit conversions."""

from __future__ import annotations

GIB = 1024**3
MIB = 1024**2

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1, "int64": 8, "bool": 1}


def nbytes(dtype: str) -> int:
    """Bytes per element of `dtype` (float32 4, bfloat16/float16 2, int8/uint8 1, int64 8)."""
    return DTYPE_BYTES[dtype]


def gib(n_bytes: float) -> float:
    """bytes / 2**30."""
    return n_bytes / GIB
