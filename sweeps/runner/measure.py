"""Measuring one job: skip it when its key is done or running, run the child process
(`python -m sweeps.runner.run_one`) with a timeout on a claimed GPU, and write exactly one row, atomically; a
row that cannot be appended is kept aside and appended by the next run."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from estimator.units import MIB
from sweeps import records
from sweeps.runner import ranks, tiny
from sweeps.runner.job import BadInput, Job

log = logging.getLogger(__name__)


PACKAGE_ROOT = Path(__file__).resolve().parents[2]


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
def claim_gpus(gpus: list[int] | None, count: int = 1):
    """Hold exclusive locks on `count` free GPUs of `gpus` (waits until that many are free at once); yields their
    ids, or None = leave devices alone."""
    if not gpus:
        yield None
        return
    if count > len(gpus):
        raise BadInput(f"a run on {count} GPUs: sweep.gpus lists {len(gpus)}; list at least {count}")
    lock_dir = runtime_dir()
    while True:
        with contextlib.ExitStack() as held:
            got = []
            for g in gpus:
                fd = held.enter_context(records.file_lock(lock_dir / f"gpu-{g}.lock", blocking=False))
                if fd is not None:
                    got.append(g)
                if len(got) == count:
                    yield tuple(got)
                    return
        time.sleep(1.0)


@contextlib.contextmanager
def claim_gpu(gpus: list[int] | None):
    """Hold an exclusive lock on one free GPU of `gpus` (waits if all are taken); None = leave devices alone."""
    with claim_gpus(gpus, 1) as got:
        yield None if got is None else got[0]


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
    spec: dict,
    timeout_s: float,
    log_path: Path,
    gpu: int | tuple[int, ...] | None = None,
    pass_fds: tuple[int, ...] = (),
    module: str = "sweeps.runner.run_one",
) -> dict:
    """Run `python -m sweeps.runner.run_one` (or another child `module` taking the same spec) on `spec`, under
    torch's launcher when the config runs on several GPUs (`sweeps.runner.ranks`, one result from its ranks'); the
    child's result, or an error dict for a crash/kill/timeout."""
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "spec.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu)) if isinstance(gpu, tuple) else str(gpu)
    nproc = int(spec["config"].get("num_gpus", 1))
    # the ranks' parent is torch's launcher, which the sweep's death signal reaches and which ends its ranks
    spec = {**spec, "parent_pid": os.getpid() if nproc == 1 else None}
    spec_path.write_text(json.dumps(spec))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            ranks.launch_argv(module, spec_path, nproc),
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
    if nproc > 1:  # one result from the ranks' (a rank that wrote none is named, with the log)
        found = {
            r: x for r, p in ranks.rank_results(result_path).items() if (x := _read_result(p)) is not None
        }
        if found:
            merged = ranks.merge(found, nproc)
            if merged["status"] == "error" and len(found) < nproc:
                merged = {**merged, "error": f"{merged['error']}; log: {log_path}"}
            return merged
    elif (result := _read_result(result_path)) is not None:
        return result
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (host out of memory?)" if name == "SIGKILL" else ""
        return {"status": "error", "error": f"run killed by {name}{hint}; log: {log_path}"}
    return {"status": "error", "error": f"run exited with code {code} without a result; log: {log_path}"}


def _read_result(path: Path) -> dict | None:
    """A child's result file, or None when it is missing or not JSON (the child died writing it)."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


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
    dir, holding the child's result.json, must then stay). Any failure of the append keeps the row: a
    measurement is never lost to a results file this code cannot parse."""
    try:
        records.append_row(job.results_path, row)
        return True
    except Exception as exc:
        reason = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
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
        "probe_options": job.probe_options,
    }
    t0 = time.perf_counter()
    try:
        with claim_gpus(job.gpus, job.config.num_gpus) as gpu:
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
