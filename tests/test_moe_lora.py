"""LoRA on a MoE model's fused experts (estimator/terms/moe_lora.py) against peft building it, and hand-worked bytes."""

from __future__ import annotations

import json

import pytest
import torch

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms import activations, moe_lora, weights
from sweeps.trace import fake_model


def _peft_trainable_numels(config: dict, **lora) -> list[int]:
    """numel of each trainable tensor peft 0.21 gives a transformers model built on the meta device from `config`."""
    import peft
    import transformers

    conf = transformers.AutoConfig.for_model(**json.loads(json.dumps(config)))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(conf, dtype=torch.bfloat16)
    pm = peft.get_peft_model(model, peft.LoraConfig(lora_dropout=0.0, **lora))
    return [p.numel() for p in pm.parameters() if p.requires_grad]


def _qwen3_moe(targets: list[str], **settings) -> tuple[dict, RunConfig, dict]:
    """The one-layer Qwen3-30B-A3B config, a LoRA r=8 RunConfig on `targets`, and peft's LoraConfig arguments."""
    config = fake_model.truncated_config_dict("Qwen/Qwen3-30B-A3B", 1)
    cfg = RunConfig(
        model="Qwen/Qwen3-30B-A3B",
        use_peft=True,
        lora_r=8,
        lora_dropout=0.0,
        lora_target_modules=tuple(targets),
        **settings,
    )
    lora = {"r": 8, "target_modules": "all-linear" if targets == ["all-linear"] else targets}
    return config, cfg, lora


@pytest.mark.parametrize(
    "targets",
    [
        ["all-linear"],
        ["q_proj", "k_proj", "v_proj", "o_proj"],
        ["q_proj", "gate_proj", "up_proj", "down_proj"],
    ],
)
def test_trainable_params_match_peft_on_qwen3_moe(targets):
    config, cfg, lora = _qwen3_moe(targets)
    arch = from_config(config, name=cfg.model)
    assert weights.lora_params(cfg, arch) == sum(_peft_trainable_numels(config, **lora))


def test_merged_expert_stacks_by_hand():
    """Qwen3-30B-A3B: 128 experts, H 2048, I 768, bf16. One layer merges gate_up [128, 1536, 2048] and down
    [128, 2048, 768]: 128 × (1536 × 2048 + 2048 × 768) × 2 B = 1,207,959,552 B (the traces' `aten.baddbmm`
    bytes for one layer), and the router's W + ΔW [128, 2048]: 524,288 B."""
    config = fake_model.truncated_config_dict("Qwen/Qwen3-30B-A3B", 4)
    arch = from_config(config, name="Qwen/Qwen3-30B-A3B")
    cfg = RunConfig(
        model="Qwen/Qwen3-30B-A3B",
        use_peft=True,
        lora_r=8,
        lora_dropout=0.0,
        lora_target_modules=("all-linear",),
        dtype="bfloat16",
    )
    assert moe_lora.merged_weights(cfg, arch) == 1_207_959_552 + 524_288
    # factor copies: gate_up lhs/rhs 2r·E·(H + 2I), down r·E·(I + H), each bf16
    assert moe_lora.factor_copies(cfg, arch) == 2 * (16 * 128 * (2048 + 1536) + 8 * 128 * (768 + 2048))
    # attention-only targets wrap no stack
    attn = RunConfig(model="Qwen/Qwen3-30B-A3B", use_peft=True, lora_target_modules=("q_proj", "v_proj"))
    assert moe_lora.saved_per_layer(attn, arch) == 0


def test_moe_saved_per_routed_copy_by_hand():
    """bf16 Qwen3-30B-A3B LoRA on attention only: gate_up out 2I + act I + down out H (routing weights need
    grad) = 2 × (1536 + 768 + 2048) B; full fine-tuning adds the gathered input H and the act·up product I."""
    config = fake_model.truncated_config_dict("Qwen/Qwen3-30B-A3B", 4)
    arch = from_config(config, name="Qwen/Qwen3-30B-A3B")
    lora = RunConfig(
        model="Qwen/Qwen3-30B-A3B", use_peft=True, lora_target_modules=("q_proj", "v_proj"), dtype="bfloat16"
    )
    assert activations.moe_expert_saved_per_copy(lora, arch) == 2 * (1536 + 768 + 2048)
    full = RunConfig(model="Qwen/Qwen3-30B-A3B", dtype="bfloat16")
    assert activations.moe_expert_saved_per_copy(full, arch) == 2 * (1536 + 768 + 2048 + 2048 + 768)


def test_merged_stack_gradient_net_of_the_released_down_stack_by_hand():
    """Qwen3-30B-A3B, bf16: backward meets the down stack first, its gradient [128, 2048, 768] beside every merged
    stack: 128 × 2048 × 768 × 2 B = 402,653,184 B (the traces' `aten._grouped_mm` [128, 2048, 768] at the peak);
    the gate_up gradient [128, 1536, 2048] (805,306,368 B) comes after the down stack's merge (402,653,184 B) is
    released, so neither instant exceeds 402,653,184 B beyond the saved stacks. Wrapping gate_up alone, the whole
    805,306,368 B."""
    config = fake_model.truncated_config_dict("Qwen/Qwen3-30B-A3B", 4)
    arch = from_config(config, name="Qwen/Qwen3-30B-A3B")
    both = RunConfig(
        model="Qwen/Qwen3-30B-A3B",
        use_peft=True,
        lora_target_modules=("all-linear",),
        lora_dropout=0.0,
        dtype="bfloat16",
    )
    assert moe_lora.backward_transient(both, arch) == 402_653_184
    gate_up = RunConfig(
        model="Qwen/Qwen3-30B-A3B",
        use_peft=True,
        lora_target_modules=("gate_proj", "up_proj"),
        lora_dropout=0.0,
        dtype="bfloat16",
    )
    assert moe_lora.wrapped_expert_params(gate_up, arch) - {"router"} == {"gate_up"}
    assert moe_lora.backward_transient(gate_up, arch) == 805_306_368


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "gate_proj", "up_proj", "down_proj"]])
def test_trainable_tensors_match_peft_tensor_by_tensor(targets):
    # the per-tensor list the 8-bit optimizer's state is sized from includes the fused-expert factors peft adds
    # (ParamWrapper A and B of each wrapped stack): once it missed them and sized 1.2 GiB of uint8 state at 17 MiB
    from estimator.terms import optimizer

    config, cfg, lora = _qwen3_moe(targets, optim="paged_adamw_8bit")
    arch = from_config(config, name=cfg.model)
    numels = sorted(_peft_trainable_numels(config, **lora))
    assert sorted(optimizer._trainable_tensors(cfg, arch)) == numels
    # 8-bit AdamW keeps two states of at least one byte per element
    assert optimizer.optimizer_state(cfg, arch) >= 2 * sum(numels)
