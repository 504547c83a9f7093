"""`grpo-vram-trace`: trace real-size GRPO steps under FakeTensorMode, one config or a grid, into result rows.

    grpo-vram-trace --model 7B --gens 8 --lora            # one config: prints the traced per-phase peaks
    grpo-vram-trace --grid default                         # results/traced/default.jsonl (skips traced keys)
    grpo-vram-trace --grid smoke                           # 3 quick configs

Every config of a grid runs in its own subprocess (`python -m sweeps.trace.cli --one '<RunConfig json>'`): a
fresh FakeTensorMode and bounded memory; a crash or time-out is recorded as a `status: "error"` row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from estimator.config import RunConfig
from sweeps import records
from sweeps.trace.grid import GRIDS, grid_configs

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
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
        from estimator.architecture import from_config
        from estimator.estimate import estimate

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


def make_row(
    cfg: RunConfig, sweep: str, k: int = DECODE_K, max_micro: int | None = None, num_layers: int | None = None
) -> dict:
    """Trace `cfg` and build its result row (status error with the message if the trace raises).

    `num_layers`: a depth-reduced trace; the row's `model.config` holds the traced config.json, which the
    estimator is evaluated on (sweeps.runner.predict)."""
    row = _row_header(cfg, sweep, variant(cfg, k, max_micro=max_micro, num_layers=num_layers))
    hf = None
    if num_layers is not None:
        from sweeps.trace.fake_model import truncated_config_dict

        hf = truncated_config_dict(cfg.model, num_layers)
    row["prediction"] = _prediction(cfg, hf)
    try:
        from sweeps.trace import step

        res = step.run(cfg, fake=True, steps=STEPS, decode_k=k, max_micro=max_micro, num_layers=num_layers)
    except Exception as e:  # one failing config must not stop a grid
        row["status"] = "error"
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
        row["traceback"] = traceback.format_exc()[-4000:]
        return row
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
    row["step_seconds"] = res.step_seconds
    row["setup_seconds"] = res.setup_seconds
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


def _one_from_args(a) -> RunConfig:
    gens = a.gens
    return RunConfig(
        model=a.model,
        dtype=a.dtype,
        use_peft=a.lora or a.qlora,
        load_in_4bit=a.qlora,
        lora_r=a.lora_r,
        num_generations=gens,
        per_device_train_batch_size=a.batch_size or gens,
        max_prompt_length=a.prompt,
        max_completion_length=a.completion,
        gradient_checkpointing=not a.no_gc,
        beta=a.beta,
        optim=a.optim,
        device=a.device,
        attn_implementation=a.attn_implementation,
        lora_target_modules=tuple(a.lora_target_modules.split(",")) if a.lora_target_modules else None,
    )


def _invalid(cfg: RunConfig) -> str | None:
    """One line naming the bad value (the estimator's own checks, as TRL makes them), or None."""
    from estimator.catalog import UnknownModel, resolve_model
    from estimator.validate import InvalidConfig, validate

    try:
        validate(cfg, resolve_model(cfg.model))
    except (UnknownModel, InvalidConfig, ValueError) as exc:
        return str(exc).splitlines()[0]
    return None


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="grpo-vram-trace", description=__doc__.splitlines()[0])
    p.add_argument(
        "--grid", choices=sorted(GRIDS), help="trace a named grid into results/traced/<grid>.jsonl"
    )
    p.add_argument("--one", help=argparse.SUPPRESS)  # RunConfig JSON: trace it here, append the row to --out
    p.add_argument("--sweep", default="cli", help=argparse.SUPPRESS)
    p.add_argument(
        "--out", type=Path, help="jsonl file for the rows (grid default: results/traced/<grid>.jsonl)"
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per grid config")
    p.add_argument("--limit", type=int, help="only the first N configs of the grid")
    p.add_argument("--model", default="7B")
    p.add_argument("--gens", type=int, default=8)
    p.add_argument("--batch-size", type=int, help="per_device_train_batch_size (default: --gens)")
    p.add_argument("--lora", action="store_true")
    p.add_argument("--qlora", action="store_true")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument(
        "--lora-target-modules", help="comma list or all-linear (default: PEFT's for the model type)"
    )
    p.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager", "flash_attention_2"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--completion", type=int, default=512)
    p.add_argument("--no-gc", action="store_true")
    p.add_argument("--beta", type=float, default=0.0)
    p.add_argument("--optim", default="adamw_torch_fused")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json", action="store_true", help="print the whole row as JSON")
    a = p.parse_args(argv)
    if a.grid:
        run_grid(a.grid, a.out or REPO / "results" / "traced" / f"{a.grid}.jsonl", a.timeout, a.limit)
        return 0
    if a.one:
        row = make_row(RunConfig.from_dict(json.loads(a.one)), a.sweep)
        if a.out:
            records.append_row(a.out, row)
        return 0 if row["status"] == "ok" else ROW_WRITTEN_WITH_ERROR
    cfg = _one_from_args(a)
    problem = _invalid(cfg)
    if problem:
        print(f"grpo-vram-trace: {problem}", file=sys.stderr)
        return 2
    row = make_row(cfg, a.sweep)
    if a.out:
        records.append_row(a.out, row)
    print(json.dumps(row, indent=1) if a.json else "", end="")
    _print_row(row)
    return 0 if row["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
