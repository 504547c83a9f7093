"""One Hydra job's run, built from the composed config: the estimator's RunConfig (checked against the one
settings schema and the one validator vram-estimate uses), the run variant, and how to run it. Bad input is
`BadInput`, one line."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from estimator.model.architecture import ConfigError
from estimator.model.catalog import UnknownModel, resolve_model
from estimator.settings import validate
from estimator.settings.config import RunConfig
from sweeps import records
from sweeps.oneline import shown
from sweeps.runner import deepspeed_config, grpo_setup, schema, tiny
from sweeps.runner.predict import arch_for

RUN_KEYS = (
    "steps",
    "prompts",
    "force_length",
    "num_prompts",
    "learning_rate",
    "lora_alpha",
    "seed",
)


PROMPTS = ("synthetic", "gsm8k")


FAILURES = ("raise", "oom", "kill", "hang")

OmegaConf.register_new_resolver("ceil_div", lambda a, b: -(-int(a) // int(b)), replace=True)


def printable(text: str) -> str:
    """`text` on one line: newlines, escapes and other control characters written as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class BadInput(ValueError):
    """A config value the sweep cannot run; reported as one line on stderr."""


@dataclass
class Job:
    """What one Hydra job runs: the estimator's config, the variant, and how to run it."""

    config: RunConfig
    variant: dict
    probes: list[str]
    inject_failure: str | None
    sweep: str
    results_path: Path
    timeout_s: float
    gpus: list[int] | None
    keep_workdir: bool
    probe_options: dict = field(default_factory=dict)  # per probe: {"history": {"out_dir": ...}}

    @property
    def key(self) -> str:
        return records.make_key(self.config.to_dict(), self.variant)

    @property
    def source(self) -> str:
        return "measured-gpu" if self.config.device == "cuda" else "measured-cpu"


def _check(value, accepted, what: str) -> None:
    if value not in accepted:
        raise BadInput(f"{what}={value!r}: accepted values are {', '.join(map(str, accepted))}")


def _check_settings(settings: dict) -> None:
    """Every run setting against the one settings schema (`estimator.settings.config`: kind, choices, bounds), the
    checks vram-estimate's flags get."""
    from estimator.settings.config import check_value
    from estimator.settings.config import schema as run_settings

    for f in run_settings():
        if f.name not in settings:
            continue
        value = settings[f.name]
        if f.kind == "strs" and isinstance(value, (str, list)):
            value = (value,) if isinstance(value, str) else tuple(value)
        problem = check_value(f, value)
        if problem:
            where = f.name if f.name in schema.FROM_OTHER_GROUPS else f"trainer.{f.name}"
            raise BadInput(f"{where}={settings[f.name]!r}: {problem}")


def _check_processes(settings: dict) -> None:
    """Several GPUs run as DDP ranks only: FSDP and ZeRO over several GPUs are traced on rank 0
    (`make trace-multigpu`), vLLM beside DDP ranks is not run."""
    n = settings.get("num_gpus", 1)
    if n == 1:
        return
    sharding = settings.get("sharding", "none")
    if sharding != "none":
        raise BadInput(
            f"trainer.num_gpus={n} with trainer.sharding={sharding}: the runner measures several GPUs as DDP "
            "ranks only (trainer.sharding=none); FSDP and ZeRO over several GPUs are traced (make trace-multigpu)"
        )
    if settings.get("use_vllm"):
        raise BadInput(
            f"trainer.num_gpus={n} with trainer.use_vllm=true: accepted with trainer.num_gpus=1 only"
        )


def _positive_int(value, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        accepted = f"integers >= {minimum}" if maximum is None else f"integers from {minimum} to {maximum}"
        raise BadInput(f"{what}={shown(value, 40)}: accepted values are {accepted}")
    return value


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadInput(f"{what}={value!r}: accepted values are true or false")
    return value


MAX_NAME = 100  # sweep.name: <name>.jsonl, its lock files and Hydra's output folder stay under 255 bytes


def name_problem(name) -> str | None:
    """Why `name` cannot name a sweep (its results file and output folder), or None."""
    if (
        not isinstance(name, str)
        or not name.strip()
        or name in (".", "..")
        or "/" in name
        or not name.isprintable()
        or len(name.encode()) > MAX_NAME
    ):
        return (
            f"accepted values are names of 1 to {MAX_NAME} printable characters without '/' "
            "(the results file is <name>.jsonl)"
        )
    return None


def _sweep_settings(s: dict) -> dict:
    """The `sweep` group checked up front: a name usable as a file name, a positive finite timeout, GPU ids."""
    name = s.get("name")
    problem = name_problem(name)
    if problem:
        raise BadInput(f"sweep.name={shown(name)}: {problem}")
    timeout = s.get("timeout_s")
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise BadInput(f"sweep.timeout_s={timeout!r}: accepted values are numbers of seconds > 0")
    results_dir = s.get("results_dir")
    if not isinstance(results_dir, str) or not results_dir.strip():
        raise BadInput(f"sweep.results_dir={results_dir!r}: accepted values are a directory path")
    gpus = s.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, list) or not gpus:
            raise BadInput(f"sweep.gpus={gpus!r}: accepted values are null or a list of GPU indices")
        for g in gpus:
            _positive_int(g, "sweep.gpus[]", minimum=0)
    return {
        "name": name,
        "timeout_s": float(timeout),
        "results_path": Path(results_dir) / f"{name}.jsonl",
        "keep_workdir": _flag(s.get("keep_workdir", False), "sweep.keep_workdir"),
        "gpus": list(gpus) if gpus is not None else None,
    }


