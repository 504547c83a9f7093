"""`grpo-vram-trace`: trace real-size GRPO steps under FakeTensorMode, one config or a grid, into result rows.

    grpo-vram-trace --model 7B --gens 8 --lora            # one config: prints the traced per-phase peaks
    grpo-vram-trace --grid default                         # results/traced/default.jsonl (skips traced keys)
    grpo-vram-trace --grid smoke                           # 3 quick configs

Every config of a grid runs in its own subprocess (`python -m sweeps.trace.cli --one '<RunConfig json>'`): a
fresh FakeTensorMode and bounded memory; a crash or time-out is recorded as a `status: "error"` row.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

from estimator.settings.config import RunConfig
from estimator.settings.versions import default_transformers
from estimator.units import GIB
from sweeps import records
from sweeps.trace.grid import GRIDS, grid_configs

REPO = Path(__file__).resolve().parents[2]
ROW_WRITTEN_WITH_ERROR = 2  # exit code of `--one` when it recorded the failure itself
DECODE_K = 2
STEPS = 2


def variant(
    cfg: RunConfig,
    k: int = DECODE_K,
    steps: int = STEPS,
    max_micro: int | None = None,
    num_layers: int | None = None,
) -> dict:
    """Run settings that are not estimator fields (part of the row key)."""
    v = {"decode": "fast-forward", "k": k} if k < cfg.max_completion_length else {"decode": "full"}
    v.update({"head": "fused-gpu", "steps": steps, "tensors": "fake"})
    if max_micro is not None:
        v["max_micro"] = max_micro
    if num_layers is not None:
        v["layers"] = num_layers
    return v


def _prediction(cfg: RunConfig, hf_config: dict | None = None) -> dict | None:
    try:
        from estimator.model.architecture import from_config
        from estimator.step.estimate import estimate

        return estimate(cfg, from_config(hf_config, name=cfg.model) if hf_config else None).to_dict()
    except Exception:  # the estimator may not cover this config yet
        return None


def _device(cfg: RunConfig) -> dict:
    rounding = 512 if cfg.device == "cuda" else 1
    return {
        "type": f"fake-{cfg.device}",
        "name": None,
        "total_bytes": None,
        "allocator_rounding_bytes": rounding,
    }


def _row_header(cfg: RunConfig, sweep: str, var: dict, **status) -> dict:
    """A traced row's identity and environment: key, config, variant, versions, device, commit."""
    row = records.base_row(
        key=records.make_key(cfg.to_dict(), var),
        source="traced",
        sweep=sweep,
        config=cfg.to_dict(),
        variant=var,
        **status,
    )
    row["versions"] = records.environment_info("cpu")["versions"]
    row["device"], row["git_commit"] = _device(cfg), records.git_commit()
    return row


QUIET_LOGGERS = ("transformers", "trl", "peft", "accelerate", "datasets")


@contextlib.contextmanager
def quiet_libraries():
    """Silence library deprecation warnings and info/warning logs that a trace triggers but a user cannot act on
    (TRL calling transformers' deprecated gradient_checkpointing names, model_init_kwargs ignored for a model
    built in code); errors still show. Restores the warning filters and logger levels on exit."""
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning, UserWarning):
            warnings.simplefilter("ignore", category)
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        try:
            yield
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)


