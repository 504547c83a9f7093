"""grpo-vram-sweep: a Hydra app; each job runs one GRPO config in a subprocess and appends exactly one row."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from estimator import validate
from estimator.architecture import ConfigError
from estimator.catalog import UnknownModel, resolve_model
from estimator.config import RunConfig
from estimator.units import MIB
from sweeps import records
from sweeps.oneline import shown
from sweeps.runner import grpo_setup, schema, tiny
from sweeps.runner.predict import arch_for

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
    """Every run setting against the one settings schema (`estimator.config`: kind, choices, bounds), the
    checks vram-estimate's flags get."""
    from estimator.config import check_value
    from estimator.config import schema as run_settings

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


def _positive_int(value, what: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BadInput(f"{what}={value!r}: accepted values are integers >= {minimum}")
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
    try:
        c = OmegaConf.to_container(cfg, resolve=True)
    except Exception as exc:  # an interpolation that cannot be resolved (a resolver failed, a variable unset)
        raise BadInput(_resolution_problem(exc)) from None
    fields = set(RunConfig.field_names())
    settings: dict = {}
    for group in ("trainer", "method"):
        for k, v in (c.get(group) or {}).items():
            if k not in fields:
                raise BadInput(f"{group}.{k}: not a run setting; accepted keys are the RunConfig fields")
            settings[k] = v
    settings["model"] = str(c["model"]["name"])
    settings["device"] = c["device"]["type"]
    _check_settings(settings)
    # what one TRL 1.16 process can run: the chunked head, one GPU, no sharding, vLLM only on CUDA
    _check(settings.get("logprob_head", "chunked"), ("chunked",), "trainer.logprob_head")
    _check(settings.get("num_gpus", 1), (1,), "trainer.num_gpus")
    _check(settings.get("sharding", "none"), ("none",), "trainer.sharding")
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


_REPORTED: set[tuple] = set()


def skip_keys(path: Path, versions: dict) -> set[str]:
    """Keys already finished under the same package versions (`records.finished_keys`).
    Lines that are not rows are counted on one stderr line (once per process for the same count)."""
    loaded = records.read_rows(path)
    for line in loaded.report_lines():
        if (str(path), line) not in _REPORTED:
            _REPORTED.add((str(path), line))
            print(f"grpo-vram-sweep: {line}; their configs run again", file=sys.stderr, flush=True)
    return records.finished_keys(loaded.rows, versions)


def check_writable(results_path: Path) -> None:
    """Fail before the first run when the results file cannot be written (a row lost after hours of measuring)."""
    problem = records.writable_problem(results_path)
    if problem:
        raise BadInput(
            f"sweep.results_dir={str(results_path.parent)!r}: cannot write results there ({problem}); "
            "give a directory you can write to"
        )


def run_lock_path(results_path: Path, key: str) -> Path:
    """The lock of (results file, key): beside the results file (git ignores *.jsonl.lock), never in a folder
    shared by every user of the machine."""
    target = records.resolve_target(results_path)
    return target.with_name(f".{target.stem}.run-{key}.jsonl.lock")


@contextlib.contextmanager
def run_lock(results_path: Path, key: str):
    """An exclusive, non-blocking lock on (results file, key); yields the lock's file descriptor, or None when
    another process (a sweep, or the orphaned child of a killed one) is running the same config right now.

    The lock file descriptor is inherited by the child, so the lock outlives a killed parent until the child ends.
    The lock file is removed on release (records.file_lock)."""
    with records.file_lock(run_lock_path(results_path, key), blocking=False) as fd:
        yield fd


def runtime_dir() -> Path:
    """This user's folder for GPU locks: $XDG_RUNTIME_DIR/grpo-vram, else <tmp>/grpo-vram-<uid> (mode 0700)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(base) / "grpo-vram" if base and os.path.isdir(base) else None
    if d is None:
        d = Path(tempfile.gettempdir()) / f"grpo-vram-{os.getuid()}"
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


@contextlib.contextmanager
def claim_gpu(gpus: list[int] | None):
    """Hold an exclusive lock on one free GPU of `gpus` (waits if all are taken); None = leave devices alone."""
    if not gpus:
        yield None
        return
    lock_dir = runtime_dir()
    while True:
        for g in gpus:
            with records.file_lock(lock_dir / f"gpu-{g}.lock", blocking=False) as fd:
                if fd is None:
                    continue
                yield g
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
            with contextlib.suppress(BaseException):
                proc.wait(timeout=10)  # gone before its work dir is removed
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
    """The result row (results/SCHEMA.md): identity, outcome, measurement, environment (the estimate is
    sweeps/report/accuracy.py's to compute)."""
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
    if not model:  # the child measured nothing: the model's name and, for one built in code, its config.json
        model = {"name": job.config.model, "params": None, "trainable_params": None, "config": hf_config}
    env = (
        {"versions": result["versions"], "device": result["device"]}
        if result.get("versions")
        else records.environment_info(job.config.device)
    )
    row.update(
        model=model,
        observed=result.get("observed"),
        step_seconds=result.get("step_seconds", []),
        train_seconds=result.get("train_seconds"),
        lengths=result.get("lengths"),
        versions=env["versions"],
        device=env["device"],
        git_commit=records.git_commit(),
    )
    return row


# What a Ctrl-C / SIGTERM reports: the job running now (set by run_job).
CURRENT: dict = {}


def recover(results_path: Path) -> None:
    """Append the rows an earlier failed append kept aside (records.save_unsaved); one line when there were any."""
    n, problems = records.recover_unsaved(results_path)
    if n:
        print(f"grpo-vram-sweep: appended {n} kept row(s) to {results_path}", file=sys.stderr, flush=True)
    if problems:
        print(
            f"grpo-vram-sweep: {len(problems)} kept row(s) for {results_path} still not appended "
            f"(first: {problems[0]})",
            file=sys.stderr,
            flush=True,
        )


def run_job(job: Job) -> dict | None:
    """Skip a finished or running key; else run it in a subprocess and append its row (None if skipped)."""
    CURRENT.clear()
    CURRENT.update(key=job.key, model=job.config.model, results=str(job.results_path))
    recover(job.results_path)
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
        return _run_locked(job, lock)


@contextlib.contextmanager
def signals_deferred():
    """SIGINT and SIGTERM wait (blocked, then delivered) while a finished run's row is made and written."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def store_row(job: Job, row: dict, workdir: Path) -> bool:
    """Append the row; when that fails (disk full, folder made read-only, the file replaced by a device), keep
    it with records.save_unsaved and say where in one stderr line. False when it could be kept nowhere (the work
    dir, holding the child's result.json, must then stay)."""
    try:
        records.append_row(job.results_path, row)
        return True
    except OSError as exc:
        reason = exc.strerror or str(exc)
        kept = records.save_unsaved(job.results_path, row)
        where = (
            f"kept it in {kept} (the next run of this sweep appends it)"
            if kept
            else f"kept the child's result in {workdir}"
        )
        print(
            f"grpo-vram-sweep: could not append the {row['status']} row of {job.key} ({job.config.model}) to "
            f"{job.results_path} ({reason}); {where}",
            file=sys.stderr,
            flush=True,
        )
        return kept is not None


def _run_locked(job: Job, lock_fd: int) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"grpo-vram-{job.key}-"))
    CURRENT["workdir"] = str(workdir)
    keep = job.keep_workdir
    try:
        return _run_in(job, lock_fd, workdir)
    except _KeepWorkdir:
        keep = True
        return CURRENT.get("row", {})
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


class _KeepWorkdir(Exception):
    """The row could be written nowhere: the work dir (result.json) is all that holds the measurement."""


def _run_in(job: Job, lock_fd: int, workdir: Path) -> dict:
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
    with signals_deferred():  # a finished measurement is written (or kept) before a Ctrl-C acts
        row = make_row(job, result)
        row["wall_seconds"] = round(time.perf_counter() - t0, 2)
        CURRENT["row"] = row
        if not store_row(job, row, workdir):
            raise _KeepWorkdir
        CURRENT.pop("workdir", None)
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


def _first_line(exc: BaseException, value=None) -> str:
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if value is not None and len(str(value)) > 80:
        line = line.replace(str(value), shown(value))
    return line if len(line) <= 300 else line[:297] + "..."


def _resolution_problem(exc: BaseException, with_key: bool = True) -> str:
    """One line for an interpolation OmegaConf could not resolve (a failing resolver, an unset variable)."""
    key = getattr(exc, "full_key", None)
    cause = exc.__cause__ or exc.__context__
    why = _first_line(cause) if cause is not None and not str(exc).strip() else _first_line(exc)
    if cause is not None and type(cause).__name__ not in why:
        why = f"{type(cause).__name__}: {_first_line(cause)}"
    where = f"{key}: " if key and with_key else ""
    return f"{where}cannot resolve the interpolation ({why}); accepted: plain values or interpolations that resolve"


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
        return False, None, _resolution_problem(exc, with_key=False)


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
                raise BadInput(f"{text}: {_first_line(exc, value)}") from None
            if _has_interpolation(value):
                resolved, value, problem = _resolve_problem(cfg, key, value)
                if problem:
                    raise BadInput(f"{text}: {problem}")
                if not resolved:  # checked once resolved, per job
                    continue
            group, _, name = key.partition(".")
            if group == "trainer" and name in RunConfig.field_names():
                from estimator.config import check_value, schema_field

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
