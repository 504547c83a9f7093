"""What one of a user's files (or a launch command's arguments) says, as RunConfig values with where each came from:
the record the readers (configfile.py, launchfile.py via configfile, training_args.py, command.py) fill and
merge.py combines."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # a DeepSpeed config named by TrainingArguments' `deepspeed` (a TRL file's key, a script's --deepspeed): it
    # switches accelerate to DeepSpeed whatever the accelerate config's distributed_type (merge.py)
    via_training_args: bool = False
    # keys `trl grpo` hands to accelerate launch (known_keys.LAUNCH_KEYS)
    launch_options: dict = field(default_factory=dict)
    # generation_kwargs max_new_tokens / max_tokens -> N
    completion_lengths: dict = field(default_factory=dict)
