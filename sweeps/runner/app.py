"""grpo-vram-sweep: a Hydra app; each job runs one GRPO config in a subprocess and appends exactly one row."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from estimator import validate
from estimator.architecture import ConfigError
from estimator.catalog import UnknownModel, resolve_model
from estimator.config import DEVICES, DTYPES, OPTIMIZERS, RunConfig
from estimator.units import MIB
from sweeps import records
from sweeps.runner import grpo_setup, schema, tiny
from sweeps.runner.predict import arch_for, predict

log = logging.getLogger(__name__)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
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

    @property
    def key(self) -> str:
        return records.make_key(self.config.to_dict(), self.variant)

    @property
    def source(self) -> str:
        return "measured-gpu" if self.config.device == "cuda" else "measured-cpu"


def _check(value, accepted, what: str) -> None:
    if value not in accepted:
        raise BadInput(f"{what}={value!r}: accepted values are {', '.join(map(str, accepted))}")


_KINDS = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}


def _check_types(settings: dict) -> None:
    """Each run setting has its RunConfig field's type: no "maybe" for a flag, no NaN / infinity for a number."""
    for f in fields(RunConfig):
        if f.name not in settings or f.name == "lora_target_modules":
            continue
        v = settings[f.name]
        ann = str(f.type)
        if v is None and "None" in ann:
            continue
        kind = ann.split("|")[0].strip()
        accepted = _KINDS.get(kind)
        if accepted is None:
            continue
        bad = not isinstance(v, accepted) or (kind != "bool" and isinstance(v, bool))
        if not bad and isinstance(v, float) and not math.isfinite(v):
            bad = True
        if bad:
            what = {"bool": "true or false", "int": "an integer", "float": "a finite number"}.get(
                kind, "text"
            )
            raise BadInput(f"{f.name}={v!r}: accepted values are {what}")
    targets = settings.get("lora_target_modules")
    if targets is not None:
        items = [targets] if isinstance(targets, str) else targets
        if (
            not isinstance(items, (list, tuple))
            or not items
            or not all(isinstance(t, str) and t.strip() for t in items)
        ):
            raise BadInput(
                f"lora_target_modules={targets!r}: accepted values are null or a non-empty list of module names"
            )