def make_row(
    cfg: RunConfig, sweep: str, k: int = DECODE_K, max_micro: int | None = None, num_layers: int | None = None
) -> dict:
    """Trace `cfg` and build its result row (status error with the message if the trace raises).

    `num_layers`: a depth-reduced trace; the row's `model.config` holds the traced config.json, which the
    estimator is evaluated on (sweeps.runner.predict). The row models the installed transformers, which the
    trace runs."""
    cfg = cfg.with_(transformers_version=default_transformers())
    if cfg.num_gpus > 1:  # rank 0 of N ranks on a fake process group (sweeps/trace/multigpu.py)
        from sweeps.trace import multigpu

        layout = {"world_size": cfg.num_gpus, "strategy": cfg.fsdp_sharding_strategy}
        return multigpu.make_row(cfg, layout, sweep)
    row = _row_header(cfg, sweep, variant(cfg, k, max_micro=max_micro, num_layers=num_layers))
    hf = None
    if num_layers is not None:
        from sweeps.trace.fake_model import truncated_config_dict

        hf = truncated_config_dict(cfg.model, num_layers)
    row["prediction"] = _prediction(cfg, hf)
    try:
        from sweeps.trace import step

        with quiet_libraries():
            res = step.run(
                cfg, fake=True, steps=STEPS, decode_k=k, max_micro=max_micro, num_layers=num_layers
            )
    except Exception as e:  # one failing config must not stop a grid
        return with_error(row, e)
    return with_result(row, cfg, res, hf)


def with_error(row: dict, e: Exception) -> dict:
    """`row` as an error row: the exception's first line and the traceback's tail."""
    row["status"] = "error"
    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
    row["traceback"] = traceback.format_exc()[-4000:]
    return row


def with_result(row: dict, cfg: RunConfig, res, hf: dict | None = None) -> dict:
    """`row` with a trace's observed peaks (source `traced`), the model's sizes and the step times (and the
    traced config.json `hf` of a depth-reduced trace, which the estimator is evaluated on)."""
    obs = res.observed
    row["model"] = {"name": cfg.model, "params": res.params, "trainable_params": res.trainable_params}
    if hf is not None:
        row["model"]["config"] = hf
    row["observed"] = {
        "source": "traced",
        "peak_bytes": obs["peak_bytes"],
        "peak_bytes_unrounded": obs["peak_bytes_unrounded"],
        "peak_phase": obs["peak_phase"],
        "phases": obs["phases"],
        "probes": {"tensors": obs},
    }
    row["step_seconds"], row["setup_seconds"] = res.step_seconds, res.setup_seconds
    return row


def _print_row(row: dict) -> None:
    if row["status"] != "ok":
        print(f"{row['config']['model']}: {row['status']}: {row['error']}")
        return
    obs = row["observed"]
    print(f"{row['config']['model']} (traced, fake tensors, {row['device']['type']}):")
    for ph, b in obs["phases"].items():
        print(f"  {ph:<10} {b / GIB:8.2f} GiB  traced")
    print(f"  peak       {obs['peak_bytes'] / GIB:8.2f} GiB  traced, in {obs['peak_phase']}")
    pred = row.get("prediction")
    if pred and pred.get("peak_allocated_bytes"):
        print(f"  estimate   {pred['peak_allocated_bytes'] / GIB:8.2f} GiB  estimated")


