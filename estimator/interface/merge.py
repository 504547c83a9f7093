"""Combine a run's files and flags as the libraries do (`merge`), then what only the whole run decides (`finish`):
FSDP's own activation checkpointing against the GRPOConfig's, generation_kwargs' lengths, DeepSpeed's
train_batch_size. The files come from `estimator/interface/configfile.py` (and command.py for a launch command)."""

from __future__ import annotations

from dataclasses import dataclass, field

from estimator.interface.file_settings import FileSettings
from estimator.interface.files import ConfigFileError, clip
from estimator.interface.training_args import COMPLETION_KEYS
from estimator.settings.config import RunConfig


def _training_args_deepspeed(out: Merged, owner: dict, f: FileSettings, name: str, value) -> bool:
    """Sharding "none" from an accelerate config beside a DeepSpeed config that TrainingArguments names: the run
    is DeepSpeed's (transformers builds a DeepSpeedPlugin from `deepspeed`, v5.24.0 training_args.py#L1706-L1715,
    and the Accelerator given one sets ACCELERATE_USE_DEEPSPEED, which selects DistributedType.DEEPSPEED:
    accelerate v1.15.0 accelerator.py#L367-L368, state.py#L974-L975). True where that settles `f`'s `value`
    against the one already in `out` (set by `owner[name]`), with a note."""
    had, first = out.values.get(name), owner.get(name)
    if first is None or had == value or "none" not in (had, value):
        return False
    ds, other = (first, f) if had != "none" else (f, first)
    if not (ds.via_training_args and ds.kind == "deepspeed" and other.kind == "accelerate"):
        return False
    if ds is f:
        out.values[name], out.sources[name] = value, _label(f, name)
        owner[name] = f
    out.notes.append(
        f"{_label(ds, name)}: named by TrainingArguments' deepspeed, which switches accelerate to DeepSpeed over "
        f"{_label(other, name)} 'none': estimated with DeepSpeed"
    )
    return True


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
    owner: dict[str, FileSettings] = {}  # the launch file that set each value
    for f in launch:
        for name, value in f.values.items():
            label = _label(f, name)
            if name == "bf16" and name not in f.must_match:
                continue  # accelerate's mixed_precision: a fallback, below
            if name in f.must_match:
                must[name] = (value, label)
                continue
            if name == "sharding" and _training_args_deepspeed(out, owner, f, name, value):
                continue
            if name in out.values and out.values[name] != value and f.kind != "launcher":
                raise ConfigFileError(
                    f"{out.sources[name]} sets {name} {clip(out.values[name])} but {label} sets {clip(value)}; "
                    "give one (or settle it with a flag)"
                )
            out.values[name], out.sources[name] = value, label
            owner[name] = f
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
