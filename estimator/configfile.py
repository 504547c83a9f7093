"""Read a TRL GRPOConfig / ModelConfig YAML or JSON file into RunConfig field values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from estimator.config import RunConfig

# Keys whose TRL name differs from ours (or which live inside a nested dict).
RENAMED = {"model_name_or_path": "model", "torch_dtype": "dtype"}
MODEL_INIT_KEYS = {"dtype": "dtype", "torch_dtype": "dtype", "attn_implementation": "attn_implementation"}
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


def _kind(name: str) -> str:
    """The type class of a RunConfig field: int, float, bool, str or str-list, from its annotation."""
    ann = {f.name: str(f.type) for f in fields(RunConfig)}[name]
    for kind in ("tuple", "bool", "int", "float", "str"):
        if ann.startswith(kind):
            return kind
    return "str"


def _nullable(name: str) -> bool:
    return "None" in {f.name: str(f.type) for f in fields(RunConfig)}[name]


def check_type(name: str, value, where: str):
    """`value` converted for field `name`, or ConfigFileError naming the key, the value and the type wanted."""
    if value is None and _nullable(name):
        return None
    kind = _kind(name)
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "tuple": isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value)),
    }[kind]
    if not ok:
        want = {
            "tuple": "a string or a list of strings",
            "str": "a string",
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
        }[kind]
        raise ConfigFileError(f"{where}: {name} must be {want}, got {value!r}")
    if kind == "float":
        return float(value)
    if kind == "tuple":
        return (value,) if isinstance(value, str) else tuple(value)
    return value


def parse_text(text: str, suffix: str) -> dict:
    """YAML (or JSON, a YAML subset) text -> a dict."""
    if suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    return data if data is not None else {}


def translate(data: dict, where: str) -> FileSettings:
    """Map TRL/ModelConfig keys to RunConfig fields; unknown keys become a note, wrong types an error."""
    known = set(RunConfig.field_names())
    out = FileSettings()
    ignored: list[str] = []
    for key, value in data.items():
        name = RENAMED.get(key, key)
        if key == "model_init_kwargs":
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigFileError(f"{where}: model_init_kwargs must be a mapping, got {value!r}")
            for sub, subval in value.items():
                if sub in MODEL_INIT_KEYS:
                    out.values[MODEL_INIT_KEYS[sub]] = check_type(MODEL_INIT_KEYS[sub], subval, where)
                else:
                    ignored.append(f"model_init_kwargs.{sub}")
        elif key == "use_cpu":
            if not isinstance(value, bool):
                raise ConfigFileError(f"{where}: use_cpu must be true or false, got {value!r}")
            if value:
                out.values["device"] = "cpu"
        elif key == "fsdp":
            if value:
                out.values["sharding"] = "fsdp"
        elif name in known:
            out.values[name] = check_type(name, value, where)
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
    return translate(data, p.name)