def _positive_int(value, what: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BadInput(f"{what}={value!r}: accepted values are integers >= {minimum}")
    return value


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadInput(f"{what}={value!r}: accepted values are true or false")
    return value


def _sweep_settings(s: dict) -> dict:
    """The `sweep` group checked up front: a name usable as a file name, a positive finite timeout, GPU ids."""
    name = s.get("name")
    if not isinstance(name, str) or not name.strip() or "/" in name or name in (".", ".."):
        raise BadInput(f"sweep.name={name!r}: accepted values are non-empty names without '/'")
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


RUN_CHECKS = {
    "steps": lambda v: _positive_int(v, "run.steps", minimum=2),
    "num_prompts": lambda v: _positive_int(v, "run.num_prompts"),
    "seed": lambda v: _positive_int(v, "run.seed", minimum=0),
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


# Settings one runner process applies beyond those it passes to GRPOConfig by name (grpo_setup.grpo_config_values):
# the model, its load (model_init_kwargs, BitsAndBytesConfig, LoraConfig), the prompts, and what only the estimator
# reads (gpu_memory_gib, trl_version and transformers_version: checked against the installed releases). Any other setting (roles, vLLM server and
# sleep-level knobs, FSDP / offload, allocator settings) must stay at its default: the runner cannot run it.
RUNNER_APPLIES = {
    "model", "device", "dtype", "attn_implementation", "use_peft", "lora_r", "lora_target_modules", "lora_dropout",
    "load_in_4bit", "bnb_4bit_quant_type", "use_bnb_nested_quant", "max_prompt_length", "bf16", "logprob_head",
    "num_gpus", "sharding", "gpu_memory_gib", "trl_version", "transformers_version",
}  # fmt: skip


def _check_runnable(settings: dict) -> None:
    """A setting the runner would silently not apply is one line (BadInput) instead of a mislabelled row."""
    from estimator.config import RunConfig, schema

    passed = set(grpo_setup.grpo_config_values(RunConfig()))
    for f in schema():
        if f.name in settings and f.name not in RUNNER_APPLIES | passed and settings[f.name] != f.default:
            raise BadInput(
                f"trainer.{f.name}={settings[f.name]!r}: the runner measures one TRL process and cannot apply it "
                f"(estimate it with vram-estimate {f.flag}); accepted: the default, {f.default!r}"
            )


def to_job(cfg: DictConfig) -> Job:
    """Map the composed Hydra config to a RunConfig + variant (raises BadInput on a value we cannot run)."""
    c = OmegaConf.to_container(cfg, resolve=True)
    fields = set(RunConfig.field_names())
    settings: dict = {}
    for group in ("trainer", "method"):
        for k, v in (c.get(group) or {}).items():
            if k not in fields:
                raise BadInput(f"{group}.{k}: not a run setting; accepted keys are the RunConfig fields")
            settings[k] = v
    settings["model"] = str(c["model"]["name"])
    settings["device"] = c["device"]["type"]
    _check(settings["device"], DEVICES, "device")
    _check(settings.get("dtype", "float32"), DTYPES, "trainer.dtype")
    _check(settings.get("optim", "adamw_torch_fused"), OPTIMIZERS, "trainer.optim")
    # what one TRL 1.16 process can run: the chunked head, one GPU, no sharding, vLLM only on CUDA
    _check(settings.get("logprob_head", "chunked"), ("chunked",), "trainer.logprob_head")
    _check(settings.get("num_gpus", 1), (1,), "trainer.num_gpus")
    _check(settings.get("sharding", "none"), ("none",), "trainer.sharding")
    _check_types(settings)
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
    probes = list(c["probe"]["names"])
    for p in probes:
        _check(p, ("tensors", "torch_cuda", "nvml"), "probe")
    s = _sweep_settings(c["sweep"])
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
    )


def skip_keys(path: Path, versions: dict) -> set[str]:
    """Keys already finished (ok or oom) under the same package versions; an error row never skips a rerun."""
    return {
        r["key"]
        for r in records.load_rows(path)
        if isinstance(r.get("key"), str)
        and r.get("status") in ("ok", "oom")
        and records.versions_match(r.get("versions"), versions)
    }


def check_writable(results_path: Path) -> None:
    """Fail before the first run when the results file cannot be written (a row lost after hours of measuring)."""
    problem = records.writable_problem(results_path)
    if problem:
        raise BadInput(
            f"sweep.results_dir={str(results_path.parent)!r}: cannot write results there ({problem}); "
            "give a directory you can write to"
        )


def _lock_dir() -> Path:
    d = Path(tempfile.gettempdir()) / "grpo-vram-locks"
    d.mkdir(parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def run_lock(results_path: Path, key: str):
    """An exclusive, non-blocking lock on (results file, key); yields the open lock file, or None when another
    process (a sweep, or the orphaned child of a killed one) is running the same config right now.

    The lock file descriptor is inherited by the child, so the lock outlives a killed parent until the child ends.
    """
    tag = hashlib.sha256(str(results_path.resolve()).encode()).hexdigest()[:12]
    path = _lock_dir() / f"{tag}-{key}.lock"
    f = open(path, "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield None
            return
        try:
            yield f
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    finally:
        f.close()


@contextlib.contextmanager
def claim_gpu(gpus: list[int] | None):
    """Hold an exclusive lock on one free GPU of `gpus` (waits if all are taken); None = leave devices alone."""
    if not gpus:
        yield None
        return
    lock_dir = Path(tempfile.gettempdir())
    while True:
        for g in gpus:
            f = open(lock_dir / f"grpo-vram-gpu-{g}.lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                continue
            try:
                yield g
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()
            return
        time.sleep(1.0)


def _output_dir() -> Path | None:
    """This Hydra job's output directory (None outside Hydra)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:
        return None


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int, keep_fds: tuple[int, ...] = ()):
    """preexec_fn: on Linux ask the kernel to send SIGTERM when the sweep dies (run_one then cleans up and
    exits); if the parent is already gone, exit at once. run_one also watches its parent's pid (any OS)."""

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            except (OSError, AttributeError):
                pass
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def run_child(
    spec: dict, timeout_s: float, log_path: Path, gpu: int | None = None, pass_fds: tuple[int, ...] = ()
) -> dict:
    """Run `python -m sweeps.runner.run_one` on `spec`; the child's result, or an error dict for a crash/kill/timeout."""
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    spec = {**spec, "parent_pid": os.getpid()}
    spec_path.write_text(json.dumps(spec))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweeps.runner.run_one", str(spec_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            pass_fds=pass_fds,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {"status": "error", "error": f"timeout: run killed after {timeout_s:g} s"}
        except BaseException:  # Ctrl-C / SIGTERM of the sweep: take the child down too (rerun resumes)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    result_path = Path(spec["result_path"])
    if result_path.exists():
        try:
            return json.loads(result_path.read_text())
        except json.JSONDecodeError:
            pass
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (host out of memory?)" if name == "SIGKILL" else ""
        return {"status": "error", "error": f"run killed by {name}{hint}; log: {log_path}"}
    return {"status": "error", "error": f"run exited with code {code} without a result; log: {log_path}"}


def make_row(job: Job, result: dict) -> dict:
    """The result row (results/SCHEMA.md): identity, outcome, measurement, prediction, environment."""
    config = job.config.to_dict()
    row = records.base_row(
        key=job.key,
        source=job.source,
        sweep=job.sweep,
        config=config,
        variant=job.variant,
        status=result.get("status", "error"),
        error=result.get("error"),
    )
    model = result.get("model") or {}
    hf_config = model.get("config") or (
        tiny.hf_config(job.config.model) if tiny.is_tiny(job.config.model) else None
    )
    prediction, prediction_error = predict(config, hf_config)
    if not model:
        pm = (prediction or {}).get("model") or {}
        model = {
            "name": job.config.model,
            "params": pm.get("params"),
            "trainable_params": None,
            "config": hf_config,
        }
    env = (
        {"versions": result["versions"], "device": result["device"]}
        if result.get("versions")
        else records.environment_info(job.config.device)
    )
    row.update(
        model=model,
        observed=result.get("observed"),
        prediction=prediction,
        prediction_error=prediction_error,
        step_seconds=result.get("step_seconds", []),
        train_seconds=result.get("train_seconds"),
        lengths=result.get("lengths"),
        versions=env["versions"],
        device=env["device"],
        git_commit=records.git_commit(),
    )
    return row


def run_job(job: Job) -> dict | None:
    """Skip a finished or running key; else run it in a subprocess and append its row (None if skipped)."""
    versions = records.package_versions()
    if job.key in skip_keys(job.results_path, versions):
        log.info("skip %s (key %s already in %s)", job.config.model, job.key, job.results_path)
        print(f"skip {job.key} {job.config.model}: already in {job.results_path}", flush=True)
        return None
    with run_lock(job.results_path, job.key) as lock:
        if lock is None:
            print(
                f"skip {job.key} {job.config.model}: another process is running this config right now",
                flush=True,
            )
            return None
        return _run_locked(job, lock.fileno())


def _run_locked(job: Job, lock_fd: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"grpo-vram-{job.key}-"))
    out_dir = _output_dir() or workdir
    spec = {
        "config": job.config.to_dict(),
        "variant": job.variant,
        "probes": job.probes,
        "inject_failure": job.inject_failure,
        "result_path": str(workdir / "result.json"),
        "workdir": str(workdir),
        "remove_workdir_if_orphaned": not job.keep_workdir,
    }
    t0 = time.perf_counter()
    try:
        with claim_gpu(job.gpus) as gpu:
            result = run_child(spec, job.timeout_s, out_dir / "run.log", gpu, pass_fds=(lock_fd,))
    except Exception as exc:  # the row is written whatever happens
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        if not job.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    row = make_row(job, result)
    row["wall_seconds"] = round(time.perf_counter() - t0, 2)
    records.append_row(job.results_path, row)
    peak = (row.get("observed") or {}).get("peak_bytes")
    peak_txt = f"{peak / MIB:.1f} MiB" if peak else "-"
    msg = f"{row['status']} {job.key} {job.config.model} peak={peak_txt} ({row['wall_seconds']} s)"
    print(msg + (f": {row['error']}" if row["error"] else ""), flush=True)
    return row


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


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    """One Hydra job: build the run, skip it if done, else measure it and append its row."""
    # SIGTERM -> SystemExit so the child is killed too (signal handlers can only be set in the main thread)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        job = to_job(cfg)
    except BadInput as exc:
        where = _multirun_job()
        if where is None:
            print(f"grpo-vram-sweep: {exc}", file=sys.stderr)
            sys.exit(2)
        # one invalid combination of a multirun is reported and skipped; the other jobs still run
        print(f"grpo-vram-sweep: {where} not run: {exc}", file=sys.stderr, flush=True)
        return
    try:
        check_writable(job.results_path)
    except BadInput as exc:  # before any run: nothing measured is lost, and the whole sweep stops
        print(f"grpo-vram-sweep: {exc}", file=sys.stderr)
        sys.exit(2)
    run_job(job)


VALUE_GROUPS = ("trainer.", "sweep.", "run.")


@functools.lru_cache(maxsize=1)
def default_config() -> DictConfig:
    """The composed default config (trainer node typed by the run-settings schema), composed once."""
    from hydra import compose, initialize_config_dir

    schema.register()
    with initialize_config_dir(config_dir=str(Path(__file__).parent / "conf"), version_base="1.3"):
        return compose(config_name="config")


def _override_values(override) -> list:
    if not override.is_sweep_override():
        return [override.value()]
    try:
        return list(override.sweep_iterator())
    except Exception:  # an interval sweep (for a sweeper plugin): nothing to enumerate here
        return []


def check_overrides(args: list[str]) -> None:
    """Every value a command line gives a `trainer.` / `sweep.` / `run.` setting (each value of a multirun
    sweep too), checked against the schema before Hydra composes or runs anything: BadInput (one line) for a
    wrong type, NaN, infinity or out-of-range value, instead of Hydra's multi-line error or a partial multirun."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("-")])
    except Exception:  # Hydra reports its own syntax errors
        return
    base = default_config()
    for o in overrides:
        key = o.key_or_group
        if not key.startswith(VALUE_GROUPS) or o.is_delete():
            continue
        for value in _override_values(o):
            text = f"{key}={value}"
            cfg = base.copy()
            try:
                OmegaConf.update(cfg, key, value, merge=True, force_add=o.is_add())
            except Exception as exc:  # OmegaConf's type validation: keep its first line
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise BadInput(f"{text}: {first}") from None
            group, _, name = key.partition(".")
            if group == "trainer" and name in RunConfig.field_names():
                from estimator.config import check_value, schema_field

                v = OmegaConf.to_container(cfg, resolve=False)["trainer"][name]
                if isinstance(v, str) and "${" in v:  # an interpolation: checked once resolved, per job
                    continue
                f = schema_field(name)
                v = tuple(v) if f.kind == "strs" and isinstance(v, list) else v
                problem = check_value(f, v)
                if problem:
                    raise BadInput(f"{text}: {problem}")


def main() -> None:
    """Entry point of `grpo-vram-sweep`: check the command line's values, register the trainer schema, then
    let Hydra compose and run."""
    try:
        check_overrides(sys.argv[1:])
    except BadInput as exc:
        print(f"grpo-vram-sweep: {exc}", file=sys.stderr)
        sys.exit(2)
    schema.register()
    hydra_main()


if __name__ == "__main__":
    main()
