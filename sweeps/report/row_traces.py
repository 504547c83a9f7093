"""Measured-gpu rows and the traced streams of their configurations: finding a row's stream, tracing the missing
ones, reading a stream as the GPU allocates it, and the command-line frame the reports that replay them share
(`sweeps.report.mincard`, `sweeps.report.replay`)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from sweeps import records
from sweeps.oneline import shown

SOURCE = "measured-gpu"
IGNORED = ("transformers_version", "trl_version", "device")  # not part of what is traced


def config_id(config: dict) -> str:
    """A config as the estimator reads it (defaults filled in, a size or catalog name read as its HF id), without
    the fields tracing does not depend on: a GPU row and the traced stream of its configuration share it."""
    from estimator.model.catalog import catalog_id

    d = RunConfig.from_dict({k: v for k, v in config.items() if k not in IGNORED}).to_dict()
    d["model"] = catalog_id(d["model"]) or d["model"]
    return json.dumps({k: v for k, v in d.items() if k not in IGNORED}, sort_keys=True)


class RowsError(Exception):
    """Rows files the report cannot read: the one line to print."""


def traced_streams(traced_dir: Path) -> dict[str, Path]:
    """The traced streams in `traced_dir` by configuration (`config_id`)."""
    rows, _ = records.read_index(Path(traced_dir) / "index.jsonl")
    return {config_id(r["config"]): Path(traced_dir) / r["stream"] for r in rows if r.get("stream")}


def trace_missing(rows: Iterable[dict], traced_dir: Path) -> list[str]:
    """Trace (CPU, fake tensors) every finished measured-gpu row's configuration that has no stream in
    `traced_dir`, as many steps as the measured run took; the keys of the streams written."""
    latest = records.latest_rows(r for r in rows if r.get("source") == SOURCE)
    return trace_configs(
        ((r["config"], int((r.get("variant") or {}).get("steps", 2))) for r in latest), traced_dir
    )


def trace_configs(configs: Iterable[tuple[dict, int]], traced_dir: Path) -> list[str]:
    """Trace each (config, steps) whose configuration has no stream in `traced_dir` yet; the keys written."""
    from sweeps.trace import streams as trace_streams

    Path(traced_dir).mkdir(parents=True, exist_ok=True)
    have = traced_streams(traced_dir)
    written = []
    for config, steps in configs:
        if config_id(config) in have:
            continue
        out = trace_streams.record(RunConfig.from_dict(config), Path(traced_dir), steps)
        if out is not None:
            written.append(out["key"])
            have = traced_streams(traced_dir)
    return written


def config_and_arch(config: dict, hf_config: dict | None = None) -> tuple[RunConfig, Arch]:
    """A row's RunConfig and model: its stored config.json (`hf_config`) where it has one, else the catalog's."""
    from estimator.model.catalog import resolve_model
    from sweeps.runner.predict import arch_for

    cfg = RunConfig.from_dict(config)
    return cfg, arch_for(cfg, hf_config) or resolve_model(cfg.model)


def real_events(path: Path, cfg: RunConfig, arch: Arch) -> list:
    """The traced stream at `path` as the GPU allocates it: tied gradients summed in place
    (`sweeps.trace.tied_sums.as_real`)."""
    from estimator.hardware.allocator import load_stream
    from sweeps.trace.tied_sums import as_real

    return as_real(load_stream(path), cfg, arch)


def add_arguments(p: argparse.ArgumentParser, rows: Path, traced: Path, what: str) -> None:
    """The rows files, `--traced DIR` and `--trace-missing`."""
    p.add_argument("rows", nargs="*", default=[str(rows)], help=f"{what} rows files (default {rows})")
    p.add_argument("--traced", default=str(traced), help=f"traced streams of the rows (default {traced})")
    p.add_argument(
        "--trace-missing", action="store_true", help="trace the rows' configurations without a stream"
    )


def read_rows(args: argparse.Namespace, default: Path, what: str) -> list[dict]:
    """The rows of `args.rows` (the default file may be absent: no rows yet), their missing traces written first
    when `args.trace_missing`; RowsError names a rows file that is not there."""
    missing = [r for r in args.rows if not Path(r).exists() and r != str(default)]
    if missing:
        raise RowsError(f"{shown(missing[0])}: no such rows file; accepted are {what} .jsonl files")
    rows = records.load_rows(args.rows)
    if args.trace_missing:
        for key in trace_missing(rows, Path(args.traced)):
            print(f"traced {key} into {args.traced}")
    return rows


def guarded(prog: str, body: Callable[[], None]) -> int:
    """Run a report's body: 0, or one line on stderr and 2 for rows it cannot read or paths it cannot write."""
    try:
        body()
    except RowsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a folder or file that cannot be read or written
        print(f"{prog}: {shown(str(exc), 160)}; accepted are writable paths", file=sys.stderr)
        return 2
    return 0
