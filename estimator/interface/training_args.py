"""TrainingArguments and TRL keys a TRL config file holds whose meaning is not one RunConfig field: FSDP's `fsdp` with
`fsdp_config`, the activation-checkpointing names and kwargs, TrlParser's `env:`, a bitsandbytes
`quantization_config`, and dict fields given as JSON strings. Each reader follows the upstream code path it
names and writes into the file's `FileSettings` (`estimator/interface/configfile.py`); every problem is one
ConfigFileError line."""

from __future__ import annotations

import json
from pathlib import Path

from estimator.interface.file_settings import FileSettings
from estimator.interface.files import ConfigFileError, clip, load_file

# TrainingArguments fields a YAML may give as a JSON string: TrainingArguments.__post_init__ parses a string that
# starts with "{" (_VALID_DICT_FIELDS, transformers v5.24.0 training_args.py#L1525-L1531; GRPOConfig adds
# model_init_kwargs and generation_kwargs, trl v1.16.0 grpo_config.py _VALID_DICT_FIELDS)
JSON_DICT_KEYS = (
    "deepspeed",
    "fsdp_config",
    "model_init_kwargs",
    "generation_kwargs",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
)
COMPLETION_KEYS = {  # generation_kwargs key -> the generation path it overrides max_completion_length on
    "max_new_tokens": "transformers' generate (grpo_trainer.py#L1155-L1172: generation_kwargs update the dict)",
    "max_tokens": "vLLM (vllm_generation.py: generation_kwargs update SamplingParams' max_tokens)",
}


FSDP_WORDS = (
    "full_shard",
    "shard_grad_op",
    "no_shard",
    "hybrid_shard",
    "hybrid_shard_zero2",
    "offload",
    "auto_wrap",
)


def str_to_bool(value) -> bool | None:
    """transformers' str_to_bool: y/yes/t/true/on/1 and n/no/f/false/off/0 (any case); None otherwise."""
    text = str(value).lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    return None


