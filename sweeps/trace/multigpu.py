"""`python -m sweeps.trace.multigpu`: the multi-GPU grid, rank 0 of N FSDP2 ranks, into results/traced/multigpu.jsonl.

    python -m sweeps.trace.multigpu                       # the whole grid (skips rows already traced ok)
    python -m sweeps.trace.multigpu --model 7B --gpus 4   # one config, printed

Each config runs in its own subprocess (a fresh process group and FakeTensorMode); a crash or time-out becomes a
`status: "error"` row, a config the tracer cannot run a `status: "skipped"` row with the reason. Full fine-tuning
(and LoRA spot checks), bf16 weights, 8 generations of 256 + 512 tokens, gradient checkpointing: the single-GPU
`core` grid's shape.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from estimator.settings.config import RunConfig
from estimator.settings.versions import default_transformers
from sweeps import records
from sweeps.oneline import OneLineParser
from sweeps.trace import cli as single_cli
from sweeps.trace.grid import _config

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "results" / "traced" / "multigpu.jsonl"
SWEEP = "multigpu"
MODELS = ("0.5B", "1.5B", "3B", "7B", "14B")
RANKS = (4, 2, 8)  # 4 first: the benchmark's shape, then the ends
STRATEGY_SPOTS = (("1.5B", 4), ("7B", 4), ("7B", 8))  # SHARD_GRAD_OP
LORA_SPOTS = (("1.5B", 4), ("3B", 4), ("7B", 8))


def grid() -> list[tuple[RunConfig, dict]]:
    """(config, layout kwargs) pairs, FULL_SHARD over models x ranks, then SHARD_GRAD_OP spot checks."""
    out = [
        (_config(model=m, dtype="bfloat16").with_(num_gpus=n, sharding="fsdp"), {"world_size": n})
        for n in RANKS
        for m in MODELS
    ]
    for m, n in STRATEGY_SPOTS:
        cfg = _config(model=m, dtype="bfloat16").with_(
            num_gpus=n, sharding="fsdp", fsdp_sharding_strategy="SHARD_GRAD_OP"
        )
        out.append((cfg, {"world_size": n, "strategy": "SHARD_GRAD_OP"}))
    for m, n in LORA_SPOTS:  # LoRA under FSDP: frozen bf16 base shards, fp32 adapters
        cfg = _config(model=m, dtype="bfloat16", use_peft=True).with_(num_gpus=n, sharding="fsdp")
        out.append((cfg, {"world_size": n}))
    # recorded as skipped with the tracer's reason: DeepSpeed ZeRO, QLoRA under FSDP, CPU offload
    for extra, lay in (
        ({"sharding": "zero2"}, {}),
        ({"sharding": "zero3"}, {}),
        ({"sharding": "fsdp", "use_peft": True, "load_in_4bit": True}, {}),
        ({"sharding": "fsdp", "offload_param": True}, {"cpu_offload": True}),
    ):
        cfg = _config(model="7B", dtype="bfloat16").with_(num_gpus=4, **extra)
        out.append((cfg, {"world_size": 4, **lay}))
    return out


def _variant(cfg: RunConfig, layout: dict) -> dict:
    from sweeps.trace.distributed import Layout

    return {**single_cli.variant(cfg), **Layout(**layout).variant()}


def make_row(cfg: RunConfig, layout: dict, sweep: str = SWEEP) -> dict:
    """Trace `cfg` as rank 0 of `layout` and build its row (error / skipped rows carry the reason)."""
    from sweeps.trace import distributed

    cfg = cfg.with_(transformers_version=default_transformers())  # the release the trace runs
    var = _variant(cfg, layout)
    row = single_cli._row_header(cfg, sweep, var)
    try:
        res = distributed.run(cfg, distributed.Layout(**layout), single_cli.STEPS, single_cli.DECODE_K)
    except NotImplementedError as e:
        row.update(status="skipped", error=str(e))
        return row
    except Exception as e:  # one failing config must not stop the grid
        return single_cli.with_error(row, e)
    return single_cli.with_result(row, cfg, res)


def run_grid(out: Path, timeout: float, limit: int | None = None) -> None:
    """Trace every grid config not already traced ok in `out`, each in a subprocess; rows appended as they finish."""
    todo_all = grid()[:limit] if limit else grid()
    done = {r["key"] for r in records.load_rows(out) if r.get("status") in ("ok", "skipped")}
    todo = [(c, lay) for c, lay in todo_all if records.make_key(c.to_dict(), _variant(c, lay)) not in done]
    print(
        f"multigpu: {len(todo_all)} configs, {len(todo_all) - len(todo)} done, {len(todo)} to go", flush=True
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for i, (cfg, lay) in enumerate(todo, 1):
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "sweeps.trace.multigpu", "--one", json.dumps(cfg.to_dict())]
        cmd += ["--layout", json.dumps(lay), "--out", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)
            err = None if proc.returncode in (0, 2) else (proc.stderr.strip().splitlines() or ["?"])[-1]
        except subprocess.TimeoutExpired:
            err = f"timeout after {timeout:.0f} s"
        if err is not None:
            row = single_cli._row_header(
                cfg, SWEEP, _variant(cfg, lay), status="error", error=f"subprocess: {err}"[:500]
            )
            records.append_row(out, row)
        status = "ok" if err is None else f"error ({err[:120]})"
        print(f"[{i}/{len(todo)}] {cfg.model} {lay}: {status} {time.perf_counter() - t0:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m sweeps.trace.multigpu", description=__doc__.splitlines()[0])
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--layout", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=None, help=f"jsonl for the rows (grid default {OUT})")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per config")
    p.add_argument("--limit", type=int, help="only the first N configs of the grid")
    p.add_argument("--model", help="trace one config of this model instead of the grid")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--fsdp-sharding-strategy", default="FULL_SHARD", choices=["FULL_SHARD", "SHARD_GRAD_OP"])
    a = p.parse_args(argv)
    if a.one:
        row = make_row(RunConfig.from_dict(json.loads(a.one)), json.loads(a.layout))
        if a.out:
            records.append_row(a.out, row)
        return 0 if row["status"] == "ok" else 2
    if a.model:
        if a.gpus < 2:
            print(f"--gpus: {a.gpus} is not a multi-GPU run; accepted: 2 or more", file=sys.stderr)
            return 2
        cfg = _config(model=a.model, dtype="bfloat16").with_(
            num_gpus=a.gpus, sharding="fsdp", fsdp_sharding_strategy=a.fsdp_sharding_strategy
        )
        row = make_row(cfg, {"world_size": a.gpus, "strategy": a.fsdp_sharding_strategy})
        if a.out:
            records.append_row(a.out, row)
        single_cli._print_row(row)
        return 0 if row["status"] == "ok" else 1
    run_grid(a.out or OUT, a.timeout, a.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