def run_grid(name: str, out: Path, timeout: float, limit: int | None = None) -> None:
    """Trace every config of grid `name` not already in `out`, each in a subprocess; rows appended as they finish."""
    cfgs = grid_configs(name)[:limit] if limit else grid_configs(name)
    done = {r["key"] for r in records.load_rows(out) if r.get("status") == "ok"}  # errors are retried
    todo = [c for c in cfgs if records.make_key(c.to_dict(), variant(c)) not in done]
    print(
        f"grid {name}: {len(cfgs)} configs, {len(cfgs) - len(todo)} already traced, {len(todo)} to go",
        flush=True,
    )
    t_grid = time.perf_counter()
    for i, cfg in enumerate(todo, 1):
        t0 = time.perf_counter()
        cmd = [
            sys.executable,
            "-m",
            "sweeps.trace.cli",
            "--one",
            json.dumps(cfg.to_dict()),
            "--out",
            str(out),
        ]
        cmd += ["--sweep", name]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
            err = (
                None
                if proc.returncode in (0, ROW_WRITTEN_WITH_ERROR)
                else (proc.stderr.strip().splitlines() or ["?"])[-1]
            )
        except subprocess.TimeoutExpired:
            err = f"timeout after {timeout:.0f} s"
        if err is not None:
            row = _row_header(cfg, name, variant(cfg), status="error", error=f"subprocess: {err}"[:500])
            records.append_row(out, row)
        dt = time.perf_counter() - t0
        status = "ok" if err is None else f"error ({err[:120]})"
        if err is None and proc.returncode == ROW_WRITTEN_WITH_ERROR:
            status = "error (see row)"
        print(
            f"[{i}/{len(todo)}] {cfg.model} peft={cfg.use_peft} 4bit={cfg.load_in_4bit} G={cfg.num_generations} "
            f"gc={cfg.gradient_checkpointing} {cfg.dtype} beta={cfg.beta} {cfg.optim}: {status} {dt:.1f} s",
            flush=True,
        )
    print(f"grid {name}: {len(todo)} traced in {time.perf_counter() - t_grid:.0f} s", flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The run settings' flags (the same schema-derived flags as `vram-estimate`) and the tracer's own."""
    from estimator.interface.flags import OneLineParser, add_run_flags

    p = OneLineParser(
        prog="grpo-vram-trace", description=__doc__.splitlines()[0], argument_default=argparse.SUPPRESS
    )
    add_run_flags(p)
    t = p.add_argument_group("trace")
    t.add_argument(
        "--grid", choices=sorted(GRIDS), help="trace a named grid into results/traced/<grid>.jsonl"
    )
    t.add_argument("--one", help=argparse.SUPPRESS)  # RunConfig JSON: trace it here, append the row to --out
    t.add_argument("--sweep", default="cli", help=argparse.SUPPRESS)
    t.add_argument(
        "--out", type=Path, help="jsonl file for the rows (grid default: results/traced/<grid>.jsonl)"
    )
    t.add_argument("--timeout", type=float, default=900.0, help="seconds per grid config")
    t.add_argument("--limit", type=int, help="only the first N configs of the grid")
    t.add_argument("--json", action="store_true", default=False, help="print the whole row as JSON")
    return p


def _check_trace_args(a: argparse.Namespace, out: Path | None) -> str | None:
    """The tracer's own flags, checked before any trace runs: --timeout, --limit, and a writable --out."""
    timeout = getattr(a, "timeout", 900.0)
    if not math.isfinite(timeout) or timeout <= 0:
        return f"--timeout {timeout:g}: accepted values are seconds > 0"
    limit = getattr(a, "limit", None)
    if limit is not None and limit < 1:
        return f"--limit {limit}: accepted values are integers >= 1"
    target = out or (REPO / "results" / "traced" / f"{a.grid}.jsonl" if getattr(a, "grid", None) else None)
    if target is not None:
        problem = records.writable_problem(target)
        if problem:
            return f"--out {target}: {problem}"
    return None


def main(argv: list[str] | None = None) -> int:
    from estimator.interface.flags import FlagError, resolve_run

    try:
        a = build_parser().parse_args(argv)
    except FlagError as e:
        print(f"grpo-vram-trace: error: {e}", file=sys.stderr)
        return 2
    out = getattr(a, "out", None)
    problem = _check_trace_args(a, out)
    if problem:
        print(f"grpo-vram-trace: error: {problem}", file=sys.stderr)
        return 2
    if getattr(a, "grid", None):
        run_grid(
            a.grid,
            out or REPO / "results" / "traced" / f"{a.grid}.jsonl",
            a.timeout,
            getattr(a, "limit", None),
        )
        return 0
    if getattr(a, "one", None):
        row = make_row(RunConfig.from_dict(json.loads(a.one)), a.sweep)
        if out:
            records.append_row(out, row)
        return 0 if row["status"] == "ok" else ROW_WRITTEN_WITH_ERROR
    try:
        cfg, _arch, notes = resolve_run(a)
    except FlagError as e:
        print(f"grpo-vram-trace: error: {e}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"grpo-vram-trace: note: {note}", file=sys.stderr)
    row = make_row(cfg, a.sweep)
    if out:
        records.append_row(out, row)
    print(json.dumps(row, indent=1) if a.json else "", end="")
    _print_row(row)
    return 0 if row["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
