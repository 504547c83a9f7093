"""What the decoder layers keep for backward, counted by autograd itself, against the estimator's formulas.

Tiny transformers 5.23 models (with PEFT 0.21 adapters where asked) run one training forward through their
decoder layers on real CPU tensors under `torch.autograd.graph.saved_tensors_hooks`; every saved tensor with a
batch-leading shape is a per-token activation, its storage counted once however many ops save it. The
estimator's per-token formulas are derived from the code paths, so this is an independent check of them: a
wrong dtype, a missed copy or a double-counted shared tensor shows up as a byte difference. The estimator is
asked with `device="cpu"`, because CPU's dropout keeps a noise tensor where CUDA keeps a bool mask (the one
device difference it models for saved tensors).
"""

from __future__ import annotations

import pytest
import torch

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms import activations

B, L = 3, 8  # no weight has a dimension of 3 or 24; windows of 4 < L mask the sliding layers

COMMON = {
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 1,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}
MODELS = {
    "qwen2": {"model_type": "qwen2"},
    "qwen3": {"model_type": "qwen3", "head_dim": 16},
    "phi3": {"model_type": "phi3", "sliding_window": None, "pad_token_id": 0},
    "gemma2": {
        "model_type": "gemma2",
        "head_dim": 16,
        "num_hidden_layers": 2,
        "sliding_window": 4,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": None,
        "query_pre_attn_scalar": 16,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "head_dim": 16,
        "num_key_value_heads": 1,
        "num_hidden_layers": 2,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 16,
    },
    # no input_layernorm, norms on the attention / MLP outputs, q_norm / k_norm over all of q_dim / kv_dim
    "olmo2": {"model_type": "olmo2", "num_hidden_layers": 2},
}


def _config(family: str) -> dict:
    return COMMON | MODELS[family]


def _measured_per_token(family: str, cfg: RunConfig, input_requires_grad: bool = True) -> float:
    """Bytes per token autograd saves across the decoder layers' training forward under `cfg` (with
    `input_requires_grad=False` the first layer's input needs no gradient, as a frozen embedding's output)."""
    import peft
    import transformers
    from transformers import masking_utils

    torch.manual_seed(0)
    conf = transformers.AutoConfig.for_model(**_config(family))
    conf._attn_implementation = cfg.attn_implementation
    model = transformers.AutoModelForCausalLM.from_config(conf, dtype=getattr(torch, cfg.dtype))
    if cfg.use_peft:
        targets = list(cfg.lora_target_modules) if cfg.lora_target_modules else None
        model = peft.get_peft_model(
            model,
            peft.LoraConfig(
                r=cfg.lora_r,
                lora_alpha=16,
                lora_dropout=cfg.lora_dropout,
                target_modules="all-linear" if targets == ["all-linear"] else targets,
            ),
        )
    model.train()
    inner = model.get_base_model().model if cfg.use_peft else model.model
    x = torch.randn(
        B, L, conf.hidden_size, dtype=getattr(torch, cfg.dtype), requires_grad=input_requires_grad
    )
    # not a leaf, as the embedding's output is not: autocast caches its cast of a leaf that requires grad (torch
    # `cached_cast`), which would merge the per-linear casts of a layer input read by linears directly (OLMo-2)
    x = x.clone()
    pos = torch.arange(L)[None]
    mask_kwargs = {
        "config": conf,
        "inputs_embeds": x,
        "attention_mask": None,
        "past_key_values": None,
        "position_ids": pos,
    }
    types = getattr(conf, "layer_types", None) or ["full_attention"] * conf.num_hidden_layers
    build = {
        "full_attention": masking_utils.create_causal_mask,
        "sliding_attention": masking_utils.create_sliding_window_causal_mask,
    }
    masks = {kind: build[kind](**mask_kwargs) for kind in set(types)}
    storages: dict[int, int] = {}
    weight_shapes = {s for p in model.parameters() for s in (tuple(p.shape), tuple(p.shape)[::-1])}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # activations: a multiple of B·L elements, not a weight (or autocast's cast of one), not the [1, L, d] tables
        if (
            t.dim() >= 2
            and t.numel() % (B * L) == 0
            and t.shape[0] != 1
            and tuple(t.shape) not in weight_shapes
        ):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    hidden = x
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16),
    ):
        for layer, kind in zip(inner.layers, types, strict=True):
            if family == "gemma3":
                cos_sin = inner.rotary_emb(hidden, pos, kind)
            else:
                cos_sin = inner.rotary_emb(hidden, pos)
            hidden = layer(hidden, attention_mask=masks[kind], position_ids=pos, position_embeddings=cos_sin)
    return sum(storages.values()) / (B * L)


def _estimated_per_token(family: str, cfg: RunConfig) -> float:
    arch = from_config(_config(family), f"tiny-{family}")
    saved = activations.saved_activations(cfg, arch, B, L) - activations.attention_mask_bytes(cfg, arch, B, L)
    return saved / (B * L)