# Upper bounds a measurement never nears: a run reaches its steady state at step 2 and sweeps run a few steps on
# 64 prompts; the child builds every prompt in memory up front, so a runaway count is refused, not run for hours.
MAX_STEPS = 10_000
MAX_NUM_PROMPTS = 100_000
MAX_SEED = 2**32 - 1  # numpy's and torch's seeding accept 0 .. 2**32 - 1

RUN_CHECKS = {
    "steps": lambda v: _positive_int(v, "run.steps", minimum=2, maximum=MAX_STEPS),
    "num_prompts": lambda v: _positive_int(v, "run.num_prompts", maximum=MAX_NUM_PROMPTS),
    "seed": lambda v: _positive_int(v, "run.seed", minimum=0, maximum=MAX_SEED),
    "force_length": lambda v: _flag(v, "run.force_length"),
}


def _check_run(variant: dict) -> None:
    for k, check in RUN_CHECKS.items():
        if k in variant:
            check(variant[k])
    for k in ("learning_rate", "lora_alpha"):
        v = variant.get(k)
        if k in variant and (
            isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0
        ):
            raise BadInput(f"run.{k}={v!r}: accepted values are finite numbers > 0")


def _check_runnable(settings: dict) -> None:
    """A setting the runner would silently not apply is one line (BadInput) instead of a mislabelled row."""
    from estimator.settings.config import schema

    applied = grpo_setup.applied_settings()
    for f in schema():
        if f.name in settings and f.name not in applied and settings[f.name] != f.default:
            raise BadInput(
                f"trainer.{f.name}={settings[f.name]!r}: the runner measures one TRL process and cannot apply it "
                f"(estimate it with vram-estimate {f.flag}); accepted: the default, {f.default!r}"
            )


def deepspeed_variant(config: RunConfig, variant: dict) -> None:
    """A ZeRO run's variant names its DeepSpeed config and, at ZeRO-3, whether generation gathers the parameters
    (trainer.ds3_gather_for_generation, GRPOConfig's setting; a ZeRO-3 row's variant records it too, so the keys of
    rows whose config leaves it out stay the same)."""
    key = deepspeed_config.GATHER_KEY
    if config.sharding == "zero3":
        variant[key] = config.ds3_gather_for_generation
    elif not config.ds3_gather_for_generation:
        raise BadInput(f"trainer.{key}=False: applies to trainer.sharding=zero3 only; accepted: true")
    ds = deepspeed_config.ds_config(config)
    if ds is not None:
        variant["deepspeed"] = ds


# the config's nodes every job reads as a mapping: deleting or nulling one is refused, not a TypeError
REQUIRED_NODES = ("model", "device", "probe", "sweep", "run", "trainer")


