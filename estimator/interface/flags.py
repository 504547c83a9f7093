"""Command-line flags for the run settings, derived from the one schema in `estimator/settings/config.py`.

`vram-estimate` and `grpo-vram-trace` both call `add_run_flags` and `run_values`, so they accept the same
settings under the same names. Flags default to "not given" (argparse.SUPPRESS) so a `--config` file's values
show through; `run_values` returns only what was given.

Every flag also answers to TRL's underscore spelling, derived from the schema (not a hand list): each flag and
alias with `_` for `-`, and `--KEY` for every top-level key a TRL config file may use for the setting (`trl=`,
the field name, `file_keys`: `--model_name_or_path`, `--torch_dtype`, `--per_device_train_batch_size`). Boolean
ones take HfArgumentParser's forms (`--use_peft`, `--use_peft true`, `--no_use_peft`). They are hidden from
--help (`TRL_SPELLING_HELP` says so once).
"""

from __future__ import annotations

import argparse
import math
import re

from estimator.interface.command import CommandError, command_files, launch_file
from estimator.interface.configfile import ConfigFileError, check_kinds, normalize_dtype, read_files
from estimator.interface.files import clip, suggestion
from estimator.interface.merge import Merged, check_train_batch_size, finish, merge
from estimator.model import catalog
from estimator.model.architecture import ConfigError
from estimator.settings.config import Field, RunConfig, flag, schema
from estimator.settings.release_config import release_values
from estimator.settings.role_spec import config_roles
from estimator.settings.trl_versions import default_version, fmt, parse_version, profile
from estimator.settings.validate import InvalidConfig, validate
from estimator.settings.validate import notes as setting_notes
from estimator.settings.versions import default_transformers, installed, installed_notes
from estimator.terms.loading import read_ahead_note
from estimator.terms.optimizer import default_optimizer_note
from estimator.text import printable

GROUP_TITLES = {"model": "model", "GRPOConfig": "GRPOConfig", "hardware": "hardware and estimator"}
DTYPE_CHOICES = ("float32", "bfloat16", "float16", "auto")  # auto = the checkpoint's dtype


class FlagError(ValueError):
    """Flags that contradict each other (one line)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that raises FlagError (one line) instead of printing usage and exiting."""

    def error(self, message: str):  # type: ignore[override]
        raise FlagError(one_line_error(self, message))


