"""Read the files of a TRL GRPO run -- TRL config, accelerate config, DeepSpeed JSON -- into RunConfig values.

`vram-estimate --config FILE` repeats; each file's kind is recognised from its keys (`kind_of`):

- "trl": a TRL GRPOConfig / ModelConfig / ScriptArguments YAML or JSON -- one file may mix their keys, as
  `trl grpo --config` accepts (trl/scripts/grpo.py make_parser: GRPOScriptArguments, GRPOConfig, ModelConfig,
  DatasetMixtureConfig) -- or an open-r1 recipe (the same plus open-r1's own keys, `known_keys.OPEN_R1_KEYS`);
- "accelerate": an `accelerate config` YAML (distributed_type / compute_environment);
- "deepspeed": a DeepSpeed JSON (zero_optimization / train_micro_batch_size_per_gpu / train_batch_size); also
  reached from an accelerate YAML's deepspeed_config_file or a TRL config's `deepspeed:` key.

Two files of one kind are refused. `merge` combines them as the libraries do (the rules and their upstream code
paths are in `estimator/interface/launchfile.py`'s docstring and `merge`'s), and flags override files.

Keys: a key the estimate uses maps to its RunConfig field (the schema's `trl=` / `file_keys`, `estimator/settings/config.py`);
a TRL / accelerate key the estimate does not use is listed as known and not modelled; a key within a small edit
distance of a known key (`suggestion`) is an error naming it; anything else is listed as unknown (another tool's).
Files are read with a size cap (`MAX_FILE_BYTES`), regular files only; every problem is one ConfigFileError line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from estimator.interface import launchfile
from estimator.interface.files import (
    MAX_TYPO_CHECKS,
    ConfigFileError,
    clip,
    load_file,
    suggestion,
)
from estimator.interface.known_keys import LAUNCH_KEYS, OPEN_R1_KEYS, TRANSFORMERS_4_KEYS, TRL_KEYS
from estimator.interface.launchfile import LaunchFileError
from estimator.settings.config import Field, RunConfig, schema
from estimator.text import listed, printable

DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}
KINDS = {
    "trl": "TRL config (GRPOConfig / ModelConfig / ScriptArguments)",
    "accelerate": "accelerate config",
    "deepspeed": "DeepSpeed JSON",
}


@dataclass
class FileSettings:
    """RunConfig field values read from one file (or a command's arguments), and what was ignored or translated.

    `sources`: field -> the key that set it; `known` / `unknown`: keys not used (known to TRL or accelerate / not);
    `must_match`, `mixed_precision`, `needs_processes`, `deepspeed_file`, `train_batch_size`: as in
    launchfile.LaunchSettings."""

    values: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kind: str = "trl"
    where: str = ""
    path: str = ""
    sources: dict = field(default_factory=dict)
    known: list = field(default_factory=list)
    unknown: list = field(default_factory=list)
    must_match: set = field(default_factory=set)
    mixed_precision: str | None = None
    needs_processes: bool = False
    deepspeed_file: str | None = None
    train_batch_size: tuple[int, str] | None = None
    flavour: str = ""
    fsdp_checkpointing: str | None = None  # launchfile.LaunchSettings'
    deepspeed_inline: dict | None = None  # a TRL config's `deepspeed:` given as the DeepSpeed config itself
    launch_options: dict = field(
        default_factory=dict
    )  # keys `trl grpo` hands to accelerate launch (LAUNCH_KEYS)
    completion_lengths: dict = field(
        default_factory=dict
    )  # generation_kwargs max_new_tokens / max_tokens -> N


def normalize_dtype(value: str) -> str:
    """'torch.bfloat16', 'bf16', 'BFloat16' -> 'bfloat16'; unknown names pass through (validated later)."""
    v = str(value).strip().lower().removeprefix("torch.")
    return DTYPE_ALIASES.get(v, v)


def check_type(f: Field, value, where: str):
    """`value` converted for setting `f`, or ConfigFileError naming the key, the value and the type wanted."""
    if value is None and f.nullable:
        return None
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "strs": isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
    }[f.kind]
    if not ok:
        want = {
            "strs": "a string or a list of strings",
            "str": "a string",
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
        }[f.kind]
        raise ConfigFileError(f"{where}: {f.name} must be {want}, got {clip(value)}")
    if f.kind == "float":
        return float(value)
    if f.kind == "strs":
        return (value,) if isinstance(value, str) else tuple(value)
    return value


def file_keys() -> tuple[dict[str, Field], dict[str, dict[str, Field]]]:
    """Top-level keys and nested keys (`model_init_kwargs.dtype`) a config file may use, to schema fields."""
    top: dict[str, Field] = {}
    nested: dict[str, dict[str, Field]] = {}
    for f in schema():
        for key in f.file_keys:
            if "." in key:
                parent, child = key.split(".", 1)
                nested.setdefault(parent, {})[child] = f
            else:
                top.setdefault(key, f)
    nested.setdefault("model_init_kwargs", {}).setdefault("torch_dtype", nested["model_init_kwargs"]["dtype"])
    nested["model_init_kwargs"].setdefault("attn_implementation", top["attn_implementation"])
    return top, nested


SPECIAL_KEYS = (  # TrainingArguments / TrlParser / ModelConfig keys translated by hand below
    "use_cpu",
    "fsdp",
    "fsdp_config",
    "fp16",
    "deepspeed",
    "env",
    "activation_checkpointing",
    "activation_checkpointing_kwargs",
    "gradient_checkpointing_kwargs",
    "load_in_8bit",
    "lora_modules_to_save",
    "use_dora",
    "cache_implementation",
)
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


def kind_of(data: dict) -> str:
    """'deepspeed', 'accelerate' or 'trl' from a file's keys."""
    if launchfile.is_deepspeed_config(data):
        return "deepspeed"
    if launchfile.is_accelerate_config(data):
        return "accelerate"
    return "trl"


FSDP_WORDS = (
    "full_shard",
    "shard_grad_op",
    "no_shard",
    "hybrid_shard",
    "hybrid_shard_zero2",
    "offload",
    "auto_wrap",
)


def _str_to_bool(value) -> bool | None:
    """transformers' str_to_bool: y/yes/t/true/on/1 and n/no/f/false/off/0 (any case); None otherwise."""
    text = str(value).lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    return None


def _fsdp_option(value, config, where: str, out: FileSettings, base: Path | None) -> None:
    """TrainingArguments `fsdp` (true, "full_shard auto_wrap" or a list) with its `fsdp_config` (a mapping or a JSON
    file's path; `fsdp_`-prefixed keys are the same keys), read as transformers 5.24 `_process_fsdp_args` and
    `_apply_legacy_fsdp_to_config` read them (training_args.py#L2775-L2938): `fsdp_config` wins over the words;
    version 2 (the default) reshards after forward unless `reshard_after_forward` is false (SHARD_GRAD_OP), version 1
    takes a strategy name; `cpu_offload` (or the word offload) offloads the parameters; `activation_checkpointing`
    there is FSDP's own (`finish` checks it against the training argument)."""
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
        on = _str_to_bool(raf)
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
    if "cpu_offload" in fs:
        offload = _str_to_bool(fs["cpu_offload"])
        if offload is None:
            raise ConfigFileError(
                f"{where}: fsdp_config.cpu_offload must be true or false, got {clip(fs['cpu_offload'])}"
            )
        if offload:
            out.values["offload_param"], out.sources["offload_param"] = True, "fsdp_config.cpu_offload"
    if "activation_checkpointing" in fs:
        ac = _str_to_bool(fs["activation_checkpointing"])
        if ac is None:
            raise ConfigFileError(
                f"{where}: fsdp_config.activation_checkpointing must be true or false, got {clip(fs['activation_checkpointing'])}"
            )
        if ac:
            out.fsdp_checkpointing = f"{where} fsdp_config.activation_checkpointing"


def _json_dict(value, key: str, where: str):
    """A TrainingArguments dict field given as a JSON string (JSON_DICT_KEYS) -> the dict; other values as given."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
            raise ConfigFileError(f"{where}: {key} {clip(value)} is not a JSON object") from None
    return value


def _environment(value, where: str, out: FileSettings) -> None:
    """TrlParser sets a YAML's `env:` mapping in os.environ before the run (trl v1.16.0 scripts/utils.py#L331-L337):
    PYTORCH_CUDA_ALLOC_CONF there configures the allocator; other variables do not change the estimate."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise ConfigFileError(f"{where}: env must be a mapping of environment variables, got {clip(value)}")
    for name, setting in value.items():
        if str(name) == "PYTORCH_CUDA_ALLOC_CONF":
            out.values["pytorch_cuda_alloc_conf"] = "" if setting is None else str(setting)
            out.sources["pytorch_cuda_alloc_conf"] = "env.PYTORCH_CUDA_ALLOC_CONF"
        else:
            out.known.append(f"env.{name}")


def _quantization_config(value, where: str, out: FileSettings) -> None:
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


def _checkpointing(given: dict, where: str, out: FileSettings) -> None:
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


def translate(data: dict, where: str, base: Path | None = None) -> FileSettings:
    """Map TRL GRPOConfig / ModelConfig / ScriptArguments keys to RunConfig fields (module docstring's key rules)."""
    top, nested = file_keys()
    out = FileSettings(kind="trl", where=where)
    open_r1: list[str] = []

    def put(f: Field, value, key: str) -> None:
        out.values[f.name] = check_type(f, value, where)
        out.sources[f.name] = key

    checkpointing: dict[str, object] = {}  # activation_checkpointing / gradient_checkpointing (+ _kwargs)
    fsdp: dict[str, object] = {}  # TrainingArguments fsdp and fsdp_config, read together
    removed: list[str] = []  # transformers 4 TrainingArguments keys
    for key, value in data.items():
        key = str(key)
        if key in JSON_DICT_KEYS:
            value = _json_dict(value, key, where)
        if key in nested:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigFileError(f"{where}: {key} must be a mapping, got {clip(value)}")
            for sub, subval in value.items():
                if sub in nested[key]:
                    put(nested[key][sub], subval, f"{key}.{sub}")
                elif key == "generation_kwargs" and sub in COMPLETION_KEYS:
                    if isinstance(subval, bool) or not isinstance(subval, int) or subval < 1:
                        raise ConfigFileError(
                            f"{where}: generation_kwargs.{sub} must be an integer >= 1, got {clip(subval)}"
                        )
                    out.completion_lengths[sub] = subval
                elif key == "model_init_kwargs" and sub == "quantization_config":
                    _quantization_config(subval, where, out)
                else:
                    out.known.append(f"{key}.{sub}")
        elif key in ("activation_checkpointing", "gradient_checkpointing"):
            if value is not None:
                checkpointing[key] = value
                out.values.setdefault(
                    "gradient_checkpointing", value
                )  # the file's order; `_checkpointing` decides
                out.sources.setdefault("gradient_checkpointing", key)
        elif key in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
            if value is not None:
                if not isinstance(value, dict):
                    raise ConfigFileError(f"{where}: {key} must be a mapping, got {clip(value)}")
                checkpointing[key] = value
        elif key == "env":
            _environment(value, where, out)
        elif key == "load_in_8bit":
            if value is True:
                out.notes.append(
                    f"{where}: load_in_8bit (an 8-bit bitsandbytes base) is not modelled: estimated with the base "
                    "in its dtype, which errs high (the 8-bit base is about half a 16-bit one)"
                )
        elif key in ("lora_modules_to_save", "use_dora"):
            if value not in (None, False, [], ""):
                what = (
                    "each listed module becomes a trainable full copy, with its gradients and optimizer state"
                    if key == "lora_modules_to_save"
                    else "DoRA adds a magnitude vector per adapted layer and recomputes each weight's norm in "
                    "every forward, on top of LoRA's memory"
                )
                raise ConfigFileError(
                    f"{where}: {key} {clip(value)} is not modelled ({what}), so the estimate would be low; "
                    f"remove it to estimate the rest of the run"
                )
        elif key == "cache_implementation":
            if value not in (None, "", "dynamic"):
                out.notes.append(
                    f"{where}: cache_implementation {clip(value)} is not modelled: generation is estimated with "
                    "transformers' dynamic KV cache"
                )
        elif key == "use_cpu":
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: use_cpu must be true or false, got {clip(value)}")
            if value:
                out.values["device"], out.sources["device"] = "cpu", "use_cpu"
        elif key in ("fsdp", "fsdp_config"):
            fsdp[key] = value
        elif key == "fp16":
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: fp16 must be true or false, got {clip(value)}")
            if value:  # GRPOConfig: bf16 defaults to `not fp16`; both are 2-byte autocast for the estimate
                out.values["bf16"], out.sources["bf16"] = True, "fp16"
                out.notes.append(f"{where}: fp16 is estimated as bf16 (same 2-byte sizes)")
        elif key == "deepspeed":
            if value in (None, ""):
                continue
            if isinstance(value, dict):  # the DeepSpeed config itself (TrainingArguments accepts a dict)
                out.deepspeed_inline = value
                continue
            if not isinstance(value, str):
                raise ConfigFileError(
                    f"{where}: deepspeed must be a DeepSpeed JSON's path or its mapping, got {clip(value)}"
                )
            p = Path(value)  # TrainingArguments opens it from the working directory
            if not p.exists() and base is not None and (base / p).exists():
                out.notes.append(
                    f"{where}: deepspeed {value} is not in the working directory; read it beside {where}"
                )
                p = base / p
            out.deepspeed_file = str(p)
        elif key in top:
            put(top[key], value, key)
        elif key in TRL_KEYS:
            out.known.append(key)
        elif key in OPEN_R1_KEYS:
            open_r1.append(key)
        elif key in TRANSFORMERS_4_KEYS:
            removed.append(key)
        elif key in LAUNCH_KEYS and key not in top and key not in nested:
            out.launch_options[key] = value
        else:
            checked = len(out.unknown) < MAX_TYPO_CHECKS
            near = checked and suggestion(key, [*top, *nested, *SPECIAL_KEYS, *TRL_KEYS, *OPEN_R1_KEYS])
            if near:
                raise ConfigFileError(f"{where}: unknown key {clip(key)}; did you mean {near}?")
            out.unknown.append(key)
    if checkpointing:
        _checkpointing(checkpointing, where, out)
    if fsdp:
        _fsdp_option(fsdp.get("fsdp"), fsdp.get("fsdp_config"), where, out, base)
    if "dtype" in out.values:
        out.values["dtype"] = normalize_dtype(out.values["dtype"])
    if open_r1:
        out.flavour = "open-r1 recipe"
        out.known += open_r1
    if out.known:
        out.notes.append(f"{where}: known keys that do not change the estimate: {listed(out.known)}")
    if removed:
        out.notes.append(
            f"{where}: transformers 4 TrainingArguments keys that transformers 5 removed (TRL 1.16's parser does "
            f"not know them), not read: {listed(removed)}"
        )
    if out.unknown:
        out.notes.append(
            f"{where}: unknown keys (not TRL 1.16's GRPOConfig / ModelConfig / ScriptArguments: another tool's?), "
            f"not read: {listed(out.unknown)}"
        )
    return out


def _from_launch(launch, kind: str, where: str, path: str) -> FileSettings:
    out = FileSettings(
        values=dict(launch.values),
        notes=list(launch.notes),
        kind=kind,
        where=where,
        path=path,
        sources=dict(launch.sources),
        unknown=list(launch.ignored),
        must_match=set(launch.must_match),
        mixed_precision=launch.mixed_precision,
        needs_processes=launch.needs_processes,
        deepspeed_file=launch.deepspeed_file,
        train_batch_size=launch.train_batch_size,
        fsdp_checkpointing=launch.fsdp_checkpointing,
    )
    if launch.ignored:
        out.notes.append(f"{where}: keys this tool does not read: {listed(launch.ignored)}")
    return out


def settings_of(data: dict, p: Path, flag: str = "--config") -> FileSettings:
    """One parsed file -> FileSettings of its kind."""
    kind = kind_of(data)
    if kind == "trl":
        out = translate(data, printable(p.name), p.parent)
        out.path = str(p)
        return out
    try:
        launch = launchfile.translate_file(data, p)
    except LaunchFileError as e:
        raise ConfigFileError(f"{flag} {e}".strip()) from None
    return _from_launch(launch, kind, printable(p.name), str(p))


def read_config_file(path: str, flag: str = "--config") -> FileSettings:
    """Read one TRL / accelerate / DeepSpeed file; one-line ConfigFileError on any problem."""
    data = load_file(path, flag)
    return settings_of(data, Path(path), flag)


def read_files(paths, flag: str = "--config") -> list[FileSettings]:
    """Every file, plus the DeepSpeed JSON a TRL config's `deepspeed:` key names; two of one kind are refused."""
    files: list[FileSettings] = []
    for path in paths:
        files.append(read_config_file(path, flag))
        ds = files[-1].deepspeed_file if files[-1].kind == "trl" else None
        inline = files[-1].deepspeed_inline if files[-1].kind == "trl" else None
        if inline is not None:
            where = f"{files[-1].where} deepspeed"
            try:
                launch = launchfile.translate_deepspeed(inline, where)
            except LaunchFileError as e:
                raise ConfigFileError(str(e)) from None
            files.append(_from_launch(launch, "deepspeed", where, ""))
        if ds:
            inner = read_config_file(ds, f"{files[-1].where}: deepspeed")
            if inner.kind != "deepspeed":
                raise ConfigFileError(
                    f"{files[-1].where}: deepspeed {clip(ds)} is not a DeepSpeed JSON (no zero_optimization)"
                )
            files.append(inner)
    check_kinds(files)
    return files


def _same(a: FileSettings, b: FileSettings) -> bool:
    try:
        return bool(a.path and b.path and Path(a.path).resolve() == Path(b.path).resolve())
    except OSError:
        return False


def check_kinds(files: list[FileSettings]) -> None:
    """At most one file of each kind (an accelerate YAML's deepspeed_config_file counts as the DeepSpeed one)."""
    seen: dict[str, FileSettings] = {}
    for f in files:
        kinds = [f.kind]
        if f.kind == "accelerate" and f.deepspeed_file:
            kinds.append("deepspeed")
        for kind in kinds:
            if kind in seen and not _same(seen[kind], f):
                raise ConfigFileError(
                    f"two {KINDS[kind]} files: {clip(seen[kind].where)} and {clip(f.where)}; give one "
                    f"(the run reads one {KINDS[kind]})"
                )
            seen.setdefault(kind, f)


def _label(f: FileSettings, name: str) -> str:
    """'acc.yaml num_processes'; a key read from a file the first one points at keeps that file's name."""
    src = f.sources.get(name, "")
    if src.split(" ")[0].endswith((".json", ".yaml", ".yml")):
        return src
    return f"{f.where} {src}".strip()


@dataclass
class Merged:
    """The run's values from every file and the command, with who set each one (`sources`) and notes."""

    values: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sources: dict = field(default_factory=dict)
    needs_processes: str | None = None
    train_batch_sizes: list[tuple[int, str]] = field(
        default_factory=list
    )  # DeepSpeed's, to check when all is known
    fsdp_checkpointing: str | None = None  # where FSDP's own activation checkpointing is on (`finish`)
    completion_lengths: dict = field(
        default_factory=dict
    )  # a TRL file's generation_kwargs lengths (`finish`)
    completion_where: str = ""


def finish(merged: Merged, values: dict, sources: dict, default_checkpointing: bool) -> list[str]:
    """What only the whole run decides, once the release's defaults are in `values` (changed in place): FSDP's own
    activation checkpointing against the GRPOConfig's, and generation_kwargs' lengths on the generation path the
    run takes. Returns notes; ConfigFileError when transformers would stop."""
    notes = []
    if merged.fsdp_checkpointing:
        given = sources.get("gradient_checkpointing")
        if values.get("gradient_checkpointing", default_checkpointing):
            said = (
                f"{given} sets gradient_checkpointing true"
                if given
                else "gradient_checkpointing is true (TRL's default)"
            )
            raise ConfigFileError(
                f"{merged.fsdp_checkpointing} is true and {said}: transformers stops when both are on "
                "(trainer.py: use FSDP's activation checkpointing with FSDP); set gradient_checkpointing: false"
            )
        values["gradient_checkpointing"] = True
        sources["gradient_checkpointing"] = merged.fsdp_checkpointing
        notes.append(
            f"{merged.fsdp_checkpointing}: FSDP's activation checkpointing, estimated as gradient_checkpointing"
        )
    key = "max_tokens" if values.get("use_vllm") else "max_new_tokens"
    if key in merged.completion_lengths and sources.get("max_completion_length") != "flags":
        n = merged.completion_lengths[key]
        values["max_completion_length"] = n
        sources["max_completion_length"] = f"{merged.completion_where} generation_kwargs.{key}"
        notes.append(
            f"{merged.completion_where}: generation_kwargs.{key} {n} overrides max_completion_length in "
            f"{COMPLETION_KEYS[key]}: completions are up to {n} tokens"
        )
    other = "max_new_tokens" if key == "max_tokens" else "max_tokens"
    if other in merged.completion_lengths:
        notes.append(
            f"{merged.completion_where}: generation_kwargs.{other} applies to "
            f"{'vLLM' if other == 'max_tokens' else 'generation without vLLM'}, not this run: not read"
        )
    return notes


def check_train_batch_size(total: int, where: str, gpus: int, micro: int, accumulation: int) -> None:
    """ConfigFileError when a DeepSpeed train_batch_size is not GPUs x micro-batch x accumulation: the HF Trainer
    fills it as world_size x per_device_train_batch_size x gradient_accumulation_steps and refuses another value
    (transformers integrations/deepspeed.py `trainer_config_process`, "train_batch_size (calculated)")."""
    product = gpus * micro * accumulation
    if total != product:
        raise ConfigFileError(
            f"{where}: train_batch_size {total} is not {gpus} GPU(s) x per_device_train_batch_size {micro} x "
            f"gradient_accumulation_steps {accumulation} = {product}, and the HF Trainer refuses the mismatch; "
            f'set it to "auto" or {product}'
        )


def merge(files: list[FileSettings], flag_values: dict) -> Merged:
    """Combine launch files (accelerate, DeepSpeed, a launcher's process count), the TRL config / arguments and the
    flags, as the libraries do:

    - TRL arguments on a command line override the TRL config file (TrlParser.parse_args_and_config sets the file's
      values as defaults; https://github.com/huggingface/trl/blob/v1.16.0/trl/scripts/utils.py#L303-L359), and
      vram-estimate's flags override everything.
    - Mixed precision: GRPOConfig's bf16 (TRL's default True; fp16 counts as the same 2-byte autocast) decides;
      accelerate's mixed_precision applies only where the GRPOConfig's bf16 and fp16 are false
      (TrainingArguments.__post_init__, transformers v5.24.0 training_args.py#L1612-L1618).
    - DeepSpeed values that are not "auto" (bf16.enabled, fp16.enabled, train_micro_batch_size_per_gpu,
      gradient_accumulation_steps) must equal TrainingArguments': a TRL file or argument that contradicts one is
      refused, as the HF Trainer refuses it (transformers v5.24.0 integrations/deepspeed.py#L108-L191, raised in
      trainer_config_finalize); given alone, the DeepSpeed value is the run's (the only value it starts with; a
      note says the TRL side must match where TRL's default differs).
    - The same setting from two files with different values is refused (which one wins is not a rule either
      library has); a flag settles it.
    """
    out = Merged()
    out.train_batch_sizes = [f.train_batch_size for f in files if f.train_batch_size is not None]
    launch = [f for f in files if f.kind in ("accelerate", "deepspeed", "launcher")]
    trl = [f for f in files if f.kind in ("trl", "trl-args")]
    out.fsdp_checkpointing = next((f.fsdp_checkpointing for f in files if f.fsdp_checkpointing), None)
    for f in trl:
        if f.completion_lengths:
            out.completion_lengths, out.completion_where = dict(f.completion_lengths), f.where
    from_environment = set()  # set by the launch command's environment, which a TRL YAML's env: overrides
    mixed = None
    must: dict[str, tuple] = {}
    for f in launch:
        for name, value in f.values.items():
            label = _label(f, name)
            if name == "bf16" and name not in f.must_match:
                continue  # accelerate's mixed_precision: a fallback, below
            if name in f.must_match:
                must[name] = (value, label)
                continue
            if name in out.values and out.values[name] != value and f.kind != "launcher":
                raise ConfigFileError(
                    f"{out.sources[name]} sets {name} {clip(out.values[name])} but {label} sets {clip(value)}; "
                    "give one (or settle it with a flag)"
                )
            out.values[name], out.sources[name] = value, label
            if f.kind == "launcher" and f.where == "environment":
                from_environment.add(name)
        if f.mixed_precision is not None:
            mixed = (f.mixed_precision, f.where)
        if f.needs_processes:
            out.needs_processes = f.where
        out.notes += f.notes
    trl_values: dict = {}
    trl_sources: dict = {}
    for f in trl:  # the file first, then a command's TRL arguments
        for name, value in f.values.items():
            trl_values[name] = value
            trl_sources[name] = _label(f, name)
        out.notes += f.notes
    for name, value in trl_values.items():
        if name in out.values and out.values[name] != value and name not in from_environment:
            raise ConfigFileError(
                f"{out.sources[name]} sets {name} {clip(out.values[name])} but {trl_sources[name]} sets {clip(value)}; "
                "give one (or settle it with a flag)"
            )
    for name, (value, label) in must.items():
        if name in trl_values and trl_values[name] != value:
            raise ConfigFileError(
                f"{label} is {clip(value)} but {trl_sources[name]} is {clip(trl_values[name])}: the HF Trainer stops "
                'on this DeepSpeed / TrainingArguments mismatch (set the DeepSpeed value to "auto")'
            )
        alone = name not in trl_values and name not in flag_values
        default = getattr(RunConfig(), name, None)
        if (
            name in ("per_device_train_batch_size", "gradient_accumulation_steps")
            and alone
            and value != default
        ):
            out.notes.append(
                f"{label} is {value}: GRPOConfig's {name} must be {value} too (TRL's default is {default}, and the "
                f"HF Trainer stops on the mismatch); estimated with {value}"
            )
        if name == "bf16" and value is False and "bf16" not in trl_values and "bf16" not in flag_values:
            out.notes.append(
                f"{label} is false: GRPOConfig's bf16 must be false too (TRL's default is true, and the HF Trainer "
                "stops on the mismatch); estimated without bf16"
            )
        out.values[name], out.sources[name] = value, label
    out.values.update(trl_values)
    out.sources.update(trl_sources)
    out.values.update(flag_values)
    out.sources.update({name: "flags" for name in flag_values})
    if mixed is not None and mixed[0] != "no" and out.values.get("bf16") is False:
        out.values["bf16"] = True
        out.sources["bf16"] = f"{mixed[1]} mixed_precision"
        out.notes.append(
            f"{mixed[1]}: mixed_precision {mixed[0]} applies because GRPOConfig's bf16 is false (transformers "
            f"TrainingArguments then reads accelerate's ACCELERATE_MIXED_PRECISION); estimated with 2-byte autocast"
        )
    return out
