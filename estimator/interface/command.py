"""`vram-estimate --from-command "<launch command>"` (or `vram-estimate [flags] -- <command>`): read what a TRL
GRPO launch command would run.

The command is read as bash reads a pasted block (continued lines joined, `#` comments dropped, one command;
`_commands`) and split with `shlex.split` (POSIX shell words); leading `NAME=value` environment assignments are
skipped (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF is read; CUDA_VISIBLE_DEVICES counts the GPUs a launcher
that uses every visible GPU starts processes on), as are the wrappers `nohup`, `time`, `exec`, `uv run`,
`poetry run`, `pipenv run`, and a shell tail (`> log 2>&1 &`, a pipe). Launchers:

- `accelerate launch [options] SCRIPT ARGS`: `--config_file` is the accelerate YAML and its options override it
  as `accelerate launch` does (an option given on the command line wins over the config file's value;
  https://github.com/huggingface/accelerate/blob/v1.15.0/src/accelerate/commands/launch.py#L1263-L1291);
  without `--config_file` it reads this machine's default config, where `accelerate config` wrote one
  (`default_accelerate_config`); `--num_processes` counts every process; `--use_deepspeed` / `--use_fsdp` / `--multi_gpu` pick the
  distributed type; `--zero_stage`, `--offload_*_device`, `--deepspeed_config_file`, `--fsdp_*` as the YAML's.
  Options are spelled with `_` or `-`, as accelerate accepts.
- `torchrun` / `python -m torch.distributed.run`: `--nproc_per_node N` x `--nnodes M` processes (`gpu` / `auto`:
  the visible GPUs, from CUDA_VISIBLE_DEVICES).
- `deepspeed`: `--num_gpus N` x `--num_nodes M`.
- `python SCRIPT` / `python -m MODULE`: one process.
- `trl grpo ARGS`: TRL's CLI, itself `accelerate launch` of trl/scripts/grpo.py: arguments its parser does not
  know go to accelerate launch, and `--accelerate_config NAME|PATH` is its `--config_file`
  (trl 1.16.0 trl/cli/commands/training.py and trl/cli/accelerate_config.py).

The script's arguments are read as TRL's HfArgumentParser reads them (`--key value`, `--key=value`, a bare
`--flag` for a true boolean, `--no_flag`, several values for a list; transformers v5.24.0 hf_argparser.py
`_parse_dataclass_field`), with `--config FILE` the TRL config (trl scripts/utils.py parse_args_and_config), and
then go through the same key rules as a TRL config file (`estimator/interface/configfile.py`). Paths are relative to the
working directory. Anything it cannot read is one CommandError line naming the word and what is accepted.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from estimator.interface.configfile import (
    FileSettings,
    _from_launch,
    file_keys,
    kind_of,
    settings_of,
    translate,
)
from estimator.interface.files import ConfigFileError, clip, load_file, suggestion
from estimator.interface.known_keys import LAUNCH_BOOL_FLAGS, LAUNCH_VALUE_FLAGS, TRL_KEYS
from estimator.interface.launchfile import LaunchFileError, translate_accelerate
from estimator.interface.training_args import ALLOC_CONF_NAMES
from estimator.text import printable

MAX_COMMAND_CHARS = 100_000
TORCHRUN_BOOL = {"--standalone", "--no_python", "--no-python", "--run_path", "--run-path", "-m", "--module"}
DEEPSPEED_BOOL = {
    "--no_python",
    "--no-python",
    "--module",
    "-m",
    "--no_local_rank",
    "--no_ssh_check",
    "--force_multi",
    "--autotuning",
    "--bind_cores_to_rank",
    "--enable_each_rank_log",
    "--save_pid",
    "--elastic_training",
}
PYTHON_BOOL = {"-u", "-O", "-OO", "-B", "-E", "-s", "-S", "-I", "-b", "-bb", "-q", "-v", "-d", "-i", "-P"}
TRL_ACCELERATE_CONFIGS = ("fsdp1", "fsdp2", "multi_gpu", "single_gpu", "zero1", "zero2", "zero3")
# trl 1.16.0's trl/accelerate_configs, copied (estimator/data/trl_accelerate_configs/README.md)
TRL_CONFIGS_DIR = Path(__file__).resolve().parents[1] / "data" / "trl_accelerate_configs"


class CommandError(ValueError):
    """A launch command this tool cannot read (one line)."""


@dataclass
class CommandSettings:
    """What a command runs: its files and arguments as FileSettings (kinds as in configfile), and notes."""

    files: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    launcher: str = "python"
    visible_gpus: int | None = None  # CUDA_VISIBLE_DEVICES' count, where the command sets it


# RL trainers whose launch commands take arguments of their own, not TRL's: a command running one of these
# packages' scripts or modules is not read as a TRL run
OTHER_TRAINERS = {
    "openrlhf": "OpenRLHF",
    "verl": "verl",
    "swift": "ms-swift",
    "nemo_rl": "NeMo-RL",
    "realhf": "ReaL",
    "areal": "AReaL",
}


def _other_trainer(script: str) -> str | None:
    """The other trainer (OTHER_TRAINERS) whose package a `-m module` starts with, or whose package folder holds a
    script not named for GRPO (a user's own grpo script in a folder named verl is read as TRL's)."""
    words = script.split()
    if words and words[0] == "-m" and len(words) > 1:
        return OTHER_TRAINERS.get(words[1].split(".")[0].lower())
    path = [p.lower() for p in re.split(r"[/\\\\]+", words[-1] if words else "")]
    if "grpo" in path[-1]:
        return None
    return next((OTHER_TRAINERS[p] for p in path[:-1] if p in OTHER_TRAINERS), None)


def _norm(opt: str) -> str:
    """accelerate / torchrun accept `--num-processes` and `--num_processes`."""
    return "--" + opt[2:].replace("-", "_") if opt.startswith("--") else opt


def _options(tokens: list[str], i: int, bools: set[str], what: str) -> tuple[dict, int]:
    """`--opt value` / `--opt=value` / bare boolean options from tokens[i:] up to the first word that is not one;
    returns ({normalized option: value or True}, index of that word)."""
    opts: dict = {}
    while i < len(tokens) and tokens[i].startswith("-") and tokens[i] != "-":
        tok = tokens[i]
        if tok == "--":
            return opts, i + 1
        name, eq, value = tok.partition("=")
        name = _norm(name)
        if eq:
            opts[name] = value
            i += 1
        elif name in bools or tok in bools:
            opts[name] = True
            i += 1
        else:
            if i + 1 >= len(tokens):
                raise CommandError(f"{what} option {clip(tok)} needs a value")
            opts[name] = tokens[i + 1]
            i += 2
    return opts, i


def _count(what: str, opt: str, value) -> int:
    try:
        n = int(str(value))
    except ValueError:
        n = 0
    if n < 1:
        raise CommandError(
            f"{what} {opt} {clip(value)}: not a process count this tool can read; accepted: an integer >= 1 "
            "(or give --gpus N)"
        )
    return n


def _include_slots(spec: str) -> int | None:
    """GPUs a `deepspeed --include` selects: NODE_SPEC = NAME[:SLOT[,SLOT ...]], hosts joined by `@`, each host's
    slots a set of integers (DeepSpeed launcher/runner.py `parse_resource_filter`); None where a host is named
    without its slots (all of its GPUs); CommandError for a slot DeepSpeed cannot read."""
    hosts: dict[str, set[int]] = {}
    for host in spec.split("@"):
        name, _, slots = host.partition(":")
        if not name or not slots:
            return None
        for slot in slots.split(","):
            if not slot.strip().isdigit():
                raise CommandError(
                    f"deepspeed --include {clip(spec)}: slot {clip(slot)} is not a GPU index; accepted: "
                    "NAME:0,1[@NAME:0,1]"
                )
            hosts.setdefault(name, set()).add(int(slot))
    return sum(len(v) for v in hosts.values()) or None


def _launcher_settings(where: str, gpus: int, key: str) -> FileSettings:
    return FileSettings(values={"num_gpus": gpus}, kind="launcher", where=where, sources={"num_gpus": key})


ACCEL_DS_OPTS = {
    "--zero_stage": "zero_stage",
    "--offload_optimizer_device": "offload_optimizer_device",
    "--offload_param_device": "offload_param_device",
    "--deepspeed_config_file": "deepspeed_config_file",
    "--gradient_accumulation_steps": "gradient_accumulation_steps",
    "--zero3_init_flag": "zero3_init_flag",
    "--zero3_save_16bit_model": "zero3_save_16bit_model",
}


def _yaml_scalar(text):
    """A command-line value as YAML reads it ('4' -> 4, 'true' -> True, 'cpu' -> 'cpu')."""
    import yaml

    if not isinstance(text, str):
        return text
    try:
        return yaml.safe_load(text)
    except Exception:
        return text


def default_accelerate_config() -> Path | None:
    """The config `accelerate launch` reads when given none and not --cpu: `accelerate config`'s
    default_config.yaml under $HF_HOME/accelerate ($XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface), if
    this machine has one (accelerate 1.15 commands/config/config_args.py `default_config_file`, launch.py#L1218)."""
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    path = Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"
    return path if path.is_file() else None


def _too_few_visible(launcher: str, per_node: int, visible: int | None, said: str) -> None:
    """CommandError where a launcher starts more processes on a machine than CUDA_VISIBLE_DEVICES shows GPUs:
    each process selects the GPU of its local rank (accelerate's and torchrun's LOCAL_RANK), so the ranks past
    the visible count find none and the run cannot start."""
    if visible is not None and per_node > visible:
        raise CommandError(
            f"{launcher} starts {per_node} processes per machine ({said}) but CUDA_VISIBLE_DEVICES shows {visible} "
            f"GPU(s): local ranks {visible} and up find no GPU; give as many processes as visible GPUs"
        )


def _accelerate(opts: dict, cwd: Path, visible: int | None = None) -> FileSettings | None:
    """`accelerate launch` options (+ its --config_file, or this machine's default config) -> the accelerate config
    they make, as one FileSettings (`visible`: CUDA_VISIBLE_DEVICES' count, checked against the processes)."""
    known = {_norm(o) for o in (*LAUNCH_BOOL_FLAGS, *LAUNCH_VALUE_FLAGS)}
    for opt in opts:
        if opt not in known and opt not in ("-m", "-q"):
            near = suggestion(opt, sorted(known))
            hint = f"; did you mean {near}?" if near else "; accepted: accelerate launch's options"
            raise CommandError(f"accelerate launch: unknown option {clip(opt)}{hint}")
    default = None
    if "--config_file" not in opts and not opts.get("--cpu"):
        default = default_accelerate_config()
        if default is not None:
            opts = {**opts, "--config_file": str(default)}
    data: dict = {}
    where = "accelerate launch"
    path = None
    if "--config_file" in opts:
        path = Path(str(opts["--config_file"]))
        path = path if path.is_absolute() else cwd / path
        data = load_file(str(path), "accelerate launch --config_file")
        where = f"{path.name} + accelerate launch options"
        if kind_of(data, f"accelerate launch --config_file {clip(str(path))}") != "accelerate":
            raise CommandError(
                f"accelerate launch --config_file {clip(str(path))}: not an accelerate config (no distributed_type)"
            )
    elif not any(
        o in opts for o in ("--num_processes", "--use_deepspeed", "--use_fsdp", "--multi_gpu", "--cpu")
    ):
        return FileSettings(kind="accelerate", where="accelerate launch", needs_processes=True)
    if opts.get("--use_deepspeed"):
        data["distributed_type"] = "DEEPSPEED"
    elif opts.get("--use_fsdp"):
        data["distributed_type"] = "FSDP"
    elif opts.get("--multi_gpu"):
        data["distributed_type"] = "MULTI_GPU"
    elif "distributed_type" not in data:
        n = opts.get("--num_processes")
        data["distributed_type"] = "MULTI_GPU" if n is not None and str(n) != "1" else "NO"
    if "--num_processes" in opts:
        data["num_processes"] = _count("accelerate launch", "--num_processes", opts["--num_processes"])
    if "--mixed_precision" in opts:
        data["mixed_precision"] = str(opts["--mixed_precision"])
    if opts.get("--cpu"):
        data["use_cpu"] = True
    procs, machines = data.get("num_processes"), opts.get("--num_machines", data.get("num_machines", 1))
    gpu_ids = opts.get(
        "--gpu_ids", data.get("gpu_ids")
    )  # accelerate sets CUDA_VISIBLE_DEVICES from these itself
    if (
        not data.get("use_cpu")
        and gpu_ids in (None, "all")
        and isinstance(procs, int)
        and str(machines).isdigit()
        and int(machines) >= 1
    ):  # accelerate's per-machine count: num_processes // num_machines (utils/launch.py)
        _too_few_visible("accelerate launch", procs // int(machines), visible, "num_processes / num_machines")
    for opt, key in ACCEL_DS_OPTS.items():
        if opt in opts:
            data.setdefault("deepspeed_config", {})
            data["deepspeed_config"] = {**(data["deepspeed_config"] or {}), key: _yaml_scalar(opts[opt])}
    for opt, value in opts.items():
        if opt.startswith("--fsdp_"):
            data["fsdp_config"] = {**(data.get("fsdp_config") or {}), opt[2:]: _yaml_scalar(value)}
    try:
        launch = translate_accelerate(data, where, path.parent if path else cwd)
    except LaunchFileError as e:
        raise CommandError(str(e)) from None
    out = _from_launch(launch, "accelerate", where, str(path) if path else "")
    if default is not None:
        out.notes.append(
            f"accelerate launch without --config_file reads this machine's default config, {printable(str(default), 120)} "
            "(written by `accelerate config`): estimated with it"
        )
    return out


def script_args(tokens: list[str]) -> tuple[dict, str | None]:
    """HfArgumentParser-style arguments -> ({key: value}, the --config path). Values stay strings (typed later)."""
    out: dict = {}
    config = None
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise CommandError(
                f"script argument {clip(tok)} is not --key [value]; accepted: TRL's --key value arguments"
            )
        name, eq, value = tok[2:].partition("=")
        values = [value] if eq else []
        i += 1
        while not eq and i < len(tokens) and not (tokens[i].startswith("--") and len(tokens[i]) > 2):
            values.append(tokens[i])
            i += 1
        if name == "config":
            if len(values) != 1:
                raise CommandError("script --config needs one file")
            config = values[0]
            continue
        if not name:
            raise CommandError("script argument '--' is not --key [value]")
        out[name] = True if not values else values[0] if len(values) == 1 else values
    return out, config


def typed_args(args: dict) -> dict:
    """Script argument strings typed as HfArgumentParser would for the settings the estimate reads: numbers,
    booleans (transformers string_to_bool), lists; `--no_X` is X false; JSON for dict arguments."""
    top, nested = file_keys()
    bools = {k for k, f in top.items() if f.kind == "bool"} | {"use_cpu", "fp16"}
    out: dict = {}
    for key, value in args.items():
        if key.startswith("no_") and key[3:] in bools and value is True:
            out[key[3:]] = False
            continue
        f = top.get(key)
        if key in bools:
            if value is True:
                out[key] = True
                continue
            v = str(value).lower()
            if v in ("yes", "true", "t", "y", "1"):
                out[key] = True
            elif v in ("no", "false", "f", "n", "0"):
                out[key] = False
            else:
                raise CommandError(f"--{key} {clip(value)}: accepted: true or false (yes/no, 1/0)")
        elif key in nested and isinstance(value, str):
            try:
                out[key] = json.loads(value)
            except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser's stack
                raise CommandError(f"--{key} {clip(value)}: not a JSON mapping") from None
        elif f is not None and f.kind == "strs":
            out[key] = [value] if isinstance(value, str) else value
        elif f is not None and f.kind in ("int", "float") and isinstance(value, str):
            try:
                out[key] = int(value) if f.kind == "int" else float(value)
            except ValueError:
                want = "an integer" if f.kind == "int" else "a number"
                raise CommandError(f"--{key} {clip(value)}: must be {want}") from None
            if f.kind == "float" and not math.isfinite(out[key]):  # 1e400 reads as inf
                raise CommandError(
                    f"--{key} {clip(value)}: not a finite number (a value past 1.8e308 reads as inf); accepted: a "
                    "finite number"
                )
        else:
            out[key] = value
    return out


def _script(tokens: list[str], i: int, module: bool) -> tuple[str, int]:
    if i >= len(tokens):
        raise CommandError(
            "the command names no training script; accepted: trl grpo, python -m trl.scripts.grpo, SCRIPT.py"
        )
    return (("-m " if module else "") + tokens[i]), i + 1


def read_command(command: str | list[str], cwd: Path | None = None) -> CommandSettings:
    """A launch command (a string, split with shlex, or its words) -> CommandSettings; CommandError if unreadable."""
    cwd = cwd or Path(".")
    tokens = _words(command)
    env = _unwrap(tokens)
    if not tokens:
        raise CommandError(
            "--from-command names no command; accepted: accelerate launch / torchrun / python / trl grpo ..."
        )
    out = CommandSettings(visible_gpus=_visible_gpus(env))
    conf = next((name for name in ALLOC_CONF_NAMES if name in env), None)  # set, even to "", wins
    if conf:
        out.files.append(
            FileSettings(
                values={"pytorch_cuda_alloc_conf": env[conf]},
                kind="launcher",
                where="environment",
                sources={"pytorch_cuda_alloc_conf": conf},
            )
        )
    script, i, accel_opts = _launcher(tokens, out)
    other = _other_trainer(script)
    if other:
        raise CommandError(
            f"--from-command: {clip(script, 60)} is {other}'s trainer, whose arguments are not TRL's; this tool "
            "reads TRL GRPO launches: give the run's settings as flags (--model, --reference-model, --use-vllm, ...)"
        )
    script, args, trl_config, accel_opts = _script_arguments(script, tokens[i:], accel_opts, out, cwd)
    name = script.split()[-1]
    if "grpo" not in name:
        out.notes.append(
            f"command: {clip(script)} is estimated as TRL's GRPO trainer (its arguments read as TRL's)"
        )
    files = _script_files(args, trl_config, cwd, trl_script="grpo" in name)
    if script == "trl grpo":
        in_file = next((f.launch_options for f in files if f.kind == "trl" and f.launch_options), {})
        if in_file:  # the command line's accelerate options come after the file's: theirs win
            accel_opts = {**launch_options(in_file, cwd), **(accel_opts or {})}
            out.launcher = "trl grpo (accelerate launch)"
    if accel_opts is not None:
        acc = _accelerate(accel_opts, cwd, out.visible_gpus)
        if acc is not None and acc.needs_processes and acc.where == "accelerate launch" and out.visible_gpus:
            # no config file, no count: accelerate launch starts torch.cuda.device_count() processes
            acc = _launcher_settings(
                "accelerate launch", out.visible_gpus, "the GPUs in CUDA_VISIBLE_DEVICES"
            )
            out.notes.append(
                f"accelerate launch without a config file or --num_processes: {out.visible_gpus} processes, one per "
                "GPU in CUDA_VISIBLE_DEVICES (unless the machine's default accelerate config says otherwise)"
            )
        if acc is not None:
            out.files.append(acc)
    out.files.extend(files)
    return out


def launch_options(keys: dict, cwd: Path) -> dict:
    """A TRL config's keys that `trl grpo` hands to accelerate launch (`FileSettings.launch_options`) as accelerate
    launch options: `--key value`, and `accelerate_config` as `--config_file` (its name resolved)."""
    out: dict = {}
    for key, value in keys.items():
        if key == "accelerate_config":
            out["--config_file"] = _trl_accelerate_config(str(value), cwd)
        else:
            out["--" + key] = value
    return out


def launch_file(keys: dict, cwd: Path) -> FileSettings | None:
    """The accelerate settings of a TRL config's launch keys, as `trl grpo --config FILE` would launch it."""
    return _accelerate(launch_options(keys, cwd), cwd)


def _words(command: str | list[str]) -> list[str]:
    """The command's words: a string split as a shell would (shlex), at most MAX_COMMAND_CHARS long.

    A pasted block is read as bash reads it (`_commands`): one command, or a CommandError naming each."""
    if not isinstance(command, str):
        return list(command)
    if len(command) > MAX_COMMAND_CHARS:
        raise CommandError(
            f"--from-command: {len(command)} characters, more than a command ({MAX_COMMAND_CHARS})"
        )
    commands = _commands(command)
    if len(commands) > 1:
        listed_ = ", ".join(clip(" ".join(c.split()), 40) for c in commands[:3]) + (
            ", ..." if len(commands) > 3 else ""
        )
        raise CommandError(
            f"--from-command: {len(commands)} commands as bash reads them (a newline ends one, also after a "
            f"`\\` line whose `#` comment swallows the `\\`): {listed_}; give the training launch alone"
        )
    try:
        return shlex.split(commands[0]) if commands else []
    except ValueError as e:
        raise CommandError(f"--from-command {clip(command)}: {e} (shell quoting)") from None


def _commands(text: str) -> list[str]:
    """The commands of a pasted block, as bash reads them: a line ending in an unescaped `\\` continues on the
    next (joined without the two characters, also inside double quotes), a `#` that starts a word outside quotes
    comments out the rest of its line (the `\\` too, so the command ends there), a newline inside quotes is kept,
    and any other newline ends a command. Blank and comment-only lines are skipped. Friendlier than bash in two
    ways: CRLF line ends read as LF, and spaces after a final `\\` still continue the line."""
    out, buf, quote = [], "", ""
    for line in text.replace("\r\n", "\n").split("\n"):
        body, commented, quote = _uncommented(line, quote, buf[-1:] or " ")
        stripped = body.rstrip() if not quote else body
        continued = not commented and quote != "'" and _odd_backslashes(stripped)
        if continued:
            buf += stripped[:-1]
            continue
        if quote:  # a quoted newline: part of the word
            buf += body + "\n"
            continue
        buf += body
        if buf.strip():
            out.append(buf.strip())
        buf = ""
    if buf.strip():  # an unclosed quote: shlex says so
        out.append(buf.strip())
    return out


def _odd_backslashes(text: str) -> bool:
    """`text` ends in an odd run of backslashes: its last one escapes the newline after it."""
    return (len(text) - len(text.rstrip("\\"))) % 2 == 1


def _uncommented(line: str, quote: str = "", prev: str = " ") -> tuple[str, bool, str]:
    """`line` up to a `#` that starts a word outside quotes, whether it had one, and the quote still open at its
    end (`quote`: the one open at its start; `prev`: the character before the line, where it continues one)."""
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped, ch = False, "x"  # an escaped character is part of a word
        elif quote:
            if ch == quote:
                quote = ""
            elif ch == "\\" and quote == '"':
                escaped = True
        elif ch == "\\":
            escaped = True
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (prev.isspace() or prev in ";&|()<>"):
            return line[:i], True, ""
        prev = ch
    return line, False, quote


def _environment(tokens: list[str]) -> dict:
    """`NAME=value` words before the command (also after `env`), removed from `tokens`."""
    env: dict = {}
    while (
        tokens
        and "=" in tokens[0]
        and not tokens[0].startswith("-")
        and tokens[0].split("=", 1)[0].isidentifier()
    ):
        k, _, v = tokens.pop(0).partition("=")
        env[k] = v
    if tokens and tokens[0] == "env":
        tokens.pop(0)
        while tokens and "=" in tokens[0] and tokens[0].split("=", 1)[0].isidentifier():
            k, _, v = tokens.pop(0).partition("=")
            env[k] = v
    return env


WRAPPERS = (("nohup",), ("time",), ("exec",), ("uv", "run"), ("poetry", "run"), ("pipenv", "run"))
SHELL_TAIL = ("|", "||", "&", "&&", ";", ">", ">>", "<", "2>", "2>>", "&>", "1>", "2>&1", "1>&2")


def _unwrap(tokens: list[str]) -> dict:
    """Remove (in place) what runs around the launcher: environment assignments, the WRAPPERS, and a shell tail
    from its first SHELL_TAIL word (or `>file`-style word) on; returns the environment."""
    for i, word in enumerate(tokens):
        if word in SHELL_TAIL or word.startswith((">", "2>", "&>", "1>")):
            del tokens[i:]
            break
    env: dict = {}
    while True:
        env.update(_environment(tokens))
        wrapper = next((w for w in WRAPPERS if tuple(tokens[: len(w)]) == w), None)
        if wrapper is None:
            return env
        del tokens[: len(wrapper)]


def _visible_gpus(env: dict) -> int | None:
    """CUDA_VISIBLE_DEVICES' device count ("0,1,2,3" -> 4), None when it is not set or not a list of devices."""
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return None
    ids = [x.strip() for x in text.split(",") if x.strip()]
    if len(set(ids)) != len(ids):  # a repeated id: CUDA's own reading of the list, not a count to rely on
        return None
    return (
        len(ids) if ids and all(x.isascii() and (x.isdigit() or x.startswith("GPU-")) for x in ids) else None
    )


def _launcher(tokens: list[str], out: CommandSettings) -> tuple[str, int, dict | None]:
    """The launcher's own options (accelerate launch, torchrun, deepspeed, python, trl): records its process
    count in `out`; returns the script, the index of its first argument, and accelerate launch's options."""
    prog = Path(tokens[0]).name
    if prog == "accelerate":
        if len(tokens) < 2 or tokens[1] != "launch":
            raise CommandError(
                f"accelerate {clip(tokens[1] if len(tokens) > 1 else '')}: accepted: accelerate launch"
            )
        accel_opts, i = _options(
            tokens, 2, {_norm(o) for o in LAUNCH_BOOL_FLAGS} | {"-m", "-q"}, "accelerate launch"
        )
        out.launcher = "accelerate launch"
        script, i = _script(tokens, i, bool(accel_opts.get("-m") or accel_opts.get("--module")))
        return script, i, accel_opts
    if prog == "torchrun" or (
        prog.startswith("python")
        and tokens[1:3] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"])
    ):
        opts, i = _options(tokens, 1 if prog == "torchrun" else 3, TORCHRUN_BOOL, "torchrun")
        per = opts.get("--nproc_per_node", 1)
        nodes = opts.get("--nnodes", 1)
        if str(per) in ("gpu", "auto") and out.visible_gpus is None:  # every visible GPU: not known here
            where = f"torchrun --nproc_per_node {per}"
            out.files.append(FileSettings(kind="launcher", where=where, needs_processes=True))
        else:
            per = out.visible_gpus if str(per) in ("gpu", "auto") else per
            _too_few_visible(
                "torchrun", _count("torchrun", "--nproc_per_node", per), out.visible_gpus, "--nproc_per_node"
            )
            n = _count("torchrun", "--nproc_per_node", per) * _count("torchrun", "--nnodes", nodes)
            out.files.append(_launcher_settings("torchrun", n, "--nproc_per_node x --nnodes"))
        out.launcher = "torchrun"
        script, i = _script(tokens, i, bool(opts.get("-m") or opts.get("--module")))
        return script, i, None
    if prog == "deepspeed":
        opts, i = _options(tokens, 1, DEEPSPEED_BOOL, "deepspeed")
        include = opts.get("--include", opts.get("-i"))
        gpus = opts.get("--num_gpus", opts.get("--num_accelerators"))
        if include is not None and (gpus is not None or "--num_nodes" in opts):
            raise CommandError(  # DeepSpeed's runner: "Cannot specify num_nodes/gpus with include/exclude"
                "deepspeed: --include with --num_gpus / --num_nodes, which DeepSpeed refuses; give one of them"
            )
        if include is not None:
            slots = _include_slots(str(include))
            if slots is None:
                raise CommandError(
                    f"deepspeed --include {clip(str(include))}: a host named without its GPU slots uses all of its "
                    "GPUs, which this tool cannot see; name them (NAME:0,1) or give --gpus N"
                )
            out.files.append(_launcher_settings("deepspeed", slots, "--include"))
        elif (
            gpus is None and out.visible_gpus
        ):  # the runner turns CUDA_VISIBLE_DEVICES into --include localhost:
            out.files.append(_launcher_settings("deepspeed", out.visible_gpus, "CUDA_VISIBLE_DEVICES"))
        elif gpus is None:
            raise CommandError(
                "deepspeed without --num_gpus (or an --include naming each GPU, or CUDA_VISIBLE_DEVICES) uses "
                "every GPU of the machine; give --num_gpus N (or --gpus N)"
            )
        else:
            per_node = _count("deepspeed", "--num_gpus", gpus)
            _too_few_visible("deepspeed", per_node, out.visible_gpus, "--num_gpus")
            n = per_node * _count("deepspeed", "--num_nodes", opts.get("--num_nodes", 1))
            out.files.append(_launcher_settings("deepspeed", n, "--num_gpus x --num_nodes"))
        out.launcher = "deepspeed"
        script, i = _script(tokens, i, bool(opts.get("--module") or opts.get("-m")))
        return script, i, None
    if prog.startswith("python"):
        j = 1
        while j < len(tokens) and tokens[j] in PYTHON_BOOL:
            j += 1
        if j < len(tokens) and tokens[j] == "-m":
            script, i = _script(tokens, j + 1, True)
        else:
            script, i = _script(tokens, j, False)
        out.files.append(_launcher_settings("python", 1, "one process"))
        out.launcher = "python"
        return script, i, None
    if prog == "trl":
        out.launcher = "trl"
        return "trl", 1, None
    raise CommandError(
        f"{clip(tokens[0])}: not a launcher this tool reads; accepted: accelerate launch, torchrun, deepspeed, "
        "python, trl grpo"
    )


def _script_arguments(
    script: str, rest: list[str], accel_opts: dict | None, out: CommandSettings, cwd: Path
) -> tuple[str, dict, str | None, dict | None]:
    """The script's arguments as TRL reads them: (script, arguments, its --config file, accelerate options).
    `trl grpo` hands the arguments its GRPO parser does not know to accelerate launch, as TRL's CLI does."""
    if Path(script).name == "trl":  # `trl grpo ...` (also as accelerate launch's script)
        if not rest or rest[0] != "grpo":
            raise CommandError(f"trl {clip(rest[0] if rest else '')}: accepted: trl grpo")
        rest = rest[1:]
        script = "trl grpo"
    args, trl_config = script_args(rest)
    if script == "trl grpo":
        launch_names = {_norm(o)[2:] for o in (*LAUNCH_BOOL_FLAGS, *LAUNCH_VALUE_FLAGS)}
        top, nested = file_keys()
        accel_opts = dict(accel_opts or {})
        for key in list(args):
            if key == "accelerate_config":
                accel_opts["--config_file"] = _trl_accelerate_config(str(args.pop(key)), cwd)
            elif key in launch_names and key not in TRL_KEYS and key not in top and key not in nested:
                accel_opts["--" + key] = args.pop(key)
        if accel_opts or out.launcher == "trl":
            out.launcher = "trl grpo (accelerate launch)"
    return script, args, trl_config, accel_opts


def _script_files(
    args: dict, trl_config: str | None, cwd: Path, trl_script: bool = True
) -> list[FileSettings]:
    """The script's --config file (with the DeepSpeed file it names) and its remaining arguments as settings
    (`trl_script` False: a script of the user's own, whose unknown arguments are its own, not typos)."""
    files: list[FileSettings] = []
    if trl_config is not None:
        p = Path(trl_config)
        p = p if p.is_absolute() else cwd / p
        data = load_file(str(p), "script --config")
        s = settings_of(data, p, "script --config")
        if s.kind != "trl":
            raise CommandError(f"script --config {clip(trl_config)}: a {s.kind} file, not a TRL config")
        files.append(s)
        if s.deepspeed_file:
            files.append(
                settings_of(load_file(s.deepspeed_file, f"{s.where}: deepspeed"), Path(s.deepspeed_file))
            )
            files[-1].via_training_args = True
    if args:
        s = translate(typed_args(args), "command", cwd, typos=trl_script)
        s.kind = "trl-args"
        s.sources = {k: "--" + v.split(".")[0] for k, v in s.sources.items()}
        files.append(s)
        if s.deepspeed_file:
            p = Path(s.deepspeed_file)
            files.append(settings_of(load_file(str(p if p.is_absolute() else cwd / p), "--deepspeed"), p))
            files[-1].via_training_args = True
    return files


def _trl_accelerate_config(value: str, cwd: Path) -> str:
    """`trl grpo --accelerate_config NAME|PATH`: a file, else one of the configs trl 1.16 ships (read from this
    package's copies, so TRL need not be installed here)."""
    p = Path(value)
    if (p if p.is_absolute() else cwd / p).is_file():
        return value
    if value in TRL_ACCELERATE_CONFIGS:
        return str(TRL_CONFIGS_DIR / f"{value}.yaml")
    raise CommandError(
        f"--accelerate_config {clip(value)}: neither a file nor one of trl's configs; accepted: a path or "
        + ", ".join(TRL_ACCELERATE_CONFIGS)
    )


def command_files(command, cwd: Path | None = None) -> CommandSettings:
    """read_command with every file / key problem as a CommandError line."""
    try:
        return read_command(command, cwd)
    except (ConfigFileError, LaunchFileError) as e:
        raise CommandError(str(e)) from None
