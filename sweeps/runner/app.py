"""grpo-vram-sweep: the Hydra app. Its command line is checked before Hydra expands it; each Hydra job builds
its run (sweeps/runner/job.py) and measures it (sweeps/runner/measure.py), appending exactly one row."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import sys
import tempfile
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from estimator.settings.config import RunConfig
from sweeps.oneline import shown
from sweeps.runner import schema
from sweeps.runner.job import (
    REQUIRED_NODES,
    BadInput,
    first_line,
    name_problem,
    printable,
    resolution_problem,
    to_job,
)
from sweeps.runner.measure import CURRENT, check_writable, run_job


def _multirun_job() -> str | None:
    """`job N (overrides)` when this is one job of a --multirun, else None."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode != RunMode.MULTIRUN:
            return None
        return f"job {hc.job.num} ({' '.join(hc.overrides.task)})"
    except Exception:
        return None


class Terminated(BaseException):
    """SIGTERM of the sweep (or `scancel` of its SLURM job): handled like Ctrl-C."""


def _on_sigterm(*_) -> None:
    raise Terminated


def interrupted_line(what: str) -> str:
    """The one line a Ctrl-C / SIGTERM ends with: which run was stopped, and that nothing written is lost."""
    if not CURRENT:
        return f"grpo-vram-sweep: {what} before any run; nothing was written"
    done = "its row was written" if "row" in CURRENT and "workdir" not in CURRENT else "no row for it"
    return (
        f"grpo-vram-sweep: {what}; stopped the run of {CURRENT['key']} ({CURRENT['model']}), {done} "
        f"(a rerun of the same command measures what is missing); rows already written stay in {CURRENT['results']}"
    )


def _in_submitit_job() -> bool:
    return bool(os.environ.get("SUBMITIT_EXECUTOR") and os.environ.get("SUBMITIT_FOLDER"))


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    """One Hydra job: build the run, skip it if done, else measure it and append its row."""
    # SIGTERM -> Terminated so the child is killed too (signal handlers can only be set in the main thread)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _one_job(cfg)
    except (KeyboardInterrupt, Terminated) as exc:
        if not _in_submitit_job():
            raise  # main() ends the whole sweep with one line
        # a SLURM job cancelled mid-run: one line in its log, and a normal end, so the submitting sweep
        # reports the other jobs instead of a traceback (the cancelled config has no row; a rerun runs it)
        what = "cancelled (SIGTERM)" if isinstance(exc, Terminated) else "interrupted (SIGINT)"
        print(interrupted_line(what), file=sys.stderr, flush=True)


def _one_job(cfg: DictConfig) -> None:
    try:
        job = to_job(cfg)
    except BadInput as exc:
        where = _multirun_job()
        if where is None:
            print(f"grpo-vram-sweep: {printable(str(exc))}", file=sys.stderr)
            sys.exit(2)
        # one invalid combination of a multirun is reported and skipped; the other jobs still run
        print(f"grpo-vram-sweep: {printable(f'{where} not run: {exc}')}", file=sys.stderr, flush=True)
        return
    try:
        check_writable(job.results_path)
    except BadInput as exc:  # before any run: nothing measured is lost, and the whole sweep stops
        print(f"grpo-vram-sweep: {printable(str(exc))}", file=sys.stderr)
        sys.exit(2)
    run_job(job)


VALUE_GROUPS = ("trainer.", "sweep.", "run.")


# Hydra's basic sweeper builds every job of a --multirun before the first runs: a bigger sweep is refused up front.
MAX_JOBS = 10_000


DIR_KEYS = ("hydra.run.dir", "hydra.sweep.dir")


@functools.lru_cache(maxsize=1)
def default_config() -> DictConfig:
    """The composed default config (trainer node typed by the run-settings schema), composed once."""
    from hydra import compose, initialize_config_dir

    schema.register()
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "conf"), version_base="1.3"):
        return compose(config_name="config")


def _kv(key: str, value) -> str:
    """`key=value` for a message: as typed when short and printable, else escaped and cut (oneline.shown)."""
    text = str(value)
    return f"{key}={text}" if len(text) <= 80 and text.isprintable() else f"{key}={shown(value)}"


