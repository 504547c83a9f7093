"""Arch's exact parameter counts against transformers building the same config on the meta device."""

from __future__ import annotations

import json

import pytest

from estimator.model.architecture import from_config
from estimator.model.catalog import catalog
from estimator.model.families import FAMILIES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def transformers_count(cfg: dict) -> int:
    """Parameters transformers 5.x creates for `cfg` (tied weights counted once: parameters() dedups)."""
    cfg = {k: v for k, v in cfg.items() if k != "auto_map"}
    config = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("hf_id", sorted(catalog()))
def test_catalog_model_matches_transformers(hf_id):
    cfg = json.loads(catalog()[hf_id].read_text())
    assert from_config(cfg).total_params == transformers_count(cfg)


def test_qwen25_7b_hand_count():
    # h=3584, 28 layers, 28 q / 4 kv heads of 128, ffn 18944, vocab 152064, untied, q/k/v biases.
    h, kv, ffn, vocab = 3584, 4 * 128, 18944, 152064
    attn = (h * h + h) + 2 * (h * kv + kv) + h * h
    layer = attn + 3 * h * ffn + 2 * h
    total = 2 * vocab * h + 28 * layer + h
    assert total == 7_615_616_512
    assert from_config(json.loads(catalog()["Qwen/Qwen2.5-7B-Instruct"].read_text())).total_params == total


def test_qwen25_05b_tied_hand_count():
    # h=896, 24 layers, 14 q / 2 kv heads of 64, ffn 4864, vocab 151936, tied embeddings.
    h, kv, ffn, vocab = 896, 2 * 64, 4864, 151936
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * ffn + 2 * h
    total = vocab * h + 24 * layer + h
    assert total == 494_032_768
    assert from_config(json.loads(catalog()["Qwen/Qwen2.5-0.5B-Instruct"].read_text())).total_params == total


BASE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}
SYNTHETIC = {
    "llama_tied_gqa": {
        **BASE,
        "model_type": "llama",
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "tie_word_embeddings": True,
    },
    "llama_untied_bias": {
        **BASE,
        "model_type": "llama",
        "num_key_value_heads": 4,
        "intermediate_size": 96,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "mlp_bias": True,
    },
    "llama_explicit_head_dim": {
        **BASE,
        "model_type": "llama",
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 80,
        "tie_word_embeddings": False,
    },
    "qwen2_default_bias": {
        **BASE,
        "model_type": "qwen2",
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "tie_word_embeddings": True,
    },
    "qwen3_qk_norm": {
        **BASE,
        "model_type": "qwen3",
        "num_key_value_heads": 2,
        "head_dim": 24,
        "intermediate_size": 96,
        "tie_word_embeddings": False,
    },
    "qwen3_moe": {
        **BASE,
        "model_type": "qwen3_moe",
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "qwen2_moe_shared": {
        **BASE,
        "model_type": "qwen2_moe",
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "mixtral": {
        **BASE,
        "model_type": "mixtral",
        "num_key_value_heads": 2,
        "intermediate_size": 48,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "phi3_fused": {
        **BASE,
        "model_type": "phi3",
        "num_key_value_heads": 4,
        "intermediate_size": 96,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
    },
    "gemma2_extra_norms": {
        **BASE,
        "model_type": "gemma2",
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
    },
    "gemma3_text_qk_norm": {
        **BASE,
        "model_type": "gemma3_text",
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 96,
    },
    "mistral": {
        **BASE,
        "model_type": "mistral",
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "tie_word_embeddings": False,
    },
    # OLMo-2: q_norm / k_norm over all of q_dim / kv_dim (not head_dim); attention_bias also gives o_proj a bias
    "olmo2_gqa_bias": {
        **BASE,
        "model_type": "olmo2",
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "tie_word_embeddings": False,
        "attention_bias": True,
    },
    "olmo2_explicit_head_dim_tied": {
        **BASE,
        "model_type": "olmo2",
        "num_key_value_heads": 1,
        "head_dim": 32,
        "intermediate_size": 80,
        "tie_word_embeddings": True,
    },
}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_config_matches_transformers(name):
    cfg = SYNTHETIC[name]
    assert from_config(cfg).total_params == transformers_count(cfg)


def test_tiny_llama_hand_count():
    # 2 layers, h=64, 4 heads of 16, 2 kv heads, ffn 96, vocab 128, tied:
    # q 64*64 + k,v 2*64*32 + o 64*64 + mlp 3*64*96 + 2 norms*64 = 30848 per layer.
    assert from_config(SYNTHETIC["llama_tied_gqa"]).total_params == 128 * 64 + 2 * 30848 + 64


OLMO2_13B = "allenai/OLMo-2-1124-13B"
# its model.safetensors.index.json: "total_size": 54864793600 bytes of float32 weights (estimator/catalog/SOURCES.md)
OLMO2_13B_PUBLISHED = 54_864_793_600 // 4


def test_olmo2_13b_equals_its_published_weight_total():
    assert OLMO2_13B_PUBLISHED == 13_716_198_400
    cfg = json.loads(catalog()[OLMO2_13B].read_text())
    arch = from_config(cfg)
    assert arch.total_params == OLMO2_13B_PUBLISHED
    assert transformers_count(cfg) == OLMO2_13B_PUBLISHED


def test_olmo2_13b_hand_count():
    # h=5120, 40 layers, 40 q = 40 kv heads of 128, ffn 13824, vocab 100352, untied, no biases; per layer
    # q/k/v/o 4·h², MLP 3·h·ffn, post-attention + post-feedforward norms 2·h, q_norm + k_norm over q_dim + kv_dim
    h, ffn, vocab = 5120, 13824, 100352
    layer = 4 * h * h + 3 * h * ffn + 2 * h + (h + h)
    total = 2 * vocab * h + 40 * layer + h
    assert total == OLMO2_13B_PUBLISHED
    assert from_config(json.loads(catalog()[OLMO2_13B].read_text())).layer_norm_params == 4 * h


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_a_config_without_tie_word_embeddings_takes_its_config_class_default(name):
    # a hub config.json may omit the key: transformers then ties per the family's config class (LlamaConfig: untied,
    # Gemma2Config: tied); sizing it tied where the class unties would leave the lm_head out
    cfg = {k: v for k, v in SYNTHETIC[name].items() if k != "tie_word_embeddings"}
    assert from_config(cfg).total_params == transformers_count(cfg)


def test_every_family_has_a_synthetic_config():
    assert {c["model_type"] for c in SYNTHETIC.values()} == set(FAMILIES)
