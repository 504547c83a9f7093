"""Pre-quantized checkpoints: GPTQ and AWQ int-N linears, read from `quantization_config` in config.json.

A GPTQ / AWQ checkpoint replaces every decoder `nn.Linear` with a packed module; embeddings, norms and the
lm_head stay in 16 bits. Buffer shapes of one linear with `in` inputs, `out` outputs, `bits` bits and group size
`g` (g = -1 means one group of `in`):

- GPTQ (AutoGPTQ `auto_gptq/nn_modules/qlinear/qlinear_cuda.py` `QuantLinear.__init__`, the layout
  transformers/optimum and gptqmodel load): qweight int32 [in·bits/32, out], qzeros int32 [ceil(in/g),
  out·bits/32], scales fp16 [ceil(in/g), out], g_idx int32 [in], bias fp16 [out].
- AWQ (AutoAWQ `awq/modules/linear/gemm.py` `WQLinear_GEMM.__init__`): qweight int32 [in, out·bits/32],
  qzeros int32 [ceil(in/g), out·bits/32], scales fp16 [ceil(in/g), out], bias fp16 [out]; no g_idx.

bitsandbytes NF4 and 8-bit (quantized at load, not in the checkpoint) stay in `terms/weights.py`.
"""

from __future__ import annotations

from estimator.model.architecture import Arch, Linear
from estimator.model.quantized import QuantSpec, quant_spec

__all__ = ["QuantSpec", "quant_spec", "arch_quant_spec", "packed_linear_bytes", "packed_base_weights"]
INT32 = 4
FP16 = 2


def arch_quant_spec(arch: Arch) -> QuantSpec | None:
    """`quant_spec` of the config.json the Arch was read from."""
    return quant_spec((arch.extra or {}).get("config", {}))


def _groups(in_features: int, group_size: int) -> int:
    g = in_features if group_size == -1 else group_size
    return -(-in_features // g)


def gptq_linear_bytes(in_features: int, out_features: int, bits: int, group_size: int, bias: bool) -> int:
    """qweight in·out·bits/8 + qzeros 4·groups·out·bits/32 + scales 2·groups·out + g_idx 4·in + bias 2·out."""
    groups = _groups(in_features, group_size)
    qweight = (in_features * bits // 32) * out_features * INT32
    qzeros = groups * (out_features * bits // 32) * INT32
    scales = groups * out_features * FP16
    g_idx = in_features * INT32
    return qweight + qzeros + scales + g_idx + (out_features * FP16 if bias else 0)


def awq_linear_bytes(in_features: int, out_features: int, bits: int, group_size: int, bias: bool) -> int:
    """qweight in·out·bits/8 + qzeros 4·groups·out·bits/32 + scales 2·groups·out + bias 2·out (no g_idx)."""
    groups = _groups(in_features, group_size)
    qweight = in_features * (out_features * bits // 32) * INT32
    qzeros = groups * (out_features * bits // 32) * INT32
    scales = groups * out_features * FP16
    return qweight + qzeros + scales + (out_features * FP16 if bias else 0)


def packed_linear_bytes(lin: Linear, spec: QuantSpec) -> int:
    """Bytes of `lin.count` packed copies of one linear under `spec`."""
    fn = gptq_linear_bytes if spec.method == "gptq" else awq_linear_bytes
    return lin.count * fn(lin.in_features, lin.out_features, spec.bits, spec.group_size, lin.bias)


def packed_base_weights(arch: Arch, spec: QuantSpec, rest_bytes_per_param: int = FP16) -> int:
    """layers × Σ packed decoder linears + (P − quantized linear params) × 2: embeddings, norms, lm_head in fp16/bf16."""
    linears = [lin for lin in arch.layer_linears if lin.is_nn_linear]
    packed = arch.num_layers * sum(packed_linear_bytes(lin, spec) for lin in linears)
    quantized_params = arch.num_layers * sum(lin.params for lin in linears)
    return packed + (arch.total_params - quantized_params) * rest_bytes_per_param