def _has_interpolation(value) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, dict):
        return any(_has_interpolation(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_interpolation(v) for v in value)
    return False


def _resolve_problem(cfg: DictConfig, key: str, value) -> tuple[bool, object, str | None]:
    """(resolved?, value, problem) of the interpolation `value` set at `key` of `cfg`. A reference to a key this
    config lacks (set by an +experiment, or Hydra's own `${hydra...}`) is left for Hydra: (False, None, None)."""
    from omegaconf.errors import InterpolationKeyError

    if "${hydra" in str(value):
        return False, None, None
    try:
        return True, OmegaConf.select(cfg, key, throw_on_resolution_failure=True), None
    except InterpolationKeyError:
        return False, None, None
    except Exception as exc:
        return False, None, resolution_problem(exc, with_key=False)


def dir_problem(text: str) -> str | None:
    """Why Hydra could not create the output folder `text` (the part before its first `${`), or None."""
    if "\0" in text:
        return "it contains a NUL character"
    path = Path(os.path.abspath(text or "."))
    long = [part for part in path.parts if len(os.fsencode(part)) > 255]
    if long:
        return f"the folder name {shown(long[0], 40)} is longer than 255 bytes"
    if len(os.fsencode(str(path))) > 4000:
        return "the path is longer than 4000 bytes"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".grpo-vram-probe-", dir=existing))
    except OSError as exc:
        return f"cannot create folders in {existing} ({exc.strerror or exc})"
    return None


def _sweep_size(override) -> int:
    """How many values a sweep override gives, counted without enumerating them (a glob counts as 1 here)."""
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    v = override.value()
    if isinstance(v, ChoiceSweep):
        return len(v.list)
    if isinstance(v, RangeSweep):
        start, stop, step = v.start, v.stop, v.step
        if step == 0:
            raise BadInput(f"{_kv(override.key_or_group, override.input_line or '')}: a range() step of 0")
        if all(isinstance(x, int) for x in (start, stop, step)):
            return len(range(start, stop, step))
        return max(0, math.ceil((stop - start) / step))
    return 1


def _values_to_check(override) -> list:
    """The values of an override to check: every value of a choice, the two ends of a range (its values share a
    type and lie between them), the single value of a plain override."""
    from hydra.core.override_parser.types import RangeSweep

    if not override.is_sweep_override():
        return [override.value()]
    v = override.value()
    if isinstance(v, RangeSweep):
        n = _sweep_size(override)
        return list(dict.fromkeys([v.start, v.start + (n - 1) * v.step])) if n else []
    try:
        return list(override.sweep_iterator())
    except Exception:  # a glob over a config group: Hydra enumerates its options
        return []


# Hydra's flags that take the next argument as their value (that argument is not an override).
_FLAGS_WITH_VALUE = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "-p", "--package")