def fsdp_option(value, config, where: str, out: FileSettings, base: Path | None) -> None:
    """TrainingArguments `fsdp` (true, "full_shard auto_wrap" or a list) with its `fsdp_config` (a mapping or a JSON
    file's path; `fsdp_`-prefixed keys are the same keys), read as transformers 5.24 `_process_fsdp_args` and
    `_apply_legacy_fsdp_to_config` read them (training_args.py#L2775-L2938): `fsdp_config` wins over the words;
    version 2 (the default) reshards after forward unless `reshard_after_forward` is false (SHARD_GRAD_OP), version 1
    takes a strategy name; `cpu_offload` (or the word offload) offloads the parameters; `activation_checkpointing`
    there is FSDP's own (`merge.finish` checks it against the training argument)."""
    if value in (None, False, "", []):
        if config not in (None, "", {}):
            out.notes.append(
                f"{where}: fsdp_config has no effect without fsdp (TrainingArguments reads it only then)"
            )
        return
    words = ["full_shard"] if value is True else value.split() if isinstance(value, str) else value
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise ConfigFileError(
            f"{where}: fsdp must be true or a string such as 'full_shard auto_wrap', got {clip(value)}"
        )
    if isinstance(config, str):
        p = Path(config)  # TrainingArguments opens it from the working directory
        if not p.exists() and base is not None and (base / p).exists():
            out.notes.append(
                f"{where}: fsdp_config {clip(config)} is not in the working directory; read it beside {where}"
            )
            p = base / p
        config = load_file(str(p), f"{where}: fsdp_config")
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise ConfigFileError(
            f"{where}: fsdp_config must be a mapping or a JSON file's path, got {clip(config)}"
        )
    fs = {str(k).removeprefix("fsdp_"): v for k, v in config.items()}
    version = fs.get("version", 2)
    if version not in (1, 2, "1", "2"):
        raise ConfigFileError(f"{where}: fsdp_config.version {clip(version)} is not accepted; accepted: 1, 2")
    version = int(version)
    explicit = "reshard_after_forward" in fs
    for word in (w.lower() for w in words):
        if word not in FSDP_WORDS:
            raise ConfigFileError(
                f"{where}: fsdp {clip(value)}: unknown option {clip(word)}; accepted: {', '.join(FSDP_WORDS)}"
            )
        if word == "offload":
            fs.setdefault("cpu_offload", True)
        elif word != "auto_wrap":
            if version == 2 and word not in ("full_shard", "shard_grad_op"):
                raise ConfigFileError(
                    f"{where}: fsdp {clip(word)} needs fsdp_config version 1, which transformers calls deprecated; "
                    "accepted with version 2: full_shard, shard_grad_op"
                )
            fs.setdefault("reshard_after_forward", word == "full_shard" if version == 2 else word)
    raf = fs.get("reshard_after_forward", True if version == 2 else "full_shard")
    if version == 2:
        on = str_to_bool(raf)
        if on is None:
            raise ConfigFileError(
                f"{where}: fsdp_config.reshard_after_forward {clip(raf)} is not accepted with version 2; accepted: true, false"
            )
        strategy = "FULL_SHARD" if on else "SHARD_GRAD_OP"
    else:
        strategy = str(raf).upper()
        if strategy.startswith("HYBRID_SHARD") or strategy not in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"):
            raise ConfigFileError(
                f"{where}: fsdp_config.reshard_after_forward {clip(raf)} is not modelled; accepted: full_shard, "
                "shard_grad_op, no_shard"
            )
        out.notes.append(f"{where}: FSDP version 1 is estimated as FSDP2 (the traced path)")
    key = "fsdp_config.reshard_after_forward" if explicit else "fsdp"
    out.values["sharding"], out.sources["sharding"] = ("none" if strategy == "NO_SHARD" else "fsdp"), "fsdp"
    if strategy == "SHARD_GRAD_OP" or (explicit and strategy != "NO_SHARD"):
        out.values["fsdp_sharding_strategy"], out.sources["fsdp_sharding_strategy"] = strategy, key
    if _fsdp_flag(fs, "cpu_offload", where):
        out.values["offload_param"], out.sources["offload_param"] = True, "fsdp_config.cpu_offload"
    if _fsdp_flag(fs, "activation_checkpointing", where):
        out.fsdp_checkpointing = f"{where} fsdp_config.activation_checkpointing"


def _fsdp_flag(fs: dict, key: str, where: str) -> bool:
    """fsdp_config's `key` as transformers' str_to_bool reads it (False when absent); one line when it is not one."""
    if key not in fs:
        return False
    value = str_to_bool(fs[key])
    if value is None:
        raise ConfigFileError(f"{where}: fsdp_config.{key} must be true or false, got {clip(fs[key])}")
    return value


def json_dict(value, key: str, where: str):
    """A TrainingArguments dict field given as a JSON string (JSON_DICT_KEYS) -> the dict; other values as given."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
            raise ConfigFileError(f"{where}: {key} {clip(value)} is not a JSON object") from None
    return value


# the variables torch's CUDA allocator reads its settings from, the first one set wins (torch 2.13
# c10/cuda/CUDAAllocatorConfig.h `instance`: PYTORCH_CUDA_ALLOC_CONF, then PYTORCH_ALLOC_CONF)
ALLOC_CONF_NAMES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def environment(value, where: str, out: FileSettings) -> None:
    """TrlParser sets a YAML's `env:` mapping in os.environ before the run (trl v1.16.0 scripts/utils.py#L331-L337):
    the allocator's variables there (ALLOC_CONF_NAMES) configure it; other variables do not change the estimate."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ConfigFileError(f"{where}: env must be a mapping of environment variables, got {clip(value)}")
    names = {str(name): setting for name, setting in value.items()}
    conf = next((name for name in ALLOC_CONF_NAMES if names.get(name) not in (None, "")), None)
    for name in names:
        if name == conf:
            out.values["pytorch_cuda_alloc_conf"] = str(names[name])
            out.sources["pytorch_cuda_alloc_conf"] = f"env.{name}"
        elif name not in ALLOC_CONF_NAMES:
            out.known.append(f"env.{name}")


