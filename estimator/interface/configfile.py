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

import re
from pathlib import Path

from estimator.interface import launchfile, training_args
from estimator.interface.file_settings import FileSettings
from estimator.interface.files import (
    MAX_TYPO_CHECKS,
    ConfigFileError,
    clip,
    load_file,
    suggestion,
)
from estimator.interface.known_keys import (
    EARLIER_TRL_KEYS,
    LAUNCH_KEYS,
    OPEN_R1_KEYS,
    OPEN_R1_MARKERS,
    TRANSFORMERS_4_KEYS,
    TRL_KEYS,
)
from estimator.interface.launchfile import LaunchFileError
from estimator.settings.config import Field, schema
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


# transformers' OptimizerNames that name another's optimizer (training_args.py: ADAMW_8BIT = "adamw_8bit",
# "just an alias for adamw_bnb_8bit")
OPTIM_ALIASES = {"adamw_8bit": "adamw_bnb_8bit"}
# attn_implementation naming a Hub kernel repository of FlashAttention (TRL docs kernels_hub.md:
# kernels-community/flash-attn2, kernels-community/vllm-flash-attn3), optionally pinned `@revision` or `:name`
HUB_FLASH_KERNEL = re.compile(r"^[\w.-]+/[\w.-]*flash[-_]?attn[\w.-]*(@[\w.-]+)?(:[\w.-]+)?$", re.IGNORECASE)


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


def kind_of(data: dict, where: str = "") -> str:
    """'deepspeed', 'accelerate' or 'trl' from a file's keys; ConfigFileError for an accelerate config that also
    carries DeepSpeed's top-level keys, which accelerate refuses (config_args.py: "had unknown keys"; DeepSpeed
    settings go under deepspeed_config or in the file its deepspeed_config_file names)."""
    if launchfile.is_deepspeed_config(data) and launchfile.is_accelerate_config(data):
        stray = [
            k
            for k in ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")
            if k in data
        ]
        raise ConfigFileError(
            f"{where}: an accelerate config (distributed_type / compute_environment) with DeepSpeed's {stray[0]} at its top "
            "level: accelerate refuses unknown keys; put DeepSpeed's settings under deepspeed_config, or in a "
            "DeepSpeed JSON its deepspeed_config_file names"
        )
    if launchfile.is_deepspeed_config(data):
        return "deepspeed"
    if launchfile.is_accelerate_config(data):
        return "accelerate"
    return "trl"