LORA_CASES = [
    # (family, dtype, bf16 autocast, attention, targets, dropout)
    ("qwen2", "bfloat16", True, "sdpa", ("all-linear",), 0.0),
    ("qwen2", "bfloat16", True, "sdpa", ("all-linear",), 0.1),
    ("qwen2", "bfloat16", True, "sdpa", ("q_proj", "v_proj"), 0.0),
    ("qwen2", "float32", True, "sdpa", ("all-linear",), 0.0),
    ("qwen2", "float32", True, "eager", ("o_proj", "down_proj"), 0.05),
    ("qwen2", "float16", False, "sdpa", ("all-linear",), 0.0),
    ("qwen2", "float16", False, "eager", ("all-linear",), 0.1),
    ("qwen2", "float16", False, "sdpa", ("k_proj", "gate_proj"), 0.0),
    ("qwen3", "bfloat16", True, "sdpa", ("all-linear",), 0.05),
    ("phi3", "bfloat16", True, "sdpa", ("all-linear",), 0.0),
    ("phi3", "float32", True, "eager", ("qkv_proj", "o_proj"), 0.1),
    ("gemma2", "bfloat16", True, "eager", ("all-linear",), 0.0),
    ("gemma3", "bfloat16", True, "sdpa", ("all-linear",), 0.05),
    ("gemma3", "float16", False, "eager", ("q_proj", "v_proj"), 0.0),
    ("olmo2", "bfloat16", True, "sdpa", ("all-linear",), 0.05),
    ("olmo2", "bfloat16", True, "sdpa", ("q_proj", "v_proj"), 0.0),
    ("olmo2", "float32", True, "sdpa", ("all-linear",), 0.0),
    ("olmo2", "float32", True, "eager", ("k_proj", "down_proj"), 0.1),
    ("olmo2", "float16", False, "sdpa", ("all-linear",), 0.0),
]


def _assert_matches(family: str, **settings) -> None:
    """The estimator's per-token saved bytes equal autograd's within 0.5 % for a no-checkpointing CPU step."""
    cfg = RunConfig(
        model="Qwen/Qwen2.5-0.5B-Instruct", gradient_checkpointing=False, device="cpu", **settings
    )
    measured, estimated = _measured_per_token(family, cfg), _estimated_per_token(family, cfg)
    assert estimated == pytest.approx(measured, rel=0.005), (measured, estimated)


@pytest.mark.parametrize(("family", "dtype", "bf16", "attn", "targets", "dropout"), LORA_CASES)
def test_lora_layer_saved_bytes_match_autograd(family, dtype, bf16, attn, targets, dropout):
    _assert_matches(
        family,
        dtype=dtype,
        bf16=bf16,
        attn_implementation=attn,
        use_peft=True,
        lora_r=8,
        lora_target_modules=targets,
        lora_dropout=dropout,
    )


FULL_CASES = [
    ("qwen2", "bfloat16", True, "sdpa"),
    ("qwen2", "float32", True, "sdpa"),
    ("qwen2", "float16", False, "eager"),
    ("qwen3", "bfloat16", True, "eager"),
    ("phi3", "float32", True, "sdpa"),
    ("gemma2", "bfloat16", True, "eager"),
    ("gemma3", "bfloat16", True, "sdpa"),
    ("gemma3", "float32", True, "eager"),
    ("olmo2", "bfloat16", True, "sdpa"),
    ("olmo2", "float32", True, "sdpa"),
    ("olmo2", "float16", False, "eager"),
    ("olmo2", "bfloat16", True, "eager"),
]


@pytest.mark.parametrize(("family", "dtype", "bf16", "attn"), FULL_CASES)
def test_full_finetune_layer_saved_bytes_match_autograd(family, dtype, bf16, attn):
    _assert_matches(family, dtype=dtype, bf16=bf16, attn_implementation=attn)


FIRST_LAYER_CASES = [
    # (family, dtype, bf16 autocast, targets, dropout): PEFT without checkpointing, so TRL does not call
    # enable_input_require_grads and the first layer's input needs no gradient
    ("qwen2", "bfloat16", True, ("q_proj", "k_proj", "v_proj", "o_proj"), 0.1),
    ("qwen3", "bfloat16", True, None, 0.05),  # default q/v targets: k_norm on an unwrapped k saves nothing
    ("qwen3", "float32", True, ("all-linear",), 0.0),
    ("gemma3", "bfloat16", True, ("q_proj", "v_proj"), 0.1),  # two layers: only the first keeps less
    ("olmo2", "bfloat16", True, ("q_proj", "v_proj"), 0.1),  # no input norm; k_norm on an unwrapped k
    ("olmo2", "float32", True, ("v_proj", "down_proj"), 0.0),  # q_norm / k_norm on unwrapped q, k: nothing
]


@pytest.mark.parametrize(("family", "dtype", "bf16", "targets", "dropout"), FIRST_LAYER_CASES)
def test_first_layer_without_input_grad_saves_less(family, dtype, bf16, targets, dropout):
    cfg = RunConfig(
        model="Qwen/Qwen2.5-0.5B-Instruct",
        gradient_checkpointing=False,
        device="cpu",
        dtype=dtype,
        bf16=bf16,
        attn_implementation="sdpa",
        use_peft=True,
        lora_r=8,
        lora_target_modules=targets,
        lora_dropout=dropout,
    )
    measured = _measured_per_token(family, cfg, input_requires_grad=False)
    arch = from_config(_config(family), f"tiny-{family}")
    estimated = _estimated_per_token(family, cfg) - activations.first_layer_unsaved_per_token(cfg, arch)
    assert estimated == pytest.approx(measured, rel=0.005), (measured, estimated)
    assert measured < _measured_per_token(family, cfg)  # and it is a real difference
