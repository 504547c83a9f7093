"""One decode step of a real transformers model (the installed 5.23 or 5.24) against the estimator's decode-step
terms, modelled at the installed release.

A tiny model prefills a `DynamicCache`, then runs one more token; `LiveStorageMode` (sweeps/probes/tensors.py)
counts every tensor storage the step allocates while the cache and weights are live. What the step holds above
what was live before it is the cache's update (`kv_concat_transient`: the longest layer's new K/V beside the old)
or the attention's copies (`decode_attention_copies`: eager's `repeat_kv`, the scores), whichever is larger, plus
the step's own small [B, 1, ·] activations and logits. The model is asked in fp32, with no autocast (every
tensor in one dtype) or under bf16 autocast (the fp32 cache cast to bf16 for the attention's matmuls or sdpa); the
tolerance covers only the per-token activations.
"""

from __future__ import annotations

import pytest
import torch

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.settings.versions import default_transformers
from estimator.terms import generation

INSTALLED = default_transformers()  # the release the estimate models: the one these real steps run

B, P = 4, 96

COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 64,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 1,
}
CASES = {
    "qwen2-gqa": {"model_type": "qwen2"},
    "llama-mha": {"model_type": "llama", "num_key_value_heads": 8},
    "llama-mqa": {"model_type": "llama", "num_key_value_heads": 1},
    # every layer sliding, window longer than the sequence: the sliding cache's update doubles K and V
    "phi3-sliding": {"model_type": "phi3", "num_key_value_heads": 8, "sliding_window": 256},
}


def _measured_step_extra(conf_dict: dict, attn: str, autocast: bool = False) -> int:
    """Bytes one decode step holds, at its peak, above what was live when it started (prefill and step in one
    autocast region when `autocast`, as TRL's generate runs them, so the weights' cached casts predate the step)."""
    import transformers

    from sweeps.probes.tensors import LiveStorageMode
    from sweeps.trace.generate import cache_kwarg

    torch.manual_seed(0)
    conf = transformers.AutoConfig.for_model(**conf_dict)
    conf._attn_implementation = attn
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.float32).eval()
    ids = torch.randint(2, conf.vocab_size, (B, P))
    region = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with torch.no_grad(), region, LiveStorageMode() as probe:
        probe.set_phase("prefill")
        cache = transformers.DynamicCache(config=model.config)
        kw = {cache_kwarg(): cache}  # the cache is updated in place
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **kw)
        del out
        probe.set_phase("decode")
        before = probe.current_bytes
        model(input_ids=ids[:, -1:], use_cache=True, **kw)
        peak = probe.phase_peaks["decode"]
    return peak - before


def _estimated(conf_dict: dict, attn: str, autocast: bool = False) -> tuple[int, int]:
    """(the estimator's step transient, a tolerance for the per-token activations it leaves out)."""
    arch = from_config(conf_dict, name="tiny")
    cfg = RunConfig(
        model="tiny",
        dtype="float32",
        bf16=autocast,
        attn_implementation=attn,
        per_device_train_batch_size=B,
        num_generations=B,
        max_prompt_length=P,
        max_completion_length=1,  # the cache after one decode step holds P + 1 positions
        transformers_version=INSTALLED,
    )
    assert cfg.generation_sequences == B and cfg.sequence_length == P + 1
    transient = max(generation.kv_concat_transient(cfg, arch), generation.decode_attention_copies(cfg, arch))
    # one token's activations (a few [B, 1, H] and [B, 1, I] tensors, the [B, 1, V] logits) and eager's
    # [B, 1, 1, L] mask, all fp32
    per_row = 4 * (
        4 * conf_dict["intermediate_size"] + 12 * conf_dict["hidden_size"] + 2 * conf_dict["vocab_size"]
    )
    return transient, B * (per_row + 2 * 4 * (P + 1))


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_decode_step_transient_matches_a_real_step(case, attn, autocast):
    conf = COMMON | CASES[case]
    measured = _measured_step_extra(conf, attn, autocast)
    estimated, slack = _estimated(conf, attn, autocast)
    # the decode-step terms are at least what the step's cache update or attention copies allocate,
    # and at most that plus the step's own one-token activations
    assert estimated <= measured <= estimated + slack, (case, attn, autocast, estimated, measured, slack)


def test_autocast_adds_a_bf16_copy_of_the_repeated_cache():
    """gemma-2-2b and Llama-3.2-1B, eager, fp32 load under bf16 autocast: eager's matmul
    casts the repeated fp32 K, then V, to bf16, one [B, heads, L, d] copy beside the two fp32 repeats. Under
    transformers 5.24 V is cached in bf16 already: the K cast still adds one bf16 copy, and the repeated V is
    bf16 instead of fp32, which saves as much again, so the step holds about what the fp32 step holds."""
    conf = COMMON | CASES["qwen2-gqa"]
    heads_tensor_bf16 = B * conf["num_attention_heads"] * conf["head_dim"] * (P + 1) * 2
    extra = _measured_step_extra(conf, "eager", autocast=True) - _measured_step_extra(conf, "eager")
    expected = heads_tensor_bf16 if INSTALLED == "5.23" else 0
    # the fp32 step's scores are fp32; under autocast the scores are bf16 before softmax, so the cast is the
    # difference give or take the scores' [B, heads, 1, L] and the step's activations
    assert abs(extra - expected) < heads_tensor_bf16 // 4, (INSTALLED, extra, expected, heads_tensor_bf16)


def test_the_gqa_eager_step_is_dominated_by_repeat_kv():
    """The case the old estimate missed: eager GQA copies K and V to every head, 2·heads/kv_heads cache tensors."""
    conf = COMMON | CASES["qwen2-gqa"]
    one_tensor = B * conf["num_key_value_heads"] * conf["head_dim"] * (P + 1) * 4
    heads_ratio = conf["num_attention_heads"] // conf["num_key_value_heads"]
    assert _measured_step_extra(conf, "eager") >= 2 * heads_ratio * one_tensor
    assert _measured_step_extra(conf, "sdpa") < 2 * one_tensor  # sdpa without a mask: native GQA