def one_line_error(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's message, with the nearest known flag for a mistyped one (as config-file keys get); the values
    argparse quotes in it (`invalid choice: '...'`, `invalid int value: '...'`) cut, and the line escaped."""
    if message.startswith("argument --") and message.endswith(": expected one argument"):
        flag = message.removeprefix("argument ").split(":")[0].split("/")[0]
        return f"{message}; a value starting with '-' goes after '=': {flag}=VALUE"
    if not message.startswith("unrecognized arguments: "):
        return printable(_QUOTED.sub(_cut_quoted, message), MAX_ERROR_CHARS)
    unknown = message.removeprefix("unrecognized arguments: ").split()[0]
    parsers, known = [parser], []
    while parsers:  # the flags of the parser and of its subcommands (argparse reports theirs at the top)
        p = parsers.pop()
        for a in p._actions:
            known += [o for o in a.option_strings if o.startswith("--")]
            if isinstance(a, argparse._SubParsersAction):
                parsers += list(a.choices.values())
    near = suggestion(unknown.split("=")[0].replace("_", "-"), known) if unknown.startswith("--") else None
    hint = f"; did you mean {near}?" if near else "; see --help for the flags"
    return f"unknown flag {clip(unknown)}{hint}"


MAX_ERROR_CHARS = 400  # one error line, however long the value typed
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")  # a repr argparse put in its message


def _cut_quoted(m: re.Match) -> str:
    """A quoted value in argparse's message cut to 60 characters, quotes kept."""
    quote, body = m.group(0)[0], m.group(1) if m.group(1) is not None else m.group(2)
    return quote + (body if len(body) <= 60 else body[:57] + "...") + quote


def int_flag(text: str) -> int:
    """An argparse `type` for a whole number in ASCII digits: one line naming the value otherwise."""
    try:
        if not text.isascii():  # int() also reads other scripts' digits ('٣' is 3)
            raise ValueError(text)
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {clip(text)}; accepted: a whole number") from None


def _float(text: str) -> float:
    try:
        if not text.isascii():
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {clip(text)}; accepted: a decimal number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{clip(text)} is not a finite number; accepted: a finite number")
    return value


def _dtype(text: str) -> str:
    value = normalize_dtype(text)
    if value not in DTYPE_CHOICES:
        raise argparse.ArgumentTypeError(f"invalid dtype {clip(text)}; accepted: {', '.join(DTYPE_CHOICES)}")
    return value


def _trl_version(text: str) -> str:
    """`0.14`, `0.14.0`, `v0.14` -> `0.14` when TRL 0.14 is modelled; else one line naming the modelled range."""
    try:
        return fmt(_release_minor(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--trl-version ")) from None


def _release_minor(text: str):
    v = parse_version(text)
    profile(v)  # a modelled release, or ValueError naming the range
    return v


def _help(f: Field) -> str:
    if "default:" in f.meta.help:
        return f.meta.help
    default = "none" if f.default is None else f.default
    return f"{f.meta.help} (default: {default})"


TRL_SPELLING_HELP = (
    "Every run flag also answers to TRL's underscore spelling: --per_device_train_batch_size, "
    "--model_name_or_path (= --model), --torch_dtype, --use_peft [true|false], --no_use_peft, --lora_r ..."
)


class _TrlBool(argparse.Action):
    """HfArgumentParser's boolean: `--flag` (true), `--flag false`, yes/no, t/f, y/n, 1/0 (string_to_bool)."""

    def __init__(self, option_strings, dest, **kw):
        kw.pop("type", None)
        super().__init__(option_strings, dest, nargs="?", const=True, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        if values is True:
            setattr(namespace, self.dest, True)
            return
        v = str(values).lower()
        if v in ("yes", "true", "t", "y", "1"):
            setattr(namespace, self.dest, True)
        elif v in ("no", "false", "f", "n", "0"):
            setattr(namespace, self.dest, False)
        else:
            raise argparse.ArgumentError(
                self, f"invalid value {clip(values)}; accepted: true or false (yes/no, 1/0)"
            )


def trl_spellings(f: Field) -> tuple[str, ...]:
    """The underscore spellings of setting `f`: its flags with `_`, and `--KEY` for its top-level file keys."""
    names = ["--" + n[2:].replace("-", "_") for n in (f.flag, *f.meta.aliases)]
    names += ["--" + k for k in f.file_keys if "." not in k]
    taken = {f.flag, *f.meta.aliases}
    return tuple(n for n in dict.fromkeys(names) if n not in taken)


def _add(group: argparse._ArgumentGroup, f: Field) -> None:
    names = (f.flag, *f.meta.aliases)
    kw: dict = {"dest": f.name, "help": _help(f)}
    if f.kind == "bool":
        kw["action"] = argparse.BooleanOptionalAction
    elif f.name == "trl_version":  # 0.14.0 / v0.14 -> 0.14, then one of the modelled releases
        kw.update(type=_trl_version, metavar=f.meta.metavar)
    elif f.name == "dtype":
        kw.update(type=_dtype, metavar="{" + ",".join(DTYPE_CHOICES) + "}")
    elif f.kind == "strs":  # repeatable: --reward-model A --reward-model B
        kw.update(nargs="+", action="extend", metavar=f.meta.metavar or "NAME")
    elif f.meta.choices is not None:
        kw["choices"] = f.meta.choices
        if f.kind != "str":
            kw.update(
                type={"int": int_flag, "float": _float}[f.kind],
                metavar="{" + ",".join(map(str, f.meta.choices)) + "}",
            )
    else:
        kw.update(type={"int": int_flag, "float": _float, "str": str}[f.kind], metavar=f.meta.metavar)
    group.add_argument(*names, **kw)
    trl = [n for n in trl_spellings(f) if n not in group._option_string_actions]
    hidden = {**kw, "help": argparse.SUPPRESS}
    if f.kind == "bool":
        hidden["action"] = _TrlBool
        if trl:
            group.add_argument(*trl, **hidden)
        keys = [k for k in (f.name, *f.file_keys) if "." not in k]
        no = [n for n in dict.fromkeys(f"--no_{k}" for k in keys) if n not in group._option_string_actions]
        if no:  # HfArgumentParser's complement of a boolean
            group.add_argument(*no, dest=f.name, action="store_false", help=argparse.SUPPRESS)
    elif trl:
        group.add_argument(*trl, **hidden)


def add_run_flags(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One flag per schema field (grouped as in the schema) plus the shortcuts --qlora, --zero and --fsdp."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUP_TITLES.items()}
    for f in schema():
        if f.name not in skip:
            _add(groups[f.meta.group], f)
    groups["model"].add_argument(
        "--qlora", action="store_true", default=argparse.SUPPRESS, help="= --use-peft --load-in-4bit"
    )
    groups["hardware"].add_argument(
        "--zero", type=int, choices=(2, 3), default=argparse.SUPPRESS, help="= --sharding zero2|zero3"
    )
    groups["hardware"].add_argument(
        "--fsdp", action="store_true", default=argparse.SUPPRESS, help="= --sharding fsdp"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        action="append",
        default=argparse.SUPPRESS,
        help="a TRL GRPOConfig / ModelConfig / ScriptArguments YAML or JSON (or an open-r1 recipe), an accelerate "
        "config YAML or a DeepSpeed JSON; repeat for one of each kind; flags override them",
    )
    parser.add_argument(
        "--from-command",
        "--from_command",
        metavar="CMD",
        default=argparse.SUPPRESS,
        help='read the settings of a launch command, e.g. "accelerate launch --config_file zero3.yaml trl grpo '
        '--config grpo.yaml --per_device_train_batch_size 4" (also: vram-estimate [flags] -- CMD ...)',
    )


def _split_targets(values: list[str]) -> tuple[str, ...]:
    """['q_proj,k_proj', 'v_proj'] -> ('q_proj', 'k_proj', 'v_proj'); empty pieces are dropped."""
    return tuple(t.strip() for v in values for t in v.split(",") if t.strip())


def run_values(ns: argparse.Namespace) -> dict:
    """The RunConfig field values given on the command line (only those given), shortcuts expanded."""
    given = vars(ns)
    names = {f.name for f in schema()}
    out = {k: v for k, v in given.items() if k in names}
    if "lora_target_modules" in out:
        targets = _split_targets(out["lora_target_modules"])
        if not targets:
            raise FlagError(
                "--lora-target-modules names no module; give names (e.g. q_proj,v_proj) or all-linear"
            )
        out["lora_target_modules"] = targets
    if given.get("qlora"):
        if out.get("use_peft") is False:
            raise FlagError("--qlora needs PEFT; drop --no-use-peft")
        out.update(use_peft=True, load_in_4bit=True)
    zero, fsdp = given.get("zero"), given.get("fsdp", False)
    if zero and fsdp:
        raise FlagError("--zero and --fsdp are alternatives; give one")
    if (zero or fsdp) and "sharding" in out:
        raise FlagError("--sharding and --zero/--fsdp say the same thing; give one")
    if zero:
        out["sharding"] = f"zero{zero}"
    elif fsdp:
        out["sharding"] = "fsdp"
    return out


def resolve_dtype(values: dict, arch) -> None:
    """dtype 'auto' = the checkpoint's torch_dtype/dtype (transformers 'auto'), float32 if the config has none."""
    if values.get("dtype") != "auto":
        return

    cfg = (arch.extra or {}).get("config", {})
    values["dtype"] = normalize_dtype(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def read_sources(ns: argparse.Namespace) -> Merged:
    """The run's values from --config files, --from-command and flags, with who set each, notes, and what is
    checked once the run is known (DeepSpeed's train_batch_size, `merge.finish`).

    Files and the command are merged by kind (`estimator.interface.merge.merge`); flags override them. With neither,
    the flags alone (sources empty, so outputs stay as they were)."""
    from pathlib import Path

    configs = getattr(ns, "config", None) or []
    configs = [configs] if isinstance(configs, str) else list(configs)
    command = getattr(ns, "from_command", None)
    flag_values = run_values(ns)
    if not configs and command is None:
        return Merged(values=flag_values)
    try:
        files = read_files(configs)
        notes: list[str] = []
        for f in [f for f in files if f.kind == "trl" and f.launch_options] if command is None else []:
            acc = launch_file(f.launch_options, Path("."))
            if acc is not None:
                files.append(acc)
                notes.append(
                    f"{f.where}: {', '.join(f.launch_options)}: `trl grpo` hands these to accelerate launch; read "
                    "as its options"
                )
            check_kinds(files)
        if command is not None:
            cmd = command_files(command, Path("."))
            files += cmd.files
            notes += cmd.notes

            check_kinds(files)
        merged = merge(files, flag_values)
        notes += _open_r1_release(files, merged)
    except (ConfigFileError, CommandError) as e:
        raise FlagError(str(e)) from None
    if merged.needs_processes and "num_gpus" not in merged.values:
        if merged.needs_processes.startswith("torchrun"):
            raise FlagError(
                f"{merged.needs_processes}: one process per visible GPU, which this tool cannot see; set "
                "CUDA_VISIBLE_DEVICES in the command or give --gpus N"
            )
        if merged.needs_processes == "accelerate launch":  # no config file, no process count
            raise FlagError(
                "accelerate launch: no --config_file and no --num_processes, so it starts one process per visible "
                "GPU (or what the machine's default accelerate config says), which this tool cannot see; give --gpus N"
            )
        raise FlagError(
            f"{merged.needs_processes}: no num_processes, and accelerate launch refuses that config without "
            "--num_processes; give --gpus N (or num_processes in the file)"
        )
    merged.notes = notes + merged.notes
    return merged


# open-r1's setup.py pins trl[vllm]==0.18.0 (huggingface/open-r1 at 1416fa0, setup.py L72)
OPEN_R1_TRL = "0.18"


def _open_r1_release(files: list, merged: Merged) -> list[str]:
    """Where a file is an open-r1 recipe and nothing names the TRL release: the one open-r1 installs (OPEN_R1_TRL),
    whose defaults (beta 0.04, a reference model) and log-prob head (full logits) the recipe runs with."""
    recipes = [f for f in files if f.flavour == "open-r1 recipe"]
    if not recipes or "trl_version" in merged.values:
        return []
    merged.values["trl_version"] = OPEN_R1_TRL
    merged.sources["trl_version"] = f"{recipes[0].where} open-r1's pin"
    return [
        f"{recipes[0].where}: an open-r1 recipe; open-r1 installs trl {OPEN_R1_TRL}.0 (its setup.py), so TRL "
        f"{OPEN_R1_TRL} is modelled (--trl-version for another)"
    ]


# TRL 0.27 removed ModelConfig.torch_dtype ("Remove deprecated functions and parameters")
TORCH_DTYPE_GONE = (0, 27)


def _unread_torch_dtype(values: dict, sources: dict, given: set, version: str) -> list[str]:
    """A `torch_dtype` read from a file or command, dropped (with a note) for a TRL release that no longer reads it.

    From TRL 0.27 ModelConfig has `dtype` only: `trl grpo` hands an unknown top-level `torch_dtype` to accelerate
    launch, which refuses it, and a script's parser (trl/scripts/grpo.py, fail_with_unknown_args=False) drops it;
    in model_init_kwargs, `create_model_from_path` sets `dtype` (default float32, trl/trainer/utils.py L1332) and
    transformers 5 reads `torch_dtype` only where `dtype` is None (modeling_utils.py `from_pretrained`). So the
    model loads in the release's default dtype."""
    where = sources.get("dtype", "")
    if not where.endswith("torch_dtype") or "dtype" not in values:
        return []
    try:
        if parse_version(version) < TORCH_DTYPE_GONE:
            return []
    except ValueError:
        return []  # refused with its own message by release_values
    said = values.pop("dtype")
    sources.pop("dtype", None)
    given.discard("dtype")
    return [
        f"{where} {printable(str(said))[:40]}: TRL {version} does not read torch_dtype (removed in 0.27; the key "
        "is dtype), so the model loads in TRL's default dtype, as estimated; write dtype to load it so"
    ]


def _torch_before_fused() -> bool:
    """The torch installed here is older than 2.8, under which transformers defaults to adamw_torch."""
    v = _installed_torch()
    return v is not None and v < (2, 8)


def _installed_torch() -> tuple[int, int] | None:
    """The installed torch's MAJOR.MINOR from its metadata (nothing imported), None if absent or unreadable."""
    text = installed("torch")
    try:
        return None if text is None else parse_version(text)
    except ValueError:
        return None


def resolve_run(ns: argparse.Namespace, defaults: dict | None = None, sources_out: dict | None = None):
    """Parsed flags (+ --config files, --from-command) -> (RunConfig, Arch, notes), validated; FlagError if bad.

    `sources_out`, when given, is filled with {field: the file / key / "flags" that set it}.

    `defaults` fill settings neither the file nor the flags give (e.g. the GPU's memory for --gpu).
    The same path serves `vram-estimate` and `grpo-vram-trace`, so both accept and refuse the same configs.
    """
    merged = read_sources(ns)
    values, notes, sources = merged.values, merged.notes, merged.sources
    given = set(values)  # what the file and flags set (the release's defaults below are not "given")
    values.setdefault("transformers_version", default_transformers())
    try:  # the modelled TRL release's defaults and batch meaning (given settings are in its terms)
        version = values.get("trl_version")
        version = fmt(default_version()) if version is None else version  # an empty one is refused below
        notes = notes + _unread_torch_dtype(values, sources, given, version)
        values = release_values(version, values)
        if "optim" not in given and values.get("optim") == "adamw_torch_fused" and _torch_before_fused():
            values["optim"] = "adamw_torch"  # transformers' default under the torch installed here
    except ValueError as e:
        raise FlagError(str(e)) from None
    try:
        finished = finish(merged, values, sources, RunConfig().gradient_checkpointing)
    except ConfigFileError as e:
        raise FlagError(str(e)) from None
    notes = notes + finished
    given |= {name for name in ("gradient_checkpointing", "max_completion_length") if name in sources}
    if sources_out is not None:
        sources_out.update(sources)
    model = values.setdefault("model", RunConfig().model)
    try:
        arch, model_note = catalog.resolve_model_with_note(model)  # a size alias says which model it chose
    except (catalog.UnknownModel, ConfigError) as e:
        raise FlagError(str(e)) from None
    if model_note and "model" in given:  # the default model is named in the report already
        notes.append(model_note)
    resolve_dtype(values, arch)
    for key, value in (defaults or {}).items():
        values.setdefault(key, value)
        given.add(key)
    try:
        cfg = RunConfig.from_dict(values)
        validate(cfg, arch)
        for total, where in merged.train_batch_sizes:
            check_train_batch_size(
                total, where, cfg.num_gpus, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
            )
    except ConfigFileError as e:
        raise FlagError(str(e)) from None
    except InvalidConfig as e:
        where = sources.get(e.setting or "", "flags")
        if (
            where != "flags" and e.detail
        ):  # a value read from a file: named by its file and key, not by a flag
            raise FlagError(f"{where} {e.detail}") from None
        raise FlagError(str(e)) from None
    except TypeError as e:
        raise FlagError(f"bad setting: {e}") from None

    field_of = {"reward": "reward_models", "reference": "reference_models", "value": "value_model"}
    for role in config_roles(cfg):  # every model beside the policy must resolve, like --model
        try:
            catalog.resolve_model(role.model)
        except (catalog.UnknownModel, ConfigError) as e:
            raise FlagError(f"{flag(field_of[role.kind])}: {e}") from None

    releases = installed_notes(cfg.trl_version, cfg.transformers_version, cfg.use_vllm)
    releases += read_ahead_note(cfg, arch, installed("transformers"))
    notes = (
        notes + setting_notes(cfg, arch, given) + default_optimizer_note(cfg, arch, given, _installed_torch())
    )
    return cfg, arch, notes + releases
