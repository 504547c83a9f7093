"""A checkpoint's packed quantization (GPTQ, AWQ), read from `quantization_config` in its config.json.

What the terms size from it is in `estimator/terms/quantized.py`; bitsandbytes quantizes at load time and is
not in the checkpoint (its terms are in `estimator/terms/weights.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.text import shown


class QuantizationError(ValueError):
    """A `quantization_config` no GPTQ / AWQ loader would accept."""


# Checkpoints packed by GPTQ / AWQ (estimator/terms/quantized.py): the bit widths their kernels pack (AutoGPTQ
# QuantLinear: 2, 3, 4, 8; AutoAWQ WQLinear_GEMM: 4) and the largest group size we accept (-1 = one group)
PACKED_BITS = {"gptq": (2, 3, 4, 8), "awq": (4,)}
MAX_GROUP_SIZE = 1 << 16


def check_quantization(cfg: dict) -> None:
    """QuantizationError (one line) for a `quantization_config` no GPTQ / AWQ loader would accept: not a mapping, a
    method that is not text, bits outside what the method packs, a group size that is not -1 or 1-65536."""
    qc = cfg.get("quantization_config")
    if qc is None:
        return
    if not isinstance(qc, dict):
        raise QuantizationError(f"quantization_config is a JSON {type(qc).__name__}, not an object")
    method = qc.get("quant_method")
    if not isinstance(method, str):
        raise QuantizationError(
            f"quantization_config.quant_method {shown(method, 40)}: expected text (gptq, awq)"
        )
    packed = PACKED_BITS.get(method.lower())
    if packed is None:  # bitsandbytes and others quantize at load: nothing packed in the checkpoint
        return
    bits = qc.get("bits", qc.get("w_bit", 4))
    if type(bits) is not int or bits not in packed:
        raise QuantizationError(
            f"quantization_config.bits {shown(bits, 40)}: {method} packs {', '.join(map(str, packed))} bits"
        )
    group = qc.get("group_size", qc.get("q_group_size", 128))
    if type(group) is not int or not (group == -1 or 1 <= group <= MAX_GROUP_SIZE):
        raise QuantizationError(
            f"quantization_config.group_size {shown(group, 40)}: expected -1 or 1 to {MAX_GROUP_SIZE}"
        )


METHODS = tuple(PACKED_BITS)


@dataclass(frozen=True)
class QuantSpec:
    """What `quantization_config` says: the method, bits per weight and the group size (-1 = per column)."""

    method: str
    bits: int = 4
    group_size: int = 128


def quant_spec(config: dict) -> QuantSpec | None:
    """The GPTQ / AWQ spec in a config.json dict (`quantization_config.quant_method`, `bits` or AWQ's `w_bit`,
    `group_size` or AWQ's `q_group_size`), or None for an unquantized or bitsandbytes checkpoint. The values were
    checked when the config.json was read (check_quantization)."""
    qc = config.get("quantization_config") or {}
    method = str(qc.get("quant_method", "")).lower()
    if method not in METHODS:
        return None
    bits = int(qc.get("bits", qc.get("w_bit", 4)))
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    return QuantSpec(method, bits, group)
