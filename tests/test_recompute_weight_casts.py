"""With gradient checkpointing, fp32 weights under bf16 autocast: the recomputed layer holds its linears' bf16
weight casts (each matmul saves its cast weight for the input gradient) until its backward is done. The bytes are
checked against a transformers model of the catalog config on the meta device: 2 bytes per element of one decoder
layer's nn.Linear weights."""

from __future__ import annotations

import json

import pytest
import torch

from estimator.model.architecture import from_config
from estimator.settings.config import RunConfig
from estimator.terms import activations as act
from estimator.terms import moe_lora
from sweeps.trace import fake_model


def _layer_linear_numel(config: dict) -> int:
    import transformers

    conf = transformers.AutoConfig.for_model(**json.loads(json.dumps(config)))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(conf)
    layer = model.model.layers[0]
    return sum(m.weight.numel() for m in layer.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("use_peft", [True, False])
def test_recomputed_layer_holds_its_weight_casts(use_peft):
    config = fake_model.truncated_config_dict("Qwen/Qwen2.5-7B-Instruct", 1)
    arch = from_config(config, name="7B")
    b, seq = 2, 300
    cfg = RunConfig(model="7B", dtype="float32", bf16=True, gradient_checkpointing=True, use_peft=use_peft)
    casts = act.recompute_layer(cfg, arch, b, seq) - b * seq * act.layer_saved_per_token(cfg, arch, seq)
    casts -= moe_lora.saved_per_layer(cfg, arch)
    assert casts == 2 * _layer_linear_numel(config)
    # a bf16 load has no casts to hold
    bf16 = RunConfig(model="7B", dtype="bfloat16", bf16=True, gradient_checkpointing=True, use_peft=use_peft)
    assert act.recompute_layer(bf16, arch, b, seq) == b * seq * act.layer_saved_per_token(bf16, arch, seq)
