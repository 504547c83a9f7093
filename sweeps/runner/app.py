"""grpo-vram-sweep: a Hydra app; each job runs one GRPO config in a subprocess and appends exactly one row."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from estimator import validate
from estimator.config import DEVICES, DTYPES, OPTIMIZERS, RunConfig
from sweeps import records
from sweeps.runner import tiny
from sweeps.runner.predict import predict

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
    retry_errors: bool
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
    if settings.get("use_vllm") and settings["device"] != "cuda":
        raise BadInput("trainer.use_vllm=true: accepted only with device=cuda")
    try:
        config = RunConfig.from_dict(settings)
    except (TypeError, ValueError) as exc:
        raise BadInput(f"run config: {exc}") from None
    try:  # the estimator's checks, as TRL makes them (positive sizes, groups divide the generation batch)
        validate.check_values(config)
        validate.check_geometry(config)
    except validate.InvalidConfig as exc:
        raise BadInput(str(exc)) from None
    run = c.get("run") or {}
    unknown = sorted(set(run) - set(RUN_KEYS) - {"inject_failure", "weights"})
    if unknown:
        raise BadInput(
            f"run.{unknown[0]}: not a run setting; accepted keys are {', '.join((*RUN_KEYS, 'weights'))}"
        )
    variant = {k: run[k] for k in RUN_KEYS if k in run}
    _check(variant.get("prompts", "synthetic"), PROMPTS, "run.prompts")
    if int(variant.get("steps", 2)) < 2:
        raise BadInput(f"run.steps={variant.get('steps')}: accepted values are integers >= 2")
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
    s = c["sweep"]
    return Job(
        config=config,
        variant=variant,
        probes=probes,
        inject_failure=inject,
        sweep=str(s["name"]),
        results_path=Path(s["results_dir"]) / f"{s['name']}.jsonl",
        timeout_s=float(s["timeout_s"]),
        retry_errors=bool(s.get("retry_errors", False)),
        gpus=list(s["gpus"]) if s.get("gpus") is not None else None,
        keep_workdir=bool(s.get("keep_workdir", False)),
    )


def skip_keys(path: Path, versions: dict, retry_errors: bool) -> set[str]:
    """Keys already finished under the same package versions (error rows too, unless retried)."""
    rows = records.load_rows(path)
    return {
        r["key"]
        for r in rows
        if "key" in r
        and records.versions_match(r.get("versions"), versions)
        and not (retry_errors and r.get("status") == "error")
    }


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


def run_child(spec: dict, timeout_s: float, log_path: Path, gpu: int | None = None) -> dict:
    """Run `python -m sweeps.runner.run_one` on `spec`; the child's result, or an error dict for a crash/kill/timeout."""
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sweeps.runner.run_one", str(spec_path)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
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
    """Skip a finished key; else run it in a subprocess and append its row. Returns the row (None if skipped)."""
    versions = records.package_versions()
    if job.key in skip_keys(job.results_path, versions, job.retry_errors):
        log.info("skip %s (key %s already in %s)", job.config.model, job.key, job.results_path)
        print(f"skip {job.key} {job.config.model}: already in {job.results_path}", flush=True)
        return None
    workdir = Path(tempfile.mkdtemp(prefix=f"grpo-vram-{job.key}-"))
    out_dir = _output_dir() or workdir
    spec = {
        "config": job.config.to_dict(),
        "variant": job.variant,
        "probes": job.probes,
        "inject_failure": job.inject_failure,
        "result_path": str(workdir / "result.json"),
        "workdir": str(workdir),
    }
    t0 = time.perf_counter()
    try:
        with claim_gpu(job.gpus) as gpu:
            result = run_child(spec, job.timeout_s, out_dir / "run.log", gpu)
    except Exception as exc:  # the row is written whatever happens
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        if not job.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    row = make_row(job, result)
    row["wall_seconds"] = round(time.perf_counter() - t0, 2)
    records.append_row(job.results_path, row)
    peak = (row.get("observed") or {}).get("peak_bytes")
    peak_txt = f"{peak / 2**20:.1f} MiB" if peak else "-"
    msg = f"{row['status']} {job.key} {job.config.model} peak={peak_txt} ({row['wall_seconds']} s)"
    print(msg + (f": {row['error']}" if row["error"] else ""), flush=True)
    return row


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """One Hydra job: build the run, skip it if done, else measure it and append its row."""
    # SIGTERM -> SystemExit so the child is killed too (signal handlers can only be set in the main thread)
    with contextlib.suppress(ValueError):
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        job = to_job(cfg)
    except BadInput as exc:
        print(f"grpo-vram-sweep: {exc}", file=sys.stderr)
        sys.exit(2)
    run_job(job)


if __name__ == "__main__":
    main()
