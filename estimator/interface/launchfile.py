"""Read an accelerate config YAML or a DeepSpeed JSON into RunConfig field values (how the run is spread).

Each rule follows the code that reads these files in the releases modelled (accelerate 1.15.0, transformers
5.24.0; permalinks at those tags):

- `distributed_type: NO` is one process whatever `num_processes` says: `accelerate launch` picks its launcher from
  distributed_type and NO runs `simple_launcher`, one `python` process
  (https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/commands/launch.py#L1228-L1245 and
  #L1390-L1413).
- A missing `num_processes` (other than under NO) is accelerate's -1, which `accelerate launch` refuses unless
  `--num_processes` is given (launch.py#L1305-L1306; config_args.py ClusterConfig `num_processes: int = -1`,
  https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/commands/config/config_args.py#L182).
  This reader leaves the GPU count unset and says so (`needs_processes`).
- `mixed_precision` missing or null means "no" (config_args.py#L113-L114 and launch.py#L1287-L1291); it reaches
  the run as ACCELERATE_MIXED_PRECISION, which transformers' TrainingArguments reads only when its own fp16 and
  bf16 are false (https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/training_args.py#L1612-L1618).
  TRL's GRPOConfig defaults bf16 to True, so the file's value is a fallback (`mixed_precision` in the result),
  merged by `estimator/interface/configfile.py`, never an override of the GRPOConfig's bf16.
- `deepspeed_config.deepspeed_config_file` hands the whole DeepSpeed config to the JSON; accelerate then refuses
  `mixed_precision`, `zero_stage`, `offload_*`, `gradient_accumulation_steps`, `gradient_clipping` and
  `zero3_save_16bit_model` in the YAML (DeepSpeedPlugin._deepspeed_config_checks,
  https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/utils/dataclasses.py#L1507-L1532).
  accelerate opens the path from the working directory (it passes it on as ACCELERATE_DEEPSPEED_CONFIG_FILE,
  https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/utils/launch.py#L582); a path that is
  not there is looked up beside the YAML, with a note.
- Inline `deepspeed_config` keys become the DeepSpeed config as DeepSpeedPlugin builds it: zero_stage defaults to
  2, offload devices to "none", gradient_accumulation_steps to "auto" (dataclasses.py#L1228-L1244, #L1296-L1318).
- In a DeepSpeed JSON, `bf16.enabled` / `fp16.enabled` / `train_micro_batch_size_per_gpu` /
  `gradient_accumulation_steps` that are not "auto" must equal TrainingArguments' values, else the HF Trainer
  stops ("Please correct the following DeepSpeed config values that mismatch TrainingArguments values";
  HfTrainerDeepSpeedConfig.fill_match / trainer_config_process,
  https://github.com/huggingface/transformers/blob/v5.24.0/src/transformers/integrations/deepspeed.py#L108-L191);
  "auto" is filled from TrainingArguments. Those explicit values come back in `must_match`; a missing section is
  filled from the trainer's mixed precision (accelerate DeepSpeedPlugin.set_mixed_precision, dataclasses.py#L1415-L1446),
  so missing = "auto" here.
- FSDP: `accelerate launch` always exports both FSDP_SHARDING_STRATEGY (default FULL_SHARD) and
  FSDP_RESHARD_AFTER_FORWARD (default true) (utils/launch.py#L313-L315, commands/launch.py#L533-L544). Under
  `fsdp_version: 1` the plugin reads `fsdp_sharding_strategy` (name or FSDP1 enum number) and FSDP1 is wrapped
  with it, so `fsdp_reshard_after_forward` is not what runs (dataclasses.py#L1843-L1856,
  accelerator.py#L1944-L1947); under `fsdp_version: 2` only `fsdp_reshard_after_forward` is read, a bool
  (true: FULL_SHARD, false: SHARD_GRAD_OP; a strategy name there is refused, #L1865-L1880).
  `fsdp_offload_params` -> offload_param. `fsdp_activation_checkpointing: true` is FSDP's own activation
  checkpointing, estimated as gradient_checkpointing; transformers stops when the training argument is on too
  (trainer.py#L878-L884, TRL's default is on), which `merge.finish` checks (`fsdp_checkpointing`).

Offload and the FSDP strategy land in RunConfig's `offload_optimizer`, `offload_param`, `fsdp_sharding_strategy`;
what the estimate does not use (`fsdp_version`) comes back in `extra`. HYBRID_SHARD, ZeRO-1, NVMe offload and
sequence / context / tensor parallelism (`parallelism_config`) are refused: RunConfig does not describe them.
Every problem is one `LaunchFileError` line naming the key, the value (truncated, escaped) and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from estimator.interface.files import MAX_TYPO_CHECKS, ConfigFileError, clip, load_file, suggestion
from estimator.interface.known_keys import ACCELERATE_KEYS
from estimator.text import printable

FSDP_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD")
FSDP_STRATEGY_NUMBERS = {1: "FULL_SHARD", 2: "SHARD_GRAD_OP", 3: "NO_SHARD", 4: "HYBRID_SHARD"}  # FSDP1 enum
DISTRIBUTED_TYPES = ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
MIXED_PRECISIONS = ("no", "bf16", "fp16", "fp8")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
ZERO_STAGES = (0, 1, 2, 3)
# keys accelerate refuses beside a deepspeed_config_file (DeepSpeedPlugin._deepspeed_config_checks)
DS_FILE_EXCLUSIVE = (
    "gradient_accumulation_steps",
    "gradient_clipping",
    "zero_stage",
    "offload_optimizer_device",
    "offload_param_device",
    "offload_param_nvme_path",
    "offload_optimizer_nvme_path",
    "zero3_save_16bit_model",
)
DS_SECTION_KEYS = (
    *DS_FILE_EXCLUSIVE,
    "deepspeed_config_file",
    "zero3_init_flag",
    "deepspeed_multinode_launcher",
    "deepspeed_hostfile",
    "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter",
    "deepspeed_moe_layer_cls_names",
    "seq_parallel_communication_data_type",
)
FSDP_SECTION_KEYS = (
    "fsdp_activation_checkpointing",
    "fsdp_activation_checkpointing_offload",
    "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch",
    "fsdp_cpu_ram_efficient_loading",
    "fsdp_forward_prefetch",
    "fsdp_min_num_params",
    "fsdp_offload_params",
    "fsdp_reshard_after_forward",
    "fsdp_sharding_strategy",
    "fsdp_state_dict_type",
    "fsdp_sync_module_states",
    "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_use_orig_params",
    "fsdp_version",
)
PARALLEL_SIZES = ("tp_size", "cp_size", "sp_size", "dp_replicate_size")  # parallelism_config_<name>
# DeepSpeed JSON top-level keys (DeepSpeed docs "DeepSpeed Configuration JSON"); the modelled ones first
DS_JSON_MODELLED = (
    "zero_optimization",
    "bf16",
    "fp16",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
)
DS_JSON_KEYS = (
    *DS_JSON_MODELLED,
    "train_batch_size",
    "optimizer",
    "scheduler",
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "activation_checkpointing",
    "communication_data_type",
    "seq_parallel_communication_data_type",
    "prescale_gradients",
    "gradient_predivide_factor",
    "sparse_gradients",
    "amp",
    "torch_autocast",
    "data_types",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comms_logger",
    "memory_breakdown",
    "dump_state",
    "checkpoint",
    "aio",
    "elasticity",
    "autotuning",
    "compression_training",
    "data_efficiency",
    "curriculum_learning",
    "pipeline",
    "sparse_attention",
    "nebula",
)
ZERO_KEYS_MODELLED = ("stage", "offload_optimizer", "offload_param")


class LaunchFileError(ValueError):
    """An accelerate / DeepSpeed file that cannot be read or holds a value this tool does not accept."""


@dataclass
class LaunchSettings:
    """RunConfig field values, settings awaiting a RunConfig field (`extra`), and notes.

    `sources`: RunConfig field -> the key that set it. `must_match`: fields whose value here is a DeepSpeed value
    the HF Trainer requires TrainingArguments to equal. `mixed_precision`: accelerate's, a fallback below the
    GRPOConfig's bf16/fp16 (None: not given). `needs_processes`: accelerate will ask for --num_processes.
    `deepspeed_file`: the DeepSpeed JSON this config points at (resolved path), if any.
    """

    values: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    sources: dict = field(default_factory=dict)
    must_match: set = field(default_factory=set)
    mixed_precision: str | None = None
    needs_processes: bool = False
    deepspeed_file: str | None = None
    ignored: list = field(default_factory=list)
    train_batch_size: tuple[int, str] | None = (
        None  # a DeepSpeed train_batch_size that is not "auto", and where
    )
    fsdp_checkpointing: str | None = None  # where fsdp_activation_checkpointing is true (FSDP's own)


def is_accelerate_config(data: dict) -> bool:
    """An accelerate config YAML names its distributed_type (or compute_environment)."""
    return "distributed_type" in data or "compute_environment" in data


# keys only a DeepSpeed config has at its top (DeepSpeed's config.py; a TRL file's bf16 / fp16 are booleans)
DS_ONLY_KEYS = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size", "gradient_clipping",
                "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer")  # fmt: skip


def is_deepspeed_config(data: dict) -> bool:
    """A DeepSpeed JSON: a zero_optimization section, DeepSpeed's batch or engine keys, or bf16 / fp16 given as
    a section ({"enabled": ...}) rather than a TRL boolean."""
    return any(k in data for k in DS_ONLY_KEYS) or any(
        isinstance(data.get(k), dict) for k in ("bf16", "fp16")
    )


def _choice(where: str, key: str, value, accepted) -> object:
    if value not in accepted:
        raise LaunchFileError(
            f"{where}: {key} {clip(value)} is not accepted; accepted: {', '.join(map(str, accepted))}"
        )
    return value


def _int(where: str, key: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise LaunchFileError(f"{where}: {key} must be an integer >= {minimum}, got {clip(value)}")
    return value


def _bool(where: str, key: str, value) -> bool:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise LaunchFileError(f"{where}: {key} must be true or false, got {clip(value)}")
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
    if stage in (0, 1):  # DeepSpeed's engine keeps fp32 master weights and gradient buffers of its own here
        what = (
            "optimizer-state sharding only"
            if stage == 1
            else "DeepSpeed's engine without ZeRO, DeepSpeed's default"
        )
        raise LaunchFileError(
            f"{where}: {key} {stage} ({what}) is not modelled, so the estimate could be low; accepted: 2, 3 (or "
            "no DeepSpeed: accelerate's MULTI_GPU)"
        )
    return {2: "zero2", 3: "zero3"}[stage]


def check_keys(where: str, keys, known, prefix: str = "") -> list[str]:
    """Keys of one mapping not in `known`: a near miss of a known key (a typo) is a LaunchFileError naming the
    suggestion; the others come back to be listed as unknown."""
    unknown = []
    for key in keys:
        if key in known:
            continue
        near = len(unknown) < MAX_TYPO_CHECKS and suggestion(str(key), known)
        if near:
            raise LaunchFileError(
                f"{where}: unknown key {clip(prefix + str(key))}; did you mean {prefix}{near}?"
            )
        unknown.append(prefix + str(key))
    return unknown


def _set(out: LaunchSettings, name: str, value, key: str) -> None:
    out.values[name] = value
    out.sources[name] = key


def translate_deepspeed(data: dict, where: str) -> LaunchSettings:
    """DeepSpeed JSON keys -> RunConfig values; explicit (non-"auto") precision / batch values in `must_match`."""
    out = LaunchSettings()
    out.ignored += check_keys(where, data, DS_JSON_KEYS)
    zero = data.get("zero_optimization")
    if zero is None:
        zero = {}
    if not isinstance(zero, dict):
        raise LaunchFileError(f"{where}: zero_optimization must be a mapping, got {clip(zero)}")
    for i, key in enumerate(zero):
        if (
            i < MAX_TYPO_CHECKS
            and key not in ZERO_KEYS_MODELLED
            and not str(key).startswith(("stage3_", "offload_"))
        ):
            if near := suggestion(str(key), ZERO_KEYS_MODELLED):
                raise LaunchFileError(
                    f"{where}: unknown key zero_optimization.{clip(key)}; did you mean zero_optimization.{near}?"
                )
    _set(
        out,
        "sharding",
        _sharding_for_stage(where, "zero_optimization.stage", zero.get("stage", 0)),
        "zero_optimization.stage",
    )
    for part in ("offload_optimizer", "offload_param"):
        section = zero.get(part)
        if section is None:
            continue
        if not isinstance(section, dict):
            raise LaunchFileError(f"{where}: zero_optimization.{part} must be a mapping, got {clip(section)}")
        _set(
            out,
            part,
            _offload(where, f"zero_optimization.{part}.device", section.get("device", "none")),
            f"zero_optimization.{part}.device",
        )
    _zero_knobs(where, zero, out)
    if "overlap_comm" in zero:
        key = "zero_optimization.overlap_comm"
        _set(out, "zero_overlap_comm", _bool(where, key, zero["overlap_comm"]), key)
    if "reduce_bucket_size" in zero:  # "auto": HF fills hidden_size^2 (None); a number: itself
        bucket = zero["reduce_bucket_size"]
        key = "zero_optimization.reduce_bucket_size"
        value = (
            None
            if bucket == "auto"
            else _int(
                where, key, int(bucket) if isinstance(bucket, float) and bucket.is_integer() else bucket
            )
        )
        _set(out, "zero_reduce_bucket_size", value, key)
    if out.values.get("offload_param") and out.values["sharding"] != "zero3":
        raise LaunchFileError(
            f"{where}: zero_optimization.offload_param needs stage 3, got stage {clip(zero.get('stage'))}"
        )
    enabled = {}
    for precision in ("bf16", "fp16"):
        sec = data.get(precision)
        if sec is None:
            continue
        if not isinstance(sec, dict):
            raise LaunchFileError(
                f'{where}: {precision} must be a mapping such as {{"enabled": "auto"}}, got {clip(sec)}'
            )
        if sec.get("enabled") not in (None, "auto"):
            enabled[precision] = _bool(where, f"{precision}.enabled", sec["enabled"])
    if enabled.get("bf16") and enabled.get("fp16"):
        raise LaunchFileError(f"{where}: bf16.enabled and fp16.enabled are both true; accepted: at most one")
    if enabled:
        on = enabled.get("bf16", False) or enabled.get("fp16", False)
        key = "fp16.enabled" if enabled.get("fp16") else "bf16.enabled"
        _set(out, "bf16", on, key)
        out.must_match.add("bf16")
        if enabled.get("fp16"):
            out.notes.append(f"{where}: fp16 is estimated as bf16 (same 2-byte sizes)")
    for key, name in (
        ("train_micro_batch_size_per_gpu", "per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ):
        if key in data and data[key] != "auto":
            _set(out, name, _int(where, key, data[key]), key)
            out.must_match.add(name)
    if (
        data.get("train_batch_size", "auto") != "auto"
    ):  # checked against GPUs x micro-batch x GA once all are known
        out.train_batch_size = (_int(where, "train_batch_size", data["train_batch_size"]), where)
    return out


# zero_optimization keys that move GPU memory and that the estimate takes at DeepSpeed 0.19.8's defaults
# (runtime/zero/config.py) or HF's "auto" fill (transformers integrations/deepspeed.py), as named here
ZERO_KNOBS_ASSUMED = {  # key -> (DeepSpeed's default, None where HF fills it or none applies; what is assumed)
    "stage3_max_reuse_distance": (1e9, "1e9"),
    "stage3_max_live_parameters": (1e9, "1e9"),
    "stage3_prefetch_bucket_size": (None, "5e7 or 0.9 x hidden^2, the larger"),
    "sub_group_size": (1e9, "1e9"),
    "stage3_param_persistence_threshold": (None, "norms and biases persist"),
    "allgather_bucket_size": (None, "not counted"),
    "zero_hpz_partition_size": (1, "1"),
    "zero_quantized_weights": (False, "false"),
    "zero_quantized_gradients": (False, "false"),
}


def _zero_knobs(where: str, zero: dict, out: LaunchSettings) -> None:
    """A note naming the memory knobs given that the estimate takes at their defaults (ZERO_KNOBS_ASSUMED); a
    partial optimizer offload (`offload_optimizer.ratio` < 1: part of the optimizer kept on the GPU) is refused,
    as the estimate would count all of it on the host, too low."""
    given = [
        f"{key} {clip(zero[key])} (estimated at {assumed})"
        for key, (default, assumed) in ZERO_KNOBS_ASSUMED.items()
        if key in zero and zero[key] not in ("auto", default)
    ]
    if given:
        out.notes.append(f"{where}: zero_optimization keys not modelled: {'; '.join(given)}")
    section = zero.get("offload_optimizer")
    ratio = section.get("ratio") if isinstance(section, dict) else None
    if ratio is not None and ratio != 1:
        raise LaunchFileError(
            f"{where}: zero_optimization.offload_optimizer.ratio {clip(ratio)} (part of the optimizer kept on the "
            "GPU) is not modelled, so the estimate would be low; accepted: 1 (all of it on the host)"
        )


def _find_ds_file(given: str, base: Path | None, where: str) -> tuple[Path, str | None]:
    """accelerate opens deepspeed_config_file from the working directory; else beside the YAML (with a note)."""
    p = Path(given)
    if p.exists() or p.is_absolute() or base is None:
        return p, None
    beside = base / p
    if beside.exists():
        return beside, (
            f"{where}: deepspeed_config_file {given} is not in the working directory; read {beside} beside the "
            "YAML (accelerate opens it from the working directory: run it from there)"
        )
    return p, None


def translate_accelerate(data: dict, where: str, base: Path | None = None) -> LaunchSettings:
    """accelerate config keys -> RunConfig values, as `accelerate launch` reads them (module docstring)."""
    out = LaunchSettings()
    out.ignored += check_keys(where, data, ACCELERATE_KEYS)
    dist = str(data.get("distributed_type", "NO")).upper()
    _choice(where, "distributed_type", dist, DISTRIBUTED_TYPES)
    _processes(out, where, dist, data.get("num_processes"))
    mp = data.get("mixed_precision")
    if mp is not None:
        out.mixed_precision = _choice(where, "mixed_precision", str(mp).lower(), MIXED_PRECISIONS)
        out.values["bf16"] = (
            out.mixed_precision != "no"
        )  # the fallback's value, merged below GRPOConfig's bf16
    use_cpu = data.get("use_cpu")
    if use_cpu is not None and not isinstance(
        use_cpu, bool
    ):  # accelerate would take any truthy value as True
        raise LaunchFileError(f"{where}: use_cpu must be true or false, got {clip(use_cpu)}")
    if use_cpu:
        _set(out, "device", "cpu", "use_cpu")
    if data.get("num_machines") is not None:  # accelerate launch --num_machines: a count of nodes
        _int(where, "num_machines", data["num_machines"])
    _check_parallelism(where, data.get("parallelism_config") or {})
    if dist in ("NO", "MULTI_GPU"):
        _set(out, "sharding", "none", "distributed_type")
    elif dist == "DEEPSPEED":
        _deepspeed_section(out, where, _mapping(where, "deepspeed_config", data), mp is not None, base)
    else:
        _fsdp_section(out, where, _mapping(where, "fsdp_config", data))
    if out.values.get("sharding", "none") != "none" and out.values.get("num_gpus") == 1:
        out.notes.append(f"{where}: {dist} with num_processes 1 shards nothing")
    return out


def _mapping(where: str, key: str, data: dict) -> dict:
    """`data[key]` as a mapping (absent or null: empty); LaunchFileError for anything else."""
    value = data.get(key) or {}
    if not isinstance(value, dict):
        raise LaunchFileError(f"{where}: {key} must be a mapping, got {clip(value)}")
    return value


def _processes(out: LaunchSettings, where: str, dist: str, procs) -> None:
    """num_processes -> num_gpus: one process without distribution (accelerate's simple_launcher), none given
    means the launch's own count."""
    if dist == "NO":
        _set(out, "num_gpus", 1, "distributed_type NO")
        if procs not in (None, 1):
            out.notes.append(
                f"{where}: distributed_type NO runs one process (accelerate launch's simple_launcher); "
                f"num_processes {clip(procs)} does not apply"
            )
    elif procs is None or procs == -1:
        out.needs_processes = True
    else:
        _set(out, "num_gpus", _int(where, "num_processes", procs), "num_processes")


def _check_parallelism(where: str, par) -> None:
    """Sequence / context / tensor parallelism and replicated shards are not modelled: only sizes of 1 pass."""
    if not isinstance(par, dict):
        raise LaunchFileError(f"{where}: parallelism_config must be a mapping, got {clip(par)}")
    for name in PARALLEL_SIZES:
        size = par.get(f"parallelism_config_{name}", 1)
        if size not in (None, 1):
            raise LaunchFileError(
                f"{where}: parallelism_config.parallelism_config_{name} {clip(size)} is not modelled "
                "(sequence / context / tensor parallelism, replicated shards); accepted: 1"
            )


def _deepspeed_section(
    out: LaunchSettings, where: str, ds: dict, has_precision: bool, base: Path | None
) -> None:
    """accelerate's deepspeed_config: the inner DeepSpeed JSON it names, or its own zero_stage / offload keys."""
    out.ignored += check_keys(where, ds, DS_SECTION_KEYS, "deepspeed_config.")
    if ds.get("deepspeed_config_file"):
        clash = [k for k in DS_FILE_EXCLUSIVE if k in ds] + (["mixed_precision"] if has_precision else [])
        if clash:
            raise LaunchFileError(
                f"{where}: {', '.join(clash)} beside deepspeed_config_file: accelerate refuses this "
                "(DeepSpeedPlugin._deepspeed_config_checks); set them in the DeepSpeed JSON"
            )
        _deepspeed_file(out, where, str(ds["deepspeed_config_file"]), base)
        return
    stage_key = "deepspeed_config.zero_stage"
    _set(out, "sharding", _sharding_for_stage(where, stage_key, ds.get("zero_stage", 2)), stage_key)
    for key, name in (
        ("offload_optimizer_device", "offload_optimizer"),
        ("offload_param_device", "offload_param"),
    ):
        if key in ds:
            _set(out, name, _offload(where, f"deepspeed_config.{key}", ds[key]), f"deepspeed_config.{key}")
    if out.values.get("offload_param") and out.values["sharding"] != "zero3":
        raise LaunchFileError(f"{where}: deepspeed_config.offload_param_device cpu needs zero_stage 3")
    ga = ds.get("gradient_accumulation_steps")
    if ga is not None and ga != "auto":
        key = "deepspeed_config.gradient_accumulation_steps"
        _set(out, "gradient_accumulation_steps", _int(where, key, ga), key)
        out.must_match.add("gradient_accumulation_steps")


def _deepspeed_file(out: LaunchSettings, where: str, name: str, base: Path | None) -> None:
    """The DeepSpeed JSON deepspeed_config_file names, read into `out`; its errors are named by this file first."""
    path, note = _find_ds_file(name, base, where)
    if note:
        out.notes.append(note)
    try:
        inner = read_deepspeed_file(str(path))
    except LaunchFileError as e:  # named as the file that points at it, then the inner file's own words
        raise LaunchFileError(f"{where}: deepspeed_config_file {e}") from None
    out.deepspeed_file = str(path)
    for key, value in inner.values.items():
        _set(out, key, value, f"{path.name} {inner.sources.get(key, '')}".strip())
    out.must_match |= inner.must_match
    out.train_batch_size = inner.train_batch_size or out.train_batch_size
    out.notes += inner.notes
    out.ignored += [f"{path.name}: {k}" for k in inner.ignored]


def _fsdp_strategy(where: str, fs: dict, version: int) -> tuple[str, str, str | None]:
    """(sharding strategy, the key it was read from, the other key's value when it names another strategy and is
    not read): FSDP1 runs fsdp_sharding_strategy, FSDP2 fsdp_reshard_after_forward (module docstring)."""
    if version == 2:
        key = "fsdp_config.fsdp_reshard_after_forward"
        raf = fs.get("fsdp_reshard_after_forward", True)
        if isinstance(raf, str) and raf.upper() in FSDP_STRATEGIES:
            raise LaunchFileError(
                f"{where}: {key} {clip(raf)} is a strategy name, which accelerate refuses under fsdp_version 2; "
                "accepted: true (FULL_SHARD), false (SHARD_GRAD_OP)"
            )
        strategy = "FULL_SHARD" if _bool(where, key, raf) else "SHARD_GRAD_OP"
        other = fs.get("fsdp_sharding_strategy")
        unread = f"fsdp_sharding_strategy {clip(other)}" if other is not None else None
        return strategy, key, unread
    strategy, key = fs.get("fsdp_sharding_strategy", "FULL_SHARD"), "fsdp_config.fsdp_sharding_strategy"
    if isinstance(strategy, int) and not isinstance(strategy, bool):
        strategy = FSDP_STRATEGY_NUMBERS.get(strategy, strategy)
    strategy = str(strategy).upper()
    _choice(where, key, strategy, FSDP_STRATEGIES)
    raf = fs.get("fsdp_reshard_after_forward")
    unread = None
    if raf is not None and not (isinstance(raf, str) and raf.upper() == strategy):
        unread = f"fsdp_reshard_after_forward {clip(raf)}"
    if strategy == "HYBRID_SHARD":
        raise LaunchFileError(
            f"{where}: {key} HYBRID_SHARD is not modelled; accepted: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD"
        )
    return strategy, key, unread


def _fsdp_section(out: LaunchSettings, where: str, fs: dict) -> None:
    """accelerate's fsdp_config: version, sharding strategy, parameter offload, activation checkpointing."""
    out.ignored += check_keys(where, fs, FSDP_SECTION_KEYS, "fsdp_config.")
    version = fs.get("fsdp_version", 1)
    out.extra["fsdp_version"] = _choice(where, "fsdp_config.fsdp_version", version, (1, 2))
    if version == 1:
        out.notes.append(
            f"{where}: fsdp_version 1 is estimated as FSDP2 (the traced path); FSDP1's flat parameters "
            "and its summon_full_params for generation differ"
        )
    strategy, key, unread = _fsdp_strategy(where, fs, version)
    if unread is not None:
        out.notes.append(
            f"{where}: {unread} is not read under fsdp_version {version} (accelerate's FSDP{version} takes "
            f"{key.split('.')[-1]}): estimated as {strategy}"
        )
    _set(out, "sharding", "none" if strategy == "NO_SHARD" else "fsdp", key)
    if strategy != "NO_SHARD":
        _set(out, "fsdp_sharding_strategy", strategy, key)
    if "fsdp_offload_params" in fs:
        key = "fsdp_config.fsdp_offload_params"
        _set(out, "offload_param", _bool(where, key, fs["fsdp_offload_params"]), key)
    key = "fsdp_config.fsdp_activation_checkpointing"
    if key.split(".")[-1] in fs and _bool(where, key, fs[key.split(".")[-1]]):
        out.fsdp_checkpointing = f"{where} {key}"
        if fs.get("fsdp_activation_checkpointing_offload") in (True, "true"):
            out.notes.append(
                f"{where}: fsdp_activation_checkpointing_offload (saved activations in host memory) is estimated "
                "as activations kept on the GPU, which errs high"
            )


def read_launch_file(path: str) -> LaunchSettings:
    """Read an accelerate config YAML or a DeepSpeed JSON; one-line LaunchFileError on any problem."""
    try:
        data = load_file(path, "")
    except ConfigFileError as e:
        raise LaunchFileError(str(e).strip()) from None
    return translate_file(data, Path(path))


def read_deepspeed_file(path: str) -> LaunchSettings:
    """The DeepSpeed JSON an accelerate config points at; LaunchFileError when it is anything else (an accelerate
    YAML pointing back at itself would otherwise be read again and again)."""
    try:
        data = load_file(path, "")
    except ConfigFileError as e:
        raise LaunchFileError(str(e).strip()) from None
    if not is_deepspeed_config(data):
        raise LaunchFileError(
            f"{clip(Path(path).name)}: not a DeepSpeed JSON (no zero_optimization or batch sizes)"
        )
    return translate_deepspeed(data, printable(Path(path).name))


def translate_file(data: dict, p: Path) -> LaunchSettings:
    """A parsed accelerate config or DeepSpeed JSON -> LaunchSettings (LaunchFileError when it is neither)."""
    if is_deepspeed_config(data):
        return translate_deepspeed(data, printable(p.name))
    if is_accelerate_config(data):
        return translate_accelerate(data, printable(p.name), p.parent)
    raise LaunchFileError(
        f"{clip(str(p), 120)}: neither an accelerate config (distributed_type) nor a DeepSpeed JSON (zero_optimization)"
    )
