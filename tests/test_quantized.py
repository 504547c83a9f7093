"""GPTQ / AWQ packed checkpoints: buffer bytes counted by hand from the QuantLinear shapes."""

import dataclasses

from estimator.model.architecture import from_config
from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.terms import quantized as q
from estimator.terms import weights as w

Q7 = resolve_model("7B")
GPTQ4 = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def test_gptq_q_proj_of_qwen25_7b_counted_by_hand():
    # q_proj: in = out = 3584, 4 bits, groups of 128 (28 groups), with bias
    qweight = (3584 * 4 // 32) * 3584 * 4  # int32 [448, 3584] = 6,422,528
    qzeros = 28 * (3584 * 4 // 32) * 4  # int32 [28, 448] = 50,176
    scales = 28 * 3584 * 2  # fp16 [28, 3584] = 200,704
    g_idx = 3584 * 4  # int32 [3584] = 14,336
    bias = 3584 * 2  # fp16 = 7,168
    assert qweight + qzeros + scales + g_idx + bias == 6_694_912
    assert q.gptq_linear_bytes(3584, 3584, 4, 128, bias=True) == 6_694_912


def test_awq_has_no_g_idx_and_packs_along_out():
    # qweight int32 [3584, 448], qzeros int32 [28, 448], scales fp16 [28, 3584], no bias
    assert q.awq_linear_bytes(3584, 3584, 4, 128, bias=False) == 6_422_528 + 50_176 + 200_704 == 6_673_408


def test_group_size_minus_one_is_one_group():
    # 256 -> 64, 4 bits: qweight [32, 64] int32 8192 B, qzeros [1, 8] 32 B, scales [1, 64] 128 B, g_idx 1024 B
    assert q.gptq_linear_bytes(256, 64, 4, -1, bias=False) == 8192 + 32 + 128 + 1024


def test_quant_spec_reads_config_json():
    assert q.quant_spec({"quantization_config": GPTQ4}) == q.QuantSpec("gptq", 4, 128)
    awq = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 64, "version": "gemm"}}
    assert q.quant_spec(awq) == q.QuantSpec("awq", 4, 64)
    assert q.quant_spec({"quantization_config": {"quant_method": "bitsandbytes"}}) is None
    assert q.quant_spec({}) is None


def test_gptq_7b_policy_weights_are_packed_linears_plus_16_bit_rest():
    arch = from_config(Q7.extra["config"] | {"quantization_config": GPTQ4})
    # one layer: q, k, v (bias), o, gate, up (3584 -> 18944), down (18944 -> 3584)
    layer = (
        q.gptq_linear_bytes(3584, 3584, 4, 128, True)
        + 2 * q.gptq_linear_bytes(3584, 512, 4, 128, True)
        + q.gptq_linear_bytes(3584, 3584, 4, 128, False)
        + 2 * q.gptq_linear_bytes(3584, 18944, 4, 128, False)
        + q.gptq_linear_bytes(18944, 3584, 4, 128, False)
    )
    linear_params = 3584 * 3584 + 3584 + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944
    rest = Q7.total_params - 28 * linear_params  # embeddings, lm_head, norms
    cfg = RunConfig(model="7B", dtype="bfloat16", use_peft=True)
    assert w.policy_weights(cfg, arch) == 28 * layer + 2 * rest
    assert 5.0e9 < w.policy_weights(cfg, arch) < 5.7e9  # the GPTQ-Int4 7B checkpoint is ~5.6 GB on disk


def test_unquantized_arch_is_unchanged():
    assert dataclasses.replace(Q7).extra["config"].get("quantization_config") is None
    assert w.policy_weights(RunConfig(model="7B", dtype="bfloat16"), Q7) == 2 * Q7.total_params


def test_gptq_estimate_uses_the_packed_base_and_a_dequantized_transient():
    from estimator.step.estimate import estimate
    from estimator.terms.activations import dequantized_weight_transient

    arch = from_config(Q7.extra["config"] | {"quantization_config": GPTQ4})
    cfg = RunConfig(model="7B", dtype="float16", use_peft=True, bf16=False)
    est = estimate(cfg, arch)
    assert est.phases["train"]["weights"] == w.policy_weights(cfg, arch)
    assert dequantized_weight_transient(cfg, arch) == 2 * 3584 * 18944  # gate/up/down: the largest, in fp16
    assert dequantized_weight_transient(cfg, Q7) == 0  # an unquantized base dequantizes nothing