def translate(data: dict, where: str, base: Path | None = None, typos: bool = True) -> FileSettings:
    """Map TRL GRPOConfig / ModelConfig / ScriptArguments keys to RunConfig fields (module docstring's key rules).

    `typos`: an unknown key close to a known one is an error naming it; False for the arguments of a script that
    is not TRL's, whose own arguments (`--dataset`) are listed as not read instead, unless close to a key that
    changes the estimate."""
    top, nested = file_keys()
    out = FileSettings(kind="trl", where=where)
    open_r1: list[str] = []

    def put(f: Field, value, key: str) -> None:
        if key.endswith("torch_dtype") and out.sources.get(f.name, "").endswith(".dtype"):
            return  # model_init_kwargs' dtype beside its torch_dtype: transformers and TRL take dtype
        if key == "torch_dtype" and out.sources.get(f.name) == "dtype":
            return
        out.values[f.name] = check_type(f, value, where)
        out.sources[f.name] = key

    checkpointing: dict[str, object] = {}  # activation_checkpointing / gradient_checkpointing (+ _kwargs)
    fsdp: dict[str, object] = {}  # TrainingArguments fsdp and fsdp_config, read together
    removed: list[str] = []  # transformers 4 TrainingArguments keys
    earlier: list[str] = []  # earlier TRL releases' GRPOConfig keys
    for key, value in data.items():
        key = str(key)
        if key in training_args.JSON_DICT_KEYS:
            value = training_args.json_dict(value, key, where)
        if key in nested:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigFileError(f"{where}: {key} must be a mapping, got {clip(value)}")
            for sub, subval in value.items():
                if sub in nested[key]:
                    put(nested[key][sub], subval, f"{key}.{sub}")
                elif key == "generation_kwargs" and sub in training_args.COMPLETION_KEYS:
                    if isinstance(subval, bool) or not isinstance(subval, int) or subval < 1:
                        raise ConfigFileError(
                            f"{where}: generation_kwargs.{sub} must be an integer >= 1, got {clip(subval)}"
                        )
                    out.completion_lengths[sub] = subval
                elif key == "model_init_kwargs" and sub == "quantization_config":
                    training_args.quantization_config(subval, where, out)
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
            training_args.environment(value, where, out)
        elif key == "load_in_8bit":
            if value is True:
                out.notes.append(
                    f"{where}: load_in_8bit (an 8-bit bitsandbytes base) is not modelled: estimated with the base "
                    "in its dtype, which errs high (the 8-bit base is about half a 16-bit one)"
                )
        elif key in ("lora_modules_to_save", "use_dora", "lora_target_parameters"):
            if value not in (None, False, [], ""):
                what = {
                    "lora_modules_to_save": "each listed module becomes a trainable full copy, with its "
                    "gradients and optimizer state",
                    "use_dora": "DoRA adds a magnitude vector per adapted layer and recomputes each weight's norm "
                    "in every forward, on top of LoRA's memory",
                    "lora_target_parameters": "PEFT puts adapters on the named parameters (a MoE's expert "
                    "weights), with their gradients, optimizer state and activations",
                }[key]
                raise ConfigFileError(
                    f"{where}: {key} {clip(value)} is not modelled ({what}), so the estimate would be low; "
                    f"remove it to estimate the rest of the run"
                )
        elif key in ("use_transformers_continuous_batching", "use_transformers_paged"):
            if value is True:
                out.notes.append(
                    f"{where}: {key}: generation through transformers' continuous batching is not modelled: "
                    "estimated with generate's dynamic KV cache; its paged cache takes max_memory_percent (0.5) "
                    "of the GPU memory free when generation starts, so nvidia-smi will show far more than the "
                    "estimate's reserved line"
                )
        elif key in ("use_liger_kernel", "use_liger_loss"):
            if value is True:
                what = {
                    "use_liger_kernel": "before TRL 1.15 (from the releases that take it as the GRPO loss) "
                    "Liger's fused GRPO loss runs, which never makes the [B, C, V] logits the estimate counts for "
                    "those releases (errs high there); from 1.15 only Liger's layer kernels, not modelled: "
                    "estimated with transformers' own layers (grpo_trainer.py L1049-1064; not measured either way)",
                    "use_liger_loss": "Liger's fused GRPO loss (in the TRL releases that read this key) is not "
                    "modelled: estimated with TRL's log-prob head, which before TRL 1.15 holds the [B, C, V] "
                    "logits the fused loss never makes (errs high there)",
                }[key]
                out.notes.append(f"{where}: {key}: {what}")
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
        elif key in EARLIER_TRL_KEYS:
            earlier.append(key)
        elif key in LAUNCH_KEYS and key not in top and key not in nested:
            out.launch_options[key] = value
        else:
            checked = len(out.unknown) < MAX_TYPO_CHECKS
            # a script's own argument may sit near a key that does not change the estimate (`--dataset`), never
            # one near a key that does (`--per_device_train_batch_sise`), which a typo would drop
            known = [*top, *nested, *SPECIAL_KEYS] + ([*TRL_KEYS, *OPEN_R1_KEYS] if typos else [])
            near = checked and suggestion(key, known)
            if near:
                raise ConfigFileError(f"{where}: unknown key {clip(key)}; did you mean {near}?")
            out.unknown.append(key)
    if checkpointing:
        training_args.checkpointing(checkpointing, where, out)
    if fsdp:
        training_args.fsdp_option(fsdp.get("fsdp"), fsdp.get("fsdp_config"), where, out, base)
    if "dtype" in out.values:
        out.values["dtype"] = normalize_dtype(out.values["dtype"])
    if out.values.get("optim") in OPTIM_ALIASES:
        out.values["optim"] = OPTIM_ALIASES[out.values["optim"]]
    attn = out.values.get("attn_implementation")
    if isinstance(attn, str) and "/" in attn and not HUB_FLASH_KERNEL.match(attn):
        raise ConfigFileError(
            f"{where}: attn_implementation {clip(attn)}: a Hub kernel this tool does not model; accepted: sdpa, "
            "flash_attention_2, eager, or a FlashAttention kernel from the Hub (kernels-community/flash-attn2)"
        )
    if isinstance(attn, str) and HUB_FLASH_KERNEL.match(attn):
        out.values["attn_implementation"] = "flash_attention_2"
        out.notes.append(
            f"{where}: attn_implementation {clip(attn)}: a FlashAttention kernel from the Hub (transformers' "
            "kernels integration), estimated as flash_attention_2 (the same tensors: no scores held)"
        )
    if set(open_r1) & OPEN_R1_MARKERS:
        out.flavour = "open-r1 recipe"
    out.known += open_r1
    if out.known:
        out.notes.append(f"{where}: known keys that do not change the estimate: {listed(out.known)}")
    if earlier:
        out.notes.append(
            f"{where}: GRPOConfig keys of earlier TRL releases (not 1.16's), not read: {listed(earlier)}"
        )
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
    nested = [
        k
        for k in launch.ignored
        if kind == "accelerate" and k.startswith(("deepspeed_config.", "fsdp_config."))
    ]
    others = [k for k in launch.ignored if k not in nested]
    if nested:  # accelerate reads its own fields of these sections and passes nothing else on
        out.notes.append(
            f"{where}: keys accelerate does not read in its deepspeed_config / fsdp_config sections (DeepSpeed's "
            f"own settings go in the file deepspeed_config_file names), so neither does this tool: {listed(nested)}"
        )
    if others:
        out.notes.append(f"{where}: keys this tool does not read: {listed(others)}")
    return out


def settings_of(data: dict, p: Path, flag: str = "--config") -> FileSettings:
    """One parsed file -> FileSettings of its kind."""
    kind = kind_of(data, f"{flag} {printable(p.name)}".strip())
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
            files[-1].via_training_args = True
        if ds:
            inner = read_config_file(ds, f"{files[-1].where}: deepspeed")
            if inner.kind != "deepspeed":
                raise ConfigFileError(
                    f"{files[-1].where}: deepspeed {clip(ds)} is not a DeepSpeed JSON (no zero_optimization)"
                )
            inner.via_training_args = True
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
            if kind not in KINDS:  # a launcher's process count, the environment's settings: merged by value
                continue
            if kind in seen and not _same(seen[kind], f):
                raise ConfigFileError(
                    f"two {KINDS[kind]} files: {clip(seen[kind].where)} and {clip(f.where)}; give one "
                    f"(the run reads one {KINDS[kind]})"
                )
            seen.setdefault(kind, f)
