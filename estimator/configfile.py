"""Read a TRL GRPOConfig / ModelConfig YAML or JSON file into RunConfig field values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from estimator.config import Field, schema

DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float": "float32",
}


class ConfigFileError(ValueError):
    """A --config file that cannot be read or holds a value of the wrong type."""


@dataclass
class FileSettings:
    """RunConfig field values read from a file, and notes about what was ignored or translated."""

    values: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


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
        raise ConfigFileError(f"{where}: {f.name} must be {want}, got {value!r}")
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


def parse_text(text: str, suffix: str) -> dict:
    """YAML (or JSON, a YAML subset) text -> a dict."""
    if suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    return data if data is not None else {}


def translate(data: dict, where: str) -> FileSettings:
    """Map TRL GRPOConfig / ModelConfig keys to RunConfig fields; unknown keys become a note, wrong types an error."""
    top, nested = file_keys()
    out = FileSettings()
    ignored: list[str] = []
    for key, value in data.items():
        if key in nested:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigFileError(f"{where}: {key} must be a mapping, got {value!r}")
            for sub, subval in value.items():
                if sub in nested[key]:
                    f = nested[key][sub]
                    out.values[f.name] = check_type(f, subval, where)
                else:
                    ignored.append(f"{key}.{sub}")
        elif key == "use_cpu":
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: use_cpu must be true or false, got {value!r}")
            if value:
                out.values["device"] = "cpu"
        elif key == "fsdp":
            if value:
                out.values["sharding"] = "fsdp"
        elif key in top:
            f = top[key]
            out.values[f.name] = check_type(f, value, where)
        else:
            ignored.append(str(key))
    if "dtype" in out.values:
        out.values["dtype"] = normalize_dtype(out.values["dtype"])
    if ignored:
        out.notes.append(f"{where}: ignored keys that do not change the estimate: {', '.join(ignored)}")
    return out


def read_config_file(path: str) -> FileSettings:
    """Read a GRPOConfig YAML/JSON file; one-line ConfigFileError on any problem."""
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigFileError(f"--config {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigFileError(
            f"--config {path}: not UTF-8 text (a binary file?); give a YAML or JSON file"
        ) from None
    try:
        data = parse_text(text, p.suffix.lower())
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError: keep the first line only
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigFileError(f"--config {path}: not valid YAML/JSON ({first})") from None
    if not isinstance(data, dict):
        raise ConfigFileError(
            f"--config {path}: expected a mapping of GRPOConfig keys, got {type(data).__name__}"
        )
    from estimator import (
        launchfile,
    )  # an accelerate config YAML or a DeepSpeed JSON says how the run is spread

    if launchfile.is_deepspeed_config(data) or launchfile.is_accelerate_config(data):
        try:
            launch = launchfile.translate_file(data, p)
        except launchfile.LaunchFileError as e:
            raise ConfigFileError(f"--config {e}") from None
        return FileSettings(values=launch.values, notes=launch.notes)
    return translate(data, p.name)
