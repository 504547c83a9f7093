"""Configurations the installed libraries refuse, refused here the same way (one line saying what to pass).

* PEFT's default LoRA targets: with `target_modules=None`, peft 0.21 `LoraModel._prepare_adapter_config`
  looks the model type up in `TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`
  (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/utils/constants.py#L67-L107) and raises "Please specify `target_modules` in `peft_config`" when it is
  missing. Each family's entry is `Family.peft_default_targets` (estimator/model/families.py).
* Attention implementations: transformers 5.23 `PreTrainedModel._sdpa_can_dispatch`
  (https://github.com/huggingface/transformers/blob/v5.23.0/src/transformers/modeling_utils.py#L1654-L1670) raises when a model class sets `_supports_sdpa = False` and sdpa is asked for
  explicitly (Gemma2: `Gemma2PreTrainedModel._supports_sdpa = False`, "sdpa does not support softcapping");
  with no implementation given, transformers falls back to eager.
* LoRA on a MoE model's fused experts: with `all-linear`, peft 0.21 wraps the 3-D expert parameters in
  `lora.ParamWrapper`, whose `__init__` raises "does not work with lora_dropout != 0"
  (https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/lora/layer.py#L2363-L2366; seen tracing Qwen3-30B-A3B).
* `cast_lm_head_to_fp32` with PEFT on tied embeddings: TRL 1.16 `_cast_lm_head_to_fp32`
  (grpo_trainer.py:1037-1043) registers a hook on `target_model.model.embed_tokens`, but after `get_peft_model`
  `target_model.model` is the `*ForCausalLM`, which has no `embed_tokens`: `GRPOTrainer.__init__` raises
  AttributeError (seen tracing Llama-3.2, Qwen3, Gemma3 and SmolLM2).
"""

from __future__ import annotations

from estimator.model.architecture import Arch
from estimator.model.families import FAMILIES, PEFT_VERSION, TRANSFORMERS_VERSION
from estimator.settings.config import InvalidConfig, RunConfig

# peft's default LoRA targets and transformers' refused attention, per family (estimator/model/families.py)
PEFT_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    t: f.peft_default_targets for t, f in FAMILIES.items() if f.peft_default_targets is not None
}


def _attention_names(arch: Arch) -> str:
    names = [lin.name.rsplit(".", 1)[-1] for lin in arch.layer_linears if lin.is_nn_linear]
    attn = [n for n in names if n.startswith(("q", "k", "v", "o")) and n.endswith("proj")]
    return ",".join(attn)


def check_library_support(cfg: RunConfig, arch: Arch | None) -> None:
    """Raise InvalidConfig (one line, naming what to pass) where PEFT or transformers would refuse `cfg`."""
    if arch is None:
        return
    fam = arch.family
    if cfg.use_peft and cfg.lora_target_modules is None and fam.peft_default_targets is None:
        raise InvalidConfig(
            f"PEFT {PEFT_VERSION} has no default LoRA target modules for model type {arch.model_type!r}: "
            f"pass --lora-target-modules all-linear, or a list such as {_attention_names(arch)}"
        )
    if cfg.use_peft and arch.is_moe and cfg.lora_dropout != 0 and cfg.lora_target_modules == ("all-linear",):
        raise InvalidConfig(
            f"PEFT {PEFT_VERSION} wraps {arch.model_type}'s fused experts in lora.ParamWrapper, which refuses "
            f"lora_dropout != 0: pass --lora-dropout 0, or attention-only --lora-target-modules"
        )
    if cfg.use_peft and cfg.cast_lm_head_to_fp32 and arch.tie_word_embeddings:
        raise InvalidConfig(
            "TRL 1.16 fails on --cast-lm-head-to-fp32 with PEFT when the embeddings are tied "
            f"({arch.model_type}: GRPOTrainer reads model.embed_tokens on the PeftModel): drop --cast-lm-head-to-fp32"
        )
    if cfg.attn_implementation == "sdpa" and fam.sdpa_refused:
        raise InvalidConfig(
            f"transformers {TRANSFORMERS_VERSION} refuses attn_implementation 'sdpa' for {arch.model_type} "
            f"({fam.sdpa_refused}): pass --attn-implementation eager (or flash_attention_2)"
        )
