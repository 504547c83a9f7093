"""Trace a named grid (sweeps/trace/grids.py) into its rows file, resumably: every job whose key has no
finished row (`records.finished_keys`) is traced and its row appended atomically as it finishes, so a rerun
continues where the last one stopped and retries errors. A config this machine cannot trace
(`random_grid.skip_reason`) is written as a `status: "skipped"` row with the reason, never dropped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sweeps import records
from sweeps.trace import rows
from sweeps.trace.grids import GRIDS, Job
from sweeps.trace.random_grid import skip_reason

REPO = Path(__file__).resolve().parents[2]
ROW_WRITTEN_WITH_ERROR = 3  # exit code of the child when it wrote a failed trace's row itself


class _OverBudget(Exception):
    """Raised by SIGALRM inside an in-process trace that ran past the per-config time budget."""


def _alarm(signum, frame):
    raise _OverBudget


def trace_job(job: Job, sweep: str) -> dict:
    """`job` traced in this process: its row (sweeps.trace.rows.make_row)."""
    return rows.make_row(
        job.config,
        sweep,
        max_micro=job.max_micro,
        num_layers=job.num_layers,
        layout=job.layout,
        seed=job.seed,
    )


def _in_process(job: Job, sweep: str, timeout: float) -> dict:
    """Trace here under a SIGALRM budget; past it, a skipped row saying so."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, int(timeout)))
    try:
        row = trace_job(job, sweep)
    finally:
        signal.alarm(0)
    if row["status"] == "error" and "_OverBudget" in (row.get("error") or ""):
        reason = f"over the trace machine's time budget ({timeout:.0f} s per config)"
        cfg = rows.traced_config(job.config)
        return rows.header(cfg, sweep, job.variant(), job.seed, status="skipped", error=reason)
    return row


def _in_child(job: Job, sweep: str, timeout: float, out: Path) -> dict | None:
    """Trace in a subprocess that appends its own row; None then, else the error row of a crash or time-out."""
    cmd = [sys.executable, "-m", "sweeps.trace", "child", json.dumps(job.to_dict()), "--sweep", sweep]
    cmd += ["--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
    except subprocess.TimeoutExpired:
        err = f"timeout after {timeout:.0f} s"
    else:
        if proc.returncode in (0, ROW_WRITTEN_WITH_ERROR):
            return None
        err = (proc.stderr.strip().splitlines() or ["?"])[-1]
    cfg = rows.traced_config(job.config)
    return rows.header(cfg, sweep, job.variant(), job.seed, status="error", error=f"subprocess: {err}"[:500])


def run(name: str, out: Path, timeout: float, limit: int | None = None) -> None:
    """Trace every job of grid `name` without a finished row in `out`."""
    grid = GRIDS[name]
    jobs = grid.jobs()[:limit] if limit else grid.jobs()
    done = records.finished_keys(records.load_rows(out))
    todo = [j for j in jobs if j.key not in done]
    print(f"grid {name}: {len(jobs)} configs, {len(jobs) - len(todo)} done, {len(todo)} to trace", flush=True)
    t_grid = time.perf_counter()
    for i, job in enumerate(todo, 1):
        t0 = time.perf_counter()
        reason = skip_reason(job.config)
        if reason is not None:
            row = rows.header(
                rows.traced_config(job.config), name, job.variant(), job.seed, status="skipped", error=reason
            )
        elif grid.in_process:
            row = _in_process(job, name, timeout)
        else:
            row = _in_child(job, name, timeout, out)
        if row is not None:
            records.append_row(out, row)
        status = "ok (row written by the child)" if row is None else row["status"]
        error = "" if row is None else (row.get("error") or "")[:120]
        cfg = job.config
        print(
            f"[{i}/{len(todo)}] {cfg.model} peft={cfg.use_peft} 4bit={cfg.load_in_4bit} G={cfg.num_generations} "
            f"gc={cfg.gradient_checkpointing} {cfg.dtype} {job.layout or ''}: {status} "
            f"{time.perf_counter() - t0:.1f} s {error}",
            flush=True,
        )
    print(f"grid {name}: {len(todo)} traced in {time.perf_counter() - t_grid:.0f} s", flush=True)
