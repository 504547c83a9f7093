"""`grpo-vram-trace` (`python -m sweeps.trace`): real-size GRPO steps traced under FakeTensorMode into result rows.

    grpo-vram-trace one --model 7B --gens 8 --lora      # one config (vram-estimate's flags): prints its peaks
    grpo-vram-trace one --model 7B --gpus 4 --sharding fsdp   # rank 0 of 4 FSDP2 ranks
    grpo-vram-trace grid default                        # a named grid (sweeps/trace/grids.py) -> results/traced/
    grpo-vram-trace retrace --tag T --where bf16 results/traced/tuned/*.jsonl   # sweeps/trace/retrace.py

Bad input is one stderr line and exit 2, before anything is traced.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from estimator.units import GIB
from sweeps import records
from sweeps.oneline import shown
from sweeps.trace import retrace
from sweeps.trace.gridrun import ROW_WRITTEN_WITH_ERROR
from sweeps.trace.gridrun import run as run_grid
from sweeps.trace.grids import GRIDS, Job
from sweeps.trace.rows import make_row

PROG = "grpo-vram-trace"
COMMANDS = ("one", "grid", "retrace")


def _print_row(row: dict) -> None:
    """The traced per-phase peaks, and the current estimate beside them."""
    if row["status"] != "ok":
        print(f"{row['config']['model']}: {row['status']}: {row['error']}")
        return
    obs = row["observed"]
    print(f"{row['config']['model']} (traced, fake tensors, {row['device']['type']}):")
    for ph, b in obs["phases"].items():
        print(f"  {ph:<10} {b / GIB:8.2f} GiB  traced")
    print(f"  peak       {obs['peak_bytes'] / GIB:8.2f} GiB  traced, in {obs['peak_phase']}")
    from sweeps.runner.predict import predict, tensors_of

    pred, _ = predict(row["config"], (row.get("model") or {}).get("config"), tensors_of(row))
    if pred and pred.get("peak_allocated_bytes"):
        print(f"  estimate   {pred['peak_allocated_bytes'] / GIB:8.2f} GiB  estimated")


def build_parser() -> argparse.ArgumentParser:
    """The command and its subcommands; `one` takes the run settings' flags (the same schema-derived flags as
    `vram-estimate`)."""
    from estimator.interface.flags import OneLineParser, add_run_flags, int_flag

    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", parser_class=OneLineParser)
    sub.required = True
    one = sub.add_parser(
        "one", help="trace one config and print its peaks", argument_default=argparse.SUPPRESS
    )
    add_run_flags(one)
    t = one.add_argument_group("trace")
    t.add_argument("--out", type=Path, help="also append the row to this .jsonl file")
    t.add_argument("--json", action="store_true", default=False, help="print the whole row as JSON")
    t.add_argument("--sweep", default="cli", help=argparse.SUPPRESS)

    g = sub.add_parser("grid", help="trace a named grid into its rows file (resumes)")
    g.add_argument("name", choices=sorted(GRIDS), help="the grid (sweeps/trace/grids.py)")
    g.add_argument(
        "--out", type=Path, help="jsonl file for the rows (default: the grid's, under results/traced/)"
    )
    g.add_argument("--timeout", type=float, help="seconds per config (default: the grid's)")
    g.add_argument("--limit", type=int_flag, help="only the first N configs of the grid")

    r = sub.add_parser("retrace", help="retrace the rows a tracer fix or an upstream release changes")
    r.add_argument("paths", nargs="+", type=Path, help="traced .jsonl files")
    r.add_argument("--tag", required=True, help="what the retrace is for; rows carrying it are skipped")
    r.add_argument(
        "--where",
        action="append",
        default=[],
        help="FIELD (truthy) or FIELD=JSON_VALUE a row's config must meet (repeatable)",
    )
    r.add_argument(
        "--timeout", type=int_flag, default=600, help="seconds per row before it is left as it was"
    )
    r.add_argument(
        "--beside",
        action="store_true",
        help="append each retrace as a row of its own under the installed transformers (old rows kept)",
    )

    c = sub.add_parser("child")  # one grid job, in the subprocess gridrun starts: appends its row to --out
    c.add_argument("job", help=argparse.SUPPRESS)
    c.add_argument("--sweep", required=True)
    c.add_argument("--out", type=Path, required=True)
    return p


def _check_args(a: argparse.Namespace) -> str | None:
    """The tracer's own flags, checked before any trace runs: --timeout, --limit, and a writable --out."""
    timeout = getattr(a, "timeout", None)
    if timeout is not None and (not math.isfinite(timeout) or timeout <= 0):
        return f"--timeout {timeout:g}: accepted values are seconds > 0"
    limit = getattr(a, "limit", None)
    if limit is not None and limit < 1:
        return f"--limit {limit}: accepted values are integers >= 1"
    out = getattr(a, "out", None)
    if a.command == "grid" and out is None:
        out = GRIDS[a.name].path
    if out is not None:
        problem = records.writable_problem(out)
        if problem:
            return f"--out {out}: {problem}"
    if a.command == "retrace":
        for path in a.paths:
            if not path.exists():
                return f"no such traced file: {shown(str(path))}"
            if not path.is_file():
                return f"{shown(str(path))}: not a regular file; give a .jsonl of traced rows"
            loaded = records.read_rows(path)
            if loaded.skipped and not loaded.rows:  # junk read as zero rows would retrace nothing, silently
                return f"{shown(str(path))}: no traced rows ({loaded.report_lines()[0]})"
    return None


def _one(a: argparse.Namespace) -> int:
    from estimator.interface.flags import FlagError, resolve_run

    try:
        cfg, _arch, notes = resolve_run(a)
    except FlagError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if cfg.num_gpus > 1:
        from sweeps.trace.distributed import untraced_reason

        reason = untraced_reason(cfg)
        if reason is not None:
            print(f"{PROG}: error: --gpus {cfg.num_gpus}: {reason}", file=sys.stderr)
            return 2
    for note in notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    row = make_row(cfg, a.sweep)
    if getattr(a, "out", None):
        records.append_row(a.out, row)
    print(json.dumps(row, indent=1) if a.json else "", end="")
    _print_row(row)
    return 0 if row["status"] == "ok" else 1


def main(argv: list[str] | None = None) -> int:
    from estimator.interface.flags import FlagError

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in (*COMMANDS, "child", "-h", "--help"):
        what = f"{shown(argv[0])} is not a command" if argv else "no command given"
        print(f"{PROG}: error: {what}; accepted: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        a = build_parser().parse_args(argv)
    except FlagError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    problem = _check_args(a)
    if problem:
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    if a.command == "one":
        return _one(a)
    if a.command == "grid":
        grid = GRIDS[a.name]
        run_grid(a.name, a.out or grid.path, a.timeout or grid.timeout, a.limit)
        return 0
    if a.command == "retrace":
        return 1 if retrace.run(a.paths, a.where, a.tag, a.timeout, beside=a.beside) else 0
    from sweeps.trace.gridrun import trace_job

    row = trace_job(Job.from_dict(json.loads(a.job)), a.sweep)
    records.append_row(a.out, row)
    return 0 if row["status"] == "ok" else ROW_WRITTEN_WITH_ERROR
