"""Read an accelerate config YAML or a DeepSpeed JSON into RunConfig field values (how the run is spread).

accelerate 1.15 (`accelerate config` output, `accelerate/commands/config/cluster.py`):

    distributed_type: DEEPSPEED | FSDP | MULTI_GPU | NO    -> sharding (with the stage / strategy below)
    num_processes: 8                                        -> num_gpus (all processes, every machine)
    mixed_precision: bf16 | fp16 | no                       -> bf16
    deepspeed_config: {zero_stage, offload_optimizer_device, offload_param_device,
                       gradient_accumulation_steps, deepspeed_config_file}
    fsdp_config: {fsdp_version, fsdp_sharding_strategy, fsdp_reshard_after_forward, fsdp_offload_params}

DeepSpeed JSON (docs "DeepSpeed Configuration JSON"): `zero_optimization.stage`,
`zero_optimization.offload_optimizer.device` / `offload_param.device` ("cpu" | "nvme" | "none"),
`bf16.enabled`, `fp16.enabled`, `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps` ("auto" = TRL's).

Offload and the FSDP strategy land in RunConfig's `offload_optimizer`, `offload_param`, `fsdp_sharding_strategy`;
what the estimate does not use (`fsdp_version`) comes back in `extra`. HYBRID_SHARD is refused (its shard group
is a node, which RunConfig does not describe). Every problem is one `LaunchFileError` line naming the key, the
value and what is accepted. `vram-estimate --config FILE` reads these files too (`estimator/configfile.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
FSDP_STRATEGY_NUMBERS = {1: "FULL_SHARD", 2: "SHARD_GRAD_OP", 3: "NO_SHARD", 4: "HYBRID_SHARD"}  # FSDP1 enum
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
ZERO_STAGES = (0, 1, 2, 3)


class LaunchFileError(ValueError):
    """An accelerate / DeepSpeed file that cannot be read or holds a value this tool does not accept."""


@dataclass
class LaunchSettings:
    """RunConfig field values, settings awaiting a RunConfig field (`extra`), and notes."""

    values: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def is_accelerate_config(data: dict) -> bool:
    """An accelerate config YAML names its distributed_type (or compute_environment)."""
    return "distributed_type" in data or "compute_environment" in data


def is_deepspeed_config(data: dict) -> bool:
    """A DeepSpeed JSON has a zero_optimization section (or DeepSpeed's batch keys)."""
    return "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data


def _choice(where: str, key: str, value, accepted) -> object:
    if value not in accepted:
        raise LaunchFileError(
            f"{where}: {key} {value!r} is not accepted; accepted: {', '.join(map(str, accepted))}"
        )
    return value


def _int(where: str, key: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LaunchFileError(f"{where}: {key} must be an integer >= {minimum}, got {value!r}")
    return value


def _bool(where: str, key: str, value) -> bool:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise LaunchFileError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _offload(where: str, key: str, value) -> bool:
    """'cpu' -> True; 'none'/None -> False; 'nvme' is not modelled."""
    dev = "none" if value is None else str(value).lower()
    _choice(where, key, dev, OFFLOAD_DEVICES)
    if dev == "nvme":
        raise LaunchFileError(f"{where}: {key} 'nvme' (ZeRO-Infinity) is not modelled; accepted: none, cpu")
    return dev == "cpu"


def _sharding_for_stage(where: str, key: str, stage) -> str:
    stage = _choice(where, key, stage, ZERO_STAGES)
    if stage == 1:
        raise LaunchFileError(
            f"{where}: {key} 1 (optimizer-state sharding only) is not modelled; accepted: 0, 2, 3"
        )
    return {0: "none", 2: "zero2", 3: "zero3"}[stage]


def translate_deepspeed(data: dict, where: str) -> LaunchSettings:
    """DeepSpeed JSON keys -> RunConfig values (+ offload in `extra`)."""
    out = LaunchSettings()
    zero = data.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise LaunchFileError(f"{where}: zero_optimization must be a mapping, got {zero!r}")
    out.values["sharding"] = _sharding_for_stage(where, "zero_optimization.stage", zero.get("stage", 0))
    for part in ("offload_optimizer", "offload_param"):
        section = zero.get(part)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise LaunchFileError(f"{where}: zero_optimization.{part} must be a mapping, got {section!r}")
        out.values[part] = _offload(where, f"zero_optimization.{part}.device", section.get("device", "none"))
    if out.values.get("offload_param") and out.values["sharding"] != "zero3":
        raise LaunchFileError(
            f"{where}: zero_optimization.offload_param needs stage 3, got stage {zero.get('stage')}"
        )
    for precision in ("bf16", "fp16"):
        sec = data.get(precision)
        if isinstance(sec, dict) and sec.get("enabled") not in (None, "auto"):
            enabled = _bool(where, f"{precision}.enabled", sec["enabled"])
            if precision == "bf16":
                out.values["bf16"] = enabled
            elif enabled:
                out.notes.append(f"{where}: fp16 is estimated as bf16 (same 2-byte sizes)")
                out.values["bf16"] = True
    for key, name in (
        ("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        if key in data and data[key] != "auto":
            out.values[name] = _int(where, key, data[key])
    return out


def translate_accelerate(data: dict, where: str, base: Path | None = None) -> LaunchSettings:
    """accelerate config keys -> RunConfig values (+ offload / FSDP strategy in `extra`)."""
    dtype = str(data.get("distributed_type", "NO")).upper()
    _choice(where, "distributed_type", dtype, DISTRIBUTED_TYPES)
    out = LaunchSettings()
    procs = _int(where, "num_processes", data.get("num_processes", 1))
    out.values["num_gpus"] = procs
    mp = str(data.get("mixed_precision", "no")).lower()
    _choice(where, "mixed_precision", mp, ("no", "bf16", "fp16", "fp8"))
    out.values["bf16"] = mp != "no"
    if dtype in ("NO", "MULTI_GPU"):
        out.values["sharding"] = "none"
    elif dtype == "DEEPSPEED":
        ds = data.get("deepspeed_config") or {}
        if not isinstance(ds, dict):
            raise LaunchFileError(f"{where}: deepspeed_config must be a mapping, got {ds!r}")
        if ds.get("deepspeed_config_file"):
            given = Path(ds["deepspeed_config_file"])  # accelerate opens it from the working directory
            inner = read_launch_file(str(given if given.exists() else (base or Path(".")) / given))
            out.values.update(
                {k: v for k, v in inner.values.items() if k != "bf16" or "bf16" not in out.values}
            )
            out.notes += inner.notes
        else:
            out.values["sharding"] = _sharding_for_stage(
                where, "deepspeed_config.zero_stage", ds.get("zero_stage", 2)
            )
            for key, name in (
                ("offload_optimizer_device", "offload_optimizer"),
                ("offload_param_device", "offload_param"),
            ):
                if key in ds:
                    out.values[name] = _offload(where, f"deepspeed_config.{key}", ds[key])
            if "gradient_accumulation_steps" in ds:
                ga = ds["gradient_accumulation_steps"]
                out.values["gradient_accumulation_steps"] = _int(
                    where, "deepspeed_config.gradient_accumulation_steps", ga
                )
    else:  # FSDP
        fs = data.get("fsdp_config") or {}
        if not isinstance(fs, dict):
            raise LaunchFileError(f"{where}: fsdp_config must be a mapping, got {fs!r}")
        version = fs.get("fsdp_version", 1)
        out.extra["fsdp_version"] = _choice(where, "fsdp_config.fsdp_version", version, (1, 2))
        if version == 1:
            out.notes.append(
                f"{where}: fsdp_version 1 is estimated as FSDP2 (the traced path); FSDP1's flat parameters "
                "and its summon_full_params for generation differ"
            )
        strategy = fs.get("fsdp_sharding_strategy")
        if "fsdp_reshard_after_forward" in fs:  # FSDP2 name; accelerate also accepts a strategy string here
            raf = fs["fsdp_reshard_after_forward"]
            if isinstance(raf, str) and raf.upper() in FSDP_STRATEGIES:
                strategy = raf.upper()
            else:
                strategy = (
                    "FULL_SHARD"
                    if _bool(where, "fsdp_config.fsdp_reshard_after_forward", raf)
                    else "SHARD_GRAD_OP"
                )
        if isinstance(strategy, int) and not isinstance(strategy, bool):
            strategy = FSDP_STRATEGY_NUMBERS.get(strategy, strategy)
        strategy = "FULL_SHARD" if strategy is None else str(strategy).upper()
        _choice(where, "fsdp_config.fsdp_sharding_strategy", strategy, FSDP_STRATEGIES)
        if strategy == "HYBRID_SHARD":
            raise LaunchFileError(
                f"{where}: fsdp_config.fsdp_sharding_strategy HYBRID_SHARD is not modelled; "
                "accepted: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD"
            )
        out.values["sharding"] = "none" if strategy == "NO_SHARD" else "fsdp"
        if strategy != "NO_SHARD":
            out.values["fsdp_sharding_strategy"] = strategy
        if "fsdp_offload_params" in fs:
            out.values["offload_param"] = _bool(
                where, "fsdp_config.fsdp_offload_params", fs["fsdp_offload_params"]
            )
    if out.values.get("sharding", "none") != "none" and procs < 2:
        out.notes.append(f"{where}: {dtype} with num_processes 1 shards nothing")
    return out


def read_launch_file(path: str) -> LaunchSettings:
    """Read an accelerate config YAML or a DeepSpeed JSON; one-line LaunchFileError on any problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise LaunchFileError(f"{path}: {e.strerror or e}") from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError: first line only
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LaunchFileError(f"{path}: not valid YAML/JSON ({first})") from None
    if not isinstance(data, dict):
        raise LaunchFileError(f"{path}: expected a mapping, got {type(data).__name__}")
    return translate_file(data, p)


def translate_file(data: dict, p: Path) -> LaunchSettings:
    """A parsed accelerate config or DeepSpeed JSON -> LaunchSettings (LaunchFileError when it is neither)."""
    if is_deepspeed_config(data):
        return translate_deepspeed(data, p.name)
    if is_accelerate_config(data):
        return translate_accelerate(data, p.name, p.parent)
    raise LaunchFileError(
        f"{p}: neither an accelerate config (distributed_type) nor a DeepSpeed JSON (zero_optimization)"
    )