def _override_args(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a in _FLAGS_WITH_VALUE
        else:
            out.append(a)
    return out


@functools.cache
def group_options(group: str) -> tuple[str, ...]:
    """The options of the config group `group` (conf/<group>/*.yaml, the schema's, Hydra's own plugins); empty
    when `group` is no config group."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    schema.register()
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "conf"), version_base="1.3"):
        return tuple(GlobalHydra.instance().config_loader().get_group_options(group))


def _check_node(o) -> None:
    """An override of a whole node or config group: an empty key, deleting or nulling a top-level node, and an
    option a config group does not have are one line (BadInput) instead of Hydra's traceback or option list."""
    from hydra.core.override_parser.types import RangeSweep

    key = o.key_or_group
    line = o.input_line or key
    if not key:
        raise BadInput(f"the override {shown(line)} has no key; accepted: key=value")
    top = key.split(".")[0].split("/")[0]
    if "." not in key and (o.is_delete() or (not o.is_sweep_override() and o.value() is None)):
        if top in REQUIRED_NODES or top in default_config():
            raise BadInput(
                f"{shown(line)}: {top} is required and cannot be deleted or set to null; accepted: set its "
                f"keys ({top}.<key>=value)" + (" or pick an option" if group_options(top) else "")
            )
        return
    if "." in key or (top == "hydra" and "/" not in key):
        return
    options = group_options(key)
    if not options:
        return
    if o.is_sweep_override() and isinstance(o.value(), RangeSweep):
        values = [o.value()]
    else:
        values = _values_to_check(o)
    for value in values:
        if not isinstance(value, str) or value not in options:
            raise BadInput(f"{_kv(key, value)}: no such {key} option; accepted: {', '.join(options)}")


def check_overrides(args: list[str]) -> None:
    """The command line checked before Hydra composes or runs anything (BadInput, one line, for each):
    a sweep of more than MAX_JOBS jobs (counted from its range()/choice() sizes, never enumerated), an interval()
    sweep without a sweeper plugin, a sweep without --multirun, an interpolation that cannot resolve, a bad
    sweep.name or output folder, and every value given to a `trainer.` / `sweep.` / `run.` setting (each value
    of a multirun sweep too) against the schema: a wrong type, NaN, infinity or an out-of-range value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    multirun = any(a in ("-m", "--multirun") for a in args)
    parser = OverridesParser.create()
    overrides = []
    for arg in _override_args(args):
        try:
            overrides += parser.parse_overrides([arg])
        except Exception as exc:  # Hydra's syntax error, as one line
            lines = [
                line.strip()
                for line in str(exc).splitlines()
                if line.strip()
                and not line.startswith(("Error parsing override", "See https"))
                and set(line.strip()) != {"^"}
            ]
            why = (lines or ["syntax error"])[0].replace(arg, shown(arg) if len(arg) > 80 else arg)
            raise BadInput(
                f"cannot parse the override {shown(arg)} ({why[:200]}); accepted: key=value in Hydra's override "
                "syntax (quote a value holding special characters or a nested ${...}: key='...')"
            ) from None
    for o in overrides:
        _check_node(o)
    sweeper_plugin = any(o.key_or_group == "hydra/sweeper" for o in overrides)
    sizes = []
    for o in overrides:
        if not o.is_sweep_override() or o.is_delete():
            continue
        key = o.key_or_group
        if o.is_interval_sweep() and not sweeper_plugin:
            raise BadInput(
                f"{_kv(key, o.input_line.partition('=')[2] if o.input_line else 'interval(...)')}: "
                "an interval() sweep needs a sweeper plugin (hydra/sweeper=optuna or nevergrad); accepted "
                "with the basic sweeper: a,b,c, range(start,stop[,step]) or choice(...)"
            )
        if not multirun:
            raise BadInput(
                f"{_kv(key, o.input_line.partition('=')[2] if o.input_line else '')}: a sweep; accepted: add "
                f"--multirun to run each value, or quote it ({key}='...') for one value"
            )
        sizes.append((key, _sweep_size(o)))
    total = math.prod(n for _, n in sizes)
    if total > MAX_JOBS:
        parts = ", ".join(f"{k}: {n:,}" for k, n in sizes)
        raise BadInput(
            f"the sweep would run {total:,} jobs ({parts}); accepted: at most {MAX_JOBS:,} jobs in one --multirun "
            "(split it into several)"
        )
    base = default_config()
    loose = None  # the default config without its schema, to resolve interpolations given to any other key
    for o in overrides:
        key = o.key_or_group
        if o.is_delete():
            continue
        for value in _values_to_check(o):
            text = _kv(key, value)
            if key == "sweep.name":
                problem = name_problem(value)
                if problem:
                    raise BadInput(f"{text}: {problem}")
            if key in DIR_KEYS and isinstance(value, str):
                problem = dir_problem(value.split("${")[0])
                if problem:
                    raise BadInput(f"{text}: Hydra cannot create this output folder ({problem})")
            if not key.startswith(VALUE_GROUPS):
                if _has_interpolation(value) and "/" not in key:
                    if loose is None:
                        loose = OmegaConf.create(OmegaConf.to_container(base, resolve=False))
                    cfg = loose.copy()
                    cfg["_grpo_vram_probe"] = value
                    _, _, problem = _resolve_problem(cfg, "_grpo_vram_probe", value)
                    if problem:
                        raise BadInput(f"{text}: {problem}")
                continue
            cfg = base.copy()
            try:
                OmegaConf.update(cfg, key, value, merge=True, force_add=o.is_add())
            except Exception as exc:  # OmegaConf's type validation: keep its first line
                raise BadInput(f"{text}: {first_line(exc, value)}") from None
            if _has_interpolation(value):
                resolved, value, problem = _resolve_problem(cfg, key, value)
                if problem:
                    raise BadInput(f"{text}: {problem}")
                if not resolved:  # checked once resolved, per job
                    continue
            group, _, name = key.partition(".")
            if group == "trainer" and name in RunConfig.field_names():
                from estimator.settings.config import check_value, schema_field

                v = OmegaConf.to_container(cfg, resolve=True)["trainer"][name]
                f = schema_field(name)
                v = tuple(v) if f.kind == "strs" and isinstance(v, list) else v
                problem = check_value(f, v)
                if problem:
                    raise BadInput(f"{text}: {problem}")


def main() -> None:
    """Entry point of `grpo-vram-sweep`: check the command line's values, register the trainer schema, then
    let Hydra compose and run. Ctrl-C or SIGTERM ends it with one line (the child stopped, no row lost)."""
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        try:
            check_overrides(sys.argv[1:])
        except BadInput as exc:
            print(f"grpo-vram-sweep: {printable(str(exc))}", file=sys.stderr)
            sys.exit(2)
        schema.register()
        hydra_main()
    except KeyboardInterrupt:
        print(interrupted_line("interrupted (SIGINT)"), file=sys.stderr, flush=True)
        sys.exit(130)
    except Terminated:
        print(interrupted_line("terminated (SIGTERM)"), file=sys.stderr, flush=True)
        sys.exit(143)


if __name__ == "__main__":
    main()