def to_job(cfg: DictConfig) -> Job:
    """Map the composed Hydra config to a RunConfig + variant (raises BadInput on a value we cannot run)."""
    try:
        c = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that cannot be resolved (a resolver failed, a variable unset)
        raise BadInput(resolution_problem(exc)) from None
    for node in REQUIRED_NODES:
        if not isinstance(c.get(node), dict):
            raise BadInput(
                f"{node}={shown(c.get(node), 40)}: the {node} settings are required; accepted: set its keys"
            )
    fields = set(RunConfig.field_names())
    settings: dict = {}
    for group in ("trainer", "method"):
        for k, v in (c.get(group) or {}).items():
            if k not in fields:
                raise BadInput(f"{group}.{k}: not a run setting; accepted keys are the RunConfig fields")
            settings[k] = v
    name = c["model"].get("name")
    if name is None or not str(name).strip():
        raise BadInput(
            f"model.name={shown(name, 40)}: accepted values are a model size (e.g. 0.5B), a catalog name, an HF "
            "id or a config.json path"
        )
    settings["model"] = str(name)
    settings["device"] = c["device"]["type"]
    _check_settings(settings)
    # what the runner can run with TRL 1.16: the chunked head; DeepSpeed ZeRO on one GPU; several GPUs as DDP
    # processes under torch's launcher (sweeps/runner/ranks.py); vLLM only on CUDA
    _check(settings.get("logprob_head", "chunked"), ("chunked",), "trainer.logprob_head")
    _check_processes(settings)
    problem = deepspeed_config.problem(settings)
    if problem:
        raise BadInput(problem)
    _check_runnable(settings)
    if settings.get("use_vllm") and settings["device"] != "cuda":
        raise BadInput("trainer.use_vllm=true: accepted only with device=cuda")
    try:
        config = RunConfig.from_dict(settings)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"run config: {exc}") from None
    try:  # the one validator vram-estimate and the tracer use (TRL / transformers / PEFT's own refusals)
        validate.validate(config, arch_for(config) or resolve_model(config.model))
    except (validate.InvalidConfig, UnknownModel, ConfigError) as exc:
        raise BadInput(str(exc)) from None
    problem = grpo_setup.release_problem(config)  # refused before any run, not recorded as a failed one
    if problem:
        raise BadInput(problem)
    run = c.get("run") or {}
    unknown = sorted(set(run) - set(RUN_KEYS) - {"inject_failure", "weights"})
    if unknown:
        raise BadInput(
            f"run.{unknown[0]}: not a run setting; accepted keys are {', '.join((*RUN_KEYS, 'weights'))}"
        )
    variant = {k: run[k] for k in RUN_KEYS if k in run}
    _check(variant.get("prompts", "synthetic"), PROMPTS, "run.prompts")
    _check_run(variant)
    deepspeed_variant(config, variant)
    # run.weights enters the variant only when random, so rows measured before it existed keep their keys
    weights = run.get("weights", "pretrained")
    _check(weights, tiny.WEIGHTS, "run.weights")
    if weights == "random" and not tiny.is_tiny(config.model):
        try:
            tiny.catalog_config(config.model)
        except ValueError as exc:
            raise BadInput(str(exc)) from None
        variant["weights"] = "random"
    inject = run.get("inject_failure")
    if inject is not None:
        _check(inject, FAILURES, "run.inject_failure")
        variant["inject_failure"] = inject
    if tiny.is_tiny(config.model):
        variant["tiny_model"] = tiny.spec_dict(config.model)
    names = c["probe"].get("names")
    if not isinstance(names, list):
        raise BadInput(
            f"probe.names={shown(names, 40)}: accepted values are a list of probe names ([] for none), e.g. [host]"
        )
    probes = list(names)
    for p in probes:
        _check(p, ("tensors", "torch_cuda", "nvml", "host", "history"), "probe")
    if "history" in probes and config.num_gpus > 1:
        raise BadInput(
            f"probe history with trainer.num_gpus={config.num_gpus}: the allocator history is recorded "
            "on one GPU only; accepted with trainer.num_gpus=1"
        )
    probe_options = _probe_options(c["probe"])
    s = _sweep_settings(c["sweep"])
    if s["gpus"] and len(s["gpus"]) < config.num_gpus:
        raise BadInput(
            f"sweep.gpus={s['gpus']}: trainer.num_gpus={config.num_gpus} needs as many; list at least "
            f"{config.num_gpus} GPUs"
        )
    return Job(
        config=config,
        variant=variant,
        probes=probes,
        inject_failure=inject,
        sweep=s["name"],
        results_path=s["results_path"],
        timeout_s=s["timeout_s"],
        gpus=s["gpus"],
        keep_workdir=s["keep_workdir"],
        probe_options=probe_options,
    )


def _probe_options(node: dict) -> dict:
    """The `probe` group's options beside its `names` (only the `history` probe has any), checked."""
    from sweeps.probes.allocator_history import option_problem

    extra = sorted(set(node) - {"names", "history"})
    if extra:
        raise BadInput(f"probe.{extra[0]}: unknown key; accepted keys are names, history")
    history = dict(node.get("history") or {})
    problem = option_problem(history)
    if problem:
        raise BadInput(printable(problem))
    return {"history": history} if history else {}


def first_line(exc: BaseException, value=None) -> str:
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if value is not None and len(str(value)) > 80:
        line = line.replace(str(value), shown(value))
    return line if len(line) <= 300 else line[:297] + "..."


def resolution_problem(exc: BaseException, with_key: bool = True) -> str:
    """One line for an interpolation OmegaConf could not resolve (a failing resolver, an unset variable)."""
    key = getattr(exc, "full_key", None)
    cause = exc.__cause__ or exc.__context__
    why = first_line(cause) if cause is not None and not str(exc).strip() else first_line(exc)
    if cause is not None and type(cause).__name__ not in why:
        why = f"{type(cause).__name__}: {first_line(cause)}"
    where = f"{key}: " if key and with_key else ""
    return f"{where}cannot resolve the interpolation ({why}); accepted: plain values or interpolations that resolve"