def quantization_config(value, where: str, out: FileSettings) -> None:
    """model_init_kwargs.quantization_config, passed to from_pretrained: a bitsandbytes 4-bit config is
    load_in_4bit with its quant type and nested quantization; an 8-bit one is noted as load_in_8bit is."""
    key = "model_init_kwargs.quantization_config"
    if not isinstance(value, dict):
        raise ConfigFileError(
            f"{where}: {key} must be a mapping (a BitsAndBytesConfig's keys), got {clip(value)}"
        )
    if value.get("load_in_4bit") is True:
        out.values["load_in_4bit"], out.sources["load_in_4bit"] = True, f"{key}.load_in_4bit"
        if "bnb_4bit_quant_type" in value:
            out.values["bnb_4bit_quant_type"] = value["bnb_4bit_quant_type"]
            out.sources["bnb_4bit_quant_type"] = f"{key}.bnb_4bit_quant_type"
        if "bnb_4bit_use_double_quant" in value:
            nested = value["bnb_4bit_use_double_quant"]
            if not isinstance(nested, bool):
                raise ConfigFileError(
                    f"{where}: {key}.bnb_4bit_use_double_quant must be true or false, got {clip(nested)}"
                )
            out.values["use_bnb_nested_quant"] = nested
            out.sources["use_bnb_nested_quant"] = f"{key}.bnb_4bit_use_double_quant"
    elif value.get("load_in_8bit") is True:
        out.notes.append(
            f"{where}: {key}.load_in_8bit (an 8-bit bitsandbytes base) is not modelled: estimated with the base in "
            "its dtype, which errs high"
        )
    else:
        raise ConfigFileError(
            f"{where}: {key} {clip(value)} is not modelled; accepted: a bitsandbytes config with load_in_4bit: true "
            "(or load_in_8bit: true)"
        )


def checkpointing(given: dict, where: str, out: FileSettings) -> None:
    """transformers 5.23 / 5.24: `activation_checkpointing` and its `_kwargs` win over their deprecated
    `gradient_checkpointing` aliases when set (training_args.py#L1533-L1545). Of the kwargs, `every_n_layers` > 1
    (only some layers checkpointed) is estimated without checkpointing, an upper bound, and `offload` (saved
    inputs in host memory) as checkpointing on the GPU, which errs high (trainer.py#L1503-L1515)."""
    name = "activation_checkpointing" if "activation_checkpointing" in given else "gradient_checkpointing"
    if name in given:
        value = given[name]
        if not isinstance(value, bool):
            raise ConfigFileError(f"{where}: {name} must be true or false, got {clip(value)}")
        out.values["gradient_checkpointing"], out.sources["gradient_checkpointing"] = value, name
    kw_name = next(
        (k for k in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs") if k in given), None
    )
    if kw_name is None or out.values.get("gradient_checkpointing") is False:
        return
    kwargs = given[kw_name]
    every = kwargs.get("every_n_layers", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigFileError(f"{where}: {kw_name}.every_n_layers must be an integer >= 1, got {clip(every)}")
    if every > 1:
        out.values["gradient_checkpointing"] = False
        out.sources["gradient_checkpointing"] = f"{kw_name}.every_n_layers"
        out.notes.append(
            f"{where}: {kw_name}.every_n_layers {every} (every {every}th layer checkpointed) is not modelled: "
            "estimated without checkpointing, an upper bound"
        )
    elif kwargs.get("offload") is True:
        out.notes.append(
            f"{where}: {kw_name}.offload (checkpointed inputs in host memory) is estimated as kept on the GPU, "
            "which errs high"
        )
