"""`make validate` / `make heldout`: trace a seeded random grid into results/traced/<set>.jsonl, resumably.

    python -m sweeps.trace.run_random --set validation     # seed A, results/traced/validation.jsonl
    python -m sweeps.trace.run_random --set heldout        # seed B, results/traced/heldout.jsonl
    python -m sweeps.trace.run_random --set heldout-c      # seed C, results/traced/heldout-c.jsonl
    python -m sweeps.trace.run_random --set heldout-d      # seed D, results/traced/heldout-d.jsonl
    python -m sweeps.trace.run_random --set heldout-e      # seed E, results/traced/heldout-e.jsonl
    python -m sweeps.trace.run_random --set heldout-f      # seed F, results/traced/heldout-f.jsonl
    python -m sweeps.trace.run_random --set heldout-g      # seed G, results/traced/heldout-g.jsonl
    python -m sweeps.trace.run_random --set heldout-h      # seed H, results/traced/heldout-h.jsonl
    python -m sweeps.trace.run_random --set heldout-i      # seed I, results/traced/heldout-i.jsonl

Configs run in this one process, one after another (each trace opens its own FakeTensorMode), so the
~10 s import of torch / transformers / TRL is paid once rather than per config. Each row is appended
atomically as it finishes (`records.append_row`); a rerun skips every key already written with status
ok or skipped and retries errors. A config this machine cannot trace (`random_grid.skip_reason`) or one
that runs past `--timeout` seconds is written as a `status: "skipped"` row with the reason.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from sweeps import records
from sweeps.oneline import OneLineParser
from sweeps.trace import random_grid
from sweeps.trace.cli import _row_header, make_row, variant

REPO = Path(__file__).resolve().parents[2]
# Depth cap: at ~0.3 of a core (2 cores shared by 8 helpers) a full-depth trace takes 1-4 minutes, so the grid
# traces each model at full width, vocabulary, batch and lengths with its first DEPTH decoder layers (6 for
# gemma-3, whose every 6th layer is global), and the estimator is held to that same config.json.
DEPTH = 4
DEPTH_BY_MODEL_TYPE = {"gemma3_text": 6}


def layers_for(cfg) -> int:
    """Decoder layers the grid traces for `cfg` (recorded in the row's variant and model.config)."""
    from estimator.model.catalog import resolve_model

    return DEPTH_BY_MODEL_TYPE.get(resolve_model(cfg.model).model_type, DEPTH)


MAX_MICRO = (
    2  # score chunks / training micro-batches per step (step.run's time cap: same peak as all of them)
)
SETS = {
    "validation": (random_grid.VALIDATION_SEED, random_grid.VALIDATION_N),
    "heldout": (random_grid.HELDOUT_SEED, random_grid.HELDOUT_N),
    "heldout-c": (random_grid.HELDOUT_C_SEED, random_grid.HELDOUT_N),
    "heldout-d": (random_grid.HELDOUT_D_SEED, random_grid.HELDOUT_N),
    "heldout-e": (random_grid.HELDOUT_E_SEED, random_grid.HELDOUT_N),
    "heldout-f": (random_grid.HELDOUT_F_SEED, random_grid.HELDOUT_N),
    "heldout-g": (random_grid.HELDOUT_G_SEED, random_grid.HELDOUT_N),
    "heldout-h": (random_grid.HELDOUT_H_SEED, random_grid.HELDOUT_N),
    "heldout-i": (random_grid.HELDOUT_I_SEED, random_grid.HELDOUT_N),
}


class _OverBudget(Exception):
    """Raised by SIGALRM inside a trace that ran past the per-config time budget."""


def _alarm(signum, frame):
    raise _OverBudget


def run(name: str, out: Path, timeout: int, limit: int | None = None) -> None:
    """Trace every config of set `name` whose key is not yet in `out` (ok or skipped)."""
    seed, n = SETS[name]
    cfgs = random_grid.random_configs(seed, n)[:limit]
    done = {r["key"] for r in records.load_rows(out) if r.get("status") in ("ok", "skipped")}
    todo = [
        c
        for c in cfgs
        if records.make_key(c.to_dict(), variant(c, max_micro=MAX_MICRO, num_layers=layers_for(c)))
        not in done
    ]
    print(f"{name} (seed {seed}): {len(cfgs)} configs, {len(todo)} to trace", flush=True)
    signal.signal(signal.SIGALRM, _alarm)
    for i, cfg in enumerate(todo, 1):
        t0 = time.perf_counter()
        reason = random_grid.skip_reason(cfg)
        if reason is None:
            signal.alarm(timeout)
            try:
                row = make_row(cfg, sweep=name, max_micro=MAX_MICRO, num_layers=layers_for(cfg))
            finally:
                signal.alarm(0)
            if row["status"] == "error" and "_OverBudget" in row.get("error", ""):
                reason = f"over the trace machine's time budget ({timeout} s per config)"
        if reason is not None:
            row = _row_header(
                cfg,
                name,
                variant(cfg, max_micro=MAX_MICRO, num_layers=layers_for(cfg)),
                status="skipped",
                error=reason,
            )
        records.append_row(out, row)
        print(
            f"[{i}/{len(todo)}] {cfg.model} {row['status']} {time.perf_counter() - t0:.1f} s "
            f"{(row.get('error') or '')[:100]}",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="grpo-vram-validate", description=__doc__.splitlines()[0])
    p.add_argument("--set", choices=sorted(SETS), default="validation")
    p.add_argument("--out", type=Path, help="default: results/traced/<set>.jsonl")
    p.add_argument(
        "--timeout", type=int, default=240, help="seconds per config before it is recorded as skipped"
    )
    p.add_argument("--limit", type=int, help="only the first N configs")
    a = p.parse_args(argv)
    run(a.set, a.out or REPO / "results" / "traced" / f"{a.set}.jsonl", a.timeout, a.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
